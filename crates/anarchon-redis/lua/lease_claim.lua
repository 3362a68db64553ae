-- anarchon, Redis `lease` strategy: the claim flowchart as one atomic step
-- on Redis's own clock (TIME).
-- This file is the body of
-- `local function claim(K, k, A, a, namespace_paused)`, which
-- lease_claim_batch.lua calls once per claim of a batch (see
-- `src/lease.rs`). The claim's keys are K[k + 1 .. k + 7] and its
-- arguments A[a + 1 .. a + 3]: the batch's own KEYS and ARGV, read in
-- place, so a claim costs no tables of its own. namespace_paused() tells
-- whether the pause of every job holds at now (and why not, when it
-- cannot be read); the job's own pause is read with the prelude's holds,
-- once per script.
-- Mirrors: anarchon_core::decide::claim, steps 1-6 (TIME is read up front
-- and the pauses are read in the same script, so as decide::claim_at; the
-- live runs only for `overlap = skip` and `buffer-one`, the waiting slot
-- only for `buffer-one`), and what anarchon_core::MemoryStore's claim_one
-- writes for each decision.
--
-- Keys:
-- k + 1 runs    hash: slot -> run record (JSON)
-- k + 2 slots   sorted set: every recorded slot, scored by its instant
-- k + 3 live    sorted set: the live slots, scored by when they stop being
--       live: running ones by their lease end, failed ones whose retry is
--       pending by the retry's due time. A running run stays in it until
--       it ends (finished, interrupted, replaced or collected), whatever
--       its lease, so `replace` finds every run still going here.
-- k + 4 fence   counter: the job's last fence (never deleted)
-- k + 5 window  string: the longest max_late (ms) of the job's claims,
--       which garbage collection keeps the job's runs for (never deleted)
-- k + 6 the job's pause  hash: since, until (absent: until resumed),
--       reason, by
-- k + 7 waiting sorted set: the slots recorded `waiting` (buffer-one),
--       scored by the end of their wait (the record's lease); at most
--       one whose wait has not ended, by construction
-- Arguments:
-- a + 1 slot (ms)  a + 2 token
-- a + 3 the claim's terms, in one argument, since a losing claim reads
--       none of them: max_late (ms), lease (ms), max_attempts, '1' if the
--       claim may start a slot recorded `paused` (a backfill) or '0', the
--       overlap rule ('allow', 'skip', 'replace' or 'buffer-one':
--       anarchon_core::Overlap::as_str) and the instance, separated by one
--       space each; led by '+' when the caller does not know the job's
--       window to be at least max_late (see "widen" below)
--
-- Returns six values: kind, attempt, fence, lease_until, state, earlier
-- (lease_claim_batch.lua puts them in its answer), or an error reply. kind
-- is one of won, running, done, late, overlap, missed (this claim recorded
-- the slot missed), interrupted (this claim ended the run so). earlier is
-- the run's past attempts as JSON for a won answer (the Rust side tells
-- from it how the attempt came to run), '' otherwise and for none.
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
-- claims lose. Those read one field and write nothing (see the losers'
-- path below), so they check no key's type: Redis itself refuses to read
-- a run hash of the wrong type. (A claim whose terms begin with '+' first
-- reads, and may raise, the job's window: see "Widen" below.)
-- No claim asks a key's TYPE. A key that is read before the first write
-- (the runs, the late window, the pauses, the live and waiting sets where
-- the overlap rule reads them) is checked by that read; the keys that are
-- only written (fence, slots, live) are written first, in that order, each
-- through `read` (a pcall that names the key when Redis refuses its type).
-- So a wrong-typed key stops the claim before the run's record is written:
-- at most the fence has grown (a fence only has to grow) and the slot is
-- listed in `slots` with no record (readers and garbage collection pass
-- over such a slot).

local runs_key, slots_key, live_key = K[k + 1], K[k + 2], K[k + 3]
local fence_key, window_key, job_pause_key, waiting_key = K[k + 4], K[k + 5], K[k + 6], K[k + 7]
local slot, token, terms = A[a + 1], A[a + 2], A[a + 3]

-- Widen: the job's window must cover every claim's max_late, also that of
-- a claim that writes nothing (it finds the slot running or ended): a
-- catch-up claim with a day's window that only finds its slots done must
-- still keep the job's runs from collection for a day, or another
-- service's collection with a shorter keep takes them and the next
-- catch-up runs them again. The caller asks for this ('+') only until a
-- claim with this window was answered, so a fleet's losing claims read
-- no more than before.
if string.byte(terms, 1) == 43 then
  terms = string.sub(terms, 2)
  local asked = tonumber(string.match(terms, '^%d+'))
  local stored, refused = read('GET', window_key, 'string')
  if refused then return redis.error_reply(refused) end
  if asked and asked > (tonumber(stored or '0') or 0) then
    redis.call('SET', window_key, int(asked))
  end
end

local rec = nil
local raw, refused = read('HGET', runs_key, 'hash', slot)
if refused then return redis.error_reply(refused) end
-- The losers' path. In a fleet most claims find someone else's run going
-- or just ended, and decoding its record cost them more than anything
-- else they do. A record that is not ours (our token is nowhere in it)
-- and says it is running with a live lease, or that it succeeded, is
-- answered from its text. This path only answers; it never writes, so it
-- cannot make a second winner: anything it does not recognise goes the
-- full way below. The text is read soundly: records are written by
-- cjson.encode alone, and inside a JSON string every '"' is escaped, so
-- '":"' only ever lies between a key and its string value. The record's
-- own `state` and `lease` are then the only places the searched texts can
-- be (no attempt in `earlier` has either key).
if raw and not string.find(raw, token, 1, true) then
  if string.find(raw, '"state":"running"', 1, true) then
    local at = string.find(raw, '"lease":"', 1, true)
    local lease_until = at and tonumber(string.match(raw, '^%d+', at + 9))
    if lease_until and lease_until >= now then
      return 'running', 0, 0, lease_until, 'running', ''
    end
  elseif string.find(raw, '"state":"succeeded"', 1, true) then
    return 'done', 0, 0, 0, 'succeeded', ''
  end
end

-- The claim's terms: read only past the losers' path, which needs none.
local max_late, lease, max_attempts, backfill, rule, instance =
  string.match(terms, '^(%d+) (%d+) (%d+) ([01]) (%S+) (.+)$')
if not max_late then
  return redis.error_reply('ERR anarchon: the terms of the claim of slot ' .. slot ..
                           ' are not "max_late lease max_attempts backfill rule instance": ' .. terms)
end
max_late, lease, max_attempts = tonumber(max_late), tonumber(lease), tonumber(max_attempts)

if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' then
    return redis.error_reply('ERR anarchon: the record of slot ' .. slot .. ' in ' .. runs_key .. ' is not valid JSON')
  end
  rec = decoded
end
local state = rec and rec.state or nil

-- A slot that has not run yet: no record, a `missed` one, a `waiting` one,
-- or (for a backfill) a `paused` one. Only such a claim reads or writes the
-- waiting set, so only it checks that key's type (before anything is
-- written): a claim that finds a running run costs what it did.
local rerun_paused = state == 'paused' and backfill == '1'
local not_yet_run = state == nil or state == 'missed' or state == 'waiting' or rerun_paused

