-- fleet.lua: refresh this replica's heartbeat and count the live ones.
--
-- KEYS[1]  the fleet's sorted set (member: replica id, score: expiry in
--          milliseconds of Redis's clock).
-- ARGV[1]  this replica's id.
-- ARGV[2]  heartbeat TTL in milliseconds.
--
-- Reply: the number of replicas whose heartbeat has not expired, this one
-- included. The set itself expires when no replica refreshes it.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
