-- Shared by every fencing script: the loader puts it right after the script's
-- first line (its #!lua shebang). Nothing here writes.
--
-- Times are integer microseconds of the server's clock (TIME); numbers that go
-- back to Redis or to the client are formatted as integer text, never "%.14g".

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int_text(n)
  return string.format('%.0f', n)
end

-- Versions are compared as canonical decimal text, so they stay exact past 2^53.
local function canonical(v)
  return v == '0' or string.match(v, '^%-?[1-9]%d*$') ~= nil
end

-- JSON equality of a guard value: true is not 1, 1 equals 1.0, null equals null.
local function same(have, want)
  if type(have) ~= type(want) then
    return false
  end
  if type(have) == 'table' then
    return false -- guards hold scalars only
  end
  return have == want
end

-- Load the record of a commit or probe and judge it, in the order of
-- fencing._rules.judge(): missing, duplicate, fenced, stale.
--
-- KEYS[1] the record: a collection's hash (fields v, f, s) or a user-owned table row
-- KEYS[2] the record's applied intent ids: a sorted set scored by applied time
-- KEYS[3] a table row's fence (a string); for a collection, KEYS[1] again (field f)
-- KEYS[4] the lease hash (fields token, owner, exp), only for a fenced commit
-- ARGV[1] 'c' (collection) or 't' (table)   ARGV[2] the intent's claim (its root id)
-- ARGV[3] expected version, '' for none      ARGV[4] lease token, '' for none
-- ARGV[5] guard JSON, '' for none            ARGV[6] table version field, '' for none
-- ARGV[7] table key field (never part of the state)
--
-- Returns status, version, fence, data, applied, ltoken, lowner, lexp, now: plain values,
-- no table (this runs on every commit). version and fence are text; data is a collection
-- record's state JSON (read only when needed: a guard, a refusal, a probe; false
-- otherwise) or a table row's HGETALL; applied is 0/1; the lease fields are false when
-- absent; now is the server clock in microseconds. A table row without an integer version
-- field gives status 'error' and the error reply in place of version.
local function judge()
  local kind, id, expected, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  local guard = ARGV[5]
  local now = now_us()
  local version, fence, data, fields
  if kind == 'c' then
    local r = redis.call('HMGET', KEYS[1], 'v', 'f')
    if not r[1] then
      return 'missing', false, false, false, 0, false, false, false, now
    end
    version, fence, data = r[1], r[2], false
  else
    local vfield, kfield = ARGV[6], ARGV[7]
    data = redis.call('HGETALL', KEYS[1])
    if #data == 0 then
      return 'missing', false, false, false, 0, false, false, false, now
    end
    fence = redis.call('GET', KEYS[3]) or '0'
    fields = {}
    for i = 1, #data, 2 do
      fields[data[i]] = data[i + 1]
    end
    if vfield == '' then
      version = '0'
    else
      version = fields[vfield]
      if not version or not canonical(version) then
        return 'error', redis.error_reply('FENCING_SCHEMA table row ' .. KEYS[1]
          .. ' has no integer ' .. vfield .. ' field (NULL or missing)')
      end
      fields[vfield] = nil
    end
    fields[kfield] = nil
  end
  local applied = 0
  if redis.call('ZSCORE', KEYS[2], id) then
    applied = 1
  end
  local ltoken, lowner, lexp = false, false, false
  if token ~= '' then
    local l = redis.call('HMGET', KEYS[4], 'token', 'owner', 'exp')
    ltoken, lowner, lexp = l[1], l[2], l[3]
  end
  local status = 'ok'
  if applied == 1 then
    status = 'duplicate'
  elseif token ~= '' and (tonumber(fence) > tonumber(token) or ltoken ~= token) then
    status = 'fenced_newer'
  elseif token ~= '' and (not lowner or tonumber(lexp) <= now) then
    status = 'fenced_expired'
  elseif expected ~= '' and version ~= expected then
    status = 'stale'
  elseif guard ~= '' then
    local want = cjson.decode(guard)
    if kind == 'c' then
      data = redis.call('HGET', KEYS[1], 's')
      local state = cjson.decode(data)
      for name, value in pairs(want) do
        local have = state[name]
        if have == nil or not same(have, value) then
          status = 'stale'
          break
        end
      end
    else
      -- a table row holds text: the client sent each guard value as that text,
      -- or null for "the field is absent"
      for name, value in pairs(want) do
        local have = fields[name]
        if value == cjson.null then
          if have ~= nil then
            status = 'stale'
            break
          end
        elseif have ~= value then
          status = 'stale'
          break
        end
      end
    end
  end
  return status, version, fence, data, applied, ltoken, lowner, lexp, now
end

-- The reply of commit.lua and probe.lua when nothing was written (or a probe): the
-- status, the record and the facts it was judged on (the client may run judge() on them):
-- {status, version, fence, state JSON or row, applied, ltoken, lowner, lexp, now}.
local function judged(status, version, fence, data, applied, ltoken, lowner, lexp, now)
  if status == 'error' then
    return version
  end
  if ARGV[1] == 'c' and status ~= 'missing' and not data then
    data = redis.call('HGET', KEYS[1], 's')
  end
  return {status, version, fence, data, applied, ltoken, lowner, lexp, int_text(now)}
end
