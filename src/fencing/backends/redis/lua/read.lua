#!lua flags=no-writes
-- Read a user-owned table row and its fence in one step.
-- KEYS[1] the row hash, KEYS[2] the row's fence key.
-- Returns false when the row does not exist, else {fence text, HGETALL of the row}.
local row = redis.call('HGETALL', KEYS[1])
if #row == 0 then
  return false
end
return {redis.call('GET', KEYS[2]) or '0', row}
