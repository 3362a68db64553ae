-- Records that a claim of job ?1 carried a late window of ?2 ms: the job's
-- late_window becomes the longest one seen. Creates the job's row (with no
-- fence handed out yet) when the job is new; writes nothing when the window
-- is not longer.
INSERT INTO {prefix}_jobs (job, late_window) VALUES (?1, ?2)
    ON CONFLICT (job) DO UPDATE SET late_window = excluded.late_window
    WHERE excluded.late_window > late_window;
