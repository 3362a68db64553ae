-- The latest ?2 runs of job ?1, newest slot first.
SELECT slot, state, attempt, fence, instance,
       started_at, finished_at, lease_until, error
FROM {prefix}_runs
WHERE job = ?1
ORDER BY slot DESC
LIMIT ?2;
