-- decide.lua: decide a batch of rate-limit checks atomically on one shard.
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
-- checks that they and this header agree).
--
-- KEYS[i]  the store key of check i (all keys in one Redis Cluster hash slot).
-- ARGV[1]  now in integer microseconds, or "" to take it from redis TIME.
--          Only the Go store's test-only clock (redisstore.Options.Clock)
--          sets it; nothing in a request can.
-- ARGV[2]  mode: "0" decide; "1" peek (every check is check-only, nothing
--          is written).
-- then 6 values per check i, starting at ARGV[3 + 6*(i-1)]:
--          algorithm (0 sliding window, 1 token bucket, 2 fixed window),
--          limit, window seconds, burst (0 = limit), hits,
--          flags (the sum of 1 = refund, 2 = shadow, 4 = force).
--
-- Reply: 4 values per check i, at 4*(i-1)+1: allowed (1/0), remaining,
-- retry_after_us, reset_us. Each is an integer reply when it is a whole
-- number in [0, 2^53), where Redis's Lua-number-to-integer conversion is
-- exact, else a decimal string formatted with '%.0f' (huge retry times,
-- and anything not finite), never truncated.
--
-- Hash fields: sliding cur_window, cur_count, prev_count; token bucket
-- tokens, last_refill (microseconds); fixed window, count; all decimal
-- numbers as Redis writes a Lua number ('%.17g' before Redis 7.2, the
-- shortest round-trip form since), read back with tonumber. A key holds
-- one algorithm's fields: a write whose key held none of its algorithm's
-- fields also removes the other algorithms' (HDEL), every write sets the
-- algorithm's TTL (PEXPIRE), and a check of another algorithm starts
-- fresh, as in the memory store. A write never deletes the key, not even
-- for a moment: in a Redis Cluster slot being migrated (MIGRATING), a
-- script may only touch keys that exist on the node, so DEL then HSET
-- would fail half-way with the key deleted and its count lost.
--
-- Batch: refunds and forced write-backs first, in order, written at once
-- (a check with both flags is a refund); then the other checks in order
-- against the tentative state (duplicate keys count twice); if no
-- consuming, non-shadow check was denied, every consumed (and refunded or
-- forced) key is written, else nothing more. Check-only checks never write.
-- A forced check adds its hits whatever the budget (a token bucket goes
-- down to 0 tokens, never below) and is allowed with the budget after it.
--
-- Needs Redis >= 4 (multi-field HSET); TIME before writes needs effects
-- replication, the default since Redis 5 and requested below for 3.2-4.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local HEADER, PER, REPLY = 2, 6, 4
local MODE_DECIDE, MODE_PEEK = '0', '1'
local ALG_SLIDING, ALG_TOKEN_BUCKET, ALG_FIXED = 0, 1, 2
local FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE = 1, 2, 4
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

local function fmt_int(x) return string.format('%.0f', x) end

-- out returns x for the reply: a number when Redis turns it into the
-- integer reply exactly, else its decimal string (see Reply above).
-- string.format is the costliest thing this script does per check.
local function out(x)
  if x >= 0 and x < 9007199254740992 and x == floor(x) then return x end
  return fmt_int(x)
end

-- Per key: the tentative state of this batch, loaded once. A key holds the
-- state of one algorithm (every write replaces the whole hash); a check of
-- another algorithm than the state's starts from a fresh state, as in the
-- memory store.
local states = {}
local NONE = {}

local function load(key, alg, w, limit, burst)
  local s = states[key]
  if s and s.alg == alg then return s end
  local fresh = s ~= nil
  local function hmget(...)
    if fresh then return NONE end
    return redis.call('HMGET', key, ...)
  end
  local wus = w * US
  local cur_win = floor(now / wus)
  s = { key = key, alg = alg, w = w, wus = wus, start = cur_win * wus }
  if alg == ALG_TOKEN_BUCKET then
    local b = burst
    if b == 0 then b = limit end
    s.b = b
    s.r = limit / wus
    local h = hmget('tokens', 'last_refill')
    s.found = h[1] or h[2] -- HMGET gives false for a missing field
    local tokens, last = tonumber(h[1]), tonumber(h[2])
    if tokens == nil or last == nil then tokens, last = b, now end
    s.tokens = min(b, tokens + (now - last) * s.r)
    s.last = now
  elseif alg == ALG_FIXED then
    local h = hmget('window', 'count')
    s.found = h[1] or h[2] -- HMGET gives false for a missing field
    local win, count = tonumber(h[1]), tonumber(h[2]) or 0
    if win ~= cur_win then count = 0 end
    s.win, s.count = cur_win, count
  else
    local h = hmget('cur_window', 'cur_count', 'prev_count')
    s.found = h[1] or h[2] or h[3] -- HMGET gives false for a missing field
    local win = tonumber(h[1])
    local cur, prev = tonumber(h[2]) or 0, tonumber(h[3]) or 0
    if win == nil then
      cur, prev = 0, 0
    elseif win ~= cur_win then
      if win == cur_win - 1 then prev = cur else prev = 0 end
      cur = 0
    end
    s.win, s.cur, s.prev = cur_win, cur, prev
  end
  states[key] = s
  return s
