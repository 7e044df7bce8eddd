-- decide.lua: decide one rate-limit request atomically on one shard.
--
-- The arithmetic is pkg/store/store.go's, bit for bit: every fractional
-- step is an IEEE-754 double operation in the order written there. The
-- numbers are named once, in the `local` lines below, and lua_test.go holds
-- them to lua/lua.go's constants.
--
-- KEYS     the checks' keys, in order: a fixed window's its window's key, a
--          sliding window of precision 0 or 1 its window's and, unless the
--          check gives its count, the previous window's (lua.WindowKey: its
--          key, ':', the window's start in seconds, as the Go store's plain
--          commands name them), any other check its own key. Every key a
--          call touches is declared, so a Redis Cluster slot being migrated
--          answers ASK or TRYAGAIN.
-- ARGV[1]  now in microseconds, or "" for Redis's TIME (only the Go store's
--          test clock sets it).
-- ARGV[2]  "0" decide; "1" peek: every check is check-only, nothing written.
-- ARGV[3]  the checks, CHECK_BYTES each: algorithm (byte: 0 sliding window,
--          1 token bucket, 2 fixed window; any other acts as 0), flags
--          (byte: 1 refund, 2 shadow, 4 force, 8 paced), then doubles:
--          limit, window seconds, burst (token bucket: capacity, 0 = limit;
--          sliding window: precision, negated when strict), hits, want,
--          horizon in microseconds, the window's start in seconds (the
--          window its keys name; a call of another window than now's
--          replies 'W' and now as a double instead, to be sent again), the
--          previous window's count (two-counter sliding window; -1: read
--          its key; given, a refund that reaches it cannot lower it).
-- Reply: RESULT_BYTES per check: allowed (byte), then doubles: remaining,
--          retry_us, reset_us, lease hits, lease now, lease from_us, lease
--          every_us.
--
-- All or nothing (docs/arithmetic.md): refunds and forced write-backs
-- first, always written; then the other checks in order against the
-- tentative state; a denied consuming non-shadow check keeps all their
-- consumption from being written. Values: a window key holds a decimal
-- count; a token bucket 't' and doubles tokens, last refill; a precision-N
-- window 'p' and doubles N, sub-window, its count, the N counts before it;
-- anything else (a negative, NaN or infinite number too) reads as fresh.
-- Every write sets its key's TTL (a window key's: while its window counts,
-- and MARGIN_US more); a denied check gives a state key without TTL the TTL
-- a write would, so a value rls did not write cannot deny it for ever.
--
-- As a script (EVAL/EVALSHA) it runs whole on every call; as a Function
-- library (lua/library.go drops the first and last lines of code) its top
-- level runs once and touches no global: bind() takes the libraries.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local HEADER, CHECK_BYTES, RESULT_BYTES = 2, 66, 57
local MODE_PEEK = '1'
local ALG_SLIDING, ALG_TOKEN_BUCKET, ALG_FIXED = 0, 1, 2
local FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE, FLAG_PACED = 1, 2, 4, 8
local TAG_TOKEN_BUCKET, TAG_PRECISE = 't', 'p'
local MAX_PRECISION = 60
local MARGIN_US = 1000000
local US = 1000000
local INF = 1 / 0

local floor, ceil, min, max, pack, sunpack, format
local BYTE_TOKEN_BUCKET, BYTE_PRECISE
local function bind()
  floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
  pack, sunpack, format = struct.pack, struct.unpack, string.format
  BYTE_TOKEN_BUCKET, BYTE_PRECISE = TAG_TOKEN_BUCKET:byte(), TAG_PRECISE:byte()
end

local now, peek -- the call's clock (microseconds) and mode

local function count_ok(x) return x >= 0 and x < INF end
local function finite(x) return x > -INF and x < INF end
local function bit(fl, b) return floor(fl / b) % 2 == 1 end

-- read returns a window key's count: 0 when absent or not a count.
local function read(key)
  local x = tonumber(redis.call('GET', key) or '')
  if x and count_ok(x) then return x, true end
  return 0, false
end

local precise_formats = {}
local function precise_format(n)
  local f = precise_formats[n]
  if not f then
    f = '<Bddd' .. string.rep('d', n)
    precise_formats[n] = f
  end
  return f
end

-- load_precise returns precision-pn state s moved to now's sub-window.
local function load_precise(s, pn)
  local sub = s.start / s.wus * pn + floor((now - s.start) * pn / s.wus)
  local old, cur, win = {}, 0, sub
  local v = redis.call('GET', s.key)
  s.found = v and true
  if v and #v == 25 + 8 * pn and v:byte(1) == BYTE_PRECISE then
    local t = { sunpack(precise_format(pn), v) }
    if t[2] == pn and finite(t[3]) and count_ok(t[4]) then
      win, cur = t[3], t[4]
      for i = 1, pn do
        if not count_ok(t[4 + i]) then
          old = {}
          break
        end
        old[i] = t[4 + i]
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
        if src == 0 then old[i] = cur elseif src > 0 then old[i] = old[src] else old[i] = 0 end
      end
    end
    cur = 0
  end
  s.pn, s.win, s.cur, s.old = pn, sub, cur, old
