#!lua
-- Create a collection record with fence 0, unless it exists. A record created again
-- after a delete continues the deleted one's versions (its tombstone), so versions
-- are never reused. KEYS[1] the record hash, KEYS[2] its tombstone; ARGV[1] the state
-- JSON. Returns the new record's version, or 0 if it exists.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local version = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
redis.call('HSET', KEYS[1], 'v', tostring(version), 'f', '0', 's', ARGV[1])
return version
