#!lua flags=no-writes
-- A lease as the store holds it, with the server's clock.
-- KEYS[1] the lease hash (see acquire.lua). Returns {0, token, owner, exp, now}.
local l = redis.call('HMGET', KEYS[1], 'token', 'owner', 'exp')
return {0, l[1], l[2], l[3], int_text(now_us())}
