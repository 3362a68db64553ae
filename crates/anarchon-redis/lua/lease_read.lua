-- anarchon, Redis `lease` strategy: peek and history, read-only.
--
-- KEYS[1] runs (hash)  KEYS[2] slots (sorted set)
-- ARGV[1] 'peek' with ARGV[2] slot, or 'history' with ARGV[2] the last rank
-- to read (limit - 1, or -1 for all)
--
-- Returns {now, record, record, ...}; a record is
-- {slot, state, attempt, fence, instance, started, finished, lease, has_error,
--  error, retry_at, earlier}
-- with '' for what the run does not have; earlier is the past attempts as
-- JSON. peek returns {now} for no record.
-- Runs after lease_prelude.lua (check, read, int, now).

local bad = check(KEYS[1], 'hash') or check(KEYS[2], 'zset')
if bad then return redis.error_reply(bad) end

local function record(slot)
  local raw = redis.call('HGET', KEYS[1], slot)
  if not raw then return nil end
  local ok, r = pcall(cjson.decode, raw)
  if not ok or type(r) ~= 'table' then
    return {slot, 'corrupt', '', '', '', '', '', '', '0', '', '', ''}
  end
  local has_error = '0'
  if r.error ~= nil then has_error = '1' end
  local earlier = ''
  if r.earlier ~= nil then earlier = cjson.encode(r.earlier) end
  return {slot, r.state or '', r.attempt or '', r.fence or '', r.instance or '',
          r.started or '', r.finished or '', r.lease or '', has_error, r.error or '',
          r.retry_at or '', earlier}
end

local out = {now}
if ARGV[1] == 'peek' then
  local r = record(ARGV[2])
  if r then out[2] = r end
elseif ARGV[1] == 'history' then
  local slots = redis.call('ZREVRANGE', KEYS[2], 0, ARGV[2])
  for _, slot in ipairs(slots) do
    local r = record(slot)
    if r then out[#out + 1] = r end
  end
else
  return redis.error_reply('ERR anarchon: unknown read ' .. ARGV[1])
end
return out
