-- anarchon-pg schema, version 8: retries of failed runs.
--
-- A run whose handler failed may be tried again: its row stays `failed`
-- and keeps, in `retry_at`, when the retry is due on the server's clock
-- (NULL: no retry pending). Until then the run counts as still going for
-- the overlap check, and from then on the next claim starts the retry as
-- the run's next attempt. `earlier` keeps the run's past attempts, oldest
-- first, as the JSON array `PastAttempts::encode` (anarchon-core)
-- describes; the claim function appends to it when a retry or a takeover
-- ends an attempt. Rows written before this version have NULL in both:
-- no retry pending, no past attempts recorded.
--
-- The pending retries get a partial index of their own, beside the live
-- leases of `{{table}}_live`, so the overlap check still reads only the
-- job's few live runs.
--
-- The claim function now also returns the run's past attempts, a change of
-- its result type that `CREATE OR REPLACE` refuses: the old one is dropped
-- here (the migration run installs the new one after this step).
--
-- `{{table}}` is replaced with the store's validated table name.

ALTER TABLE "{{table}}"
    ADD COLUMN retry_at bigint,
    ADD COLUMN earlier jsonb;

CREATE INDEX "{{table}}_retries" ON "{{table}}" (job, retry_at)
    WHERE state = 'failed' AND retry_at IS NOT NULL;

DROP FUNCTION IF EXISTS "{{table}}_claim"(
    text[], bigint[], uuid[], text[], bigint[], bigint[], boolean[], integer[], boolean[]
);
