-- Whether a slot of job ?1 other than ?2 waits at ?3 (`buffer-one`): it is
-- recorded `waiting` and its wait, kept in `lease_until`, is not over.
-- Reads only the partial index of waiting slots.
SELECT EXISTS (
    SELECT 1 FROM {prefix}_runs
    WHERE job = ?1 AND state = 'waiting' AND lease_until >= ?3 AND slot <> ?2
) AS waiting;
