#!lua flags=no-writes
-- Whether an intent's root id is among a record's applied ids (for prune_effects: an
-- unsettled effect is forgotten only once its work committed).
-- KEYS[1] the record's applied set; ARGV[1] the root id. Returns 1 or 0.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 1
end
return 0
