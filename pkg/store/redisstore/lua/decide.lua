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
--          (byte: 1 refund, 2 shadow, 4 force, 8 paced, 16 strict),
--          precision (byte: a sliding window's sub-windows, 0 or 1 for the
--          two-counter window), then doubles: limit, window seconds, burst
--          (token bucket: capacity, 0 = limit), hits, want, horizon in
--          microseconds, the window's start in seconds (the window its keys
--          name; a call of another window than now's replies 'W' and now
--          as a double instead, to be sent again), the previous window's
--          count (two-counter sliding window; -1: read its key; given, a
--          refund that reaches it cannot lower it).
-- Reply: RESULT_BYTES per check: allowed (byte), then doubles: remaining,
--          retry_us, reset_us, lease hits, lease now, lease from_us, lease
--          every_us.
--
-- All or nothing (docs/redis.md, invariant 5). Values: a window key holds a
-- decimal count; a token bucket 't' and doubles tokens, last refill; a
-- precision-N window 'p' and doubles N, sub-window, its count, the N counts
-- before it; anything else (a negative, NaN or infinite number too) reads
-- as fresh. Every write sets its key's TTL (invariants 1 and 7).
--
-- As a Function library (lua/library.go) its top level runs once and may
-- touch no global: bind() takes the libraries on the first call. A call's
-- state lives in its own tables; the file-level names are constants.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local HEADER, CHECK_BYTES, RESULT_BYTES = 2, 67, 57
local MODE_PEEK = '1'
local ALG_SLIDING, ALG_TOKEN_BUCKET, ALG_FIXED = 0, 1, 2
local FLAG_REFUND, FLAG_SHADOW, FLAG_FORCE, FLAG_PACED, FLAG_STRICT = 1, 2, 4, 8, 16
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

local function count_ok(x) return x >= 0 and x < INF end
local function finite(x) return x > -INF and x < INF end
local function bit(fl, b) return floor(fl / b) % 2 == 1 end

-- read returns a window key's count: 0 when absent or not a count.
local function read(key)
  local x = tonumber(redis.call('GET', key) or '')
  if x and count_ok(x) then return x, true end
  return 0, false
end

local function set(s, k, v)
  redis.call('SET', k, v, 'PX', format('%.0f', s.m.ttl_ms(s, k)))
end

-- window_reset returns the microseconds until s's window ends.
local function window_reset(s) return s.wus - (s.now - s.start) end

-- headroom returns how many single hits pass under limit at rate.
local function headroom(limit, rate)
  if rate < limit then return ceil(limit - rate) end
  return 0
end

-- passes returns whether h hits pass under limit at rate.
local function passes(limit, rate, h)
  if rate >= limit then return false end
  return h <= ceil(limit - rate)
end

-- settle makes a retry time computed in floating point at least 1 us, and
-- later by a few microseconds at most while h would still not pass.
local function settle(s, limit, h, ra)
  if ra < 1 then ra = 1 end
  for _ = 1, 4 do
    if s.m.passes_at(s, limit, h, ra) then return ra end
    ra = ra + 1
  end
  return ra
end

