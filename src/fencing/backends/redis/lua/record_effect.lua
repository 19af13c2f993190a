#!lua
-- Record an effect unless its idempotency key exists: the first recording wins, and
-- every later one gets the stored row back unchanged.
-- KEYS[1] the effects hash: idempotency key -> the row, a JSON array in the order of
--         fencing._effects.EFFECT_COLUMNS (times are integer microseconds of the
--         server's clock, as text; absent values are null)
-- KEYS[2] the intent's index: a sorted set of its effects' keys scored by recorded_at
-- ARGV[1..7] idempotency_key, scope, record_key, intent_id, transition, name, status
-- ARGV[8] '=' .. the detail JSON, or '-' for none
-- Returns the stored row (JSON text).
local found = redis.call('HGET', KEYS[1], ARGV[1])
if found then
  return found
end
local now = int_text(now_us())
local detail = cjson.null
if string.sub(ARGV[8], 1, 1) == '=' then
  detail = string.sub(ARGV[8], 2)
end
local row = cjson.encode({ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7],
  detail, cjson.null, cjson.null, now, now})
redis.call('HSET', KEYS[1], ARGV[1], row)
-- the score: an integer below 2^53, which Redis holds exactly
redis.call('ZADD', KEYS[2], now, ARGV[1])
return row
