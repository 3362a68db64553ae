-- Applies `ClaimDecision::Interrupt`, as `decide::claim` (anarchon-core)
-- decided it (claim.rs): SQLite decides a claim in Rust, not in SQL.
--
-- Run (job ?1, slot ?2) ran out of lease with no attempts left, at ?3.
UPDATE {prefix}_runs
SET state = 'interrupted', finished_at = ?3
WHERE job = ?1 AND slot = ?2 AND state = 'running';
