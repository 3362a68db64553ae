-- anarchon, Redis `lease` strategy: the claim flowchart as one atomic step
-- on Redis's own clock (TIME).
-- Mirrors: anarchon_core::decide::claim, steps 1-6 (TIME is read up front
-- and the pauses are read in the same script, so as decide::claim_at; the
-- live runs only for `overlap = skip`).
--
-- KEYS[1] runs   hash: slot -> run record (JSON)
-- KEYS[2] slots  sorted set: every recorded slot, scored by its instant
-- KEYS[3] live   sorted set: the live slots, scored by when they stop being
--         live: running ones by their lease end, failed ones whose retry is
--         pending by the retry's due time
-- KEYS[4] fence  counter: the job's last fence (never deleted)
-- KEYS[5] window string: the longest max_late (ms) of the job's claims,
--         which garbage collection keeps the job's runs for (never deleted)
-- KEYS[6] the job's pause        hash: since, until (absent: until resumed), reason, by
-- KEYS[7] the namespace's pause  hash, the same fields ({p}:pause: in Redis
--         Cluster it would lie in another hash slot than the job's keys)
-- ARGV[1] slot (ms)  ARGV[2] token  ARGV[3] instance  ARGV[4] max_late (ms)
-- ARGV[5] lease (ms) ARGV[6] 'skip' or 'allow'  ARGV[7] max_attempts
-- ARGV[8] '1' if the claim may start a slot recorded `paused` (a backfill)
--
-- Returns {kind, attempt, fence, lease_until, now, state, earlier}; kind is
-- one of won, running, done, late, overlap. earlier is the run's past
-- attempts as JSON for a won answer (the Rust side tells from it how the
-- attempt came to run), '' otherwise and for none.
--
-- A record's fields (all text but earlier): state, attempt, token, fence,
-- instance, started, finished, lease (its end), error, retry_at (a failed
-- run's pending retry is due then) and earlier (an array of the attempts
-- that ended: attempt, ended 'failed' or 'taken-over', at, instance, error;
-- absent while there are none).
-- Runs after lease_prelude.lua (check, int, now).

local bad = check(KEYS[1], 'hash') or check(KEYS[2], 'zset') or check(KEYS[3], 'zset')
  or check(KEYS[4], 'string') or check(KEYS[5], 'string')
  or check(KEYS[6], 'hash') or check(KEYS[7], 'hash')
if bad then return redis.error_reply(bad) end

local slot, token, instance = ARGV[1], ARGV[2], ARGV[3]
local max_late, lease = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_attempts = tonumber(ARGV[7])

local window = tonumber(redis.call('GET', KEYS[5]) or '0') or 0
if max_late > window then redis.call('SET', KEYS[5], int(max_late)) end

local rec = nil
local raw = redis.call('HGET', KEYS[1], slot)
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' then
    return redis.error_reply('ERR anarchon: the record of slot ' .. slot .. ' in ' .. KEYS[1] .. ' is not valid JSON')
  end
  rec = decoded
end
local state = rec and rec.state or nil

local function write(r)
  redis.call('HSET', KEYS[1], slot, cjson.encode(r))
  -- Scored by the slot's instant: a manual run's slot is its request time
  -- negated (anarchon_core::Slot::at), so history and collection go by time.
  redis.call('ZADD', KEYS[2], math.abs(tonumber(slot)), slot)
end

-- Whether the pause under `key` holds at now: there is one, and it lasts
-- until resumed or ends after now.
local function holds(key)
  local pause = redis.call('HMGET', key, 'since', 'until')
  if not pause[1] then return false end
  return not pause[2] or now < tonumber(pause[2])
end

-- 5 and 6. No record, or only a `missed` one (or, for a backfill, a
-- `paused` one).
local rerun_paused = state == 'paused' and ARGV[8] == '1'
if state == nil or state == 'missed' or rerun_paused then
  -- 5. The job or every job is paused: a fresh slot is recorded `paused`
  -- (nobody's, like a skipped one); a missed or paused slot stays so.
  if holds(KEYS[6]) or holds(KEYS[7]) then
    if state == nil then
      write({state = 'paused', finished = int(now)})
      return {'done', 0, 0, 0, now, 'paused', ''}
    end
    if rerun_paused then return {'done', 0, 0, 0, now, 'paused', ''} end
    return {'late', 0, 0, 0, now, '', ''}
  end
  -- 6. Late, overlapping, or it starts.
  if now - math.abs(tonumber(slot)) > max_late then
    if state == nil then write({state = 'missed', finished = int(now)}) end
    return {'late', 0, 0, 0, now, '', ''}
  end
  if ARGV[6] == 'skip' then
    -- Live runs only: a lease end or a pending retry's due time >= now. At
    -- most two, one may be this slot.
    local live = redis.call('ZRANGEBYSCORE', KEYS[3], int(now), '+inf', 'LIMIT', 0, 2)
    for _, other in ipairs(live) do
      if other ~= slot then
        write({state = 'skipped', finished = int(now)})
        return {'overlap', 0, 0, 0, now, '', ''}
      end
    end
  end
  local fence = redis.call('INCR', KEYS[4])
  local lease_until = now + lease
  write({state = 'running', attempt = '1', token = token, fence = int(fence),
         instance = instance, started = int(now), lease = int(lease_until)})
  redis.call('ZADD', KEYS[3], int(lease_until), slot)
  return {'won', 1, fence, lease_until, now, 'running', ''}
end

-- 1. Finished (succeeded, failed, interrupted, skipped, paused): done,
-- except a failed run whose retry is pending. That one counts as still
-- going until the retry is due; from then on any claim starts the retry
-- with the next attempt, neither late nor paused (it belongs to a run that
-- started). Checked here, off the path of a running record. The failed
-- attempt joins the past attempts, with when it failed and its error.
if state ~= 'running' then
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
  local failed = tonumber(rec.attempt)
  if failed then
    local past = rec.earlier or {}
    past[#past + 1] = {attempt = failed, ended = 'failed', at = tonumber(rec.finished),
                       instance = rec.instance, error = rec.error}
    rec.earlier = past
  end
  local attempt = (failed or 1) + 1
  local fence = redis.call('INCR', KEYS[4])
  local lease_until = now + lease
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

local attempt, fence, lease_until = tonumber(rec.attempt), tonumber(rec.fence), tonumber(rec.lease)
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
return {'done', 0, 0, 0, now, 'interrupted', ''}
