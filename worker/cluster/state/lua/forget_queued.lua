-- An aging sweep forgets the queued messages of a run whose messages do nothing now (worker/cluster/aging.py): it
-- ended, it was cancelled, or it has no record in Redis and no live driver (a client-driven run whose client ended or
-- died: runstate.py DRIVER_LEASE). One step: a client renews its lease before it records a message, so a message
-- recorded under a live lease is never forgotten by a sweep that read the lease gone.
-- KEYS: 1 the run's record (hash), 2 its cancel flag, 3 its driver lease, 4 queued (zset), 5 queued messages (hash)
-- ARGV: the final statuses
-- Returns 1 when the run's messages were forgotten, 0 when they still matter.
local status = redis.call('HGET', KEYS[1], 'status')
local stopped = redis.call('EXISTS', KEYS[2]) == 1
if not stopped then
  if status then
    for i = 1, #ARGV do
      if status == ARGV[i] then stopped = true end
    end
  else
    stopped = redis.call('EXISTS', KEYS[3]) == 0
  end
end
if not stopped then return 0 end
redis.call('DEL', KEYS[4], KEYS[5])
return 1
