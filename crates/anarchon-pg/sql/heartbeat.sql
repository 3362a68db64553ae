-- Mirrors `decide::heartbeat` (anarchon-core).
--
-- Extends the lease of a run the token still holds to the server's now + lease.
UPDATE "{{table}}" AS t
   SET lease_until = least(
           floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint::numeric + $4,
           9223372036854775807)::bigint
 WHERE t.job = $1 AND t.slot = $2 AND t.state = 'running' AND t.token = $3
