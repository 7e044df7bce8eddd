-- decide.lua: decide a batch of rate-limit requests atomically on one shard.
--
-- The arithmetic is pkg/store/store.go's, bit for bit: every fractional step
-- is an IEEE-754 double operation in the order written there, so this script
-- and the Go memory store give identical results for identical inputs and
-- clocks. Integers stay exact while limits, hits and bursts are at most
-- 2^53, and so is the sum of a window's hits, which forced write-backs
-- (below) can carry past the limit (now in microseconds is about 2^51).
--
-- The numbers below are named once, in the `local` lines after this
-- header, and those names and values are lua/lua.go's constants (lua_test.go
-- checks that they and this header agree). Binary values are little-endian
-- (struct.pack '<'); a double is an IEEE-754 binary64.
--
-- KEYS[i]  the store key of check i (all keys in one Redis Cluster hash slot).
-- ARGV[1]  now in integer microseconds, or "" to take it from redis TIME.
--          Only the Go store's test-only clock (redisstore.Options.Clock)
--          sets it; nothing in a request can.
-- ARGV[2]  mode: "0" decide; "1" peek (every check is check-only, nothing
--          is written).
-- ARGV[3], ARGV[4], ...: one request each, its checks in order, 34 bytes
--          per check: algorithm (byte: 0 sliding window, 1 token bucket,
--          2 fixed window), flags (byte: the sum of 1 = refund, 2 = shadow,
--          4 = force), then doubles: limit, window seconds, burst
--          (0 = limit), hits. The requests' checks are KEYS in order.
--
-- Reply: one string, 25 bytes per check in KEYS order: allowed (byte 1/0),
-- then doubles: remaining, retry_after_us, reset_us.
--
-- Requests: the Go store sends several concurrent requests of one slot in
-- one call: one TIME, one MGET and at most one SET per key for all of them.
-- Each request is decided as if it ran alone after the ones before it: its
-- refunds and forced write-backs first, in order, always applied; then its
-- other checks in order against the tentative state (duplicate keys count
-- twice); if none of its consuming, non-shadow checks was denied, all its
-- consumption stands, else none of it (the state is rolled back for the
-- requests after it). Check-only checks never write. A forced check adds
-- its hits whatever the budget (a token bucket goes down to 0 tokens, never
-- below) and is allowed with the budget after it. At the end every key
-- that some request changed is written once, with its final state.
--
-- State: one string per key, written with its TTL in one command
-- (SET key value PX ttl): a tag byte, then doubles: 's' sliding window:
-- window index, count, previous count; 't' token bucket: tokens, last
-- refill (microseconds); 'f' fixed window: window index, count. A key
-- holds one algorithm's state: a check of another algorithm (another tag,
-- or a value of the wrong length or type) starts fresh, as in the memory
-- store, and its write replaces the value. A write never deletes the key,
-- not even for a moment: in a Redis Cluster slot being migrated
-- (MIGRATING), a script may only touch keys that exist on the node, so DEL
-- then SET would fail half-way with the count lost.
--
-- TIME before writes needs effects replication, the default since Redis 5
-- and requested below for 3.2-4.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local HEADER, CHECK_BYTES, RESULT_BYTES = 2, 34, 25
local MODE_DECIDE, MODE_PEEK = '0', '1'
local ALG_SLIDING, ALG_TOKEN_BUCKET, ALG_FIXED = 0, 1, 2
local FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE = 1, 2, 4
local TAG_SLIDING, TAG_TOKEN_BUCKET, TAG_FIXED = 's', 't', 'f'
local US = 1000000

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * US + tonumber(t[2])
end
local peek = ARGV[2] == MODE_PEEK

local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local pack, sunpack = struct.pack, struct.unpack
local BYTE_SLIDING, BYTE_TOKEN_BUCKET, BYTE_FIXED = TAG_SLIDING:byte(), TAG_TOKEN_BUCKET:byte(), TAG_FIXED:byte()

local function fmt_int(x) return string.format('%.0f', x) end

-- ttl_arg returns the whole number of milliseconds x as a PX argument, a
-- decimal string, formatted once per value and call: handing Redis a Lua
-- number costs as much as the rest of a write.
local ttl_args = {}
local function ttl_arg(x)
  local a = ttl_args[x]
  if not a then
    a = fmt_int(x)
    ttl_args[x] = a
  end
  return a
