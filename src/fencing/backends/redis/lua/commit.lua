#!lua
-- One guarded commit, atomically: judge (prelude.lua), then write the new state,
-- version + 1, fence = max(fence, token), and record the intent id as applied.
-- KEYS and ARGV[1..7] as in prelude.lua, then:
--   collection: ARGV[8] the new state JSON
--   table:      ARGV[8..] field, value pairs; a value is '=' .. text to set the
--               field, or '-' to remove it (None)
-- Writes start only after every check, and the version comes first: an error
-- in a write (a non-integer version field) leaves nothing half written.
-- Replies: judged() (prelude.lua) when refused; {'applied', version, fence, row or false}.
local status, version, fence, data, applied, ltoken, lowner, lexp, now = judge()
if status ~= 'ok' then
  return judged(status, version, fence, data, applied, ltoken, lowner, lexp, now)
end
local token = ARGV[4]
local new_fence = fence
if token ~= '' and tonumber(token) > tonumber(fence) then
  new_fence = token
end
local row = false
if ARGV[1] == 'c' then
  redis.call('HINCRBY', KEYS[1], 'v', 1)
  redis.call('HSET', KEYS[1], 'f', new_fence, 's', ARGV[8])
  version = redis.call('HGET', KEYS[1], 'v')
else
  local vfield = ARGV[6]
  if vfield ~= '' then
    redis.call('HINCRBY', KEYS[1], vfield, 1)
  end
  for i = 8, #ARGV, 2 do
    local value = ARGV[i + 1]
    if string.sub(value, 1, 1) == '=' then
      redis.call('HSET', KEYS[1], ARGV[i], string.sub(value, 2))
    else
      redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
  if new_fence ~= fence then
    redis.call('SET', KEYS[3], new_fence)
  end
  row = redis.call('HGETALL', KEYS[1])
  if vfield ~= '' then
    version = redis.call('HGET', KEYS[1], vfield)
  end
end
-- the score: an integer below 2^53, which Redis passes on exactly
redis.call('ZADD', KEYS[2], now, ARGV[2])
-- applied: {'applied', version, fence, the row (a table) or false (the client has the state)}
return {'applied', version, new_fence, row}