end

-- load returns the state of check i's key, read once per call.
local states
local function load(key, pkey, pv, alg, w, limit, burst)
  local s = states[key]
  if s then return s end
  local wus = w * US
  local start = floor(now / wus) * wus
  s = { key = key, alg = alg, w = w, wus = wus, start = start }
  if alg == ALG_TOKEN_BUCKET then
    local b = burst
    if b == 0 then b = limit end
    s.b, s.r = b, limit / wus
    local v = redis.call('GET', key)
    s.found = v and true
    local tokens, last = b, now
    if v and #v == 17 and v:byte(1) == BYTE_TOKEN_BUCKET then
      local _, t, l = sunpack('<Bdd', v)
      if count_ok(t) and finite(l) then tokens, last = t, l end
    end
    s.tokens, s.last = min(b, tokens + (now - last) * s.r), now
  elseif alg == ALG_SLIDING and burst ~= 0 and burst ~= 1 and burst ~= -1 then
    local pn = burst
    if pn < 0 then pn = -pn end
    if pn > MAX_PRECISION or pn ~= floor(pn) then
      error('decide.lua: precision ' .. pn .. ' is not a whole number in [2, ' .. MAX_PRECISION .. ']')
    end
    s.strict = burst < 0
    load_precise(s, pn)
  else
    s.ckey, s.pkey = key, pkey
    s.cur, s.found = read(key)
    s.prev = 0
    if pkey then s.prev = read(pkey) elseif alg == ALG_SLIDING and count_ok(pv) then s.prev = pv end
  end
  states[key] = s
  return s
end

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
    return max(0, limit - s.cur)
  end
  local rate
  if s.pn then
    rate = precise_rate(s, s.win, now - s.start)
  else
    rate = s.prev * (1 - (now - s.start) / s.wus) + s.cur
  end
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
  local rate
  if s.pn then
    local t = now + ra
    local k = floor(t / s.wus)
    local into = t - k * s.wus
    rate = precise_rate(s, k * s.pn + floor(into * s.pn / s.wus), into)
  else
    local into = now - s.start + ra
    local prev, cur = s.prev, s.cur
    if into >= 2 * s.wus then
      prev, cur = 0, 0
    elseif into >= s.wus then
      prev, cur, into = cur, 0, into - s.wus
    end
    rate = prev * (1 - into / s.wus) + cur
  end
  if rate >= limit then return false end
  return h <= ceil(limit - rate)
end

-- settle makes a retry time computed in floating point at least 1 us, and
-- later by a few microseconds at most while h would still not pass.
local function settle(s, limit, h, ra)
  if ra < 1 then ra = 1 end
  for _ = 1, 4 do
    if passes_at(s, limit, h, ra) then return ra end
    ra = ra + 1
  end
  return ra
end

-- retry_after returns the microseconds until h >= 1 hits would pass with
-- no other traffic.
local function retry_after(s, limit, h)
  if s.alg == ALG_TOKEN_BUCKET then
    if h <= s.b then return settle(s, limit, h, floor((h - s.tokens) / s.r) + 1) end
    return floor(s.b / s.r) + 1
  elseif s.alg == ALG_FIXED then
    return reset(s)
  end
  local into = now - s.start
  local rst = s.wus - into
  local x
  if s.pn then
    local a = limit - h + 1
    if a <= 0 then return rst end
    local pn, wus, sub = s.pn, s.wus, s.win
    local full = 0
    for y = sub - pn + 1, sub do full = full + precise_count(s, y) end
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
  else
    local a = limit - s.cur - h + 1
    if a > 0 and s.prev > 0 then
      x = (1 - a / s.prev) * s.wus - into
    else
      local a2 = limit - h + 1
      if a2 <= 0 then return rst end
      if s.cur < a2 then x = rst - 1 else x = rst + (1 - a2 / s.cur) * s.wus end
    end
  end
  return settle(s, limit, h, floor(x) + 1)
end

