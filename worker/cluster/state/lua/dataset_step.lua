-- One step of a dataset job's bookkeeping, atomic: add a chunk of records, finish a chunk, mark the file
-- read, or just claim / check. Every step then claims chunks to dispatch (at most `window` in flight) and
-- says whether the job has ended: its file is read (or its reader is gone), nothing is in flight, and
-- nothing is left to dispatch (or it was cancelled, or stopped by its failure threshold).
-- KEYS: 1 ds (hash: read, total, written, done, failed, stopped), 2 todo (list of chunk numbers),
--       3 pending (set: dispatched, not finished), 4 out (hash n -> outcome bytes), 5 cov (hash n -> records
--       with an outcome), 6 fails (hash n -> failed records), 7 rec (hash n -> records bytes), 8 cancel flag,
--       9 abort flag of the job's chunks, 10 next (hash n -> chunks claimed when n finished, "1,2"),
--       11 reader (exists while the client reading the file is alive: renewed by every add, gone at read_done),
--       12 claim (hash n -> the claim of the task that began chunk n last: each delivery's own token),
--       13 the run's tombstone (keys.py purged_key)
-- ARGV: 1 mode, 2 window, 3 ttl, then per mode:
--   add       4 n, 5 records bytes, 6 records read so far, 7 seconds the reader lives without another add
--   finish    4 n, 5 outcome bytes, 6 covered, 7 failed, 8 drop the records (1: all ran and succeeded),
--             9 tolerated percent or '', 10 tolerated count or '', 11 the finishing task's claim or '',
--             12... pairs of a field of KEYS[1] and what to add to it (the chunk's model calls: 'llm\t<model>\t<count>')
--   read_done 4 total records
-- Returns {state, claimed chunk numbers...}; state: 'end', 'go', 'dup' (a finish already counted), or 'stale'
-- (a finish whose claim is no longer the chunk's: a later delivery of the chunk began, and only its finish counts),
-- or 'purged' (the run was purged: nothing is written).
local mode, window, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[13]) == 1 then return {'purged'} end

local function keep()
  for i = 1, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
  redis.call('EXPIRE', KEYS[10], ttl)
  redis.call('EXPIRE', KEYS[12], ttl)
end

if mode == 'add' then
  redis.call('HSET', KEYS[7], ARGV[4], ARGV[5])
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('HSET', KEYS[1], 'written', tonumber(ARGV[4]) + 1, 'read', ARGV[6])
  redis.call('SET', KEYS[11], 1, 'EX', tonumber(ARGV[7]))
  keep()
elseif mode == 'finish' then
  if ARGV[11] and ARGV[11] ~= '' and redis.call('HGET', KEYS[12], ARGV[4]) ~= ARGV[11] then
    return {'stale'}
  end
  if redis.call('SREM', KEYS[3], ARGV[4]) == 0 then
    return {'dup'}
  end
  local old_cov = tonumber(redis.call('HGET', KEYS[5], ARGV[4]) or '0')
  local old_failed = tonumber(redis.call('HGET', KEYS[6], ARGV[4]) or '0')
  redis.call('HSET', KEYS[4], ARGV[4], ARGV[5])
  redis.call('HSET', KEYS[5], ARGV[4], ARGV[6])
  redis.call('HSET', KEYS[6], ARGV[4], ARGV[7])
  redis.call('HINCRBY', KEYS[1], 'done', tonumber(ARGV[6]) - old_cov)
  for i = 12, #ARGV - 1, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
  local failed = redis.call('HINCRBY', KEYS[1], 'failed', tonumber(ARGV[7]) - old_failed)
  if ARGV[8] == '1' then redis.call('HDEL', KEYS[7], ARGV[4]) end
  local total = redis.call('HGET', KEYS[1], 'total')
  if (ARGV[10] ~= '' and failed > tonumber(ARGV[10]))
      or (ARGV[9] ~= '' and total and failed * 100 > tonumber(ARGV[9]) * tonumber(total)) then
    redis.call('HSET', KEYS[1], 'stopped', 'threshold')
    redis.call('SET', KEYS[9], 1, 'EX', ttl)
  end
  keep()
elseif mode == 'read_done' then
  redis.call('HSET', KEYS[1], 'total', ARGV[4], 'read', ARGV[4])
  redis.call('DEL', KEYS[11])
end

local stopped = redis.call('EXISTS', KEYS[8]) == 1 or redis.call('HEXISTS', KEYS[1], 'stopped') == 1
local claimed = {}
if not stopped then
  while redis.call('SCARD', KEYS[3]) < window do
    local n = redis.call('LPOP', KEYS[2])
    if not n then break end
    redis.call('SADD', KEYS[3], n)
    table.insert(claimed, n)
  end
end
if mode == 'finish' then
  redis.call('HSET', KEYS[10], ARGV[4], table.concat(claimed, ','))
end
-- A job whose reader died before the end of its file ends too (with what it read), once nothing is in flight.
local read = redis.call('HEXISTS', KEYS[1], 'total') == 1 or redis.call('EXISTS', KEYS[11]) == 0
local ended = read and redis.call('SCARD', KEYS[3]) == 0
  and (stopped or redis.call('LLEN', KEYS[2]) == 0)
table.insert(claimed, 1, ended and 'end' or 'go')
return claimed
