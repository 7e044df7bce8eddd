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
--          4 = force, 8 = undo, and 16 times a counter call's reply mod 8;
--          see "Counter calls" below; and 128 = paced: a two-counter
--          sliding window's budget is then its current window's own,
--          max(0, limit - count), of precision N the count of the window's
--          sub-windows so far, retry and next hit at the window's end,
--          store.Check.Paced), then doubles: limit, window seconds, burst
--          (token bucket: capacity, 0 = limit; sliding window: precision,
--          the number of sub-windows, 0 or 1 for the two-counter window, at
--          most MAX_PRECISION, negated for a strict window), hits. The requests' checks are KEYS in order.
--
-- Reply: one string, 25 bytes per check in KEYS order: allowed (byte 1/0),
-- then doubles: remaining, retry_after_us, reset_us. An allowed check
-- sends retry_after_us 0, or, when it consumed the last of the budget
-- (remaining 0), the retry a check-only check would get right after it.
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
-- (SET key value PX ttl), in one of two forms. Compact, a decimal integer
-- (Redis stores it in the key's object itself, as small as a counter of
-- envoyproxy/ratelimit), for a sliding window whose counts are below 2^24
-- (COMPACT_COUNTS): (count * 2^24 + previous count) * 8 + window index
-- mod 4; for a fixed window whose count is below 2^48 (COMPACT_FIXED):
-- count * 8 + 4 + window index mod 4. The window index mod 4 is enough
-- because a sliding key expires two windows after its last write and a
-- fixed one when its window ends, on the clock of `now`; so the compact
-- form is written only when `now` is Redis's TIME. Otherwise a tag byte,
-- then doubles: 's' sliding window: window index, count, previous count;
-- 't' token bucket: tokens, last refill (microseconds); 'f' fixed window:
-- window index, count; 'p' sliding window of precision N >= 2: N, the
-- sub-window index, its count, then the counts of the N sub-windows before
-- it, newest first. A key holds one algorithm's state: a check of
-- another algorithm (another tag or form, or a value of the wrong length
-- or type) starts fresh, as in the memory store, and its write replaces
-- the value. A write never deletes the key,
-- not even for a moment: in a Redis Cluster slot being migrated
-- (MIGRATING), a script may only touch keys that exist on the node, so DEL
-- then SET would fail half-way with the count lost.
--
-- State written by anything else is checked as it is read: a count or a
-- token count that is negative, NaN or infinite (or a window index or
-- refill time that is not finite) starts fresh, as a missing key would;
-- and a check that is denied (and so writes nothing) on a key that has no
-- TTL gives it the TTL a write would, so that no such value can deny a key
-- forever.
--
-- Counter calls. The Go store decides a consuming check of a two-counter
-- sliding window or a fixed window without this script when it can: it
-- sends INCRBY of the key by hits * 2^27 (sliding: the count field of the
-- compact form) or hits * 8 (fixed), then TIME, and admits the check only
-- when the reply is the compact form of the current window with the
-- count within the limit (pkg/store/redis/counters.go). Otherwise it
-- sends the check here with the undo flag and the reply's form (reply mod
-- 8): before anything is decided, the hits that INCRBY added are taken
-- back from the stored value if it still holds them (the same form and
-- window; for a sliding window also the next window's form, into which a
-- roll moved the count as the previous one), never below 0, and the key
-- is written even when the check is then denied. A value of another form
-- replaced the INCRBY's hits: nothing is taken back.
--
-- One text, two ways to run it. As a script (EVAL/EVALSHA) it runs whole
-- on every call and ends with `return rls_decide(KEYS, ARGV)`. As a Redis
-- Function library (lua/library.go: this text without the line that
-- requests effects replication and without that last line, plus the
-- functions' registration) its top level runs once, when loaded, and each
-- FCALL runs rls_decide alone: the functions below are defined once, not
-- per call. The top level touches no global (a library's top level runs
-- where none exists): bind() takes the libraries on the first call, and
-- every per-call variable is set afresh by rls_decide.
--
-- TIME before writes needs effects replication, the default since Redis 5
-- and requested below for 3.2-4 (scripts only; Functions need Redis 7).

if redis.replicate_commands then pcall(redis.replicate_commands) end

local HEADER, CHECK_BYTES, RESULT_BYTES = 2, 34, 25
local MODE_DECIDE, MODE_PEEK = '0', '1'
local ALG_SLIDING, ALG_TOKEN_BUCKET, ALG_FIXED = 0, 1, 2
local FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE, FLAG_UNDO, FLAG_PACED = 1, 2, 4, 8, 128
local TAG_SLIDING, TAG_TOKEN_BUCKET, TAG_FIXED, TAG_PRECISE = 's', 't', 'f', 'p'
local MAX_PRECISION = 60
local COMPACT_COUNTS, COMPACT_FIXED = 16777216, 281474976710656
local US = 1000000
local INF = 1 / 0
local DIGIT_9 = 57 -- '9': a value starting with a digit (or '-') is compact

-- The libraries, bound on the first call (see the header).
local floor, ceil, min, max, pack, sunpack, format
local BYTE_SLIDING, BYTE_TOKEN_BUCKET, BYTE_FIXED, BYTE_PRECISE
local function bind()
  floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
  pack, sunpack, format = struct.pack, struct.unpack, string.format
  BYTE_SLIDING, BYTE_TOKEN_BUCKET = TAG_SLIDING:byte(), TAG_TOKEN_BUCKET:byte()
  BYTE_FIXED, BYTE_PRECISE = TAG_FIXED:byte(), TAG_PRECISE:byte()
end

-- The call: its keys, now (microseconds), peek, and compact (compact
-- values rely on keys expiring on the clock of `now`: only with Redis's
-- own, as a test clock jumps where TTLs do not follow).
local K, now, peek, compact

-- finite reports whether x is a number that is neither NaN nor infinite.
local function finite(x) return x > -INF and x < INF end

-- count_ok reports whether x is a count this script could have written:
-- not negative, not NaN, not infinite.
local function count_ok(x) return x >= 0 and x < INF end

-- ttl_arg returns the whole number of milliseconds x as a PX argument, a
-- decimal string, formatted once per value and call (ttl_args; nil on the
-- short path, which writes once): handing Redis a Lua number costs as much
-- as the rest of a write.
local ttl_args
local function ttl_arg(x)
  if not ttl_args then return format('%.0f', x) end
  local a = ttl_args[x]
  if not a then
    a = format('%.0f', x)
    ttl_args[x] = a
  end
  return a
end

-- Per key: the stored value (false when missing or not a string), read
-- with one MGET per 256 keys before anything else, and the tentative
-- state of this call. A check of another algorithm than the state's
-- starts from a fresh state, as in the memory store.
local stored, states
local function read_all()
  stored, states = {}, {}
  local n = #K
  for from = 1, n, 256 do
    local to = min(n, from + 255)
    local vs = redis.call('MGET', unpack(K, from, to))
    for i = from, to do stored[K[i]] = vs[i - from + 1] end
  end
end

-- The rollback journal of the request being decided, while its tentative
-- checks run (in_tentative): entries 1..jn, undone in reverse order when
-- the request is denied. An entry is a key and the state a check of
-- another algorithm replaced (J_KEY set), or, when the request has more
-- than one tentative check (journaling), a state and the value of its
-- changing field (cur, count or tokens) before a check consumed from it:
-- a request of one tentative check consumes only when it is allowed. A
-- state the request loaded needs no entry: undone, it is the stored value
-- again.
local in_tentative, journaling = false, false
local J_STATE, J_VALUE, J_KEY = {}, {}, {}
local jn = 0

-- Per request: the state a check of another algorithm replaced, by key
-- (the first one replaced), or nil when none was; and the request's serial
-- number, which wrote[key] holds for a key the request wrote (a refund, a
-- forced write-back, or consumption that stood). A key the request wrote
-- is written with its final state, whatever replaced what; a replaced
-- state of a key it did not write comes back after it, as nothing was
-- stored.
local replaced
local req = 0
local wrote

-- Keys to write at the end, in first-touch order: refunded, forced, or
-- consumed by a request that stood.
local dirty, dirty_keys

-- The states of denied checks, by key (nil until one is denied): at the
-- end, those of keys nothing wrote get their TTL back if they lost it.
local denied

-- precise_format returns the struct format of a precision-n state.
local precise_formats = {}
local function precise_format(n)
  local f = precise_formats[n]
  if not f then
    f = '<Bddd' .. string.rep('d', n)
    precise_formats[n] = f
  end
  return f
end

-- load_precise returns the state of a sliding window of precision pn at
-- key from its stored value v (false when absent), moved to the current
-- sub-window (pkg/store/store.go).
local function load_precise(key, alg, w, v, pn, req_)
  local wus = w * US
  local cur_win = floor(now / wus)
  local start = cur_win * wus
  local sub = cur_win * pn + floor((now - start) * pn / wus)
  local old = {}
  local cur, win = 0, sub
  if v and #v == 25 + 8 * pn and v:byte(1) == BYTE_PRECISE then
    local t = { sunpack(precise_format(pn), v) }
    if t[2] == pn and finite(t[3]) and count_ok(t[4]) then
      win, cur = t[3], t[4]
      for i = 1, pn do
        local c = t[4 + i]
        if not count_ok(c) then
          old = {}
          break
        end
        old[i] = c
      end
    end
  end
  if #old ~= pn then
    for i = 1, pn do old[i] = 0 end
    win, cur = sub, 0
  end
  local d = sub - win
  if d ~= 0 then
    if d < 0 or d > pn then
      for i = 1, pn do old[i] = 0 end
    else
      for i = pn, 1, -1 do
        local src = i - d
        if src == 0 then
          old[i] = cur
        elseif src > 0 then
          old[i] = old[src]
        else
          old[i] = 0
        end
      end
    end
    cur = 0
  end
  return { key = key, alg = alg, w = w, wus = wus, start = start, born = req_,
    pn = pn, win = sub, cur = cur, old = old }
end

-- precision returns the sub-windows of a check (0: not a sliding window of
-- precision 2 or more); a strict window sends its precision negated.
local function precision(alg, burst)
  if alg ~= ALG_SLIDING then return 0 end
  if burst < 0 then burst = -burst end
  if burst < 2 then return 0 end
  if burst > MAX_PRECISION or burst ~= floor(burst) then
    error('decide.lua: precision ' .. burst .. ' is not a whole number in [2, ' .. MAX_PRECISION .. ']')
  end
  return burst
end

-- build returns the state of a check at key from its stored value v
-- (false when absent), moved to now; born is the request's serial number.
local function build(key, alg, w, limit, burst, pn, v, born)
  if pn > 0 then
    local s = load_precise(key, alg, w, v, pn, born)
    s.strict = burst < 0 -- the oldest sub-window counts whole
    return s
  end
  local s
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
      if not (count_ok(tokens) and finite(last)) then tokens, last = b, now end
    else
      tokens, last = b, now
    end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = born,
      b = b, r = r, tokens = min(b, tokens + (now - last) * r), last = now }
  elseif alg == ALG_FIXED then
    local _, win, count = nil, nil, 0
    local b1 = v and v:byte(1)
    if b1 and b1 <= DIGIT_9 then
      -- Compact: count * 8 + 4 + window mod 4. The key expires when its
      -- window ends, so only the current window's value is ever read.
      local x = tonumber(v)
      if x and count_ok(x) and x % 8 >= 4 and (cur_win - x) % 4 == 0 then
        win, count = cur_win, floor(x / 8)
      end
    elseif b1 == BYTE_FIXED and #v == 17 then
      _, win, count = sunpack('<Bdd', v)
      if not count_ok(count) then count = 0 end
    end
    if win ~= cur_win then count = 0 end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = born,
      win = cur_win, count = count }
  else
    local _, win, cur, prev
    local b1 = v and v:byte(1)
    local x = b1 and b1 <= DIGIT_9 and tonumber(v)
    if x and not count_ok(x) then
      cur, prev = 0, 0
    elseif x and x % 8 < 4 then
      -- Compact: (count * 2^24 + previous count) * 8 + window mod 4. The
      -- key expires two windows after its last write, so the value read
      -- is of the current window or one of the two before.
      local back = (cur_win - x) % 4
      x = floor(x / 8)
      cur, prev = floor(x / COMPACT_COUNTS), x % COMPACT_COUNTS
      if back == 1 then
        prev, cur = cur, 0
      elseif back ~= 0 then
        cur, prev = 0, 0
      end
    elseif b1 == BYTE_SLIDING and #v == 25 then
      _, win, cur, prev = sunpack('<Bddd', v)
      if not (count_ok(cur) and count_ok(prev)) then cur, prev, win = 0, 0, cur_win end
      if win ~= cur_win then
        if win == cur_win - 1 then prev = cur else prev = 0 end
        cur = 0
      end
    else
      cur, prev = 0, 0
    end
    s = { key = key, alg = alg, w = w, wus = wus, start = start, born = born,
      win = cur_win, cur = cur, prev = prev }
  end
  return s
