-- anarchon, Redis `lease` strategy: the lines every lease script starts
-- with. The Rust side sends this file followed by the script itself, as one
-- script (see `src/lease.rs`).
--
-- check(key, want) names a key whose Redis type is not the one the script
-- needs (a key of ours overwritten by someone else), so the script can
-- refuse before it reads or writes anything. read(command, key, want, ...)
-- runs a read of key and returns its reply, or nil and the same message
-- when Redis refuses the key's type: a read needs no check of its own.
-- int(n) writes a number without
-- an exponent. now is the store's clock in milliseconds, from TIME.

local function check(key, want)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= want then
    return 'WRONGTYPE anarchon: key ' .. key .. ' holds a ' .. found .. ' but must be a ' .. want
  end
end
local function read(command, key, want, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return nil, 'WRONGTYPE anarchon: key ' .. key .. ' holds the wrong type of value but must be a ' .. want
    end
    return nil, reply.err
  end
  return reply
end
local function int(n) return string.format('%.0f', n) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

