-- Record one finished step of a run, fenced: nothing is written unless the run is still at that step.
-- KEYS[1]: the run hash; KEYS[2]: the store hash; KEYS[3]: the trail list (nodes completed, in order);
-- KEYS[4]: the steps list (each step's [action, config hash, reads hash] JSON, in the trail's order);
-- KEYS[5]: the undo hash ('<step>:<key>' -> 'v' .. the value the key held before that step, or '-' if absent)
-- ARGV[1]: the step that finished; ARGV[2]: next node ('' when the flow ended); ARGV[3]: the node;
-- ARGV[4]: now (unix seconds); ARGV[5]: ttl; ARGV[6]: batch counts JSON for the node ('' if none);
-- ARGV[7]: the step's [action, config, reads] JSON; ARGV[8]: number of deleted keys n;
-- ARGV[9..8+n]: deleted keys; then changed key, value pairs.
if redis.call('HGET', KEYS[1], 'step') ~= ARGV[1] then
  return 0
end
local function keep(name)  -- what `name` held before this step, so a rewind can put it back
  local old = redis.call('HGET', KEYS[2], name)
  redis.call('HSET', KEYS[5], ARGV[1] .. ':' .. name, old and ('v' .. old) or '-')
end
local n = tonumber(ARGV[8])
for i = 9, 8 + n do
  keep(ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
for i = 9 + n, #ARGV, 2 do
  keep(ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'step', tonumber(ARGV[1]) + 1, 'node', ARGV[2], 'status', 'running', 'updated', ARGV[4])
if ARGV[6] ~= '' then
  local batches = cjson.decode(redis.call('HGET', KEYS[1], 'batches') or '{}')
  batches[ARGV[3]] = cjson.decode(ARGV[6])
  redis.call('HSET', KEYS[1], 'batches', cjson.encode(batches))
end
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('RPUSH', KEYS[4], ARGV[7])
for i = 1, 5 do
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5]))
end
return 1
