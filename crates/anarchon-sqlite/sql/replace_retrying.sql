-- The other half of `replace_running.sql`: every failed run of job ?1
-- other than slot ?2 waiting for its retry ends `replaced` at ?3, its retry
-- cleared. Reads only the partial index of runs waiting for a retry.
UPDATE {prefix}_runs INDEXED BY {prefix}_runs_retrying
SET state = 'replaced', finished_at = ?3, retry_at = NULL
WHERE job = ?1 AND retry_at IS NOT NULL AND slot <> ?2;
