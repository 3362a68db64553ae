-- Mirrors `decide::give_back` (anarchon-core).
--
-- Gives the token's run back before its handler started: the lease ends
-- now and the holder is cleared, which tells the next takeover that this
-- attempt was not used.
UPDATE "{{table}}" AS t
   SET lease_until = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1,
       token = NULL
 WHERE t.job = $1 AND t.slot = $2 AND t.state = 'running' AND t.token = $3
