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
-- an exponent; caught (below) turns a pcall of one call of a batch into
-- its answer. now is the store's clock in milliseconds, from TIME.
-- held(since, till) tells whether a pause holds at now; holds(key) reads
-- the pause under key and tells the same.

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
-- caught(pcall(f, ...)) is what one call of a batch answers: its result,
-- or its error as an error reply for that call alone. redis.call raises a
-- table with `err` (Redis 7) or a string that starts with the error's code
-- (Redis 6); a Lua error is a string.
local function caught(ok, answer)
  if ok then return answer end
  if type(answer) == 'table' and answer.err then return redis.error_reply(answer.err) end
  if type(answer) == 'string' and string.match(answer, '^%u+ ') then return redis.error_reply(answer) end
  return redis.error_reply('ERR anarchon: ' .. tostring(answer))
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- held(since, till): whether a pause that began at `since` (nil or false
-- for no pause) and lasts until `till` (nil or false for until resumed)
-- holds at now.
local function held(since, till)
  if not since then return false end
  return not till or now < tonumber(till)
end

-- holds(key): whether the pause under `key` (a hash: since, until) holds
-- at now; nil and why when the key is not a hash. Each key is read once
-- per script and remembered: only the claim scripts ask, and no claim
-- writes a pause, so a batch's claims of one job (manual runs beside the
-- schedule's) and every claim's reading of the namespace's pause share
-- one HMGET.
local pauses_read = {}
local function holds(key)
  local known = pauses_read[key]
  if known ~= nil then return known end
  local pause, wrong = read('HMGET', key, 'hash', 'since', 'until')
  if wrong then return nil, wrong end
  local holds_now = held(pause[1], pause[2])
  pauses_read[key] = holds_now
  return holds_now
end