end

local function load(key, alg, w, limit, burst)
  local s = states[key]
  local pn = precision(alg, burst)
  if s and s.alg == alg and (s.pn or 0) == pn then
    if pn > 0 then s.strict = burst < 0 end -- as the memory store: each check's own
    return s
  end
  if s then
    if in_tentative then
      jn = jn + 1
      J_STATE[jn], J_VALUE[jn], J_KEY[jn] = s, nil, key
    end
    replaced = replaced or {}
    if replaced[key] == nil then replaced[key] = s end
  end
  -- Within a request, a check of another algorithm than the key's state
  -- starts fresh (as the memory store does). Across requests, a state no
  -- request wrote is the stored value, so read that again.
  local v = false
  if not s or (s.born ~= req and not dirty[key]) then v = stored[key] end
  s = build(key, alg, w, limit, burst, pn, v, req)
  states[key] = s
  return s
end

-- save records s's changing field in the journal before a tentative check
-- consumes from it.
local function save(s)
  if not journaling then return end
  jn = jn + 1
  local v
  if s.alg == ALG_TOKEN_BUCKET then
    v = s.tokens
  elseif s.alg == ALG_FIXED then
    v = s.count
  else
    v = s.cur
  end
  J_STATE[jn], J_VALUE[jn], J_KEY[jn] = s, v, false
