-- Replace a model call's reservation by what it billed (worker/llm/budget.py); nothing for a purged run.
-- KEYS[1]: the run's budget (hash)   KEYS[2]: the run's tombstone
-- ARGV[1], ARGV[2]: tokens and micro-dollars reserved   ARGV[3], ARGV[4]: tokens and micro-dollars billed
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HINCRBY', KEYS[1], 'reserved_tokens', 0 - tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[1], 'reserved_usd', 0 - tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'spent_tokens', tonumber(ARGV[3]))
redis.call('HINCRBY', KEYS[1], 'spent_usd', tonumber(ARGV[4]))
return 1
