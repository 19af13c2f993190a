#!lua
-- Create a collection record at version 1 with fence 0, unless it exists.
-- KEYS[1] the record hash; ARGV[1] the state JSON. Returns 1 if created, else 0.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'v', '1', 'f', '0', 's', ARGV[1])
return 1
