-- anarchon, Redis `lease` strategy: runner steps, one or many in one script.
-- The Rust side sends lease_prelude.lua, then lease_heartbeat.lua as the
-- body of `local function step(KEYS, ARGV)`, then this file (see
-- `src/lease.rs`). A store on a single Redis sends its finishes through
-- it: those that wait while one script is in flight go together, up to a
-- hundred a script. (On a Redis Cluster the runs of different jobs lie on
-- different nodes, and each finish is sent alone, by lease_heartbeat.lua.)
--
-- Why: the runs of one instant end together, and a finish sent alone paid
-- an EVALSHA and a TIME of its own around the few commands that record it.
--
-- KEYS: the two keys of lease_heartbeat.lua for each step, step after step.
-- ARGV: for each step, the number of its arguments, then those arguments
--       (ARGV of lease_heartbeat.lua).
--
-- Returns one answer per step, in order: lease_heartbeat.lua's array, or an
-- error reply for that step alone. A step that fails (a key of the wrong
-- type, a corrupt record) stops nothing but itself: each runs under pcall,
-- and what it wrote before it failed stays, as it would have as a script
-- of its own. Every step of the script sees the same `now`.

local answers = {}
local k, a = 0, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  if not n or a + n > #ARGV or k + 2 > #KEYS then
    return redis.error_reply('ERR anarchon: a batch of steps with keys or arguments missing at step ' .. (#answers + 1))
  end
  local args = {}
  for i = 1, n do args[i] = ARGV[a + i] end
  local keys = {KEYS[k + 1], KEYS[k + 2]}
  k, a = k + 2, a + 1 + n
  answers[#answers + 1] = caught(pcall(step, keys, args))
end
if k ~= #KEYS then
  return redis.error_reply('ERR anarchon: a batch of steps with ' .. (#KEYS - k) .. ' keys left over')
end
return answers
