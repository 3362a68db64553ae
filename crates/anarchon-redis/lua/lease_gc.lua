-- anarchon, Redis `lease` strategy: garbage collection for one job.
-- Deletes the records of runs whose slot is more than `keep`, and more than
-- the job's late window, before now; except live runs that stopped being
-- live less than `keep` ago: running runs whose lease ended then (a backup
-- may still take them over), and failed runs whose retry was due then (a
-- claim may still start it). A `waiting` slot is collected by age like a
-- missed one, and leaves the waiting set with its record. The fence
-- counter and the window are never touched.
--
-- KEYS[1] runs (hash)  KEYS[2] slots (sorted set)  KEYS[3] live (sorted set)
-- KEYS[4] window (string: the job's longest max_late, ms)
-- KEYS[5] waiting (sorted set: the slots recorded `waiting`)
-- ARGV[1] keep (ms)  ARGV[2] the most records to delete in this call
--
-- Returns {deleted, more}: more is 1 when the limit stopped the collection.
-- Runs after lease_prelude.lua (check, read, int, now).

local bad = check(KEYS[1], 'hash') or check(KEYS[2], 'zset') or check(KEYS[3], 'zset')
  or check(KEYS[4], 'string') or check(KEYS[5], 'zset')
if bad then return redis.error_reply(bad) end

local window = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
local cutoff = now - math.max(tonumber(ARGV[1]), window)
local lease_cutoff = now - tonumber(ARGV[1])
local limit = tonumber(ARGV[2])

local deleted, kept = 0, 0
while deleted < limit do
  local slots = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. int(cutoff), 'LIMIT', kept, 100)
  if #slots == 0 then return {deleted, 0} end
  for _, slot in ipairs(slots) do
    local keep = false
    local raw = redis.call('HGET', KEYS[1], slot)
    if raw then
      local ok, r = pcall(cjson.decode, raw)
      if ok and type(r) == 'table' then
        local live_until = nil
        if r.state == 'running' then
          live_until = tonumber(r.lease)
        elseif r.state == 'failed' then
          live_until = tonumber(r.retry_at)
        end
        keep = live_until ~= nil and live_until >= lease_cutoff
      end
    end
    if keep then
      kept = kept + 1
    else
      redis.call('HDEL', KEYS[1], slot)
      redis.call('ZREM', KEYS[2], slot)
      redis.call('ZREM', KEYS[3], slot)
      redis.call('ZREM', KEYS[5], slot)
      deleted = deleted + 1
    end
  end
end
return {deleted, 1}
