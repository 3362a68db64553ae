-- Whether another run of job ?1 (a slot other than ?2) holds a lease that is
-- alive at ?3. Reads only the partial index of running runs.
SELECT EXISTS (
    SELECT 1 FROM {prefix}_runs
    WHERE job = ?1 AND state = 'running' AND lease_until >= ?3 AND slot <> ?2
) AS live;