-- The answers that write nothing: steps 1 (ended, or a retry not yet
-- due), 2 (our own claim again) and 3 (someone else's live lease).
local attempt, fence, lease_until
if state == 'running' then
  attempt, fence, lease_until = tonumber(rec.attempt), tonumber(rec.fence), tonumber(rec.lease)
  if not attempt or not fence or not lease_until then
    return redis.error_reply('ERR anarchon: the running record of slot ' .. slot .. ' in ' .. runs_key .. ' lacks attempt, fence or lease')
  end
  -- 2. Our own claim, sent again (with the past attempts, as every won
  -- answer: '' for none).
  if rec.token == token then
    return 'won', attempt, fence, lease_until, 'running', rec.earlier and cjson.encode(rec.earlier) or ''
  end
  -- 3. Someone else's live lease.
  if lease_until >= now then
    return 'running', attempt, fence, lease_until, 'running', ''
  end
elseif not not_yet_run then
  -- 1. Finished (succeeded, failed, interrupted, skipped, paused,
  -- replaced): done, except a failed run whose retry is pending. That one
  -- counts as still going until the retry is due.
  if state ~= 'failed' or rec.retry_at == nil then
    return 'done', 0, 0, 0, state, ''
  end
  local retry_at = tonumber(rec.retry_at)
  if not retry_at then
    return redis.error_reply('ERR anarchon: the failed record of slot ' .. slot .. ' in ' .. runs_key .. ' has a retry_at that is not a number')
  end
  if now < retry_at then
    return 'running', 0, 0, retry_at, 'failed', ''
  end
end

-- This claim may write. A claim of a waiting slot takes it out of the
-- waiting set after its other writes, so that key is checked now, before
-- any write (a rare path); every other key is checked by a read or by its
-- first write (above).
local bad = state == 'waiting' and check(waiting_key, 'zset') or nil
if bad then return redis.error_reply(bad) end
local stored, refused = read('GET', window_key, 'string')
if refused then return redis.error_reply(refused) end
local window = tonumber(stored or '0') or 0

-- Lists the slot in `slots`, scored by its instant: a manual run's slot is
-- its request time negated (anarchon_core::Slot::at), so history and
-- collection go by time. (nil and why, when the key is not a sorted set.)
local function list_slot()
  local _, wrong = read('ZADD', slots_key, 'zset', math.abs(tonumber(slot)), slot)
  return wrong
end

-- Writes the slot's record (runs and late window are checked by their
-- reads above).
local function put(r)
  -- The job's late window grows with the first record this claim writes.
  if max_late > window then
    redis.call('SET', window_key, int(max_late))
    window = max_late
  end
  redis.call('HSET', runs_key, slot, cjson.encode(r))
