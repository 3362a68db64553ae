-- Version 6: retries of failed runs.
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 5.
--
-- `retry_at` is set only while a failed run waits for its retry (UTC ms on
-- SQLite's clock); the retry clears it. `earlier` holds the run's earlier
-- attempts and how each ended, as the JSON array anarchon-core's
-- `PastAttempts` writes; NULL means none.
ALTER TABLE {prefix}_runs ADD COLUMN retry_at INTEGER;
ALTER TABLE {prefix}_runs ADD COLUMN earlier TEXT;

-- The runs waiting for a retry, for the overlap rule: until its retry is
-- due, such a run is still going, and the check reads only this index.
CREATE INDEX IF NOT EXISTS {prefix}_runs_retrying
    ON {prefix}_runs (job, retry_at)
    WHERE retry_at IS NOT NULL;
