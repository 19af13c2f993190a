#!lua
-- Declare (or redeclare) a guarded table: the set of its column names.
-- KEYS[1] the declaration set; ARGV the column names.
redis.call('DEL', KEYS[1])
redis.call('SADD', KEYS[1], unpack(ARGV))
return #ARGV
