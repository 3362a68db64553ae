-- anarchon, Redis `lease` strategy: the lines every lease script starts
-- with. The Rust side sends this file followed by the script itself, as one
-- script (see `src/lease.rs`).
--
-- check(key, want) names a key whose Redis type is not the one the script
-- needs (a key of ours overwritten by someone else), so the script can
-- refuse before it reads or writes anything. int(n) writes a number without
-- an exponent. now is the store's clock in milliseconds, from TIME.

local function check(key, want)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= want then
    return 'WRONGTYPE anarchon: key ' .. key .. ' holds a ' .. found .. ' but must be a ' .. want
  end
end
local function int(n) return string.format('%.0f', n) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