end


local function write(s)
  if s.alg == ALG_TOKEN_BUCKET then
    redis.call('HSET', s.key, 'tokens', s.tokens, 'last_refill', s.last)
    local ttl_us = ceil(s.b / s.r) + US
    -- A bucket refilling over centuries would pass PEXPIRE's range and
    -- Redis would reject the whole script: 2^53 ms is "never" enough.
    redis.call('PEXPIRE', s.key, fmt_int(min(ceil(ttl_us / 1000), 9007199254740992)))
  elseif s.alg == ALG_FIXED then
    redis.call('HSET', s.key, 'window', s.win, 'count', s.count)
    local reset = s.wus - (now - s.start)
    redis.call('PEXPIRE', s.key, fmt_int(ceil(reset / 1000)))
  else
    redis.call('HSET', s.key, 'cur_window', s.win, 'cur_count', s.cur, 'prev_count', s.prev)
    redis.call('PEXPIRE', s.key, fmt_int(2 * s.w * 1000))
  end
  if not s.found then
    -- The key held no state of this algorithm, so it may hold another's:
    -- remove those fields. A key that did hold this algorithm's fields
    -- holds no other's, since every write that changed a key's algorithm
    -- removed the previous one's.
    if s.alg == ALG_TOKEN_BUCKET then
      redis.call('HDEL', s.key, 'cur_window', 'cur_count', 'prev_count', 'window', 'count')
    elseif s.alg == ALG_FIXED then
      redis.call('HDEL', s.key, 'cur_window', 'cur_count', 'prev_count', 'tokens', 'last_refill')
    else
      redis.call('HDEL', s.key, 'tokens', 'last_refill', 'window', 'count')
    end
    s.found = true
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

-- has reports whether flags holds bit.
local function has(flags, bit) return floor(flags / bit) % 2 == 1 end

local n = #KEYS
local checks = {}
for i = 1, n do
  local base = HEADER + PER * (i - 1)
  local flags = tonumber(ARGV[base + 6])
  local c = {
    alg = tonumber(ARGV[base + 1]), -- unknown values act as 0 (sliding)
    limit = tonumber(ARGV[base + 2]),
    w = tonumber(ARGV[base + 3]),
    burst = tonumber(ARGV[base + 4]),
    hits = tonumber(ARGV[base + 5]),
    refund = has(flags, FLAG_REFUND),
    shadow = has(flags, FLAG_SHADOW),
  }
  c.force = not c.refund and has(flags, FLAG_FORCE)
  if c.alg ~= ALG_TOKEN_BUCKET and c.alg ~= ALG_FIXED then c.alg = ALG_SLIDING end
  if peek then c.hits, c.refund, c.force = 0, false, false end
  c.early = c.refund or c.force -- applied and written before the others
  checks[i] = c
end

local reply = {}
local function result(i, allowed, remaining, retry, rst)
  local o = REPLY * (i - 1)
  reply[o + 1] = allowed and 1 or 0
  reply[o + 2] = out(remaining)
  reply[o + 3] = out(retry)
  reply[o + 4] = out(rst)
end

-- A token bucket with limit 0 never refills: it denies everything (RetryAfter
-- one window, Reset 0), a refund of it is allowed with Remaining 0, and
-- neither reads nor writes state.
local function dead(c) return c.alg == ALG_TOKEN_BUCKET and c.limit == 0 end

-- Keys to write, in first-touch order: refunded or consumed.
local dirty, dirty_keys = {}, {}
local function touch(key)
  if not dirty[key] then
    dirty[key] = true
    dirty_keys[#dirty_keys + 1] = key
  end
end

-- Refunds and forced write-backs first; always written.
for i = 1, n do
  local c = checks[i]
  if c.early and dead(c) then
    result(i, true, 0, 0, 0)
  elseif c.early then
    local s = load(KEYS[i], c.alg, c.w, c.limit, c.burst)
    if c.refund then refund(s, c.hits) else force(s, c.hits) end
    touch(KEYS[i])
    result(i, true, budget(s, c.limit), 0, reset(s))
  end
end
for _, key in ipairs(dirty_keys) do write(states[key]) end

-- Then the others in order, against the tentative state.
local veto = false
for i = 1, n do
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
      consume(s, h)
      touch(KEYS[i])
      result(i, true, r - h, 0, reset(s))
    else
      if not c.shadow then veto = true end
      result(i, false, r, retry_after(s, c.limit, h), reset(s))
    end
  end
end

-- All consumption or none; refunded and forced keys are rewritten with their
-- final state.
if not veto and not peek then
  for _, key in ipairs(dirty_keys) do write(states[key]) end
end

return reply
