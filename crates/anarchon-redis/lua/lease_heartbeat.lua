-- anarchon, Redis `lease` strategy: heartbeat, release, give-back and finish.
-- Mirrors: anarchon_core::decide::heartbeat (step 'renew'),
-- decide::release ('release'), decide::give_back ('give_back') and
-- decide::finish ('finish').
-- Sent alone (heartbeat, release, give-back) it is a script of its own;
-- for finishes it is the body of `local function step(KEYS, ARGV)`, which
-- lease_step_batch.lua calls once per finish of a group.
-- One script for the four steps a runner takes on its own run; each is
-- allowed only while the run is running under the caller's token, except
-- that a finish sent again by the token that finished the run, with the
-- same final state, gets the same answer as the first time.
--
-- KEYS[1] runs (hash)  KEYS[2] live (sorted set)
-- ARGV[1] slot  ARGV[2] token
-- ARGV[3] step: 'renew', 'release', 'give_back' or 'finish'
-- renew:   ARGV[4] lease (ms)
-- finish:  ARGV[4] final state  ARGV[5] '1' if there is an error  ARGV[6] error
--          ARGV[7] for a failure that asks for a retry, how long after now
--          it is due (ms), else ''  ARGV[8] the job's next slot (ms): a retry
--          due at or after it is not made  ARGV[9] what such a failure's
--          error gets added (anarchon_core::retry::NOT_RETRIED)
--
-- A failure whose retry is made keeps its due time as retry_at and stays
-- in live, scored by it: until then it counts as a run still going.
--
-- Returns {1, now} if the token holds the run (the step was done), else {0, now}.
-- Runs after lease_prelude.lua (check, read, int, now). No key's type is
-- checked up front: reading the run hash checks it, and every step's first
-- write is to the live set, through read(), so a live set of the wrong type
-- stops the step before anything is changed.

local slot, token, which = ARGV[1], ARGV[2], ARGV[3]

local raw, refused = read('HGET', KEYS[1], 'hash', slot)
if refused then return redis.error_reply(refused) end
if not raw then return {0, now} end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then
  return redis.error_reply('ERR anarchon: the record of slot ' .. slot .. ' in ' .. KEYS[1] .. ' is not valid JSON')
end
if rec.token ~= token then return {0, now} end
if rec.state ~= 'running' then
  -- A finish sent again by the token that finished the run, with the same
  -- end: it was recorded (its answer was lost); nothing changes.
  if which == 'finish' and rec.state == ARGV[4] then return {1, now} end
  return {0, now}
end
-- The step's first write, to the live set: an error when it is not one.
local function live(command, ...)
  local _, wrong = read(command, KEYS[2], 'zset', ...)
  return wrong
end
local wrong

if which == 'renew' then
  local lease_until = now + tonumber(ARGV[4])
  rec.lease = int(lease_until)
  wrong = live('ZADD', int(lease_until), slot)
elseif which == 'release' then
  -- A lease is alive while its end >= now: one millisecond ago has run out.
  rec.lease = int(now - 1)
  wrong = live('ZADD', int(now - 1), slot)
elseif which == 'give_back' then
  -- Released before the handler started: no holder tells the next
  -- takeover that this attempt was not used.
  rec.lease = int(now - 1)
  rec.token = nil
  wrong = live('ZADD', int(now - 1), slot)
elseif which == 'finish' then
  rec.state = ARGV[4]
  rec.finished = int(now)
  if ARGV[5] == '1' then rec.error = ARGV[6] else rec.error = nil end
  rec.retry_at = nil
  local after = tonumber(ARGV[7] or '')
  if after then
    local due = now + after
    if due < tonumber(ARGV[8]) then
      rec.retry_at = int(due)
    else
      rec.error = (rec.error or '') .. ARGV[9]
    end
  end
  if rec.retry_at then
    wrong = live('ZADD', rec.retry_at, slot)
  else
    wrong = live('ZREM', slot)
  end
else
  return redis.error_reply('ERR anarchon: unknown step ' .. which)
end
if wrong then return redis.error_reply(wrong) end
redis.call('HSET', KEYS[1], slot, cjson.encode(rec))
return {1, now}
