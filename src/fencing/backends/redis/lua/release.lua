#!lua
-- Release a lease still held by this token; the token stays for the next grant.
-- KEYS[1] the lease hash (see acquire.lua); ARGV[1] token.
-- Returns {released 0/1, token, owner, exp, now}.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp')
if l[1] ~= ARGV[1] or not l[2] or tonumber(l[3]) <= now then
  return {0, l[1], l[2], l[3], int_text(now)}
end
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HSET', KEYS[1], 'exp', '0')
return {1, l[1], false, '0', int_text(now)}
