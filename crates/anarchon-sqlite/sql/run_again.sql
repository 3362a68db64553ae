-- Applies `ClaimDecision::TakeOver` and `ClaimDecision::Retry`, as
-- `decide::claim` (anarchon-core) decided it (claim.rs): SQLite decides a
-- claim in Rust, not in SQL.
--
-- Run (job ?1, slot ?2) runs again: a takeover of a run whose lease ran
-- out, or the retry of a failed one whose retry is due. The attempt (?3),
-- the caller's token (?4), a new fence (?5), the caller (?6), a new lease
-- end (?7) and the run's past attempts (?8, the attempt that just ended
-- added); a retry's end, error and due time are cleared.
UPDATE {prefix}_runs
SET state = 'running', attempt = ?3, token = ?4, fence = ?5, instance = ?6,
    lease_until = ?7, earlier = ?8,
    finished_at = NULL, error = NULL, retry_at = NULL
WHERE job = ?1 AND slot = ?2
  AND (state = 'running' OR (state = 'failed' AND retry_at IS NOT NULL));
