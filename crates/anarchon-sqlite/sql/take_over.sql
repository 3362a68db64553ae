-- Applies `ClaimDecision::TakeOver`, as `decide::claim` (anarchon-core)
-- decided it (claim.rs): SQLite decides a claim in Rust, not in SQL.
--
-- A takeover of run (job ?1, slot ?2) whose lease ran out: the next attempt
-- (?3), the caller's token (?4), a new fence (?5), the caller (?6) and a new
-- lease end (?7).
UPDATE {prefix}_runs
SET attempt = ?3, token = ?4, fence = ?5, instance = ?6, lease_until = ?7
WHERE job = ?1 AND slot = ?2 AND state = 'running';
