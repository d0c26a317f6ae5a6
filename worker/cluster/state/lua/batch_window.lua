-- One step of a batch's window, atomic: plan the batch (its blocks of items to do) or finish a chunk; then claim
-- chunks to send while fewer than `window` are in flight (none once the run is cancelled or the batch aborted),
-- each of consecutive blocks holding about `chunk_seconds` of measured work (one block until a chunk has been
-- measured), at most `max_items`; and say whether the batch has ended: nothing in flight and nothing left to send
-- (or stopped). Exactly one finish sees the end. A chunk is known by its first index.
-- KEYS: 1 plan (hash: id, window, max_items, min_items, chunk_seconds, header, priority, waited, items, seconds,
--       ended), 2 todo (list of "start:end" blocks, in index order), 3 pending (hash chunk start ->
--       "end:block,...@sent": sent, when it was claimed),
--       4 out (hash chunk start -> outcome bytes), 5 items (hash block start -> items bytes), 6 cancel flag,
--       7 abort flag of the batch, 8 next (hash chunk start -> the chunks its finish claimed, ";" between), 9 the run record,
--       10 the run's tombstone (keys.py purged_key): a purged run's step writes nothing and returns {'purged'}
-- ARGV: 1 mode, 2 ttl, 3 plan id, then per mode:
--   plan    4 window, 5 max_items, 6 min_items, 7 chunk_seconds, 8 header bytes, 9 priority, 10 now, 11.. blocks
--   finish  4 chunk start, 5 outcome bytes, 6 items run, 7 seconds it took, 8 the window now, 9 now,
--           10 the first index past the outcome (or '')
--   split   4 chunk start, 5 `at`, 6 the chunk's end as its holder read it, 7 the items [at, next block) encoded
--           as a block of their own, or '' when `at` starts a block, 8 now: items [at, end) of a chunk become a
--           chunk of their own (its unstarted items, handed back by a draining worker: worker/cluster/batches/handback.py)
-- Returns {state, priority, waited (seconds the last finished chunk waited in the queue: claimed to begun),
-- claimed "start:end:block,block"...}; state: 'go', 'end' (this step ended the batch), 'dup' (a finish already
-- counted: those of its claims not finished yet, again; 'dupend' if the batch has ended), 'stale' (a chunk of an
-- earlier plan of this batch: a resume planned it again), 'short' (a finish whose outcome passes the chunk's end:
-- its end was split off meanwhile; the end follows, to cut the outcome at), 'gone' (a split of a chunk finished, or
-- split, meanwhile: nothing to hand back).
local mode, ttl, id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('EXISTS', KEYS[10]) == 1 then return {'purged'} end
local now = ({plan = ARGV[10], finish = ARGV[9], split = ARGV[8]})[mode]

local function keep()
  for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ttl) end
  redis.call('EXPIRE', KEYS[8], ttl)
end

local function reply(state, claimed)
  local priority = redis.call('HGET', KEYS[9], 'priority') or redis.call('HGET', KEYS[1], 'priority') or 'normal'
  local out = {state, priority, redis.call('HGET', KEYS[1], 'waited') or '0'}
  for _, c in ipairs(claimed) do table.insert(out, c) end
  return out
end

local function split(text, sep)
  local parts = {}
  for part in string.gmatch(text, '[^' .. sep .. ']+') do table.insert(parts, part) end
  return parts
end

if mode == 'plan' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[8])
  redis.call('HSET', KEYS[1], 'id', id, 'window', ARGV[4], 'max_items', ARGV[5], 'min_items', ARGV[6],
    'chunk_seconds', ARGV[7], 'header', ARGV[8], 'priority', ARGV[9], 'waited', 0, 'items', 0, 'seconds', 0)
  for i = 11, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