end

-- Per key: the stored value (false when missing or not a string), read
-- with one MGET per 256 keys before anything else, and the tentative
-- state of this call. A check of another algorithm than the state's
-- starts from a fresh state, as in the memory store.
local stored, states = {}, {}
do
  local n = #KEYS
  for from = 1, n, 256 do
    local to = min(n, from + 255)
    local vs = redis.call('MGET', unpack(KEYS, from, to))
    for i = from, to do stored[KEYS[i]] = vs[i - from + 1] end
  end
end

-- The rollback journal of the request being decided, made when first
-- needed: per key, the state before the request's tentative checks first
-- changed or replaced it. A request of one tentative check consumes only
-- when it is allowed, so only a replaced state (another algorithm) needs
-- undoing: copy_states is false then, saving the copies. A state loaded
-- by the request needs none: undone, it is the stored value again.
local journal
local tentative_phase, copy_states = false, false

-- Per request: the state a check of another algorithm replaced, by key
-- (the first one replaced), or nil when none was; and the request's serial
-- number, which wrote[key] holds for a key the request wrote (a refund, a
-- forced write-back, or consumption that stood). A key the request wrote
-- is written with its final state, whatever replaced what; a replaced
-- state of a key it did not write comes back after it, as nothing was
-- stored.
local replaced
local req = 0
local wrote = {}

-- Keys to write at the end, in first-touch order: refunded, forced, or
-- consumed by a request that stood.
local dirty, dirty_keys = {}, {}

local function load(key, alg, w, limit, burst)
  local s = states[key]
  if s and s.alg == alg then return s end
  if s then
    if tentative_phase then
      journal = journal or {}
      if journal[key] == nil then journal[key] = s end
    end
    replaced = replaced or {}
    if replaced[key] == nil then replaced[key] = s end
  end
  -- Within a request, a check of another algorithm than the key's state
  -- starts fresh (as the memory store does). Across requests, a state no
  -- request wrote is the stored value, so read that again.
  local v = false
  if not s or (s.born ~= req and not dirty[key]) then v = stored[key] end
  local wus = w * US
  local cur_win = floor(now / wus)
  local start = cur_win * wus
  if alg == ALG_TOKEN_BUCKET then
    local b = burst
    if b == 0 then b = limit end
    local r = limit / wus
    local _, tokens, last
    if v and #v == 17 and v:byte(1) == BYTE_TOKEN_BUCKET then
      _, tokens, last = sunpack('<Bdd', v)
    else
      tokens, last = b, now
    end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = req,
      b = b, r = r, tokens = min(b, tokens + (now - last) * r), last = now }
  elseif alg == ALG_FIXED then
    local _, win, count = nil, nil, 0
    if v and #v == 17 and v:byte(1) == BYTE_FIXED then
      _, win, count = sunpack('<Bdd', v)
    end
    if win ~= cur_win then count = 0 end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = req,
      win = cur_win, count = count }
  else
    local _, win, cur, prev
    if v and #v == 25 and v:byte(1) == BYTE_SLIDING then
      _, win, cur, prev = sunpack('<Bddd', v)
      if win ~= cur_win then
        if win == cur_win - 1 then prev = cur else prev = 0 end
        cur = 0
      end
    else
      cur, prev = 0, 0
    end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = req,
      win = cur_win, cur = cur, prev = prev }
  end
  states[key] = s
  return s
end

-- save records s in the journal before a request's tentative check first
-- changes it.
local function save(s)
  if not copy_states then return end
  journal = journal or {}
  if journal[s.key] == nil then
    local c = {}
    for k, v in pairs(s) do c[k] = v end
    journal[s.key] = c
  end
end

local function write(s)
  if s.alg == ALG_TOKEN_BUCKET then
    local ttl_us = ceil(s.b / s.r) + US
    -- A bucket refilling over centuries would pass PX's range and Redis
    -- would reject the whole script: 2^53 ms is "never" enough.
    redis.call('SET', s.key, pack('<Bdd', BYTE_TOKEN_BUCKET, s.tokens, s.last),
      'PX', ttl_arg(min(ceil(ttl_us / 1000), 9007199254740992)))
  elseif s.alg == ALG_FIXED then
    local reset = s.wus - (now - s.start)
    redis.call('SET', s.key, pack('<Bdd', BYTE_FIXED, s.win, s.count),
      'PX', ttl_arg(ceil(reset / 1000)))
  else
    redis.call('SET', s.key, pack('<Bddd', BYTE_SLIDING, s.win, s.cur, s.prev),
      'PX', ttl_arg(2 * s.w * 1000))
  end
