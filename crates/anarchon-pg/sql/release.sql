-- Mirrors `decide::release` (anarchon-core).
--
-- Ends the token's lease now: one millisecond before the server's now, so the
-- next claim finds it run out and takes the run over.
UPDATE "{{table}}" AS t
   SET lease_until = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1
 WHERE t.job = $1 AND t.slot = $2 AND t.state = 'running' AND t.token = $3
