-- The job index: every job a claim has locked, in name order. Its rows
-- hold the fence counters and are never deleted, so a job whose runs were
-- all collected is still listed.
SELECT job FROM {prefix}_jobs ORDER BY job;
