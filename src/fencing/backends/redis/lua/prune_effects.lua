#!lua
-- Forget effects finished with before a cutoff (see fencing._effects.PRUNABLE): not
-- settled and untouched since (the caller checked that their work committed), or
-- reconciled since. Each candidate is judged again
-- here, atomically, on its row as it is now; one that needs reconciling is never
-- removed. Its intent's index loses it too, and goes when empty.
-- KEYS[1] the effects hash; KEYS[1 + i] the index of candidate i's intent.
-- ARGV[1] the cutoff (integer microseconds, text); ARGV[1 + i] candidate i's key.
-- Returns how many effects were removed.
local cutoff = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  local found = redis.call('HGET', KEYS[1], ARGV[i])
  if found then
    local row = cjson.decode(found)
    local done = false
    if row[9] == cjson.null then
      done = tonumber(row[12]) < cutoff
    elseif row[10] ~= cjson.null then
      done = tonumber(row[10]) < cutoff
    end
    if done then
      redis.call('HDEL', KEYS[1], ARGV[i])
      redis.call('ZREM', KEYS[i], ARGV[i])
      if redis.call('ZCARD', KEYS[i]) == 0 then
        redis.call('DEL', KEYS[i])
      end
      removed = removed + 1
    end
  end
end
return removed