end

-- budget returns R, the number of single hits that would pass now.
local function budget(s, limit)
  if s.alg == ALG_TOKEN_BUCKET then
    return max(0, floor(s.tokens))
  elseif s.alg == ALG_FIXED then
    return max(0, limit - s.count)
  end
  local elapsed = (now - s.start) / s.wus
  local rate = s.prev * (1 - elapsed) + s.cur
  if rate < limit then return ceil(limit - rate) end
  return 0
end

-- reset returns the microseconds until the window ends (token bucket: until
-- the bucket is full).
local function reset(s)
  if s.alg == ALG_TOKEN_BUCKET then
    if s.tokens < s.b then return floor((s.b - s.tokens) / s.r) + 1 end
    return 0
  end
  return s.wus - (now - s.start)
end

-- passes_at reports whether h hits would pass ra microseconds from now with
-- no other traffic (sliding window and token bucket).
local function passes_at(s, limit, h, ra)
  if s.alg == ALG_TOKEN_BUCKET then return min(s.b, s.tokens + ra * s.r) >= h end
  local into = now - s.start + ra
  local prev, cur = s.prev, s.cur
  if into >= 2 * s.wus then
    prev, cur = 0, 0
  elseif into >= s.wus then
    prev, cur, into = cur, 0, into - s.wus
  end
  local rate = prev * (1 - into / s.wus) + cur
  if rate >= limit then return false end
  return h <= ceil(limit - rate)
end

-- settle corrects a retry time computed in floating point: at least 1 us,
-- and later by a few microseconds at most while h would still not pass.
local function settle(s, limit, h, ra)
  if ra < 1 then ra = 1 end
  for _ = 1, 4 do
    if passes_at(s, limit, h, ra) then return ra end
    ra = ra + 1
  end
  return ra
end

-- retry_after returns the microseconds until h hits would pass with no other
-- traffic (h >= 1).
local function retry_after(s, limit, h)
  if s.alg == ALG_TOKEN_BUCKET then
    if h <= s.b then return settle(s, limit, h, floor((h - s.tokens) / s.r) + 1) end
    return floor(s.b / s.r) + 1
  elseif s.alg == ALG_FIXED then
    return reset(s)
  end
  local into = now - s.start
  local rst = s.wus - into
  local a = limit - s.cur - h + 1
  local x
  if a > 0 and s.prev > 0 then
    x = (1 - a / s.prev) * s.wus - into
  else
    local a2 = limit - h + 1
    if a2 <= 0 then return rst end
    if s.cur < a2 then
      x = rst - 1
    else
      x = rst + (1 - a2 / s.cur) * s.wus
    end
  end
  return settle(s, limit, h, floor(x) + 1)
end

local function refund(s, h)
  if s.alg == ALG_TOKEN_BUCKET then
    s.tokens = min(s.b, s.tokens + h)
  elseif s.alg == ALG_FIXED then
    s.count = max(0, s.count - h)
  else
    s.cur = s.cur - h
    if s.cur < 0 then
      s.prev = max(0, s.prev + s.cur)
      s.cur = 0
    end
  end
end

local function consume(s, h)
  if s.alg == ALG_TOKEN_BUCKET then
    s.tokens = s.tokens - h
  elseif s.alg == ALG_FIXED then
    s.count = s.count + h
  else
    s.cur = s.cur + h
  end
end

-- force adds h hits whatever the budget; a bucket stops at 0 tokens.
local function force(s, h)
  if s.alg == ALG_TOKEN_BUCKET then
    s.tokens = max(0, s.tokens - h)
  else
    consume(s, h)
  end
end

-- The flags byte's bits (FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE), by value
-- 0 to 7 (higher bits are ignored). Literal tables: computing them costs
-- more than the rest of a small call (lua_test.go checks them).
local IS_REFUND = { [0] = false, true, false, true, false, true, false, true }
local IS_SHADOW = { [0] = false, false, true, true, false, false, true, true }
local IS_FORCE = { [0] = false, false, false, false, true, true, true, true }

local reply = {}
local function result(i, allowed, remaining, retry, rst)
  reply[i] = pack('<Bddd', allowed and 1 or 0, remaining, retry, rst)
