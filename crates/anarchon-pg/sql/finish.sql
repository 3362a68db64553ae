-- Mirrors `decide::finish` (anarchon-core).
--
-- Records how a run ended, if the token still holds it.
--
-- A finish sent again by the token that finished the run, with the same
-- state, matches too and changes nothing (the right-hand sides read the
-- row as it was): same token, same answer, when the first answer was lost.
UPDATE "{{table}}" AS t
   SET error = CASE WHEN t.state = 'running' THEN $5 ELSE t.error END,
       finished_at = CASE
           WHEN t.state = 'running'
           THEN floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
           ELSE t.finished_at
       END,
       state = $4
 WHERE t.job = $1 AND t.slot = $2 AND t.token = $3 AND (t.state = 'running' OR t.state = $4)
