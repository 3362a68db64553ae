-- Whether another run of job ?1 (a slot other than ?2) is live at ?3: it
-- holds a lease alive then, or it failed and its retry is not due before
-- then. Reads only the partial indexes of running and retrying runs.
SELECT EXISTS (
    SELECT 1 FROM {prefix}_runs
    WHERE job = ?1 AND state = 'running' AND lease_until >= ?3 AND slot <> ?2
) OR EXISTS (
    SELECT 1 FROM {prefix}_runs
    WHERE job = ?1 AND retry_at >= ?3 AND slot <> ?2
) AS live;
