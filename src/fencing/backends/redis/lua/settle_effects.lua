#!lua
-- Settle an intent's effects: outcome = ARGV[3] (and updated_at = now) where it is
-- still null; those not yet reconciled join the set of effects that need reconciling.
-- KEYS[1] the effects hash (see record_effect.lua), KEYS[2] the intent's index,
-- KEYS[3] the set of effects that need reconciling (scored by recorded_at).
-- ARGV[1] scope, ARGV[2] intent id (the root id), ARGV[3] outcome.
-- Returns every effect of the intent after, oldest first (recorded_at, then key): the
-- index's own order, as its scores are recorded_at and ties sort by member.
local keys = redis.call('ZRANGE', KEYS[2], 0, -1)
local out = {}
local now = false
for _, key in ipairs(keys) do
  local found = redis.call('HGET', KEYS[1], key)
  if found then
    local row = cjson.decode(found)
    -- the index key is a digest of (scope, intent id): the row is the authority
    if row[2] == ARGV[1] and row[4] == ARGV[2] then
      if row[9] == cjson.null then
        now = now or int_text(now_us())
        row[9] = ARGV[3]
        row[12] = now
        found = cjson.encode(row)
        redis.call('HSET', KEYS[1], key, found)
        if row[10] == cjson.null then
          redis.call('ZADD', KEYS[3], row[11], key)
        end
      end
      out[#out + 1] = found
    end
  end
end
return out
