-- Version 2: each job's late window, so that garbage collection keeps a
-- job's runs as long as a late claim of that job could still win them,
-- whichever scheduler collects.
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 1.

-- The longest `max_late` (ms) any claim of the job has carried. Jobs that
-- were claimed before this version start at 0: the collecting scheduler's
-- `keep` alone protects them until their next claim.
ALTER TABLE {prefix}_jobs ADD COLUMN late_window INTEGER NOT NULL DEFAULT 0;
