-- Version 1: runs, jobs (the fence counters) and the index of live runs.
--
-- {prefix} is the validated table prefix. Every statement is idempotent, and
-- the whole file runs inside one BEGIN IMMEDIATE transaction.

-- One row per job: its fence counter. The counter only grows; rows are never
-- deleted, so fences keep growing after old runs are collected.
CREATE TABLE IF NOT EXISTS {prefix}_jobs (
    job        TEXT    NOT NULL PRIMARY KEY,
    last_fence INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- One row per run (job, slot). Instants are UTC milliseconds since the Unix
-- epoch on SQLite's clock; tokens are hyphenated lowercase UUID text.
CREATE TABLE IF NOT EXISTS {prefix}_runs (
    job         TEXT    NOT NULL,
    slot        INTEGER NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN
                    ('running', 'missed', 'succeeded', 'failed', 'interrupted', 'skipped')),
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

-- The live runs of a job, for the overlap rule: a partial index holds only
-- running runs, so the check never reads a job's finished history.
CREATE INDEX IF NOT EXISTS {prefix}_runs_live
    ON {prefix}_runs (job, lease_until)
    WHERE state = 'running';