-- own returns a paced check's budget: the current window's own count's
-- (precision N: of the window's sub-windows so far).
local function own(s, limit)
  local count = s.cur
  if s.pn then
    for i = 1, s.win - s.start / s.wus * s.pn do count = count + s.old[i] end
  end
  return max(0, limit - count)
end

local function add(s, h)
  if s.alg == ALG_TOKEN_BUCKET then s.tokens = s.tokens - h else s.cur = s.cur + h end
end

local function refund(s, h)
  if s.alg == ALG_TOKEN_BUCKET then
    s.tokens = min(s.b, s.tokens + h)
  elseif s.alg == ALG_FIXED then
    s.cur = max(0, s.cur - h)
  elseif s.pn then
    s.cur = s.cur - h
    if s.cur < 0 then
      local deficit = -s.cur
      s.cur = 0
      for i = 1, s.pn do
        local take = min(deficit, s.old[i])
        s.old[i] = s.old[i] - take
        deficit = deficit - take
      end
    end
  else
    s.cur = s.cur - h
    if s.cur < 0 then
      s.prev = max(0, s.prev + s.cur)
      s.cur = 0
      s.prev_dirty = true
    end
  end
end

-- lease returns the lease of up to want hits after a check left budget r
-- (pkg/store's Leases and SlidingLease): hits, now, from_us, every_us.
local function lease(s, limit, r, want, horizon)
  local n = min(want, r)
  if n == want or horizon <= 0 or s.pn or s.alg ~= ALG_SLIDING or s.prev <= 0 then return n, n, 0, 0 end
  local owned = max(0, limit - s.cur)
  if r >= owned then return n, n, 0, 0 end
  s.cur = s.cur + r
  local from = retry_after(s, limit, 1)
  s.cur = s.cur - r
  local every = floor((s.wus + s.prev - 1) / s.prev)
  local last = min(horizon, s.wus - (now - s.start) - 1)
  if from > last then return n, n, 0, 0 end
  local m = min(owned - r, want - n, floor((last - from) / every) + 1)
  return n + m, n, from, every
end

-- snapshot and restore keep a state's counts from before the request's
-- tentative checks, for a vetoed request.
local function snapshot(s)
  local old = s.old
  if old then old = { unpack(old) } end
  return { s.cur, s.tokens, old }
end

local function restore(s, t)
  s.cur, s.tokens = t[1], t[2]
  if t[3] then s.old = t[3] end
end

-- ttl_ms returns the TTL of key k of s in whole milliseconds, or nil for a
-- key whose time has passed.
local function ttl_ms(s, k)
  local until_us
  if s.alg == ALG_TOKEN_BUCKET then
    -- A bucket refilling over centuries would pass PX's range: 2^53 ms is
    -- "never" enough.
    return min(ceil((ceil(s.b / s.r) + US) / 1000), 9007199254740992)
  elseif s.pn then
    return 2 * s.w * 1000
  elseif s.alg == ALG_FIXED then
    until_us = s.start + s.wus
  elseif k == s.pkey then
    until_us = s.start + s.wus
  else
    until_us = s.start + 2 * s.wus
  end
  return ceil((until_us + MARGIN_US - now) / 1000)
end

local function set(s, k, v)
  redis.call('SET', k, v, 'PX', format('%.0f', ttl_ms(s, k)))
end

local function write(s)
  if s.alg == ALG_TOKEN_BUCKET then
    set(s, s.key, pack('<Bdd', BYTE_TOKEN_BUCKET, s.tokens, s.last))
  elseif s.pn then
    set(s, s.key, pack(precise_format(s.pn), BYTE_PRECISE, s.pn, s.win, s.cur, unpack(s.old)))
  else
    set(s, s.ckey, format('%.0f', s.cur))
    if s.prev_dirty and s.pkey then set(s, s.pkey, format('%.0f', s.prev)) end
  end
end

-- restore_ttl gives a state key a denied check found its TTL back when it
-- has none (a window key's name moves on with its window).
local function restore_ttl(s)
  if not s.ckey and s.found and redis.call('PTTL', s.key) == -1 then
    redis.call('PEXPIRE', s.key, format('%.0f', ttl_ms(s, s.key)))
  end
end

local function rls_decide(keys, args)
  if not floor then bind() end
  if args[1] ~= '' then
    now = tonumber(args[1])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * US + tonumber(t[2])
  end
  peek = args[2] == MODE_PEEK
  local blob = args[HEADER + 1]
  local n = #blob / CHECK_BYTES
  if n ~= floor(n) then error('decide.lua: ' .. #blob .. ' bytes of checks') end
  states = {}
  local C, S = {}, {}
  local ki = 1
  for i = 1, n do
    local alg, fl, limit, w, burst, hits, want, horizon, ws, pv = sunpack('<BBdddddddd', blob, (i - 1) * CHECK_BYTES + 1)
    if alg ~= ALG_TOKEN_BUCKET and alg ~= ALG_FIXED then alg = ALG_SLIDING end
    local key, pkey = keys[ki], nil
    ki = ki + 1
    if alg == ALG_FIXED or (alg == ALG_SLIDING and burst >= -1 and burst <= 1) then
      if ws * US ~= floor(now / (w * US)) * w * US then return 'W' .. pack('<d', now) end
      if alg == ALG_SLIDING and pv < 0 then
        pkey = keys[ki]
        ki = ki + 1
      end
    end
    if ki - 1 > #keys then error('decide.lua: ' .. #keys .. ' keys for ' .. n .. ' checks') end
    local c = { alg = alg, limit = limit, w = w, hits = hits, want = want, horizon = horizon,
      refund = bit(fl, FLAG_REFUND), shadow = bit(fl, FLAG_SHADOW), force = bit(fl, FLAG_FORCE), paced = bit(fl, FLAG_PACED) }
    if peek then c.hits, c.refund, c.force = 0, false, false end
    c.write = c.refund or c.force
    C[i] = c
    -- A token bucket with limit 0 never refills: it denies everything and
    -- neither reads nor writes state.
    if not (alg == ALG_TOKEN_BUCKET and limit == 0) then S[i] = load(key, pkey, pv, alg, w, limit, burst) end
  end
  if ki ~= #keys + 1 then error('decide.lua: ' .. #keys .. ' keys for ' .. n .. ' checks') end
  local out, wrote = {}, {}
  -- Refunds and forced write-backs first.
  for i = 1, n do
    local c, s = C[i], S[i]
    if c.write then
      if s then
        if c.refund then refund(s, c.hits) elseif s.alg == ALG_TOKEN_BUCKET then s.tokens = max(0, s.tokens - c.hits) else add(s, c.hits) end
        wrote[s] = true
        out[i] = { true, budget(s, c.limit), 0, reset(s) }
      else
        out[i] = { true, 0, 0, 0 }
      end
    end
  end
  local base = {}
  for _, s in pairs(states) do base[s] = snapshot(s) end
  -- Then the others, in order, against the tentative state. The request's
  -- only consuming check may lease when denied (pkg/store's Leases).
  local consuming = 0
  for i = 1, n do
    if not C[i].write and C[i].hits > 0 then consuming = consuming + 1 end
  end
  local veto, consumed, found, leased = false, {}, {}, {}
  for i = 1, n do
    local c, s = C[i], S[i]
    if not c.write then
      local h, limit = c.hits, c.limit
      if not s then
        out[i] = { false, 0, c.w * US, 0 }
        if h > 0 and not c.shadow then veto = true end
      else
        local pc = c.paced and s.alg == ALG_SLIDING
        local r
        if pc then r = own(s, limit) else r = budget(s, limit) end
        if h == 0 then
          if r >= 1 then
            out[i] = { true, r, 0, reset(s) }
          else
            local ra
            if pc then ra = reset(s) else ra = retry_after(s, limit, 1) end
            out[i] = { false, r, ra, reset(s) }
            found[#found + 1] = s
          end
        elseif h <= r then
          add(s, h)
          local lh, ln, lf, le = 0, 0, 0, 0
          if c.want > 0 and not c.shadow and not pc then
            lh, ln, lf, le = lease(s, limit, r - h, c.want, c.horizon)
            add(s, lh)
          end
          local rem = r - h - lh
          if s.alg == ALG_SLIDING and not s.pn and not pc then rem = budget(s, limit) end
          out[i] = { true, rem, 0, reset(s), lh, ln, lf, le, found = r }
          consumed[s] = true
        else
          local ra
          if pc then ra = reset(s) else ra = retry_after(s, limit, h) end
          out[i] = { false, r, ra, reset(s) }
          if consuming == 1 and c.want > 0 and c.horizon > 0 and not c.shadow and not pc and s.alg == ALG_SLIDING and not s.pn then
            local lh, ln, lf, le = lease(s, limit, r, c.want, c.horizon)
            if lh > 0 then
              add(s, lh)
              out[i] = { false, r, ra, reset(s), lh, ln, lf, le }
              leased[s] = true
            end
          end
          if not leased[s] then found[#found + 1] = s end
          if not c.shadow then veto = true end
        end
      end
    end
  end
  if veto then
    for s, t in pairs(base) do
      if not leased[s] then restore(s, t) end
    end
    for i = 1, n do
      local o = out[i]
      if o.found then o[2], o[5], o[6], o[7], o[8] = o.found, 0, 0, 0, 0 end
    end
  end
  if not peek then
    for _, s in pairs(states) do
      if wrote[s] or leased[s] or (consumed[s] and not veto) then write(s) end
    end
    for _, s in ipairs(found) do
      if not (wrote[s] or (consumed[s] and not veto)) then restore_ttl(s) end
    end
  end
  local reply = {}
  for i = 1, n do
    local o = out[i]
    reply[i] = pack('<Bddddddd', o[1] and 1 or 0, o[2], o[3], o[4], o[5] or 0, o[6] or 0, o[7] or 0, o[8] or 0)
  end
  return table.concat(reply)
end

return rls_decide(KEYS, ARGV)
