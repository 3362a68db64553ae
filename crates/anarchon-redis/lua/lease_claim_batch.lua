-- anarchon, Redis `lease` strategy: claims, one or many in one script.
-- The Rust side sends lease_prelude.lua, then lease_claim.lua as the body of
-- `local function claim(K, k, A, a, namespace_paused)`, then this
-- file (see `src/lease.rs`). On a single Redis one script carries up to a
-- hundred claims; on a Redis Cluster the claims of different jobs lie in
-- different hash slots, so there each script carries one.
--
-- Why: in a fleet every instance claims every run, and all but one of them
-- lose. A losing claim reads one field, yet paid two commands of its own
-- around it (EVALSHA, TIME); one call for a whole batch pays those once.
-- What every claim shares is sent once, not once per claim (the key and
-- the reading of the namespace's pause), and each claim reads its keys and
-- arguments where they lie, in KEYS and ARGV.
--
-- KEYS[1] the namespace's pause ({p}:pause), read at most once. On a Redis
--         Cluster it lies in another hash slot than the job's keys: there
--         the caller reads it just before and passes it as ARGV[1..3], and
--         KEYS[1] names the pause of the script's one job (not read for
--         this).
-- KEYS[2..] the seven keys of lease_claim.lua for each claim, claim after
--         claim.
-- ARGV[1] 'given' when the namespace's pause comes as arguments (Redis
--         Cluster), 'read' for the script to read KEYS[1]  ARGV[2] its
--         since ('' for no pause)  ARGV[3] its until ('' for until resumed)
-- ARGV[4..] the three arguments of lease_claim.lua for each claim, claim
--         after claim.
--
-- Returns a flat array: `now` (the store's clock, ms), then six values
-- per claim, in order: lease_claim.lua's kind, attempt, fence,
-- lease_until, state and earlier. A claim that fails (a key of the wrong
-- type, a corrupt record, a command Redis refuses) has an error reply for
-- its kind and 0, 0, 0, '', '' for the rest, and stops nothing but
-- itself: each runs under pcall, and what it wrote before it failed stays,
-- as it would have as a script of its own. The answer is flat: Redis
-- converts a nested table with lookups of its own, which cost a losing
-- claim about 6% of its instructions (counted with callgrind).
--
-- Every claim of the batch sees the same `now`: the script is one atomic
-- step on Redis, read once from TIME by the prelude.

local KEYS_PER_CLAIM, ARGS_PER_CLAIM = 7, 3
local claims = (#KEYS - 1) / KEYS_PER_CLAIM
if ARGV[1] ~= 'given' and ARGV[1] ~= 'read' then
  return redis.error_reply("ERR anarchon: a batch of claims must say 'given' or 'read' for the namespace's pause")
end
if claims ~= math.floor(claims) or #ARGV ~= 3 + claims * ARGS_PER_CLAIM then
  return redis.error_reply('ERR anarchon: a batch of claims with ' .. #KEYS .. ' keys and ' .. #ARGV ..
                           ' arguments: each claim takes ' .. KEYS_PER_CLAIM .. ' keys and ' .. ARGS_PER_CLAIM ..
                           ' arguments, after 1 key and 3 arguments of the batch')
end

-- Whether the pause of every job holds at now: as given, or read once per
-- script (the prelude's holds), and only by a claim that may start its
-- slot.
local function namespace_paused()
  if ARGV[1] == 'given' then
    return held(ARGV[2] ~= '' and ARGV[2], ARGV[3] ~= '' and ARGV[3])
  end
  return holds(KEYS[1])
end

local answers = {now}
local n = 1
-- Appends one claim's answer: pcall's ok, then the claim's six values.
local function answer(ok, kind, attempt, fence, lease_until, state, earlier)
  answers[n + 1] = caught(ok, kind)
  answers[n + 2] = attempt or 0
  answers[n + 3] = fence or 0
  answers[n + 4] = lease_until or 0
  answers[n + 5] = state or ''
  answers[n + 6] = earlier or ''
  n = n + 6
end
for i = 0, claims - 1 do
  answer(pcall(claim, KEYS, 1 + i * KEYS_PER_CLAIM, ARGV, 3 + i * ARGS_PER_CLAIM,
               namespace_paused))
end
return answers
