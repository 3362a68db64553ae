-- Reads what `decide::claim` (anarchon-core) decides on (claim.rs).
--
-- The store's clock and the run (job ?1, slot ?2), if it has a record: one
-- row always, with NULL run columns when there is none.
SELECT {now} AS now,
       r.state, r.attempt, r.token, r.fence, r.lease_until
FROM (SELECT 1) AS one
LEFT JOIN {prefix}_runs AS r ON r.job = ?1 AND r.slot = ?2;
