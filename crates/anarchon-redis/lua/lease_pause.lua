-- anarchon, Redis `lease` strategy: the operator's pauses (pause, resume,
-- read), each one atomic step on Redis's clock (TIME).
-- Mirrors: anarchon_core::control::PauseRequest::at ('pause': an end that
-- is not after now is refused and nothing is written; the Rust side refuses
-- a pause for zero time before it sends anything) and the pause, resume and
-- pauses of anarchon_core::MemoryStore.
--
-- A pause is a hash: since (ms), until (ms; absent for "until resumed"),
-- reason and by (absent when not given). The job's lives at {p:job}:pause,
-- the namespace's at {p}:pause; the set {p}:pauses lists the scopes that
-- have one ('*' for the namespace, else the job's name), so the pauses can
-- be read without scanning the keyspace.
--
-- 'pause':  KEYS[1] the scope's pause  KEYS[2] the index {p}:pauses
--           ARGV[2] scope ('*' or the job)  ARGV[3] 'resumed', 'at' or 'for'
--           ARGV[4] the end (ms, for 'at') or the length (ms, for 'for')
--           ARGV[5] '1' if a reason follows  ARGV[6] reason
--           ARGV[7] '1' if an author follows  ARGV[8] by
--           Returns {'paused', now, until or ''} or {'refused', now, ''}.
-- 'resume': KEYS[1] the scope's pause  KEYS[2] the index  ARGV[2] scope
--           Returns {1 if there was a pause else 0, now}.
--           In Redis Cluster a job's pause and the index lie in two hash
--           slots: there 'pause' and 'resume' get KEYS[1] only and leave
--           the index to the caller (SADD before a pause, SREM after a
--           resume, so the index never misses a pause).
-- 'read':   KEYS[1..n] pauses  ARGV[2..n+1] their scopes
--           Returns {now, {scope, since, until, has_reason, reason, has_by, by}, ...}
--           for the keys that hold a pause ('' for what it does not have).
-- Runs after lease_prelude.lua (check, read, int, now).

local op = ARGV[1]

if op == 'read' then
  for i = 1, #KEYS do
    local bad = check(KEYS[i], 'hash')
    if bad then return redis.error_reply(bad) end
  end
  local out = {now}
  for i = 1, #KEYS do
    local p = redis.call('HMGET', KEYS[i], 'since', 'until', 'reason', 'by')
    if p[1] then
      out[#out + 1] = {ARGV[i + 1], p[1], p[2] or '', p[3] and '1' or '0', p[3] or '',
                       p[4] and '1' or '0', p[4] or ''}
    end
  end
  return out
end

local index = KEYS[2]
local bad = check(KEYS[1], 'hash') or (index and check(index, 'set')) or nil
if bad then return redis.error_reply(bad) end
local scope = ARGV[2]

if op == 'resume' then
  local removed = redis.call('DEL', KEYS[1])
  if index then redis.call('SREM', index, scope) end
  return {removed, now}
end

if op ~= 'pause' then
  return redis.error_reply('ERR anarchon: unknown pause step ' .. tostring(op))
end

local kind, value = ARGV[3], ARGV[4]
local till = nil
if kind == 'at' then
  -- The end is stored as given; it must be after now on Redis's clock.
  if tonumber(value) <= now then return {'refused', now, ''} end
  till = value
elseif kind == 'for' then
  local length = tonumber(value)
  if not length or length < 0 then
    return redis.error_reply('ERR anarchon: a pause length must be a number of ms, not ' .. tostring(value))
  end
  till = int(now + length)
elseif kind ~= 'resumed' then
  return redis.error_reply('ERR anarchon: unknown pause end ' .. tostring(kind))
end

-- A new pause replaces the scope's pause whole.
redis.call('DEL', KEYS[1])
local fields = {'since', int(now)}
if till then fields[#fields + 1] = 'until'; fields[#fields + 1] = till end
if ARGV[5] == '1' then fields[#fields + 1] = 'reason'; fields[#fields + 1] = ARGV[6] end
if ARGV[7] == '1' then fields[#fields + 1] = 'by'; fields[#fields + 1] = ARGV[8] end
redis.call('HSET', KEYS[1], unpack(fields))
if index then redis.call('SADD', index, scope) end
return {'paused', now, till or ''}