end

-- undo restores what the journal recorded, last first.
local function undo()
  for k = jn, 1, -1 do
    local s = J_STATE[k]
    if J_KEY[k] then
      states[J_KEY[k]] = s
    elseif s.alg == ALG_TOKEN_BUCKET then
      s.tokens = J_VALUE[k]
    elseif s.alg == ALG_FIXED then
      s.count = J_VALUE[k]
    else
      s.cur = J_VALUE[k]
    end
  end
end

-- ttl_ms returns the TTL of s's key, in whole milliseconds, set on every
-- write.
local function ttl_ms(s)
  if s.alg == ALG_TOKEN_BUCKET then
    -- A bucket refilling over centuries would pass PX's range and Redis
    -- would reject the whole script: 2^53 ms is "never" enough.
    return min(ceil((ceil(s.b / s.r) + US) / 1000), 9007199254740992)
  elseif s.alg == ALG_FIXED then
    return ceil((s.wus - (now - s.start)) / 1000)
  end
  return 2 * s.w * 1000
end

local function write(s)
  local v
  if s.alg == ALG_TOKEN_BUCKET then
    v = pack('<Bdd', BYTE_TOKEN_BUCKET, s.tokens, s.last)
  elseif s.alg == ALG_FIXED then
    local c = s.count
    if compact and c < COMPACT_FIXED and c == floor(c) then
      v = c * 8 + 4 + s.win % 4
    else
      v = pack('<Bdd', BYTE_FIXED, s.win, c)
    end
  elseif s.pn then
    v = pack(precise_format(s.pn), BYTE_PRECISE, s.pn, s.win, s.cur, unpack(s.old))
  else
    local c, p = s.cur, s.prev
    if compact and c < COMPACT_COUNTS and p < COMPACT_COUNTS and c == floor(c) and p == floor(p) then
      v = (c * COMPACT_COUNTS + p) * 8 + s.win % 4
    else
      v = pack('<Bddd', BYTE_SLIDING, s.win, c, p)
    end
  end
  redis.call('SET', s.key, v, 'PX', ttl_arg(ttl_ms(s)))
