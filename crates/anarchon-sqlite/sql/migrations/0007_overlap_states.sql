-- Version 7: the `waiting` and `replaced` states of the overlap rules
-- `buffer-one` and `replace`.
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 6.
--
-- SQLite cannot change a CHECK constraint in place: the runs table is
-- rebuilt with the two states among its own, rows and all, and its
-- indexes made again.
CREATE TABLE {prefix}_runs_v7 (
    job         TEXT    NOT NULL,
    slot        INTEGER NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN
                    ('running', 'missed', 'waiting', 'succeeded', 'failed', 'interrupted',
                     'skipped', 'paused', 'replaced')),
    attempt     INTEGER,
    token       TEXT,
    fence       INTEGER,
    instance    TEXT,
    started_at  INTEGER,
    finished_at INTEGER,
    lease_until INTEGER,
    error       TEXT,
    retry_at    INTEGER,
    earlier     TEXT,
    PRIMARY KEY (job, slot)
) WITHOUT ROWID;
INSERT INTO {prefix}_runs_v7
    SELECT job, slot, state, attempt, token, fence, instance,
           started_at, finished_at, lease_until, error, retry_at, earlier
    FROM {prefix}_runs;
DROP TABLE {prefix}_runs;
ALTER TABLE {prefix}_runs_v7 RENAME TO {prefix}_runs;
CREATE INDEX {prefix}_runs_live
    ON {prefix}_runs (job, lease_until)
    WHERE state = 'running';
CREATE INDEX {prefix}_runs_retrying
    ON {prefix}_runs (job, retry_at)
    WHERE retry_at IS NOT NULL;

-- The slots waiting for a live run of their job to end (`buffer-one`),
-- each with the end of its wait in `lease_until`: the check for another
-- waiting slot reads only this index.
CREATE INDEX {prefix}_runs_waiting
    ON {prefix}_runs (job, lease_until)
    WHERE state = 'waiting';