-- Each algorithm is a table of the same functions of a state s (one key's,
-- read once per call): load, budget (single hits that pass now), reset (us
-- until the window ends or the bucket is full), passes_at (whether h hits
-- pass ra us from now with no other traffic), retry_after (us until h hits
-- pass), own (a paced check's budget; sliding windows only), add, force,
-- refund, ttl_ms (a key's TTL, whole ms) and write.

local function add_count(s, h) s.cur = s.cur + h end

local BUCKET = {}
function BUCKET.load(s, c)
  local b = c.burst
  if b == 0 then b = c.limit end
  s.b, s.r = b, c.limit / s.wus
  local v = redis.call('GET', s.key)
  s.found = v and true
  local tokens, last = b, s.now
  if v and #v == 17 and v:byte(1) == BYTE_TOKEN_BUCKET then
    local _, t, l = sunpack('<Bdd', v)
    if count_ok(t) and finite(l) then tokens, last = t, l end
  end
  s.tokens, s.last = min(b, tokens + (s.now - last) * s.r), s.now
end
function BUCKET.budget(s) return max(0, floor(s.tokens)) end
function BUCKET.reset(s)
  if s.tokens < s.b then return floor((s.b - s.tokens) / s.r) + 1 end
  return 0
end
function BUCKET.passes_at(s, _, h, ra) return min(s.b, s.tokens + ra * s.r) >= h end
function BUCKET.retry_after(s, limit, h)
  if h <= s.b then return settle(s, limit, h, floor((h - s.tokens) / s.r) + 1) end
  return floor(s.b / s.r) + 1
end
function BUCKET.add(s, h) s.tokens = s.tokens - h end
function BUCKET.force(s, h) s.tokens = max(0, s.tokens - h) end
function BUCKET.refund(s, h) s.tokens = min(s.b, s.tokens + h) end
function BUCKET.ttl_ms(s)
  -- A bucket refilling over centuries would pass PX's range: 2^53 ms is
  -- "never" enough.
  return min(ceil((ceil(s.b / s.r) + US) / 1000), 9007199254740992)
end
function BUCKET.write(s) set(s, s.key, pack('<Bdd', BYTE_TOKEN_BUCKET, s.tokens, s.last)) end

local FIXED = { windowed = true, reset = window_reset, add = add_count, force = add_count }
function FIXED.load(s)
  s.cur, s.found = read(s.key)
end
function FIXED.budget(s, limit) return max(0, limit - s.cur) end
FIXED.retry_after = window_reset
function FIXED.refund(s, h) s.cur = max(0, s.cur - h) end
function FIXED.ttl_ms(s) return ceil((s.start + s.wus + MARGIN_US - s.now) / 1000) end
function FIXED.write(s) set(s, s.key, format('%.0f', s.cur)) end

-- SLIDING is the two-counter window: its window's count and the previous
-- window's, weighted by the part of it still in the window.
local SLIDING = { windowed = true, reset = window_reset, add = add_count, force = add_count }
function SLIDING.load(s, _, pkey, pv)
  s.pkey = pkey
  s.cur, s.found = read(s.key)
  s.prev = 0
  if pkey then s.prev = read(pkey) elseif count_ok(pv) then s.prev = pv end
end
function SLIDING.budget(s, limit)
  return headroom(limit, s.prev * (1 - (s.now - s.start) / s.wus) + s.cur)
end
function SLIDING.passes_at(s, limit, h, ra)
  local into = s.now - s.start + ra
  local prev, cur = s.prev, s.cur
  if into >= 2 * s.wus then
    prev, cur = 0, 0
  elseif into >= s.wus then
    prev, cur, into = cur, 0, into - s.wus
  end
  return passes(limit, prev * (1 - into / s.wus) + cur, h)
end
function SLIDING.retry_after(s, limit, h)
  local into = s.now - s.start
  local rst = s.wus - into
  local x
  local a = limit - s.cur - h + 1
  if a > 0 and s.prev > 0 then
    x = (1 - a / s.prev) * s.wus - into
  else
    local a2 = limit - h + 1
    if a2 <= 0 then return rst end
    if s.cur < a2 then x = rst - 1 else x = rst + (1 - a2 / s.cur) * s.wus end
  end
  return settle(s, limit, h, floor(x) + 1)
end
function SLIDING.own(s, limit) return max(0, limit - s.cur) end
function SLIDING.refund(s, h)
  s.cur = s.cur - h
  if s.cur < 0 then
    s.prev = max(0, s.prev + s.cur)
    s.cur = 0
    s.prev_dirty = true
  end
end
function SLIDING.ttl_ms(s, k)
  local until_us = s.start + 2 * s.wus
  if k == s.pkey then until_us = s.start + s.wus end
  return ceil((until_us + MARGIN_US - s.now) / 1000)
end
function SLIDING.write(s)
  set(s, s.key, format('%.0f', s.cur))
  if s.prev_dirty and s.pkey then set(s, s.pkey, format('%.0f', s.prev)) end
end

-- PRECISE is the window of pn sub-windows: the current one's count (cur,
-- of sub-window win) and the pn before it (old[1] the latest).
local PRECISE = { reset = window_reset, add = add_count, force = add_count }
local precise_formats = {} -- struct formats by pn: the same in every call
local function precise_format(n)
  local f = precise_formats[n]
  if not f then
    f = '<Bddd' .. string.rep('d', n)
    precise_formats[n] = f
  end
  return f
end

-- load_counts returns the counts stored for s, or nil when none are valid.
local function load_counts(s, pn)
  local v = redis.call('GET', s.key)
  s.found = v and true
  if not (v and #v == 25 + 8 * pn and v:byte(1) == BYTE_PRECISE) then return nil end
  local t = { sunpack(precise_format(pn), v) }
  if t[2] ~= pn or not finite(t[3]) or not count_ok(t[4]) then return nil end
  local old = {}
  for i = 1, pn do
    if not count_ok(t[4 + i]) then return nil end
    old[i] = t[4 + i]
  end
  return t[3], t[4], old
end

-- PRECISE.load reads s and moves it to now's sub-window.
function PRECISE.load(s, c)
  local pn = c.precision
  if pn > MAX_PRECISION then
    error('decide.lua: precision ' .. pn .. ' is not a whole number in [2, ' .. MAX_PRECISION .. ']')
  end
  s.strict = c.strict
  local sub = s.start / s.wus * pn + floor((s.now - s.start) * pn / s.wus)
  local win, cur, old = load_counts(s, pn)
  if not win then
    old = {}
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

function PRECISE.budget(s, limit) return headroom(limit, precise_rate(s, s.win, s.now - s.start)) end
function PRECISE.passes_at(s, limit, h, ra)
  local t = s.now + ra
  local k = floor(t / s.wus)
  local into = t - k * s.wus
  return passes(limit, precise_rate(s, k * s.pn + floor(into * s.pn / s.wus), into), h)
end
function PRECISE.retry_after(s, limit, h)
  local a = limit - h + 1
  if a <= 0 then return window_reset(s) end
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
      local x
      if s.strict or c == 0 or q > 1 then
        if m == 0 then x = -1 else x = (k * wus + b0 - s.now) - 1 end
      else
        x = (k * wus + b1 - s.now) - q * (b1 - b0)
      end
      return settle(s, limit, h, floor(x) + 1)
    end
    m = m + 1
  end
end
-- PRECISE.own counts the window's sub-windows so far.
function PRECISE.own(s, limit)
  local count = s.cur
  for i = 1, s.win - s.start / s.wus * s.pn do count = count + s.old[i] end
  return max(0, limit - count)
end
function PRECISE.refund(s, h)
  s.cur = s.cur - h
  if s.cur >= 0 then return end
  local deficit = -s.cur
  s.cur = 0
  for i = 1, s.pn do
    local take = min(deficit, s.old[i])
    s.old[i] = s.old[i] - take
    deficit = deficit - take
  end
end
function PRECISE.ttl_ms(s) return 2 * s.w * 1000 end
function PRECISE.write(s)
  set(s, s.key, pack(precise_format(s.pn), BYTE_PRECISE, s.pn, s.win, s.cur, unpack(s.old)))
end

-- algorithm returns the table of a check's algorithm code and precision.
local function algorithm(alg, pn)
  if alg == ALG_TOKEN_BUCKET then return BUCKET end
  if alg == ALG_FIXED then return FIXED end
  if pn >= 2 then return PRECISE end
  return SLIDING
end

-- lease returns the lease of up to want hits after a check left budget r
-- (pkg/store's Leases and SlidingLease): hits, now, from_us, every_us.
local function lease(s, limit, r, want, horizon)
  local n = min(want, r)
  if n == want or horizon <= 0 or s.m ~= SLIDING or s.prev <= 0 then return n, n, 0, 0 end
  local owned = max(0, limit - s.cur)
  if r >= owned then return n, n, 0, 0 end
  s.cur = s.cur + r
  local from = SLIDING.retry_after(s, limit, 1)
  s.cur = s.cur - r
  local every = floor((s.wus + s.prev - 1) / s.prev)
  local last = min(horizon, s.wus - (s.now - s.start) - 1)
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

-- restore_ttl gives a state key a denied check found its TTL back when it
-- has none (a window key's name moves on with its window).
local function restore_ttl(s)
  if not s.m.windowed and s.found and redis.call('PTTL', s.key) == -1 then
    redis.call('PEXPIRE', s.key, format('%.0f', s.m.ttl_ms(s, s.key)))
  end
end

-- parse reads the call's checks into call.checks and their states into
-- call.states (nil for a token bucket of limit 0, which never refills:
-- it denies everything and neither reads nor writes). It returns false
-- when a check names another window than now's.
local function parse(call, keys, blob)
  local n = #blob / CHECK_BYTES
  if n ~= floor(n) then error('decide.lua: ' .. #blob .. ' bytes of checks') end
  local byKey, ki = {}, 1
  for i = 1, n do
    local alg, fl, pn, limit, w, burst, hits, want, horizon, ws, pv =
      sunpack('<BBBdddddddd', blob, (i - 1) * CHECK_BYTES + 1)
    local m = algorithm(alg, pn)
    local key, pkey = keys[ki], nil
    ki = ki + 1
    if m.windowed then
      if ws * US ~= floor(call.now / (w * US)) * w * US then return false end
      if m == SLIDING and pv < 0 then
        pkey = keys[ki]
        ki = ki + 1
      end
    end
    if ki - 1 > #keys then error('decide.lua: ' .. #keys .. ' keys for ' .. n .. ' checks') end
    local c = { limit = limit, w = w, burst = burst, precision = pn, hits = hits, want = want, horizon = horizon,
      refund = bit(fl, FLAG_REFUND), shadow = bit(fl, FLAG_SHADOW), force = bit(fl, FLAG_FORCE),
      paced = bit(fl, FLAG_PACED), strict = bit(fl, FLAG_STRICT) }
    if call.peek then c.hits, c.refund, c.force = 0, false, false end
    c.write = c.refund or c.force
    call.checks[i] = c
    if not (m == BUCKET and limit == 0) then
      local s = byKey[key]
      if not s then
        local wus = w * US
        s = { key = key, m = m, now = call.now, w = w, wus = wus, start = floor(call.now / wus) * wus }
        m.load(s, c, pkey, pv)
        byKey[key] = s
      end
      call.states[i] = s
    end
  end
  if ki ~= #keys + 1 then error('decide.lua: ' .. #keys .. ' keys for ' .. n .. ' checks') end
  call.byKey = byKey
  return true
end

-- write_first applies the refunds and forced write-backs, always written.
local function write_first(call)
  for i, c in ipairs(call.checks) do
    local s = call.states[i]
    if c.write then
      if s then
        if c.refund then s.m.refund(s, c.hits) else s.m.force(s, c.hits) end
        call.wrote[s] = true
        call.out[i] = { true, s.m.budget(s, c.limit), 0, s.m.reset(s) }
      else
        call.out[i] = { true, 0, 0, 0 }
      end
    end
  end
end

-- admit consumes check c's h hits, which fit its budget r, and leases what
-- it may beside them.
local function admit(call, i, c, s, r, pc)
  local h, limit = c.hits, c.limit
  s.m.add(s, h)
  local lh, ln, lf, le = 0, 0, 0, 0
  if c.want > 0 and not c.shadow and not pc then
    lh, ln, lf, le = lease(s, limit, r - h, c.want, c.horizon)
    s.m.add(s, lh)
  end
  local rem = r - h - lh
  if s.m == SLIDING and not pc then rem = s.m.budget(s, limit) end
  call.out[i] = { true, rem, 0, s.m.reset(s), lh, ln, lf, le, found = r }
  call.consumed[s] = true
end

-- deny answers check c, whose h hits exceed its budget r; the request's
-- only consuming check may still lease (pkg/store's Leases).
local function deny(call, i, c, s, r, pc)
  local h, limit = c.hits, c.limit
  local ra
  if pc then ra = s.m.reset(s) else ra = s.m.retry_after(s, limit, h) end
  call.out[i] = { false, r, ra, s.m.reset(s) }
  if call.consuming == 1 and c.want > 0 and c.horizon > 0 and not c.shadow and not pc and s.m == SLIDING then
    local lh, ln, lf, le = lease(s, limit, r, c.want, c.horizon)
    if lh > 0 then
      s.m.add(s, lh)
      call.out[i] = { false, r, ra, s.m.reset(s), lh, ln, lf, le }
      call.leased[s] = true
    end
  end
  if not call.leased[s] then call.found[#call.found + 1] = s end
  if not c.shadow then call.veto = true end
end

-- decide answers check i, not a write, against the tentative state.
local function decide(call, i)
  local c, s = call.checks[i], call.states[i]
  local h, limit = c.hits, c.limit
  if not s then
    call.out[i] = { false, 0, c.w * US, 0 }
    if h > 0 and not c.shadow then call.veto = true end
    return
  end
  local pc = c.paced and s.m.own ~= nil
  local r
  if pc then r = s.m.own(s, limit) else r = s.m.budget(s, limit) end
  if h == 0 then
    if r >= 1 then
      call.out[i] = { true, r, 0, s.m.reset(s) }
      return
    end
    local ra
    if pc then ra = s.m.reset(s) else ra = s.m.retry_after(s, limit, 1) end
    call.out[i] = { false, r, ra, s.m.reset(s) }
    call.found[#call.found + 1] = s
  elseif h <= r then
    admit(call, i, c, s, r, pc)
  else
    deny(call, i, c, s, r, pc)
  end
end

-- commit undoes a vetoed request's tentative consumption, then writes what
-- changed (nothing for a peek).
local function commit(call, base)
  if call.veto then
    for s, t in pairs(base) do
      if not call.leased[s] then restore(s, t) end
    end
    for _, o in ipairs(call.out) do
      if o.found then o[2], o[5], o[6], o[7], o[8] = o.found, 0, 0, 0, 0 end
    end
  end
  if call.peek then return end
  local kept = function(s) return call.wrote[s] or (call.consumed[s] and not call.veto) end
  for _, s in pairs(call.byKey) do
    if kept(s) or call.leased[s] then s.m.write(s) end
  end
  for _, s in ipairs(call.found) do
    if not kept(s) then restore_ttl(s) end
  end
end

local function rls_decide(keys, args)
  if not floor then bind() end
  local now
  if args[1] ~= '' then
    now = tonumber(args[1])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * US + tonumber(t[2])
  end
  local call = { now = now, peek = args[2] == MODE_PEEK, checks = {}, states = {}, out = {},
    wrote = {}, consumed = {}, found = {}, leased = {}, veto = false, consuming = 0 }
  if not parse(call, keys, args[HEADER + 1]) then return 'W' .. pack('<d', now) end
  write_first(call)
  local base = {}
  for _, s in pairs(call.byKey) do base[s] = snapshot(s) end
  for _, c in ipairs(call.checks) do
    if not c.write and c.hits > 0 then call.consuming = call.consuming + 1 end
  end
  for i, c in ipairs(call.checks) do
    if not c.write then decide(call, i) end
  end
  commit(call, base)
  local reply = {}
  for i, o in ipairs(call.out) do
    reply[i] = pack('<Bddddddd', o[1] and 1 or 0, o[2], o[3], o[4], o[5] or 0, o[6] or 0, o[7] or 0, o[8] or 0)
  end
  return table.concat(reply)
end

return rls_decide(KEYS, ARGV)
