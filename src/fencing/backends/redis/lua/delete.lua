#!lua
-- Delete a collection record, keeping its last version in its tombstone (never lowered).
-- KEYS[1] the record hash, KEYS[2] its tombstone. Returns 1 if deleted, else 0.
local version = redis.call('HGET', KEYS[1], 'v')
if not version then
  return 0
end
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(version) > before then
  redis.call('SET', KEYS[2], version)
end
redis.call('DEL', KEYS[1])
return 1
