-- anarchon-pg schema, version 5: operator pauses.
--
-- A pause of one job, or of every job (scope `*`, never part of a job
-- name), is a row the claim function reads in the same transaction as the
-- run (sql/claim_function.sql, step 5); a slot claimed while it holds is
-- recorded `paused`, a state the runs table now accepts. `until` is NULL
-- for a pause that lasts until resumed; times are the server's clock in
-- milliseconds, like every other time here.
--
-- The widened state check is added NOT VALID: every existing row already
-- satisfies the narrower check it replaces, so there is nothing to scan,
-- and new rows are checked as before.
--
-- `{{table}}` is replaced with the store's validated table name.

ALTER TABLE "{{table}}" DROP CONSTRAINT "{{table}}_state";
ALTER TABLE "{{table}}" ADD CONSTRAINT "{{table}}_state" CHECK (
    state IN ('running', 'missed', 'succeeded', 'failed', 'interrupted', 'skipped', 'paused')
) NOT VALID;

CREATE TABLE "{{table}}_pauses" (
    scope     text COLLATE "C" PRIMARY KEY,
    since     bigint NOT NULL,
    until     bigint,
    reason    text,
    paused_by text
);
