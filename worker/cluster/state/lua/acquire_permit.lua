-- Take one of ARGV[2] permits for ARGV[1] (a holder token) until ARGV[3] (lease expiry, unix seconds).
-- Expired leases (a killed worker's) are dropped first. Returns 1 when granted, 0 when all are taken.
-- KEYS[1]: the permit sorted set (member = holder token, score = lease expiry)
local now = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  return 1
end
return 0
