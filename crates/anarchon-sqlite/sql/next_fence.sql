-- Increments job ?1's fence counter (creating it at 1) and returns it.
INSERT INTO {prefix}_jobs (job, last_fence) VALUES (?1, 1)
    ON CONFLICT (job) DO UPDATE SET last_fence = last_fence + 1
RETURNING last_fence;
