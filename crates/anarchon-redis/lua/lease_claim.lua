-- anarchon, Redis `lease` strategy: the claim flowchart as one atomic step
-- on Redis's own clock (TIME).
-- Mirrors: anarchon_core::decide::claim, steps 1-6 (TIME is read up front
-- and the pauses are read in the same script, so as decide::claim_at; the
-- live runs only for `overlap = skip` and `buffer-one`, the waiting slot
-- only for `buffer-one`), and what anarchon_core::MemoryStore's claim_one
-- writes for each decision.
--
-- KEYS[1] runs   hash: slot -> run record (JSON)
-- KEYS[2] slots  sorted set: every recorded slot, scored by its instant
-- KEYS[3] live   sorted set: the live slots, scored by when they stop being
--         live: running ones by their lease end, failed ones whose retry is
--         pending by the retry's due time. A running run stays in it until
--         it ends (finished, interrupted, replaced or collected), whatever
--         its lease, so `replace` finds every run still going here.
-- KEYS[4] fence  counter: the job's last fence (never deleted)
-- KEYS[5] window string: the longest max_late (ms) of the job's claims,
--         which garbage collection keeps the job's runs for (never deleted)
-- KEYS[6] the job's pause        hash: since, until (absent: until resumed), reason, by
-- KEYS[7] the namespace's pause  hash, the same fields ({p}:pause). In Redis
--         Cluster it lies in another hash slot than the job's keys: there
--         the caller reads it just before and passes it as ARGV[9..11],
--         and KEYS[7] names the job's own pause (not read for this).
-- KEYS[8] waiting sorted set: the slots recorded `waiting` (buffer-one),
--         scored by the end of their wait (the record's lease); at most
--         one whose wait has not ended, by construction
-- ARGV[1] slot (ms)  ARGV[2] token  ARGV[3] instance  ARGV[4] max_late (ms)
-- ARGV[5] lease (ms) ARGV[6] the overlap rule: 'allow', 'skip', 'replace'
-- or 'buffer-one' (anarchon_core::Overlap::as_str)  ARGV[7] max_attempts
-- ARGV[8] '1' if the claim may start a slot recorded `paused` (a backfill)
-- ARGV[9] 'given' when the namespace's pause comes as arguments (Redis
--         Cluster), absent otherwise  ARGV[10] its since ('' for no pause)
-- ARGV[11] its until ('' for until resumed)
--
-- Returns {kind, attempt, fence, lease_until, now, state, earlier}; kind is
-- one of won, running, done, late, overlap, missed (this claim recorded
-- the slot missed), interrupted (this claim ended the run so). earlier is
-- the run's past
-- attempts as JSON for a won answer (the Rust side tells from it how the
-- attempt came to run), '' otherwise and for none.
--
-- A record's fields (all text but earlier): state, attempt, token, fence,
-- instance, started, finished, lease (its end; for a `waiting` slot the
-- end of its wait), error, retry_at (a failed run's pending retry is due
-- then) and earlier (an array of the attempts that ended: attempt, ended
-- 'failed' or 'taken-over', at, instance, error; absent while there are
-- none).
-- Runs after lease_prelude.lua (check, read, int, now).
--
-- Most claims of a slot find it running or ended: in a fleet of N, N - 1
-- claims lose. Those read one field and write nothing, so they check no
-- key's type: Redis itself refuses to read a run hash of the wrong type.
-- A claim that will write checks every key it may write first, so a
-- wrong-typed key stops it before anything is changed.

local slot, token, instance = ARGV[1], ARGV[2], ARGV[3]
local max_late, lease = tonumber(ARGV[4]), tonumber(ARGV[5])
local rule = ARGV[6]
local max_attempts = tonumber(ARGV[7])

local rec = nil
local raw, refused = read('HGET', KEYS[1], 'hash', slot)
if refused then return redis.error_reply(refused) end
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' then
    return redis.error_reply('ERR anarchon: the record of slot ' .. slot .. ' in ' .. KEYS[1] .. ' is not valid JSON')
  end
  rec = decoded
end
local state = rec and rec.state or nil

-- A slot that has not run yet: no record, a `missed` one, a `waiting` one,
-- or (for a backfill) a `paused` one. Only such a claim reads or writes the
-- waiting set, so only it checks that key's type (before anything is
-- written): a claim that finds a running run costs what it did.
local rerun_paused = state == 'paused' and ARGV[8] == '1'
local not_yet_run = state == nil or state == 'missed' or state == 'waiting' or rerun_paused

