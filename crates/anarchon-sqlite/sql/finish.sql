-- Ends run (job ?1, slot ?2) held by token ?3 in state ?4 with error ?5.
UPDATE {prefix}_runs
SET state = ?4, error = ?5, finished_at = {now}
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND state = 'running';
