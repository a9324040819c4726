-- The admission check and reservation of one request against the meters
-- of its tenant and its key, atomically (redisMeters.admit). It mirrors
-- memMeters.admit step for step; TestRedisMatchesMemory holds them equal.
--
-- KEYS, per holder (the tenant's, then the key's):
--   w   ZSET  reservations in the window: member id, score µs admitted
--   f   ZSET  requests in flight: member "id:tokens:micro", score µs admitted
--   h   HASH  id -> the reservation's tokens in the window; "sum" of them;
--             "rt", "rm": the tokens and micro-USD reserved in flight
--   st  STR   tokens spent in the budget's period (set by the caller, NX)
--   sm  STR   micro-USD spent in the budget's period
-- ARGV: now µs ("" = the server's TIME), window µs, lease µs, ttl ms,
--   reservation id, tokens, micro, then per holder: requests/min,
--   tokens/min, max concurrent, budget tokens (0 none), budget micro-USD
--   (-1 none), budgeted (1/0).
-- Returns {admitted, need, now, per holder: requestWait µs, tokenWait µs,
--   concurrentFull, overBudget, requests, tokens, reset µs}; need (a bit
--   per holder) says whose period's spend is not in Redis yet: nothing
--   was reserved, the caller sets it (SET NX) and asks again.

local function chunks(list, fn)
  for i = 1, #list, 512 do
    fn(unpack(list, i, math.min(i + 511, #list)))
  end
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local window, lease, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local id, tokens, micro = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local holders = #KEYS / 5
local states, need = {}, 0

for i = 0, holders - 1 do
  local w, f, h, st, sm = KEYS[5*i+1], KEYS[5*i+2], KEYS[5*i+3], KEYS[5*i+4], KEYS[5*i+5]
  local a = 7 + 6*i
  local rpm, tpm, maxc = tonumber(ARGV[a+1]), tonumber(ARGV[a+2]), tonumber(ARGV[a+3])
  local btok, bmic, budgeted = tonumber(ARGV[a+4]), tonumber(ARGV[a+5]), ARGV[a+6] == '1'

  -- prune: reservations that left the window
  local old = redis.call('ZRANGEBYSCORE', w, '-inf', now - window)
  if #old > 0 then
    local gone = 0
    chunks(old, function(...)
      for _, v in ipairs(redis.call('HMGET', h, ...)) do gone = gone + (tonumber(v) or 0) end
      redis.call('HDEL', h, ...)
    end)
    redis.call('ZREMRANGEBYSCORE', w, '-inf', now - window)
    if gone > 0 then redis.call('HINCRBY', h, 'sum', -gone) end
  end
  -- requests in flight past their lease: their gateway ended before
  -- settling them
  local stale = redis.call('ZRANGEBYSCORE', f, '-inf', now - lease)
  if #stale > 0 then
    local rt, rm = 0, 0
    for _, m in ipairs(stale) do
      local t, c = string.match(m, ':(%d+):(%d+)$')
      rt, rm = rt + (tonumber(t) or 0), rm + (tonumber(c) or 0)
    end
    redis.call('ZREMRANGEBYSCORE', f, '-inf', now - lease)
    if rt > 0 then redis.call('HINCRBY', h, 'rt', -rt) end
    if rm > 0 then redis.call('HINCRBY', h, 'rm', -rm) end
  end

  local count = redis.call('ZCARD', w)
  local sum = tonumber(redis.call('HGET', h, 'sum')) or 0
  local s = {0, 0, 0, 0}
  -- requests per minute: wait for the one that makes room to leave
  if rpm > 0 and count >= rpm then
    local e = redis.call('ZRANGE', w, count - rpm, count - rpm, 'WITHSCORES')
    s[1] = tonumber(e[2]) + window - now
  end
  -- tokens per minute: wait for the oldest ones that make room to leave
  if tpm > 0 and tokens > tpm then
    s[2] = window -- it can never fit (what the walk below would find)
  elseif tpm > 0 and sum + tokens > tpm then
    local used, from = sum, 0
    while used + tokens > tpm do
      local page = redis.call('ZRANGE', w, from, from + 255, 'WITHSCORES')
      if #page == 0 then break end
      local ids = {}
      for x = 1, #page, 2 do ids[#ids + 1] = page[x] end
      local toks = redis.call('HMGET', h, unpack(ids))
      for y = 1, #ids do
        if used + tokens <= tpm then break end
        used = used - (tonumber(toks[y]) or 0)
        s[2] = tonumber(page[2*y]) + window - now
      end
      from = from + #ids
    end
    if used + tokens > tpm then s[2] = window end -- it can never fit
  end
  if maxc > 0 and redis.call('ZCARD', f) >= maxc then s[3] = 1 end
  if budgeted then
    local spentTok, spentMic = redis.call('GET', st), redis.call('GET', sm)
    if not spentTok or not spentMic then
      need = need + 2^i
    else
      local rt = tonumber(redis.call('HGET', h, 'rt')) or 0
      local rm = tonumber(redis.call('HGET', h, 'rm')) or 0
      if btok > 0 and tonumber(spentTok) + rt + tokens > btok or bmic >= 0 and tonumber(spentMic) + rm + micro > bmic then
        s[4] = 1
      end
    end
  end
  states[i + 1] = s
end

if need > 0 then
  return {0, need, now}
end
local admitted = 1
for _, s in ipairs(states) do
  if s[1] > 0 or s[2] > 0 or s[3] == 1 or s[4] == 1 then admitted = 0 end
end
local out = {admitted, 0, now}
for i = 0, holders - 1 do
  local w, f, h = KEYS[5*i+1], KEYS[5*i+2], KEYS[5*i+3]
  if admitted == 1 then
    redis.call('ZADD', w, now, id)
    redis.call('HSET', h, id, ARGV[6])
    redis.call('HINCRBY', h, 'sum', ARGV[6])
    redis.call('ZADD', f, now, id .. ':' .. ARGV[6] .. ':' .. ARGV[7])
    redis.call('HINCRBY', h, 'rt', ARGV[6])
    redis.call('HINCRBY', h, 'rm', ARGV[7])
  end
  redis.call('PEXPIRE', w, ttl)
  redis.call('PEXPIRE', f, ttl)
  redis.call('PEXPIRE', h, ttl)
  local s = states[i + 1]
  local reset = 0
  local first = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
  if #first > 0 then reset = tonumber(first[2]) + window - now end
  for _, v in ipairs({s[1], s[2], s[3], s[4], redis.call('ZCARD', w), tonumber(redis.call('HGET', h, 'sum')) or 0, reset}) do
    out[#out + 1] = v
  end
end
return out
