-- Append a batch of item outcomes to the run's progress stream and keep the stream's TTL.
-- KEYS[1]: the stream; ARGV[1]: batch key; ARGV[2]: msgpack [[index, ok], ...]; ARGV[3]: ttl seconds
-- With a failure threshold, the same write counts the batch's failed items and aborts it past the threshold:
-- KEYS[2]: the batch's failure counts (hash: chunk start -> that chunk's failed items, 'total' -> their sum);
-- KEYS[3]: the batch's abort flag; ARGV[4]: chunk start; ARGV[5]: the chunk's failed items so far;
-- ARGV[6]: the most failed items the batch tolerates.
-- A chunk reports its running count, kept as a maximum: a redelivered chunk (its worker was killed)
-- counts its items again from zero without counting them twice.
redis.call('XADD', KEYS[1], '*', 'batch', ARGV[1], 'b', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
if #KEYS == 3 then
  local failed = tonumber(ARGV[5])
  local before = tonumber(redis.call('HGET', KEYS[2], ARGV[4]) or '0')
  if failed > before then
    redis.call('HSET', KEYS[2], ARGV[4], failed)
    local total = redis.call('HINCRBY', KEYS[2], 'total', failed - before)
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
    if total > tonumber(ARGV[6]) then
      redis.call('SET', KEYS[3], 1, 'EX', tonumber(ARGV[3]))
    end
  end
end
return 1
