-- Reads what `decide::claim` (anarchon-core) decides on (claim.rs).
--
-- The store's clock, the run (job ?1, slot ?2) if it has a record, and the
-- pauses of the job and of every job (`*`): one row always, with NULL run
-- columns when there is no record, and `*_paused` NULL when there is no
-- such pause (`*_until` NULL then means: until resumed).
SELECT {now} AS now,
       r.state, r.attempt, r.token, r.fence, r.lease_until, r.retry_at,
       r.instance, r.finished_at, r.error, r.earlier,
       (SELECT 1 FROM {prefix}_pauses WHERE scope = ?1) AS job_paused,
       (SELECT until FROM {prefix}_pauses WHERE scope = ?1) AS job_until,
       (SELECT 1 FROM {prefix}_pauses WHERE scope = '*') AS all_paused,
       (SELECT until FROM {prefix}_pauses WHERE scope = '*') AS all_until
FROM (SELECT 1) AS one
LEFT JOIN {prefix}_runs AS r ON r.job = ?1 AND r.slot = ?2;
