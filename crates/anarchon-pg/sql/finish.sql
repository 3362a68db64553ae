-- Mirrors `decide::finish` (anarchon-core).
--
-- Records how a run ended, if the token still holds it: $4 the state, $5
-- the error. A failure whose runner asks for a retry comes with the wait
-- ($6, ms; NULL for no retry) and the job's next slot ($7, ms): the retry
-- is due at the server's now + $6, kept in retry_at, unless that is not
-- before $7; then the failure is final and the error gets $8 (the core's
-- "not retried" note) appended. The end and the due time read the clock
-- once, so the retry is due exactly $6 after the recorded end.
--
-- A finish sent again by the token that finished the run, with the same
-- state, matches too and changes nothing (the right-hand sides read the
-- row as it was): same token, same answer, when the first answer was lost.
UPDATE "{{table}}" AS t
   SET error = CASE
           WHEN t.state <> 'running' THEN t.error
           WHEN $6::bigint IS NOT NULL AND c.due >= $7::bigint THEN $5::text || $8::text
           ELSE $5::text
       END,
       finished_at = CASE WHEN t.state = 'running' THEN c.now ELSE t.finished_at END,
       retry_at = CASE
           WHEN t.state <> 'running' THEN t.retry_at
           WHEN $6::bigint IS NOT NULL AND c.due < $7::bigint THEN c.due
           ELSE NULL
       END,
       state = $4
  FROM (SELECT n.now, least(n.now::numeric + $6::bigint, 9223372036854775807)::bigint AS due
          FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now) AS n
       ) AS c
 WHERE t.job = $1 AND t.slot = $2 AND t.token = $3 AND (t.state = 'running' OR t.state = $4)
