-- Applies `ClaimDecision::Start`, `RecordSkipped` and `RecordMissed`, as
-- `decide::claim` (anarchon-core) decided it (claim.rs): SQLite decides a
-- claim in Rust, not in SQL.
--
-- Writes the whole record of run (job ?1, slot ?2), replacing a `missed`
-- one: a first win, a skipped slot or a missed slot.
INSERT OR REPLACE INTO {prefix}_runs
    (job, slot, state, attempt, token, fence, instance,
     started_at, finished_at, lease_until, error)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL);
