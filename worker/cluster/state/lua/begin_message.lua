-- A delivery of a message begins (worker/cluster/aging.py): it is no longer queued, and if aging copied it, only the
-- first delivery of the pair to begin runs (a redelivery of that one too: same task id).
-- KEYS: 1 queued (zset task id -> when sent), 2 queued messages (hash task id -> packed message),
--       3 copies (hash task id -> the first id of its message, for a copied message and its copies),
--       4 begun (hash first id -> the task id of the delivery that began it)
-- ARGV: 1 the task id, 2 ttl, 3.. every task id of its message (its original and copies)
-- Returns 1 (run it) or 0 (another delivery of its message began first: skip it).
local id, ttl = ARGV[1], tonumber(ARGV[2])
local family = {unpack(ARGV, 3)}
redis.call('ZREM', KEYS[1], unpack(family))
redis.call('HDEL', KEYS[2], unpack(family))
local first = redis.call('HGET', KEYS[3], id)
if not first then return 1 end
local holder = redis.call('HGET', KEYS[4], first)
if not holder then
  redis.call('HSET', KEYS[4], first, id)
  redis.call('EXPIRE', KEYS[4], ttl)
  return 1
end
return holder == id and 1 or 0
