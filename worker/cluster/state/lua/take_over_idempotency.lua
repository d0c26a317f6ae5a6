-- Take over an idempotency key's claim whose run was never recorded (its submit died between claiming the key and
-- recording the run) or was purged: only if the claim still holds what the caller found in it.
-- KEYS[1]: the claim (string)   ARGV[1]: the value found   ARGV[2]: the new value   ARGV[3]: TTL (seconds)
-- Returns 1 when taken over, 0 when the claim changed meanwhile (another submit took it first).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
return 1
