-- The job index: every job a claim has locked, in name order. Its rows
-- hold the fence counters and are never deleted.
SELECT job FROM "{{table}}_jobs" ORDER BY job;
