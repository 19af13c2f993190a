#!lua
-- Mark an effect: its status and detail when given; reconciled_at = now if asked and
-- still null (idempotent); updated_at = now.
-- KEYS[1] the effects hash (see record_effect.lua), KEYS[2] the set of effects that
-- need reconciling (a sorted set scored by recorded_at).
-- ARGV[1] idempotency key, ARGV[2] status or '' to keep it, ARGV[3] '=' .. detail JSON
-- or '-' to keep it, ARGV[4] '1' to mark it reconciled, else '0'.
-- Returns the row after (JSON text), or false if there is no such effect.
local found = redis.call('HGET', KEYS[1], ARGV[1])
if not found then
  return false
end
local row = cjson.decode(found)
local now = int_text(now_us())
if ARGV[2] ~= '' then
  row[7] = ARGV[2]
end
if string.sub(ARGV[3], 1, 1) == '=' then
  row[8] = string.sub(ARGV[3], 2)
end
if ARGV[4] == '1' and row[10] == cjson.null then
  row[10] = now
  redis.call('ZREM', KEYS[2], ARGV[1])
end
row[12] = now
found = cjson.encode(row)
redis.call('HSET', KEYS[1], ARGV[1], found)
return found
