-- anarchon-pg schema, version 3: each job's late window.
--
-- Garbage collection must keep a job's runs as long as a late claim of that
-- job could still win them, whichever scheduler collects: schedulers of
-- other services share the table and pass their own, shorter, `keep`. So
-- every claim records the longest `max_late` of its job in the job's row,
-- in the write that already locks that row, and collection keeps each job's
-- runs at least that long. Jobs claimed before this version start at 0:
-- the collecting scheduler's `keep` alone protects them until their next
-- claim.
--
-- The claim function reads and writes the column (sql/claim_function.sql).
--
-- `{{table}}` is replaced with the store's validated table name.

ALTER TABLE "{{table}}_jobs" ADD COLUMN late_window bigint NOT NULL DEFAULT 0;
