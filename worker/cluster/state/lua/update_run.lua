-- Change a running run's limits (`chordflow update`): set them in its overrides hash (`priority`: in the record
-- itself, the field the dispatch reads) and append the change to the record's `updates` history, atomically, only
-- while the run is queued or running, or (ARGV[4] = '1': a budget change alone) whatever its status: a run over
-- its budget fails, and a larger budget lets `resume` go on.
-- KEYS[1]: the run record (hash)   KEYS[2]: the run's overrides (hash)
-- ARGV[1]: now (unix seconds)   ARGV[2]: the run TTL   ARGV[3]: the changes as a JSON object (for the history)
-- ARGV[4]: '1' when the changes are the budget's alone   ARGV[5..]: field, value pairs to set in the overrides
-- Returns 'ok', 'unknown' (no record) or the run's final status.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return 'unknown'
end
if status ~= 'queued' and status ~= 'running' and ARGV[4] ~= '1' then
  return status
end
for i = 5, #ARGV, 2 do
  if ARGV[i] == 'priority' then
    redis.call('HSET', KEYS[1], 'priority', ARGV[i + 1])
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
local history = {}
local kept = redis.call('HGET', KEYS[1], 'updates')
if kept and kept ~= '' then
  history = cjson.decode(kept)
end
history[#history + 1] = {at = tonumber(ARGV[1]), changes = cjson.decode(ARGV[3])}
redis.call('HSET', KEYS[1], 'updates', cjson.encode(history))
return 'ok'
