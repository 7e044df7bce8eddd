-- exchange.lua: one replica's exchange of one global key (package global,
-- docs/global.md). It is the only writer of the key's state in the global
-- store and runs atomically, so its invariant holds at every instant:
-- for every window v, the shares regions hold for v sum to at most the
-- limit (a sliding window: for every v, the sum over regions of the larger
-- of a region's shares for v-1 and v). A region holds, for window v, its
-- stored share for v (written by this script, never lowered), else its
-- floor when v >= its floor's first window, else nothing.
--
-- KEYS[1]: the key's meta hash; window v's hash is KEYS[1]..'|'..v (one
--   hash tag: KEYS[1] begins with the counter key's).
-- ARGV: 1 now in µs ('' = this server's TIME, the one clock), 2 region,
--   3 replica, 4 limit, 5 window µs, 6 lease µs, 7 interval µs, 8 the floor
--   a region asks for, 9 this replica's demand in hits per window, 10 '1'
--   for a sliding window, 11 margin µs (clock error allowance), 12 'p' to
--   publish the demand only (a round's first call), else grant, 13 '1'
--   when the demand is a shift's (measured since the interval's boundary).
-- Meta fields: 'e|R' region R's lease end (a window index), 'f|R' its
--   floor, 'ff|R' its floor's first window, 's|R' when it last called (µs),
--   'd|R|P' replica P's demand as 'n:hits', published in round n (the
--   interval its call's now is in); 'x' the last round a shift was published.
-- Reply: {now µs, c, floor, floor's first window, lease end e, share of c,
--   ..., share of e}: this region's shares from the current window c on;
--   to a publish, {now µs}.
--
-- A round is two calls by every replica: each publishes its demand a
-- quarter into the interval, then, half into it, is granted shares from
-- the demand every replica published: the grants of a round read the same
-- demands whatever their order, so a shift published in round k is in the
-- shares of window k+1 whole, not in one region's and not another's.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local me, rep = ARGV[2], ARGV[3]
local L, W, lease, ival = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local floorWant, demand, sliding, margin = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1', tonumber(ARGV[11])
local meta = KEYS[1]
local ttl = math.floor((11 * lease + 3 * W + margin + 10 * ival) / 1000)
local round = math.floor(now / ival)
local myDemand = 'd|' .. me .. '|' .. rep
if ARGV[12] == 'p' then
  redis.call('HSET', meta, myDemand, round .. ':' .. demand)
  if ARGV[13] == '1' then redis.call('HSET', meta, 'x', round) end
  redis.call('PEXPIRE', meta, ttl)
  return {now}
end
local c = math.floor(now / W)
local enew = math.floor((now + lease) / W)
local myRound = -1

-- The regions, from the meta hash.
local R = {}
local function reg(q)
  local x = R[q]
  if not x then
    x = {e = -1, ff = 0, seen = 0, d = 0, fields = {}}
    R[q] = x
  end
  return x
end
local raw = redis.call('HGETALL', meta)
local shifted = -1
for i = 1, #raw, 2 do
  local k, v = raw[i], raw[i + 1]
  local kind, q = string.match(k, '^(%a+)|([^|]+)')
  if k == 'x' then shifted = tonumber(v) end
  if kind then
    local x = reg(q)
    table.insert(x.fields, k)
    if kind == 'e' then x.e = tonumber(v)
    elseif kind == 'f' then x.fl = tonumber(v)
    elseif kind == 'ff' then x.ff = tonumber(v)
    elseif kind == 's' then x.seen = tonumber(v)
    elseif kind == 'd' then
      local n, d = string.match(v, '^(-?%d+):(%d+)$')
      n, d = tonumber(n), tonumber(d)
      if not n then
        redis.call('HDEL', meta, k) -- not this script's
      elseif k == myDemand then
        myRound = n
        if n == round then x.d = x.d + d end
      elseif n < round - 10 then
        redis.call('HDEL', meta, k) -- a replica gone
      elseif n >= round - 1 then -- this round's, else the round before's
        x.d = x.d + d
      end
    end
  end
end
-- A region absent for 10 leases has stopped using its floor (it stops by
-- itself at its last call + 10 leases, on this clock within the margin):
-- its fields go, and with them its floor, from windows it can no longer
-- count in (two windows later: a sliding window's hits count in the next).
for q, x in pairs(R) do
  if q ~= me and x.seen + 10 * lease + margin + 2 * W < now then
    redis.call('HDEL', meta, unpack(x.fields))
    R[q] = nil
  end
end
local mine = reg(me)
mine.seen = math.max(mine.seen, now)
redis.call('HSET', meta, 's|' .. me, mine.seen)
if myRound ~= round then -- not published this round (a key's first call): now
  mine.d = mine.d + demand
  redis.call('HSET', meta, myDemand, round .. ':' .. demand)
end

-- The window hashes that the shares of windows c .. maxE+2 depend on.
local maxE = enew
for _, x in pairs(R) do maxE = math.max(maxE, x.e) end
local Wv = {}
for v = c - 1, maxE + 3 do
  local h = redis.call('HGETALL', meta .. '|' .. v)
  local t = {}
  for i = 1, #h, 2 do t[h[i]] = tonumber(h[i + 1]) end
  Wv[v] = t
end
local function held(q, v)
  local s = Wv[v] and Wv[v][q]
  if s then return s end
  local x = R[q]
  if x and x.fl and v >= x.ff then return x.fl end
  return 0
end
local function held2(q, v)
  if sliding then return math.max(held(q, v - 1), held(q, v)) end
  return held(q, v)
end
-- others: what the other regions hold of v; a region gone from the meta
-- hash still holds what its window hashes say.
local function others(v)
  local s, seen = 0, {}
  local function add(q)
    if q ~= me and not seen[q] then
      seen[q] = true
      s = s + held2(q, v)
    end
  end
  for q, _ in pairs(R) do add(q) end
  for _, w in ipairs({v - 1, v}) do
    if Wv[w] then for q, _ in pairs(Wv[w]) do add(q) end end
  end
  return s
end
-- free: the most this region may hold for v, all else as it stands.
local function free(v)
  local x = L - others(v)
  if sliding then x = math.min(x, L - others(v + 1)) end
  return math.max(x, 0)
end

-- A floor is granted once, out of what no region holds in any window from
-- its first on (past maxE+2 only floors are held): as much of the floor
-- asked as the other floors leave, from the earliest window after which
-- there is room for it in every window (a region joining while others
-- hold the whole limit gets its floor when their leases end).
if not mine.fl then
  local g = math.max(math.min(math.floor(floorWant), free(maxE + 2)), 0)
  local ff = maxE + 2
  while ff > c + 1 and free(ff - 1) >= g do ff = ff - 1 end
  mine.fl, mine.ff = g, ff
  redis.call('HSET', meta, 'f|' .. me, g, 'ff|' .. me, ff)
end

-- Targets: the capacity not held as floors by regions without demand,
-- in proportion to the demanding regions' demands (so the busy region gets
-- most), or when it covers them all, each its demand and an equal part of
-- the rest (capacity no one demands goes to whoever asks); each at least
-- its floor.
local act, cap, D = {}, L, 0
for q, x in pairs(R) do
  if x.d > 0 or q == me then
    table.insert(act, q)
    D = D + x.d
  else
    cap = cap - (x.fl or 0)
  end
end
local t
if D <= cap then
  t = mine.d + (cap - D) / #act
else
  t = cap * mine.d / D
end
t = math.floor(math.max(t, mine.fl or 0))
-- A sliding window's share drops only by more than a twentieth of the
-- limit: a drop idles its capacity for a window (the next window counts a
-- region's larger share of the two), and a steady demand's measure
-- wobbles by up to about that much from one round to the next. Not in the
-- round of a shift or the next: a shift's demand is a quarter's, which
-- wobbles twice as much, and the next round's, a whole interval's, corrects
-- it at once (held within the band, the error would drop a window later,
-- idling that window's capacity instead).
if sliding and shifted < round - 1 then
  local keep = held(me, c)
  if t < keep and keep - t <= L / 20 then t = keep end
end

-- Shares from the current window to the new lease end: each only rises,
-- into what no other region holds.
for v = c, enew do
  local cur = Wv[v][me]
  local base = cur or held(me, v)
  local x = math.max(base, math.min(t, free(v)))
  if (cur == nil and v > c) or x > base then
    Wv[v][me] = x
    local wk = meta .. '|' .. v
    redis.call('HSET', wk, me, x)
    redis.call('PEXPIREAT', wk, math.floor(((v + 3) * W + margin) / 1000))
  end
end
mine.e = math.max(mine.e, enew)
redis.call('HSET', meta, 'e|' .. me, mine.e)
redis.call('PEXPIRE', meta, ttl)

local out = {now, c, mine.fl, mine.ff, mine.e}
for v = c, mine.e do table.insert(out, held(me, v)) end
return out
