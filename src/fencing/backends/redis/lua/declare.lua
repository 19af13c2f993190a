#!lua
-- Declare a guarded table: the set of its column names.
-- KEYS[1] the declaration set; ARGV[1] 'replace' (the set becomes ARGV[2..]) or 'add'
-- (ARGV[2..] join what is declared); ARGV[2..] the column names.
-- Returns the declared names after the change.
if ARGV[1] == 'replace' then
  redis.call('DEL', KEYS[1])
end
redis.call('SADD', KEYS[1], unpack(ARGV, 2))
return redis.call('SMEMBERS', KEYS[1])