end

-- Records an ending that holds no lease (paused, missed, skipped,
-- waiting): the slot is listed first, so a wrong-typed `slots` stops it
-- with nothing written. (nil and why.)
local function write(r)
  local wrong = list_slot()
  if wrong then return wrong end
  put(r)
end

-- Starts the slot's run: a new fence, the slot listed, the run live until
-- `lease_until`, then its record. The keys only written come first, so a
-- wrong-typed one stops the claim before the record is written.
-- (nil and why.)
local function start(r, lease_until)
  local fence, wrong = read('INCR', fence_key, 'string')
  if wrong then return nil, wrong end
  wrong = list_slot()
  if wrong then return nil, wrong end
  local _, not_live = read('ZADD', live_key, 'zset', int(lease_until), slot)
  if not_live then return nil, not_live end
  r.fence = int(fence)
  put(r)
  return fence
end

-- Whether another run of the job is live: a lease end or a pending
-- retry's due time >= now. At most two entries, one may be this slot.
-- (nil and why, when the key is not a sorted set.)
local function another_live()
  local live, wrong = read('ZRANGEBYSCORE', live_key, 'zset', int(now), '+inf', 'LIMIT', 0, 2)
  if wrong then return nil, wrong end
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
    if waiting then redis.call('ZREM', waiting_key, slot) end
  end
  -- Records the slot ended as `r` (it no longer waits). (nil and why.)
  local function end_as(r)
    local wrong = write(r)
    if wrong then return wrong end
    stop_waiting()
  end
  -- 5. The job or every job is paused: a fresh or waiting slot is recorded
  -- `paused` (nobody's, like a skipped one); a missed or paused slot stays
  -- so.
  local job_paused, wrong = holds(job_pause_key)
  if wrong then return redis.error_reply(wrong) end
  local all_paused, wrong_all = namespace_paused()
  if wrong_all then return redis.error_reply(wrong_all) end
  if job_paused or all_paused then
    if state == nil or waiting then
      local wrong = end_as({state = 'paused', finished = int(now)})
      if wrong then return redis.error_reply(wrong) end
      return 'done', 0, 0, 0, 'paused', ''
    end
    if rerun_paused then return 'done', 0, 0, 0, 'paused', '' end
    return 'late', 0, 0, 0, '', ''
  end
  -- 6. Late, overlapping, waiting, or it starts. A slot that waited past
  -- its max_late is missed like one never claimed.
  if now - math.abs(tonumber(slot)) > max_late then
    if state == nil or waiting then
      local wrong = end_as({state = 'missed', finished = int(now)})
      if wrong then return redis.error_reply(wrong) end
      -- This claim recorded the miss: the one claimant told so.
      return 'missed', 0, 0, 0, '', ''
    end
    return 'late', 0, 0, 0, '', ''
  end
  if rule == 'skip' then
    local live, wrong = another_live()
    if wrong then return redis.error_reply(wrong) end
    if live then
      wrong = end_as({state = 'skipped', finished = int(now)})
      if wrong then return redis.error_reply(wrong) end
      return 'overlap', 0, 0, 0, '', ''
    end
  end
  if rule == 'buffer-one' then
    if waiting then
      -- The waiting slot starts once the live run has ended; until then
      -- the caller looks again a lease later.
      local live, wrong = another_live()
      if wrong then return redis.error_reply(wrong) end
      if live then return 'running', 0, 0, now + lease, 'waiting', '' end
    else
      -- One slot waits at most: while another's wait lasts, this one is
      -- skipped, even if the live run has just ended.
      local waits, wrong = read('ZRANGEBYSCORE', waiting_key, 'zset', int(now), '+inf', 'LIMIT', 0, 2)
      if wrong then return redis.error_reply(wrong) end
      for _, other in ipairs(waits) do
        if other ~= slot then
          wrong = write({state = 'skipped', finished = int(now)})
          if wrong then return redis.error_reply(wrong) end
          return 'overlap', 0, 0, 0, '', ''
        end
      end
      local live
      live, wrong = another_live()
      if wrong then return redis.error_reply(wrong) end
      if live then
        -- Nobody's, until the end of its wait: the slot plus max_late.
        local wait_until = math.abs(tonumber(slot)) + max_late
        wrong = write({state = 'waiting', lease = int(wait_until)})
        if wrong then return redis.error_reply(wrong) end
        redis.call('ZADD', waiting_key, int(wait_until), slot)
        return 'running', 0, 0, now + lease, 'waiting', ''
      end
    end
  end
  -- Every other run still going is to end `replaced`: those running
  -- (whatever their lease) and those failed with a retry pending or due.
  -- Each keeps its holder, so its heartbeat and finish are fenced. All are
  -- read before anything is written, so a corrupt record stops the claim
  -- with nothing changed; they are written after this run has started, so
  -- a key that stops the start leaves them as they were.
  local ended = {}
  if rule == 'replace' then
    local going, wrong = read('ZRANGEBYSCORE', live_key, 'zset', '-inf', '+inf')
    if wrong then return redis.error_reply(wrong) end
    for _, other in ipairs(going) do
      if other ~= slot then
        local other_raw = redis.call('HGET', runs_key, other)
        local r = nil
        if other_raw then
          local ok, decoded = pcall(cjson.decode, other_raw)
          if not ok or type(decoded) ~= 'table' then
            return redis.error_reply('ERR anarchon: the record of slot ' .. other .. ' in ' .. runs_key .. ' is not valid JSON')
          end
          r = decoded
        end
        ended[#ended + 1] = {other, r}
      end
    end
  end
  local lease_until = now + lease
  local fence, wrong = start({state = 'running', attempt = '1', token = token,
                              instance = instance, started = int(now), lease = int(lease_until)},
                             lease_until)
  if wrong then return redis.error_reply(wrong) end
  stop_waiting()
  for _, pair in ipairs(ended) do
    local other, r = pair[1], pair[2]
    if r and (r.state == 'running' or (r.state == 'failed' and r.retry_at ~= nil)) then
      r.state = 'replaced'
      r.finished = int(now)
      r.retry_at = nil
      redis.call('HSET', runs_key, other, cjson.encode(r))
    end
    redis.call('ZREM', live_key, other)
  end
  return 'won', 1, fence, lease_until, 'running', ''
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
  lease_until = now + lease
  rec.state = 'running'
  rec.attempt = int(attempt)
  rec.token = token
  rec.instance = instance
  rec.lease = int(lease_until)
  rec.finished = nil
  rec.error = nil
  rec.retry_at = nil
  local wrong
  fence, wrong = start(rec, lease_until)
  if wrong then return redis.error_reply(wrong) end
  return 'won', attempt, fence, lease_until, 'running', rec.earlier and cjson.encode(rec.earlier) or ''
end

-- 4. The lease ran out. A run given back before its handler started (no
-- holder) runs the same attempt again; otherwise the attempt whose lease
-- ran out joins the past attempts, with when its lease ended.
local given_back = rec.token == nil
if given_back or attempt < max_attempts then
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
  rec.instance = instance
  rec.lease = int(lease_until)
  local wrong
  fence, wrong = start(rec, lease_until)
  if wrong then return redis.error_reply(wrong) end
  return 'won', attempt, fence, lease_until, 'running', rec.earlier and cjson.encode(rec.earlier) or ''
end
rec.state = 'interrupted'
rec.finished = int(now)
-- The slot is listed already (listing it again checks the key); the live
-- set is checked by taking the slot out, before the record changes.
local wrong = list_slot()
if wrong then return redis.error_reply(wrong) end
local _, not_live = read('ZREM', live_key, 'zset', slot)
if not_live then return redis.error_reply(not_live) end
put(rec)
-- This claim ended the run: the one claimant told so.
return 'interrupted', 0, 0, 0, '', ''
