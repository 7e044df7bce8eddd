-- demand.lua: share one rls replica's RLQS demand for a rule's counter with
-- the fleet, and sum the fleet's.
--
-- KEYS[1]  the counter's demand hash (field: replica id, value: "<demand>
--          <expiry in milliseconds of Redis's clock>").
-- ARGV[1]  this replica's id.
-- ARGV[2]  this replica's demand, in hits per second over its streams; 0
--          withdraws it.
-- ARGV[3]  how long it holds, in milliseconds.
--
-- Reply: the fleet's demand as a string (this replica's included). Expired
-- or unreadable fields are removed; the hash expires when no replica
-- refreshes it.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local mine = tonumber(ARGV[2])
if mine and mine > 0 and mine < math.huge and ttl and ttl > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. (now + ttl))
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local total = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local d, exp = string.match(all[i + 1], '^(%S+) (%d+)$')
  d, exp = tonumber(d), tonumber(exp)
  if d == nil or exp == nil or exp <= now or d ~= d or d < 0 or d == math.huge then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + d
  end
end
return string.format('%.17g', total)
