-- Append a batch of item outcomes to the run's progress stream and keep the stream's TTL.
-- KEYS[1]: the stream; KEYS[2]: the run's tombstone (keys.py purged_key); ARGV[1]: batch key;
-- ARGV[2]: msgpack [[index, ok], ...]; ARGV[3]: ttl seconds
-- With a failure threshold, the same write counts the batch's failed items and aborts it past the threshold:
-- KEYS[3]: the batch's failure counts (hash: chunk start -> that chunk's failed items, 'total' -> their sum);
-- KEYS[4]: the batch's abort flag; ARGV[4]: chunk start; ARGV[5]: the chunk's failed items so far;
-- ARGV[6]: the most failed items the batch tolerates.
-- A chunk reports its running count, kept as a maximum: a redelivered chunk (its worker was killed)
-- counts its items again from zero without counting them twice.
-- Returns 1, or 0 (nothing written) for a purged run: a chunk still running then writes none of its keys back.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('XADD', KEYS[1], '*', 'batch', ARGV[1], 'b', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
if #KEYS == 4 then
  local failed = tonumber(ARGV[5])
  local before = tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0')
  if failed > before then
    redis.call('HSET', KEYS[3], ARGV[4], failed)
    local total = redis.call('HINCRBY', KEYS[3], 'total', failed - before)
    redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
    if total > tonumber(ARGV[6]) then
      redis.call('SET', KEYS[4], 1, 'EX', tonumber(ARGV[3]))
    end
  end
end
return 1
