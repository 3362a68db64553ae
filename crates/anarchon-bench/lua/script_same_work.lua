-- anarchon-bench: the Redis `script` strategy's own work with nothing of
-- anarchon around it, the server's ceiling for that strategy's claims.
-- Scans the stream newest first, a page at a time, for the slot; returns
-- the token found there, or appends the caller's claim and returns its
-- token. Left out, against the real script: the type check, the server's
-- clock, the window's lower bound, trimming and the instance field.
--
-- KEYS[1] claims (stream)   ARGV[1] slot   ARGV[2] token

local page = 100
local from = '+'
while true do
  local entries = redis.call('XREVRANGE', KEYS[1], from, '-', 'COUNT', page)
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    if fields[2] == ARGV[1] then
      return fields[4]
    end
  end
  if #entries < page then break end
  from = '(' .. entries[#entries][1]
end
redis.call('XADD', KEYS[1], '*', 'slot', ARGV[1], 'token', ARGV[2])
return ARGV[2]
