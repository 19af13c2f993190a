#!lua
-- Extend a lease still held by this token (fencing._rules.lease_renewal).
-- KEYS[1] the lease hash (see acquire.lua); ARGV[1] token, ARGV[2] ttl in microseconds.
-- Returns {renewed 0/1, token, owner, exp, now}.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp')
if l[1] ~= ARGV[1] or not l[2] or tonumber(l[3]) <= now then
  return {0, l[1], l[2], l[3], int_text(now)}
end
local exp = int_text(now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'exp', exp)
return {1, l[1], l[2], exp, int_text(now)}
