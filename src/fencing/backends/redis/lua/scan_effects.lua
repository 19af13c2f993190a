#!lua flags=no-writes
-- One step of a scan of every effect (for prune_effects): HSCAN of the effects hash.
-- KEYS[1] the effects hash. ARGV[1] the HSCAN cursor, ARGV[2] how many to ask for.
-- Returns {next cursor, the server's now (integer microseconds, text), row, row, ...}.
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local out = {page[1], int_text(now_us())}
local items = page[2]
for i = 2, #items, 2 do
  out[#out + 1] = items[i]
end
return out
