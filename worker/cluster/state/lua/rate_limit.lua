-- One operation on a rate-limit bucket (GCRA, worker/engine/rate_limits.py says how it works), atomically,
-- on Redis's own clock so every host agrees. All times are microseconds.
-- KEYS[1]: the bucket hash (keys.limit_key): tat (next call's theoretical arrival), tok (the token account's),
--          iv (us per call in force), iv_at (when that rate was last declared), call_us (how long an admitted call
--          runs: a moving average over about the last 50 calls, for the metrics' desired workers)
-- ARGV[1]: 'admit' | 'hold'
-- ARGV[2]: us per call this caller declares (0: tokens only); ARGV[3]: burst
-- ARGV[4]: us per token (0: no token limit)
-- ARGV[5]: admit: tokens to charge first (owed by earlier calls of this process); hold: us to hold back
-- ARGV[6]: us a declared rate counts for the lowest-rate rule; ARGV[7]: us of tokens the account may owe
-- ARGV[8]: the bucket's ttl in seconds
-- ARGV[9], ARGV[10]: admit: us that calls of this process admitted earlier ran, and how many they were
-- Returns the us to wait before asking again (0: admitted, or held).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local b = redis.call('HMGET', KEYS[1], 'tat', 'tok', 'iv', 'iv_at')
local tat = tonumber(b[1]) or now
local tok = tonumber(b[2]) or now
local iv = tonumber(b[3]) or 0
local iv_at = tonumber(b[4]) or 0
local declared = tonumber(ARGV[2])
if declared >= iv or now - iv_at > tonumber(ARGV[6]) then
  iv = declared
  iv_at = now
end
local burst = tonumber(ARGV[3])
local tiv = tonumber(ARGV[4])
local window = tonumber(ARGV[7])
local wait = 0
if ARGV[1] == 'admit' then
  if tiv > 0 then
    tok = math.max(tok, now) + tonumber(ARGV[5]) * tiv
  end
  if tiv > 0 and tok - now > window then
    wait = tok - now - window
  elseif iv > 0 then
    wait = math.max(tat, now) - now - iv * (burst - 1)
    if wait <= 0 then
      wait = 0
      -- A caller late for its slot by less than one interval keeps the cadence (rate_limits.py _cadence).
      if now - tat >= iv then tat = now end
      tat = tat + iv
    end
  end
else
  tat = math.max(tat, now + tonumber(ARGV[5]) + iv * (burst - 1))
  if tiv > 0 then
    tok = math.max(tok, now + tonumber(ARGV[5]) + window)
  end
end
redis.call('HSET', KEYS[1], 'tat', tat, 'tok', tok, 'iv', iv, 'iv_at', iv_at)
local calls = tonumber(ARGV[10] or 0)
if calls > 0 then
  -- The calls' mean moves the average as much as that many calls one at a time would (weight 1/50 each).
  local mean = tonumber(ARGV[9]) / calls
  local old = tonumber(redis.call('HGET', KEYS[1], 'call_us') or mean)
  redis.call('HSET', KEYS[1], 'call_us', math.floor(old + (mean - old) * (1 - 0.98 ^ calls)))
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[8]))
return math.ceil(wait)
