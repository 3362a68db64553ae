-- The latest ?2 runs of job ?1, newest first by instant: a manual run's
-- key is its request time negated, so the order is by abs(slot), and at
-- one instant the manual run (negative) comes before the scheduled slot.
SELECT slot, state, attempt, fence, instance,
       started_at, finished_at, lease_until, error, retry_at, earlier
FROM {prefix}_runs
WHERE job = ?1
ORDER BY abs(slot) DESC, slot
LIMIT ?2;