end

-- restore_ttl gives s's key, which a denied check found and nothing wrote,
-- its TTL back when it has none (a value written without one would
-- otherwise deny the key for ever, since denials never write).
local function restore_ttl(s)
  if redis.call('PTTL', s.key) == -1 then redis.call('PEXPIRE', s.key, ttl_arg(ttl_ms(s))) end
end

-- precise_rate returns the rate of precision state s at sub-window x, into
-- microseconds into its window (x may be later than s.win: no traffic
-- since).
local function precise_count(s, x)
  local d = s.win - x
  if d == 0 then return s.cur end
  if d >= 1 and d <= s.pn then return s.old[d] end
  return 0
end

local function precise_rate(s, x, into)
  local pn = s.pn
  local j = x % pn
  local frac = 1
  if not s.strict then
    local b0, b1 = ceil(j * s.wus / pn), ceil((j + 1) * s.wus / pn)
    frac = (b1 - into) / (b1 - b0)
  end
  local full = 0
  for y = x - pn + 1, x do full = full + precise_count(s, y) end
  return precise_count(s, x - pn) * frac + full
end

-- budget returns R, the number of single hits that would pass now.
local function budget(s, limit)
  if s.alg == ALG_TOKEN_BUCKET then
    return max(0, floor(s.tokens))
  elseif s.alg == ALG_FIXED then
    return max(0, limit - s.count)
  elseif s.pn then
    local rate = precise_rate(s, s.win, now - s.start)
    if rate < limit then return ceil(limit - rate) end
    return 0
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
  if s.pn then
    local t = now + ra
    local k = floor(t / s.wus)
    local into = t - k * s.wus
    local rate = precise_rate(s, k * s.pn + floor(into * s.pn / s.wus), into)
    if rate >= limit then return false end
    return h <= ceil(limit - rate)
  end
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
  if s.pn then
    local a = limit - h + 1
    if a <= 0 then return rst end
    local pn, wus, sub = s.pn, s.wus, s.win
    local full = 0
    for y = sub - pn + 1, sub do full = full + precise_count(s, y) end
    local x
    local m = 0
    while true do
      local y = sub + m
      if m > 0 then full = full + precise_count(s, y) - precise_count(s, y - pn) end
      local c = precise_count(s, y - pn)
      if full < a and not (s.strict and full + c >= a) then
        local k = floor(y / pn)
        local j = y - k * pn
        local b0, b1 = ceil(j * wus / pn), ceil((j + 1) * wus / pn)
        local q = (a - full) / c
        if s.strict or c == 0 or q > 1 then
          if m == 0 then x = -1 else x = (k * wus + b0 - now) - 1 end
        else
          x = (k * wus + b1 - now) - q * (b1 - b0)
        end
        break
      end
      m = m + 1
    end
    return settle(s, limit, h, floor(x) + 1)
  end
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

