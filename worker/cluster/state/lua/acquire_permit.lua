-- Take or renew one of the batch's permits for ARGV[1] (a holder token) until ARGV[3] (lease expiry, unix seconds).
-- The number of permits is the run's `max_concurrent` override when `chordflow update` set one, else ARGV[2].
-- Expired leases (a killed worker's) are dropped first. A holder renewing while more permits are held than the
-- limit allows (it was lowered) gives its permit up and waits like a new one, so the holders drop to the limit.
-- ARGV[6], when given, is the holder's chunk (`<start>/`): a new delivery of a chunk first takes back every permit
-- an earlier delivery of it still holds (that delivery died, or was given up on: its items run here now), so a
-- chunk delivered again never waits for the leases of the one it replaces.
-- Returns 1 when granted, 0 when all are taken.
-- KEYS[1]: the permit sorted set (member = holder token, score = lease expiry)   KEYS[2]: the run's overrides (hash)
-- KEYS[3]: the run's tombstone (keys.py purged_key): a purged run's chunk gets no permit (0) and writes nothing.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local now = tonumber(ARGV[4])
local limit = tonumber(redis.call('HGET', KEYS[2], 'max_concurrent') or ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[6] then
  local chunk = ARGV[6]
  for _, holder in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if string.sub(holder, 1, #chunk) == chunk then
      redis.call('ZREM', KEYS[1], holder)
    end
  end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) > limit then
    redis.call('ZREM', KEYS[1], ARGV[1])
    return 0
  end
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  return 1
end
return 0
