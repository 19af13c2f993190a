#!lua
-- Forget applied intent ids older than ARGV[1] microseconds, by this node's clock.
-- KEYS[1] a record's applied set. Returns how many ids were removed.
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local cutoff = now_us() - tonumber(ARGV[1])
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. int_text(cutoff))
