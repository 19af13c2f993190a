#!lua
-- Set the schema version, atomically: a new store gets ARGV[1]; an older store is
-- raised to it (1 -> 2 only added keys, which the scripts make on first use); a
-- newer one is left alone for the client to refuse. KEYS[1] the schema key.
-- Returns the version the store is at now (text).
redis.call('SET', KEYS[1], ARGV[1], 'NX')
local found = redis.call('GET', KEYS[1])
local version = tonumber(found)
if version and version < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return found
