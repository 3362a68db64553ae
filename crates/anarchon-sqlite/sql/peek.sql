-- A plain read of run (job ?1, slot ?2) with the store's clock; no
-- transaction, no lock.
SELECT {now} AS now,
       r.state, r.attempt, r.lease_until, r.retry_at
FROM (SELECT 1) AS one
LEFT JOIN {prefix}_runs AS r ON r.job = ?1 AND r.slot = ?2;
