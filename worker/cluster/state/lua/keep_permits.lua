-- Keep the permits ARGV[5..] (holder tokens of one chunk delivery, each with an item in flight or between items)
-- until ARGV[1] (lease expiry, unix seconds). A lease that ran out while its holder lived (the process paused,
-- Redis away for longer than a lease) is taken again when a permit is free; one that is not free is lost, and its
-- thread asks again before its next item. Never gives a held permit up: a lowered limit takes permits back only
-- between items (acquire_permit.lua), so a permit is never handed on while its item runs.
-- Returns the lost tokens.
-- KEYS[1]: the permit sorted set   KEYS[2]: the run's overrides (hash)
-- KEYS[3]: the run's tombstone (keys.py purged_key): a purged run's permits are all lost, and nothing is written.
-- ARGV[2]: now (unix seconds)   ARGV[3]: the batch's max_concurrent   ARGV[4]: the set's TTL (seconds)
if redis.call('EXISTS', KEYS[3]) == 1 then
  local lost = {}
  for i = 5, #ARGV do table.insert(lost, ARGV[i]) end
  return lost
end
local now = tonumber(ARGV[2])
local limit = tonumber(redis.call('HGET', KEYS[2], 'max_concurrent') or ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost = {}
for i = 5, #ARGV do
  local token = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], token) or redis.call('ZCARD', KEYS[1]) < limit then
    redis.call('ZADD', KEYS[1], ARGV[1], token)
  else
    table.insert(lost, token)
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return lost
