#!lua flags=no-writes
-- Effects as stored (JSON rows, see record_effect.lua), read in one step.
-- KEYS[1] the effects hash; KEYS[2] the index to list (an intent's, or the set of
-- effects that need reconciling), absent when reading one key.
-- ARGV[1] an idempotency key, or '' to list KEYS[2]; ARGV[2] the limit.
-- Returns a list of rows: the key's (none or one), or the index's first ARGV[2],
-- oldest first (the scores are recorded_at; ties sort by key).
if ARGV[1] ~= '' then
  local found = redis.call('HGET', KEYS[1], ARGV[1])
  if found then
    return {found}
  end
  return {}
end
local keys = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1)
local out = {}
for _, key in ipairs(keys) do
  local found = redis.call('HGET', KEYS[1], key)
  if found then
    out[#out + 1] = found
  end
end
return out
