-- Append a batch of item outcomes to the run's progress stream and keep the stream's TTL.
-- KEYS[1]: the stream; ARGV[1]: batch key; ARGV[2]: msgpack [[index, ok], ...]; ARGV[3]: ttl seconds
redis.call('XADD', KEYS[1], '*', 'batch', ARGV[1], 'b', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
