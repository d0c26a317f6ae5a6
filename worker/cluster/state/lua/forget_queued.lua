-- An aging sweep forgets the queued messages of a run whose messages do nothing now (worker/cluster/aging.py): it
-- ended, or it has no record in Redis and no live driver (a client-driven run whose client ended or died:
-- runstate.py DRIVER_LEASE). One step: a client renews its lease before it records a message, so a message
-- recorded under a live lease is never forgotten by a sweep that read the lease gone. A cancelled run that has not
-- ended keeps them: it ends once each of its chunks reported, so one the broker lost must still be sent again.
-- KEYS: 1 the run's record (hash), 2 its driver lease, 3 queued (zset), 4 queued messages (hash)
-- ARGV: the final statuses
-- Returns 1 when the run's messages were forgotten, 0 when they still matter.
local status = redis.call('HGET', KEYS[1], 'status')
local stopped = false
if status then
  for i = 1, #ARGV do
    if status == ARGV[i] then stopped = true end
  end
else
  stopped = redis.call('EXISTS', KEYS[2]) == 0
end
if not stopped then return 0 end
redis.call('DEL', KEYS[3], KEYS[4])
return 1