-- A paced check of a sliding window (store.Check.Paced) counts against
-- its current window alone (of precision N: the sub-windows since the
-- window began): pbudget and pretry are budget and retry_after for a check
-- that may be paced (pc).
local function pbudget(s, limit, pc)
  if not pc or s.alg ~= ALG_SLIDING then return budget(s, limit) end
  local count = s.cur
  if s.pn then
    for i = 1, s.win - s.start / s.wus * s.pn do count = count + s.old[i] end
  end
  return max(0, limit - count)
end

local function pretry(s, limit, h, pc)
  if pc and s.alg == ALG_SLIDING then return reset(s) end
  return retry_after(s, limit, h)
end

local function refund(s, h)
  if s.alg == ALG_TOKEN_BUCKET then
    s.tokens = min(s.b, s.tokens + h)
  elseif s.alg == ALG_FIXED then
    s.count = max(0, s.count - h)
  elseif s.pn then
    s.cur = s.cur - h
    if s.cur < 0 then
      local deficit = -s.cur
      s.cur = 0
      local old = s.old
      for i = 1, s.pn do
        local take = min(deficit, old[i])
        old[i] = old[i] - take
        deficit = deficit - take
      end
    end
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

local reply
local function result(i, allowed, remaining, retry, rst)
  reply[i] = pack('<Bddd', allowed and 1 or 0, remaining, retry, rst)
