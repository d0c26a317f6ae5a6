-- Keep a model's answer to one request of the run (worker/llm/answers.py), for the run's TTL.
-- KEYS[1]: the run's answers (hash: request key -> answer JSON)   KEYS[2]: the run's tombstone (keys.py purged_key)
-- ARGV[1]: the request key   ARGV[2]: the answer (JSON)   ARGV[3]: the run TTL (seconds)
-- Returns 1, or 0 for a purged run (nothing written: a purged run stays purged).
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
