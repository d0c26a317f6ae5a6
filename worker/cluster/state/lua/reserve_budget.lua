-- Reserve the most a model call can bill against the run's budget (worker/llm/budget.py), or refuse.
-- The caps are `budget_tokens` / `budget_usd` of the run's overrides when `chordflow update` set them, else those
-- the workflow set (`tokens` / `usd` here, written by the run's advances). USD are counted in micro-dollars.
-- KEYS[1]: the run's budget (hash: tokens, usd, spent_tokens, spent_usd, reserved_tokens, reserved_usd)
-- KEYS[2]: the run's overrides (hash)   KEYS[3]: the run's tombstone (a purged run reserves nothing)
-- ARGV[1]: tokens to reserve   ARGV[2]: micro-dollars to reserve   ARGV[3]: the run TTL (seconds)
-- Returns {1} when reserved, {0, kind, spent, cap} when the reservation would pass the cap of `kind`, {-1} purged.
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1} end
local asked = {tokens = tonumber(ARGV[1]), usd = tonumber(ARGV[2])}
for _, kind in ipairs({'tokens', 'usd'}) do
  local cap = redis.call('HGET', KEYS[2], 'budget_' .. kind) or redis.call('HGET', KEYS[1], kind)
  if cap then
    local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_' .. kind) or '0')
    local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved_' .. kind) or '0')
    if spent + reserved + asked[kind] > tonumber(cap) then
      return {0, kind, tostring(spent), tostring(cap)}
    end
  end
end
redis.call('HINCRBY', KEYS[1], 'reserved_tokens', asked.tokens)
redis.call('HINCRBY', KEYS[1], 'reserved_usd', asked.usd)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return {1}
