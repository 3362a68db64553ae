-- anarchon, Redis `idmp` strategy (Redis 8.6+): make sure a job's stream
-- exists with the IDMP duration and size asked for, before any claim is
-- added to it. Creating and configuring happen in one atomic step, because
-- XCFGSET clears the stream's idempotency maps: configuring a stream that
-- already holds claims could let a slot be claimed twice.
--
-- KEYS[1] the job's stream
-- ARGV[1] IDMP-DURATION (s)  ARGV[2] IDMP-MAXSIZE
--
-- Returns {'configured' or 'existing', duration, maxsize}; -1 when the
-- server does not report a value.

local found = redis.call('TYPE', KEYS[1])['ok']
if found == 'none' then
  redis.call('XADD', KEYS[1], '0-1', 'created', 'anarchon')
  redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[1], 'IDMP-MAXSIZE', ARGV[2])
  return {'configured', tonumber(ARGV[1]), tonumber(ARGV[2])}
end
if found ~= 'stream' then
  return redis.error_reply('WRONGTYPE anarchon: key ' .. KEYS[1] .. ' holds a ' .. found .. ' but must be a stream')
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local duration, maxsize = -1, -1
for i = 1, #info, 2 do
  if info[i] == 'idmp-duration' then duration = tonumber(info[i + 1]) or -1
  elseif info[i] == 'idmp-maxsize' then maxsize = tonumber(info[i + 1]) or -1 end
end
return {'existing', duration, maxsize}
