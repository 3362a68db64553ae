-- Version 4: manual-run requests (an operator's "run now").
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 3.
--
-- One row per request, keyed by the job and the id the operator gave it,
-- so the same id twice is one request. `requested_at` is SQLite's clock
-- when the request was written, moved a millisecond past the job's latest
-- request where it would not be later: the manual run's key in the runs
-- table is its negation. Manual runs themselves live in {prefix}_runs
-- beside the scheduled ones; no other table changes.
CREATE TABLE {prefix}_requests (
    job          TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    requested_at INTEGER NOT NULL,
    requested_by TEXT,
    PRIMARY KEY (job, id)
) WITHOUT ROWID;
CREATE INDEX {prefix}_requests_by_time ON {prefix}_requests (requested_at);