-- The answers that write nothing: steps 1 (ended, or a retry not yet
-- due), 2 (our own claim again) and 3 (someone else's live lease).
local attempt, fence, lease_until
if state == 'running' then
  attempt, fence, lease_until = tonumber(rec.attempt), tonumber(rec.fence), tonumber(rec.lease)
  if not attempt or not fence or not lease_until then
    return redis.error_reply('ERR anarchon: the running record of slot ' .. slot .. ' in ' .. KEYS[1] .. ' lacks attempt, fence or lease')
  end
  -- 2. Our own claim, sent again (with the past attempts, as every won
  -- answer: '' for none).
  if rec.token == token then
    return {'won', attempt, fence, lease_until, now, 'running',
            rec.earlier and cjson.encode(rec.earlier) or ''}
  end
  -- 3. Someone else's live lease.
  if lease_until >= now then
    return {'running', attempt, fence, lease_until, now, 'running', ''}
  end
elseif not not_yet_run then
  -- 1. Finished (succeeded, failed, interrupted, skipped, paused,
  -- replaced): done, except a failed run whose retry is pending. That one
  -- counts as still going until the retry is due.
  if state ~= 'failed' or rec.retry_at == nil then
    return {'done', 0, 0, 0, now, state, ''}
  end
  local retry_at = tonumber(rec.retry_at)
  if not retry_at then
    return redis.error_reply('ERR anarchon: the failed record of slot ' .. slot .. ' in ' .. KEYS[1] .. ' has a retry_at that is not a number')
  end
  if now < retry_at then
    return {'running', 0, 0, retry_at, now, 'failed', ''}
  end
end

-- This claim may write. A key it reads before its first write is checked
-- by that read (the late window here, the pauses and the waiting set
-- below); a key it only writes is checked now.
local bad = check(KEYS[2], 'zset') or check(KEYS[3], 'zset') or check(KEYS[4], 'string')
  or (state == 'waiting' and check(KEYS[8], 'zset')) or nil
if bad then return redis.error_reply(bad) end
local stored, refused = read('GET', KEYS[5], 'string')
if refused then return redis.error_reply(refused) end
local window = tonumber(stored or '0') or 0

local function write(r)
  -- The job's late window grows with the first record this claim writes.
  if max_late > window then
    redis.call('SET', KEYS[5], int(max_late))
    window = max_late
  end
  redis.call('HSET', KEYS[1], slot, cjson.encode(r))
  -- Scored by the slot's instant: a manual run's slot is its request time
  -- negated (anarchon_core::Slot::at), so history and collection go by time.
  redis.call('ZADD', KEYS[2], math.abs(tonumber(slot)), slot)
end

-- Whether the pause under `key` holds at now: there is one, and it lasts
-- until resumed or ends after now.
-- (nil and why, when the key is not a hash.)
local function holds(key)
  local pause, wrong = read('HMGET', key, 'hash', 'since', 'until')
  if wrong then return nil, wrong end
  if not pause[1] then return false end
  return not pause[2] or now < tonumber(pause[2])
end

-- Whether another run of the job is live: a lease end or a pending
-- retry's due time >= now. At most two entries, one may be this slot.
local function another_live()
  local live = redis.call('ZRANGEBYSCORE', KEYS[3], int(now), '+inf', 'LIMIT', 0, 2)
  for _, other in ipairs(live) do
    if other ~= slot then return true end
  end
  return false
end

-- 5 and 6. A slot that has not run yet.
if not_yet_run then
  local waiting = state == 'waiting'
  -- Whatever a waiting slot becomes but waiting (paused, missed, skipped
  -- or running), it no longer waits.
  local function stop_waiting()
    if waiting then redis.call('ZREM', KEYS[8], slot) end
  end
  -- 5. The job or every job is paused: a fresh or waiting slot is recorded
  -- `paused` (nobody's, like a skipped one); a missed or paused slot stays
  -- so.
  local job_paused, wrong = holds(KEYS[6])
  if wrong then return redis.error_reply(wrong) end
  local all_paused, wrong_all
  if ARGV[9] == 'given' then
    all_paused = ARGV[10] ~= '' and (ARGV[11] == '' or now < tonumber(ARGV[11]))
  else
    all_paused, wrong_all = holds(KEYS[7])
  end
  if wrong_all then return redis.error_reply(wrong_all) end
  if job_paused or all_paused then
    if state == nil or waiting then
      stop_waiting()
      write({state = 'paused', finished = int(now)})
      return {'done', 0, 0, 0, now, 'paused', ''}
    end
    if rerun_paused then return {'done', 0, 0, 0, now, 'paused', ''} end
    return {'late', 0, 0, 0, now, '', ''}
  end
  -- 6. Late, overlapping, waiting, or it starts. A slot that waited past
  -- its max_late is missed like one never claimed.
  if now - math.abs(tonumber(slot)) > max_late then
    if state == nil or waiting then
      stop_waiting()
      write({state = 'missed', finished = int(now)})
      -- This claim recorded the miss: the one claimant told so.
      return {'missed', 0, 0, 0, now, '', ''}
    end
    return {'late', 0, 0, 0, now, '', ''}
  end
  if rule == 'skip' and another_live() then
    stop_waiting()
    write({state = 'skipped', finished = int(now)})
    return {'overlap', 0, 0, 0, now, '', ''}
  end
  if rule == 'buffer-one' then
    if waiting then
      -- The waiting slot starts once the live run has ended; until then
      -- the caller looks again a lease later.
      if another_live() then return {'running', 0, 0, now + lease, now, 'waiting', ''} end
    else
      -- One slot waits at most: while another's wait lasts, this one is
      -- skipped, even if the live run has just ended.
      local waits, wrong = read('ZRANGEBYSCORE', KEYS[8], 'zset', int(now), '+inf', 'LIMIT', 0, 2)
      if wrong then return redis.error_reply(wrong) end
      for _, other in ipairs(waits) do
        if other ~= slot then
          write({state = 'skipped', finished = int(now)})
          return {'overlap', 0, 0, 0, now, '', ''}
        end
      end
      if another_live() then
        -- Nobody's, until the end of its wait: the slot plus max_late.
        local wait_until = math.abs(tonumber(slot)) + max_late
        write({state = 'waiting', lease = int(wait_until)})
        redis.call('ZADD', KEYS[8], int(wait_until), slot)
        return {'running', 0, 0, now + lease, now, 'waiting', ''}
      end
    end
  end
  if rule == 'replace' then
    -- Every other run still going ends `replaced`: those running (whatever
    -- their lease) and those failed with a retry pending or due. Each
    -- keeps its holder, so its heartbeat and finish are fenced. All are
    -- read before anything is written, so a corrupt record stops the claim
    -- with nothing changed.
    local ended = {}
    for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '+inf')) do
      if other ~= slot then
        local other_raw = redis.call('HGET', KEYS[1], other)
        local r = nil
        if other_raw then
          local ok, decoded = pcall(cjson.decode, other_raw)
          if not ok or type(decoded) ~= 'table' then
            return redis.error_reply('ERR anarchon: the record of slot ' .. other .. ' in ' .. KEYS[1] .. ' is not valid JSON')
          end
          r = decoded
        end
        ended[#ended + 1] = {other, r}
      end
    end
    for _, pair in ipairs(ended) do
      local other, r = pair[1], pair[2]
      if r and (r.state == 'running' or (r.state == 'failed' and r.retry_at ~= nil)) then
        r.state = 'replaced'
        r.finished = int(now)
        r.retry_at = nil
        redis.call('HSET', KEYS[1], other, cjson.encode(r))
      end
      redis.call('ZREM', KEYS[3], other)
    end
  end
  stop_waiting()
  local fence = redis.call('INCR', KEYS[4])
  local lease_until = now + lease
  write({state = 'running', attempt = '1', token = token, fence = int(fence),
         instance = instance, started = int(now), lease = int(lease_until)})
  redis.call('ZADD', KEYS[3], int(lease_until), slot)
  return {'won', 1, fence, lease_until, now, 'running', ''}
end

-- 1, continued. A failed run whose retry is due: any claim starts the
-- retry with the next attempt, neither late nor paused (it belongs to a run
-- that started). The failed attempt joins the past attempts, with when it
-- failed and its error.
if state ~= 'running' then
  local failed = tonumber(rec.attempt)
  if failed then
    local past = rec.earlier or {}
    past[#past + 1] = {attempt = failed, ended = 'failed', at = tonumber(rec.finished),
                       instance = rec.instance, error = rec.error}
    rec.earlier = past
  end
  attempt = (failed or 1) + 1
  fence = redis.call('INCR', KEYS[4])
  lease_until = now + lease
  rec.state = 'running'
  rec.attempt = int(attempt)
  rec.token = token
  rec.fence = int(fence)
  rec.instance = instance
  rec.lease = int(lease_until)
  rec.finished = nil
  rec.error = nil
  rec.retry_at = nil
  write(rec)
  redis.call('ZADD', KEYS[3], int(lease_until), slot)
  return {'won', attempt, fence, lease_until, now, 'running',
          rec.earlier and cjson.encode(rec.earlier) or ''}
end

-- 4. The lease ran out. A run given back before its handler started (no
-- holder) runs the same attempt again; otherwise the attempt whose lease
-- ran out joins the past attempts, with when its lease ended.
local given_back = rec.token == nil
if given_back or attempt < max_attempts then
  fence = redis.call('INCR', KEYS[4])
  if not given_back then
    local past = rec.earlier or {}
    past[#past + 1] = {attempt = attempt, ended = 'taken-over', at = lease_until,
                       instance = rec.instance}
    rec.earlier = past
    attempt = attempt + 1
  end
  lease_until = now + lease
  rec.attempt = int(attempt)
  rec.token = token
  rec.fence = int(fence)
  rec.instance = instance
  rec.lease = int(lease_until)
  write(rec)
  redis.call('ZADD', KEYS[3], int(lease_until), slot)
  return {'won', attempt, fence, lease_until, now, 'running',
          rec.earlier and cjson.encode(rec.earlier) or ''}
end
rec.state = 'interrupted'
rec.finished = int(now)
write(rec)
redis.call('ZREM', KEYS[3], slot)
-- This claim ended the run: the one claimant told so.
return {'interrupted', 0, 0, 0, now, '', ''}
