-- anarchon, Redis `script` strategy: a claim-only step for any Redis or Valkey.
-- Scans the job's claims of the last `window` (newest first) for the slot.
-- If one is there, returns its token; otherwise appends the caller's claim
-- and returns the caller's token. The caller won if the token is its own.
-- Entries older than the window are trimmed on the way.
--
-- KEYS[1] claims (stream)
-- ARGV[1] slot  ARGV[2] token  ARGV[3] instance  ARGV[4] window (ms)
--
-- Returns {token, entry id, 1 if this call added the entry else 0}.

local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'none' and found ~= 'stream' then
  return redis.error_reply('WRONGTYPE anarchon: key ' .. KEYS[1] .. ' holds a ' .. found .. ' but must be a stream')
end

local function int(n) return string.format('%.0f', n) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local oldest = int(math.max(now - tonumber(ARGV[4]), 0))

local page = 100
local from = '+'
while true do
  local entries = redis.call('XREVRANGE', KEYS[1], from, oldest, 'COUNT', page)
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    local slot, token = nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'slot' then slot = fields[i + 1]
      elseif fields[i] == 'token' then token = fields[i + 1] end
    end
    if slot == ARGV[1] and token then
      return {token, entry[1], 0}
    end
  end
  if #entries < page then break end
  from = '(' .. entries[#entries][1]
end

local id = redis.call('XADD', KEYS[1], 'MINID', '~', oldest, '*',
  'slot', ARGV[1], 'token', ARGV[2], 'instance', ARGV[3])
return {ARGV[2], id, 1}
