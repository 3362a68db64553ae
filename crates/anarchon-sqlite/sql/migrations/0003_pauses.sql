-- Version 3: operator pauses, and the `paused` state they leave on slots.
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 2.

-- SQLite cannot change a CHECK constraint in place: the runs table is
-- rebuilt with `paused` among its states, rows and all, and its index of
-- live runs made again.
CREATE TABLE {prefix}_runs_v3 (
    job         TEXT    NOT NULL,
    slot        INTEGER NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN
                    ('running', 'missed', 'succeeded', 'failed', 'interrupted', 'skipped',
                     'paused')),
    attempt     INTEGER,
    token       TEXT,
    fence       INTEGER,
    instance    TEXT,
    started_at  INTEGER,
    finished_at INTEGER,
    lease_until INTEGER,
    error       TEXT,
    PRIMARY KEY (job, slot)
) WITHOUT ROWID;
INSERT INTO {prefix}_runs_v3
    SELECT job, slot, state, attempt, token, fence, instance,
           started_at, finished_at, lease_until, error
    FROM {prefix}_runs;
DROP TABLE {prefix}_runs;
ALTER TABLE {prefix}_runs_v3 RENAME TO {prefix}_runs;
CREATE INDEX {prefix}_runs_live
    ON {prefix}_runs (job, lease_until)
    WHERE state = 'running';

-- One row per pause: `scope` is a job's name, or `*` for every job (never
-- part of a job name). `until` is NULL for a pause that lasts until it is
-- resumed. Times are on SQLite's clock, like the runs'.
CREATE TABLE {prefix}_pauses (
    scope     TEXT    NOT NULL PRIMARY KEY,
    since     INTEGER NOT NULL,
    until     INTEGER,
    reason    TEXT,
    paused_by TEXT
) WITHOUT ROWID;
