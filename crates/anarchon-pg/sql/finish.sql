-- Records how a run ended, if the token still holds it.
UPDATE "{{table}}" AS t
   SET state = $4,
       finished_at = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       error = $5
 WHERE t.job = $1 AND t.slot = $2 AND t.state = 'running' AND t.token = $3
