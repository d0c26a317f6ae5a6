-- Set a run's flag (a batch's abort flag) for the run TTL, unless the run was purged: a chunk still running when its
-- run was purged writes nothing of the run back.
-- KEYS[1]: the flag; KEYS[2]: the run's tombstone (keys.py purged_key). ARGV[1]: ttl seconds.
-- Returns 1 when set, 0 for a purged run.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], 1, 'EX', tonumber(ARGV[1]))
return 1
