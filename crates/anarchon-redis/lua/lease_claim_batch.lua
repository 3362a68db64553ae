-- anarchon, Redis `lease` strategy: claims, one or many in one script.
-- The Rust side sends lease_prelude.lua, then lease_claim.lua as the body of
-- `local function claim(KEYS, ARGV, memo)`, then this file (see
-- `src/lease.rs`). On a single Redis one script carries up to a hundred
-- claims; on a Redis Cluster the claims of different jobs lie in different
-- hash slots, so there each script carries one.
--
-- Why: in a fleet every instance claims every run, and all but one of them
-- lose. A losing claim reads one field, yet paid two commands of its own
-- around it (EVALSHA, TIME); one call for a whole batch pays those once,
-- and the winner's read of the namespace's pause is shared too (memo).
--
-- KEYS: the eight keys of lease_claim.lua for each claim, claim after claim.
-- ARGV: for each claim, the number of its arguments, then those arguments
--       (ARGV of lease_claim.lua).
--
-- Returns one answer per claim, in order: lease_claim.lua's array, or an
-- error reply for that claim alone. A claim that fails (a key of the wrong
-- type, a corrupt record, a command Redis refuses) stops nothing but
-- itself: each runs under pcall, and what it wrote before it failed stays,
-- as it would have as a script of its own.
--
-- Every claim of the batch sees the same `now`: the script is one atomic
-- step on Redis, read once from TIME by the prelude.

local answers, memo = {}, {}
local k, a = 0, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  if not n or a + n > #ARGV or k + 8 > #KEYS then
    return redis.error_reply('ERR anarchon: a batch of claims with keys or arguments missing at claim ' .. (#answers + 1))
  end
  local keys, args = {}, {}
  for i = 1, 8 do keys[i] = KEYS[k + i] end
  for i = 1, n do args[i] = ARGV[a + i] end
  k, a = k + 8, a + 1 + n
  answers[#answers + 1] = caught(pcall(claim, keys, args, memo))
end
if k ~= #KEYS then
  return redis.error_reply('ERR anarchon: a batch of claims with ' .. (#KEYS - k) .. ' keys left over')
end
return answers
