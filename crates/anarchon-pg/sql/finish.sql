-- Mirrors `decide::finish` (anarchon-core), for one run or many at once:
-- the store sends the finishes that wait together as one statement (see
-- src/finishes.rs), so a burst of runs ending costs one transaction.
--
-- Each finish is one element of the arrays: $1 job, $2 slot, $3 token,
-- $4 the final state, $5 the error (NULL for none), $6 for a failure whose
-- runner asks for a retry the wait (ms; NULL for no retry), $7 the job's
-- next slot (ms). A run is recorded if its token still holds it: the retry
-- is due at the server's now + $6, kept in retry_at, unless that is not
-- before $7; then the failure is final and its error gets $8 (the core's
-- "not retried" note) appended. The statement reads the clock once (c), so
-- its runs end at one instant and a retry is due exactly its wait after
-- the recorded end.
--
-- A finish sent again by the token that finished the run, with the same
-- state, matches too and changes nothing (the right-hand sides read the
-- row as it was): same token, same answer, when the first answer was lost.
--
-- Returns the runs recorded, each with its token and final state; a finish
-- whose run, token and state are not among them was fenced. (The same run
-- twice with two different ends is recorded with one of them.)
WITH c AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now
)
UPDATE "{{table}}" AS t
   SET error = CASE
           WHEN t.state <> 'running' THEN t.error
           WHEN f.wait IS NOT NULL AND f.due >= f.next_slot THEN f.error || $8::text
           ELSE f.error
       END,
       finished_at = CASE WHEN t.state = 'running' THEN f.now ELSE t.finished_at END,
       retry_at = CASE
           WHEN t.state <> 'running' THEN t.retry_at
           WHEN f.wait IS NOT NULL AND f.due < f.next_slot THEN f.due
           ELSE NULL
       END,
       state = f.state
  FROM (SELECT u.job, u.slot, u.token, u.state, u.error, u.wait, u.next_slot, c.now,
               least(c.now::numeric + u.wait, 9223372036854775807)::bigint AS due
          FROM c,
               unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::text[],
                      $6::bigint[], $7::bigint[])
                 AS u(job, slot, token, state, error, wait, next_slot)
       ) AS f
 WHERE t.job = f.job AND t.slot = f.slot AND t.token = f.token
   AND (t.state = 'running' OR t.state = f.state)
RETURNING t.job, t.slot, t.token, t.state
