-- anarchon, Redis `lease` strategy: manual-run requests (an operator's
-- "run now"), each step one atomic script on Redis's clock (TIME).
-- Mirrors: the request_run, run_requests and (for requests)
-- collect_garbage of anarchon_core::MemoryStore, with
-- anarchon_core::request::stamp.
--
-- KEYS[1] {p}:requests  hash: '<job> <id>' -> '<requested_at> <from> <to>'
--                       then ' <by>' when an author was given; from and to
--                       are a backfill's range (ms), '-' for a manual run
-- KEYS[2] {p}:requested hash: job -> the job's latest stamp (never deleted,
--                       so a stamp never repeats after a collection)
-- Both keys carry the namespace's hash tag only: every step touches one
-- hash slot.
--
-- 'request': ARGV[2] job  ARGV[3] id  ARGV[4] '1' if an author follows
--            ARGV[5] by  ARGV[6] from  ARGV[7] to ('-' for a manual run)
--            Returns {1 if written else 0, requested_at, has_by, by, from, to}.
-- 'read':    Returns {now, field, value, field, value, ...}.
-- 'collect': ARGV[2] keep (ms). Forgets requests stamped before now - keep.
--            Returns {the number forgotten}.
-- Runs after lease_prelude.lua (check, read, int, now).

local bad = check(KEYS[1], 'hash') or check(KEYS[2], 'hash')
if bad then return redis.error_reply(bad) end
local op = ARGV[1]

local function parse(value)
  local at, from, to, rest = string.match(value, '^(%d+) (%S+) (%S+)(.*)$')
  if not at then return value, '0', '', '-', '-' end
  if rest ~= '' then return at, '1', string.sub(rest, 2), from, to end
  return at, '0', '', from, to
end

if op == 'read' then
  local out = {int(now)}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do out[#out + 1] = all[i] end
  return out
end

if op == 'collect' then
  local before = now - tonumber(ARGV[2])
  local all = redis.call('HGETALL', KEYS[1])
  local gone = 0
  for i = 1, #all, 2 do
    -- An entry whose stamp cannot be read can never be run: it goes too.
    local at = tonumber((parse(all[i + 1])))
    if not at or at < before then
      redis.call('HDEL', KEYS[1], all[i])
      gone = gone + 1
    end
  end
  return {gone}
end

if op ~= 'request' then
  return redis.error_reply('ERR anarchon: unknown request step ' .. tostring(op))
end

local job, id = ARGV[2], ARGV[3]
local field = job .. ' ' .. id
local stored = redis.call('HGET', KEYS[1], field)
if stored then
  local at, has_by, by, from, to = parse(stored)
  return {0, at, has_by, by, from, to}
end
local at = now
local latest = tonumber(redis.call('HGET', KEYS[2], job))
if latest and latest >= at then at = latest + 1 end
local value = int(at) .. ' ' .. ARGV[6] .. ' ' .. ARGV[7]
if ARGV[4] == '1' then value = value .. ' ' .. ARGV[5] end
redis.call('HSET', KEYS[1], field, value)
redis.call('HSET', KEYS[2], job, int(at))
return {1, int(at), ARGV[4], ARGV[5], ARGV[6], ARGV[7]}