end

local function touch(key)
  wrote[key] = req
  if not dirty[key] then
    dirty[key] = true
    dirty_keys[#dirty_keys + 1] = key
  end
end

-- The checks of the request being decided, by index in KEYS: parallel
-- arrays (a table per check would cost more than deciding it).
local C_ALG, C_LIMIT, C_W, C_BURST, C_HITS = {}, {}, {}, {}, {}
local C_REFUND, C_FORCE, C_SHADOW, C_PACED = {}, {}, {}, {}
local CONSUMED = {} -- the request's checks that consumed, by index in KEYS

-- deny notes s, the state of a denied check, for restore_ttl at the end
-- (the first state denied per key; a peek never writes).
local function deny(s)
  if peek then return end
  denied = denied or {}
  if not denied[s.key] then denied[s.key] = s end
end

-- check decides tentative check i (h hits, not a refund or forced
-- write-back) against s and answers it: consumed when its hits fit (the
-- journal records s first when the request keeps one), denied when they
-- do not; a check-only check (h == 0) is neither.
local function check(i, s, limit, h, pc)
  local r = pbudget(s, limit, pc)
  if h == 0 then
    if r >= 1 then
      result(i, true, r, 0, reset(s))
    else
      result(i, false, r, pretry(s, limit, 1, pc), reset(s))
      deny(s)
    end
    return false, false
  elseif h <= r then
    save(s)
    consume(s, h)
    -- An allowed check that leaves no budget reports, where a denial's
    -- retry goes, when one more hit would pass (Go's Result.NextHit).
    local nx = 0
    if h == r then nx = pretry(s, limit, 1, pc) end
    result(i, true, r - h, nx, reset(s))
    return true, false
  end
  result(i, false, r, pretry(s, limit, h, pc), reset(s))
  deny(s)
  return false, true
end

-- decide_one decides a request of one check that is neither a refund nor
-- a forced write-back, the usual request: no journal is needed, as it
-- consumes only when allowed.
local function decide_one(i, alg, limit, w, burst, h, pc)
  req = req + 1
  replaced = nil
  local key = K[i]
  if alg == ALG_TOKEN_BUCKET and limit == 0 then
    result(i, false, 0, w * US, 0)
    return
  end
  if check(i, load(key, alg, w, limit, burst), limit, h, pc) then touch(key) end
  if replaced and wrote[key] ~= req then states[key] = replaced[key] end
end

-- decide_request decides checks first..last, one request.
local function decide_request(first, last)
  req = req + 1
  replaced = nil
  -- Refunds and forced write-backs first; they always stand. A token
  -- bucket with limit 0 never refills: it denies everything (RetryAfter
  -- one window, Reset 0), a refund of it is allowed with Remaining 0, and
  -- neither reads nor writes state.
  local tentative = 0
  for i = first, last do
    if C_REFUND[i] or C_FORCE[i] then
      if C_ALG[i] == ALG_TOKEN_BUCKET and C_LIMIT[i] == 0 then
        result(i, true, 0, 0, 0)
      else
        local s = load(K[i], C_ALG[i], C_W[i], C_LIMIT[i], C_BURST[i])
        if C_REFUND[i] then refund(s, C_HITS[i]) else force(s, C_HITS[i]) end
        touch(K[i])
        result(i, true, budget(s, C_LIMIT[i]), 0, reset(s))
      end
    else
      tentative = tentative + 1
    end
  end
  -- Then the others in order, against the tentative state.
  in_tentative, journaling, jn = true, tentative > 1, 0
  local veto, nconsumed = false, 0
  for i = first, last do
    if not (C_REFUND[i] or C_FORCE[i]) then
      local limit, h = C_LIMIT[i], C_HITS[i]
      if C_ALG[i] == ALG_TOKEN_BUCKET and limit == 0 then
        if h > 0 and not C_SHADOW[i] then veto = true end
        result(i, false, 0, C_W[i] * US, 0)
      else
        local consumed, vetoes = check(i, load(K[i], C_ALG[i], C_W[i], limit, C_BURST[i]), limit, h, C_PACED[i])
        if consumed then
          nconsumed = nconsumed + 1
          CONSUMED[nconsumed] = i
        elseif vetoes and not C_SHADOW[i] then
          veto = true
        end
      end
    end
  end
  if veto then
    -- None of it: restore what the request changed or replaced.
    if nconsumed > 0 and not journaling then
      error('decide.lua: a request of one tentative check consumed and was vetoed')
    end
    undo()
  else
    for k = 1, nconsumed do touch(K[CONSUMED[k]]) end
    if replaced then
      for key, s in pairs(replaced) do
        if wrote[key] ~= req then states[key] = s end
      end
    end
  end
  in_tentative, journaling, jn = false, false, 0
end

-- unincr takes back h hits that a counter call (see the header) added to
-- key's stored value, whose reply was of form (its value mod 8), when the
-- value still holds them, and reports whether it did.
local function unincr(key, alg, h, form)
  local v = stored[key]
  local b1 = v and v:byte(1)
  local x = b1 and b1 <= DIGIT_9 and tonumber(v)
  if not x or not count_ok(x) or x ~= floor(x) then return false end
  local f = x % 8
  if alg == ALG_FIXED then
    if form < 4 or f ~= form then return false end
    x = max(f, x - 8 * h)
  else
    if form >= 4 or f >= 4 then return false end
    local c = floor(x / 8)
    local cur, prev = floor(c / COMPACT_COUNTS), c % COMPACT_COUNTS
    if f == form then
      cur = max(0, cur - h)
    elseif f == (form + 1) % 4 then
      prev = max(0, prev - h)
    else
      return false
    end
    x = (cur * COMPACT_COUNTS + prev) * 8 + f
  end
  stored[key] = format('%.0f', x)
  return true
end

-- unincr_all applies the undo flags of A's checks (see the header) to
-- the stored values and returns the keys it changed, or nil.
local function unincr_all(A)
  local keys, n = nil, 0
  for a = HEADER + 1, #A do
    local blob = A[a]
    for j = 0, #blob / CHECK_BYTES - 1 do
      n = n + 1
      local alg, fl, _, _, _, hits = sunpack('<BBdddd', blob, j * CHECK_BYTES + 1)
      if floor(fl / FLAG_UNDO) % 2 == 1 and unincr(K[n], alg, hits, floor(fl / 16) % 8) then
        keys = keys or {}
        keys[#keys + 1] = K[n]
      end
    end
  end
  return keys
end

-- decide_all decides a call of any shape: each request's checks decoded
-- and decided, in order, then every changed key written once.
local function decide_all(A)
  read_all()
  local undone = not peek and unincr_all(A)
  ttl_args, wrote, dirty, dirty_keys, reply, denied = {}, {}, {}, {}, {}, nil
  req, replaced, in_tentative, journaling, jn = 0, nil, false, false, 0
  local n = 0
  for a = HEADER + 1, #A do
    local blob = A[a]
    local m = #blob / CHECK_BYTES
    if m ~= floor(m) or n + m > #K then
      error('decide.lua: a request of ' .. #blob .. ' bytes after ' .. n .. ' of ' .. #K .. ' checks')
    end
    local first = n + 1
    local alone = false
    for j = 0, m - 1 do
      local alg, fl, limit, w, burst, hits = sunpack('<BBdddd', blob, j * CHECK_BYTES + 1)
      local pc = fl >= FLAG_PACED
      fl = fl % 8
      if alg ~= ALG_TOKEN_BUCKET and alg ~= ALG_FIXED then alg = ALG_SLIDING end -- unknown: sliding
      local rf, fo = IS_REFUND[fl], IS_FORCE[fl] and not IS_REFUND[fl]
      if peek then hits, rf, fo = 0, false, false end
      n = n + 1
      if m == 1 and not (rf or fo) then
        alone = true
        decide_one(n, alg, limit, w, burst, hits, pc)
      else
        C_ALG[n], C_LIMIT[n], C_W[n], C_BURST[n], C_HITS[n] = alg, limit, w, burst, hits
        C_REFUND[n], C_FORCE[n], C_SHADOW[n], C_PACED[n] = rf, fo, IS_SHADOW[fl], pc
      end
    end
    if m > 0 and not alone then decide_request(first, n) end
  end
  if n ~= #K then error('decide.lua: ' .. n .. ' checks for ' .. #K .. ' keys') end

  if not peek then
    if undone then
      for _, key in ipairs(undone) do
        if not dirty[key] and states[key] then
          dirty[key] = true
          dirty_keys[#dirty_keys + 1] = key
        end
      end
    end
    for _, key in ipairs(dirty_keys) do write(states[key]) end
    if denied then
      for key, s in pairs(denied) do
        if not dirty[key] and stored[key] then restore_ttl(s) end
      end
    end
  end
  return table.concat(reply)
end

-- decide_single decides the usual call: one request of one check that is
-- neither a refund nor a forced write-back (every check of a peek is
-- neither). It reads the key with one MGET (as decide_all, so a key
-- holding another type reads as absent), writes it at most once, and
-- builds no table but the state: no journal, no dirty set, no reply parts.
-- With form (the reply mod 8 of a counter call whose answer the Go store
-- could not trust, see the header; a window's roll, mostly), the counter
-- call's hits are taken back first (unincr), as decide_all would.
local function decide_single(key, alg, limit, w, burst, h, pc, form)
  if alg == ALG_TOKEN_BUCKET and limit == 0 then return pack('<Bddd', 0, 0, w * US, 0) end
  local v = redis.call('MGET', key)[1]
  local undone = false
  if form then -- the undo flag: take the counter call's hits back first
    stored = { [key] = v }
    undone = unincr(key, alg, h, form)
    v = stored[key]
  end
  local s = build(key, alg, w, limit, burst, precision(alg, burst), v, 0)
  local r = pbudget(s, limit, pc)
  if h == 0 then
    if r >= 1 then return pack('<Bddd', 1, r, 0, reset(s)) end
    h = 1 -- denied: the retry time of one hit
  elseif h <= r then
    consume(s, h)
    local rst = reset(s)
    local nx = 0
    if h == r then nx = pretry(s, limit, 1, pc) end -- as check's
    ttl_args = nil
    write(s)
    return pack('<Bddd', 1, r - h, nx, rst)
  end
  local out = pack('<Bddd', 0, r, pretry(s, limit, h, pc), reset(s))
  if undone then -- the value changed: written, denied or not, as decide_all does
    ttl_args = nil
    write(s)
  elseif v and not peek then
    ttl_args = nil
    restore_ttl(s)
  end
  return out
end

-- rls_decide is the entry point: FCALL's function, and the script's last
-- line. keys and args are KEYS and ARGV (see the header).
local function rls_decide(keys, args)
  if not floor then bind() end
  K = keys
  local clock = args[1]
  if clock ~= '' then
    now = tonumber(clock)
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * US + tonumber(t[2])
  end
  peek = args[2] == MODE_PEEK
  compact = clock == ''
  if #keys == 1 and #args == HEADER + 1 and #args[HEADER + 1] == CHECK_BYTES then
    local alg, fl, limit, w, burst, hits = sunpack('<BBdddd', args[HEADER + 1])
    local pc = fl >= FLAG_PACED
    if pc then fl = fl - FLAG_PACED end
    if fl >= FLAG_UNDO and not peek then
      local base = fl % 8
      if alg ~= ALG_TOKEN_BUCKET and hits > 0 and not (IS_REFUND[base] or IS_FORCE[base]) then
        if alg ~= ALG_FIXED then alg = ALG_SLIDING end -- unknown: sliding
        return decide_single(keys[1], alg, limit, w, burst, hits, pc, floor(fl / 16) % 8)
      end
      return decide_all(args)
    end
    fl = fl % 8
    if alg ~= ALG_TOKEN_BUCKET and alg ~= ALG_FIXED then alg = ALG_SLIDING end -- unknown: sliding
    if peek then return decide_single(keys[1], alg, limit, w, burst, 0, pc) end
    if not (IS_REFUND[fl] or IS_FORCE[fl]) then return decide_single(keys[1], alg, limit, w, burst, hits, pc) end
  end
  return decide_all(args)
end

return rls_decide(KEYS, ARGV)
