-- The end of an admitted request (redisMeters' settle): it leaves the
-- requests in flight and their reservations, its window reservation
-- drops to the tokens it used, and what it used is added to the spend of
-- the budget period it was admitted in (when that spend is in Redis).
--
-- KEYS, per holder: w, f, h, st, sm as in redis_admit.lua.
-- ARGV: reservation id, its in-flight member, tokens used, micro-USD used,
--   ttl ms.

local id, member = ARGV[1], ARGV[2]
local used, usedMic, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local bound, boundMic = string.match(member, ':(%d+):(%d+)$')
bound, boundMic = tonumber(bound), tonumber(boundMic)
for i = 0, #KEYS / 5 - 1 do
  local w, f, h, st, sm = KEYS[5*i+1], KEYS[5*i+2], KEYS[5*i+3], KEYS[5*i+4], KEYS[5*i+5]
  if redis.call('ZREM', f, member) == 1 then
    if bound > 0 then redis.call('HINCRBY', h, 'rt', -bound) end
    if boundMic > 0 then redis.call('HINCRBY', h, 'rm', -boundMic) end
  end
  local cur = tonumber(redis.call('HGET', h, id))
  if cur and used < cur then -- still in the window
    redis.call('HSET', h, id, used)
    redis.call('HINCRBY', h, 'sum', used - cur)
  end
  if used > 0 and redis.call('EXISTS', st) == 1 then redis.call('INCRBY', st, used) end
  if usedMic > 0 and redis.call('EXISTS', sm) == 1 then redis.call('INCRBY', sm, usedMic) end
  redis.call('PEXPIRE', w, ttl)
  redis.call('PEXPIRE', f, ttl)
  redis.call('PEXPIRE', h, ttl)
end
return 1