end

-- A token bucket with limit 0 never refills: it denies everything (RetryAfter
-- one window, Reset 0), a refund of it is allowed with Remaining 0, and
-- neither reads nor writes state.
local function dead(c) return c.alg == ALG_TOKEN_BUCKET and c.limit == 0 end

local function touch(key)
  wrote[key] = req
  if not dirty[key] then
    dirty[key] = true
    dirty_keys[#dirty_keys + 1] = key
  end
end

-- decide_request decides checks first..last, one request.
local function decide_request(checks, first, last)
  req = req + 1
  replaced = nil
  -- Refunds and forced write-backs first; they always stand.
  local tentative = 0
  for i = first, last do
    local c = checks[i]
    if c.early and dead(c) then
      result(i, true, 0, 0, 0)
    elseif c.early then
      local s = load(KEYS[i], c.alg, c.w, c.limit, c.burst)
      if c.refund then refund(s, c.hits) else force(s, c.hits) end
      touch(KEYS[i])
      result(i, true, budget(s, c.limit), 0, reset(s))
    else
      tentative = tentative + 1
    end
  end
  -- Then the others in order, against the tentative state.
  journal, tentative_phase, copy_states = nil, true, tentative > 1
  local veto, consumed = false, nil
  for i = first, last do
    local c = checks[i]
    if not c.early and dead(c) then
      if c.hits > 0 and not c.shadow then veto = true end
      result(i, false, 0, c.w * US, 0)
    elseif not c.early then
      local s = load(KEYS[i], c.alg, c.w, c.limit, c.burst)
      local r = budget(s, c.limit)
      local h = c.hits
      if h == 0 then
        if r >= 1 then
          result(i, true, r, 0, reset(s))
        else
          result(i, false, r, retry_after(s, c.limit, 1), reset(s))
        end
      elseif h <= r then
        save(s)
        consume(s, h)
        consumed = consumed or {}
        consumed[#consumed + 1] = i
        result(i, true, r - h, 0, reset(s))
      else
        if not c.shadow then veto = true end
        result(i, false, r, retry_after(s, c.limit, h), reset(s))
      end
    end
  end
  if veto then
    -- None of it: restore what the request changed or replaced.
    if consumed and not copy_states then
      error('decide.lua: a request of one tentative check consumed and was vetoed')
    end
    if journal then
      for key, s in pairs(journal) do states[key] = s end
    end
  else
    if consumed then
      for _, i in ipairs(consumed) do touch(KEYS[i]) end
    end
    if replaced then
      for key, s in pairs(replaced) do
        if wrote[key] ~= req then states[key] = s end
      end
    end
  end
  journal, tentative_phase, copy_states = nil, false, false
end

-- Decode every request's checks, then decide the requests in order.
local checks = {}
local bounds = {}
local n = 0
for a = HEADER + 1, #ARGV do
  local blob = ARGV[a]
  local m = #blob / CHECK_BYTES
  if m ~= floor(m) then error('decide.lua: a request of ' .. #blob .. ' bytes') end
  local first = n + 1
  for j = 0, m - 1 do
    local alg, fl, limit, w, burst, hits = sunpack('<BBdddd', blob, j * CHECK_BYTES + 1)
    fl = fl % 8
    if alg ~= ALG_TOKEN_BUCKET and alg ~= ALG_FIXED then alg = ALG_SLIDING end -- unknown: sliding
    local rf, fo = IS_REFUND[fl], IS_FORCE[fl] and not IS_REFUND[fl]
    if peek then hits, rf, fo = 0, false, false end
    n = n + 1
    checks[n] = { alg = alg, limit = limit, w = w, burst = burst, hits = hits,
      refund = rf, force = fo, shadow = IS_SHADOW[fl],
      early = rf or fo } -- applied before the request's others
  end
  bounds[#bounds + 1] = first
  bounds[#bounds + 1] = n
end
if n ~= #KEYS then error('decide.lua: ' .. n .. ' checks for ' .. #KEYS .. ' keys') end
for b = 1, #bounds, 2 do
  if bounds[b] <= bounds[b + 1] then decide_request(checks, bounds[b], bounds[b + 1]) end
end

if not peek then
  for _, key in ipairs(dirty_keys) do write(states[key]) end
end

return table.concat(reply)