elseif mode == 'finish' then
  if redis.call('HGET', KEYS[1], 'id') ~= id then return {'stale'} end
  local start = ARGV[4]
  local held = redis.call('HGET', KEYS[3], start)
  if held and ARGV[10] ~= '' and tonumber(string.sub(held, 1, string.find(held, ':') - 1)) < tonumber(ARGV[10]) then
    return {'short', string.sub(held, 1, string.find(held, ':') - 1)}
  end
  if not held then
    local again = {}  -- the claims of its counted finish still in flight (a finished one's items are gone)
    for _, c in ipairs(split(redis.call('HGET', KEYS[8], start) or '', ';')) do
      if redis.call('HEXISTS', KEYS[3], string.sub(c, 1, string.find(c, ':') - 1)) == 1 then
        table.insert(again, c)
      end
    end
    return reply(redis.call('HEXISTS', KEYS[1], 'ended') == 1 and 'dupend' or 'dup', again)
  end
  redis.call('HDEL', KEYS[3], start)
  redis.call('HSET', KEYS[4], start, ARGV[5])
  redis.call('HSET', KEYS[1], 'window', ARGV[8])
  local at = string.find(held, '@')
  local blocks = split(string.sub(held, string.find(held, ':') + 1, at - 1), ',')
  local waited = tonumber(now) - tonumber(string.sub(held, at + 1)) - tonumber(ARGV[7])
  redis.call('HSET', KEYS[1], 'waited', math.max(0, waited))
  if #blocks > 0 then redis.call('HDEL', KEYS[5], unpack(blocks)) end
  if tonumber(ARGV[6]) > 0 then
    redis.call('HINCRBY', KEYS[1], 'items', ARGV[6])
    redis.call('HINCRBYFLOAT', KEYS[1], 'seconds', ARGV[7])
  end
elseif mode == 'split' then
  if redis.call('HGET', KEYS[1], 'id') ~= id then return {'stale'} end
  local start, at = ARGV[4], ARGV[5]
  local held = redis.call('HGET', KEYS[3], start)
  if not held or string.sub(held, 1, string.find(held, ':') - 1) ~= ARGV[6] or tonumber(at) >= tonumber(ARGV[6]) then
    return {'gone'}
  end
  local at_sign = string.find(held, '@')
  local before, after = {}, {}
  for _, b in ipairs(split(string.sub(held, string.find(held, ':') + 1, at_sign - 1), ',')) do
    table.insert(tonumber(b) < tonumber(at) and before or after, b)
  end
  if after[1] ~= at then
    redis.call('HSET', KEYS[5], at, ARGV[7])
    table.insert(after, 1, at)
  end
  redis.call('HSET', KEYS[3], start, at .. ':' .. table.concat(before, ',') .. string.sub(held, at_sign))
  local claim = ARGV[6] .. ':' .. table.concat(after, ',')
  redis.call('HSET', KEYS[3], at, claim .. '@' .. now)
  -- kept with the chunk's claims: its finish (or a duplicate of it) sends it again if its sender died first
  local kept = redis.call('HGET', KEYS[8], start)
  redis.call('HSET', KEYS[8], start, (kept and kept ~= '' and (kept .. ';') or '') .. at .. ':' .. claim)
  keep()
  return reply('go', {at .. ':' .. claim})
end

-- The chunk size: measured seconds per item so far, else one block (a probe).
local plan = redis.call('HMGET', KEYS[1], 'window', 'max_items', 'min_items', 'chunk_seconds', 'items', 'seconds')
local window, max_items, min_items = tonumber(plan[1]), tonumber(plan[2]), tonumber(plan[3])
local measured, seconds = tonumber(plan[5]), tonumber(plan[6])
local target = 0
if measured > 0 and seconds > 0 then
  target = math.min(max_items, math.max(min_items, math.ceil(tonumber(plan[4]) * measured / seconds)))
end

local stopped = redis.call('EXISTS', KEYS[6]) == 1 or redis.call('EXISTS', KEYS[7]) == 1
local claimed = {}
if not stopped then
  while redis.call('HLEN', KEYS[3]) < window do
    local block = redis.call('LPOP', KEYS[2])
    if not block then break end
    local colon = string.find(block, ':')
    local start, stop = string.sub(block, 1, colon - 1), tonumber(string.sub(block, colon + 1))
    local blocks = {start}
    while stop - tonumber(start) < target do
      local following = redis.call('LINDEX', KEYS[2], 0)
      if not following then break end
      colon = string.find(following, ':')
      local a, b = string.sub(following, 1, colon - 1), tonumber(string.sub(following, colon + 1))
      if tonumber(a) ~= stop or b - tonumber(start) > max_items then break end
      redis.call('LPOP', KEYS[2])
      table.insert(blocks, a)
      stop = b
    end
    local list = table.concat(blocks, ',')
    redis.call('HSET', KEYS[3], start, stop .. ':' .. list .. '@' .. now)
    table.insert(claimed, start .. ':' .. stop .. ':' .. list)
  end
end
if mode == 'finish' then
  -- the chunks split off it still in flight go again with its claims (one whose sender died is sent at last)
  for _, c in ipairs(split(redis.call('HGET', KEYS[8], ARGV[4]) or '', ';')) do
    if redis.call('HEXISTS', KEYS[3], string.sub(c, 1, string.find(c, ':') - 1)) == 1 then
      table.insert(claimed, c)
    end
  end
  redis.call('HSET', KEYS[8], ARGV[4], table.concat(claimed, ';'))
end
keep()
if redis.call('HLEN', KEYS[3]) == 0 and (stopped or redis.call('LLEN', KEYS[2]) == 0) then
  redis.call('HSET', KEYS[1], 'ended', 1)
  return reply('end', claimed)
end
return reply('go', claimed)
