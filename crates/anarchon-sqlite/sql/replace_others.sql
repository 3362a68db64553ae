-- Applies the `replace` half of `ClaimDecision::StartReplacing`, as
-- `decide::claim` (anarchon-core) decided it (claim.rs).
--
-- Every run of job ?1 other than slot ?2 still going — running, whatever
-- its lease, or failed with a retry pending — ends `replaced` at ?3. Its
-- token stays, so its runner is fenced at its next heartbeat.
UPDATE {prefix}_runs
SET state = 'replaced', finished_at = ?3, retry_at = NULL
WHERE job = ?1 AND slot <> ?2
  AND (state = 'running' OR (state = 'failed' AND retry_at IS NOT NULL));
