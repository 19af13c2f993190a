#!lua
-- Acquire a lease unless it is held (fencing._rules.lease_grant).
-- KEYS[1] the lease hash: token (the last token granted), owner (absent once
-- released), exp (expiry, microseconds of the server's clock). The hash has no
-- TTL and is never deleted, so tokens only grow: across release, expiry and
-- reconnects. Expiry is judged against TIME here, not by key expiry.
-- ARGV[1] owner, ARGV[2] ttl in microseconds.
-- Returns {granted 0/1, token, owner, exp, now}.
local now = now_us()
local l = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp')
if l[2] and tonumber(l[3]) > now then
  return {0, l[1], l[2], l[3], int_text(now)}
end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
local exp = int_text(now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'exp', exp)
return {1, int_text(token), ARGV[1], exp, int_text(now)}
