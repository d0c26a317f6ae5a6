-- The merge task stores the merged batch result, then wakes the scheduler through the run's stream.
-- KEYS[1]: the result key; KEYS[2]: the stream; KEYS[3]: the run's tombstone (keys.py purged_key)
-- ARGV[1]: result bytes; ARGV[2]: batch key; ARGV[3]: ttl. Returns 1, or 0 (nothing written) for a purged run.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
redis.call('XADD', KEYS[2], '*', 'batch', ARGV[2], 'done', '1')
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return 1
