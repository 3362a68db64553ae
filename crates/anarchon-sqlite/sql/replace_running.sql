-- Applies the `replace` half of `ClaimDecision::StartReplacing`, as
-- `decide::claim` (anarchon-core) decided it (claim.rs), for running runs;
-- `replace_retrying.sql` does the failed runs waiting for a retry.
--
-- Every run of job ?1 other than slot ?2 still running, whatever its
-- lease, ends `replaced` at ?3. Its token stays, so its runner is fenced
-- at its next heartbeat. Reads only the partial index of running runs
-- (named: on a small table the planner would rather walk the job's rows).
UPDATE {prefix}_runs INDEXED BY {prefix}_runs_live
SET state = 'replaced', finished_at = ?3
WHERE job = ?1 AND state = 'running' AND slot <> ?2;
