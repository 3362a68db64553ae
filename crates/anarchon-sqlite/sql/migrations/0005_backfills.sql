-- Version 5: backfill requests.
--
-- {prefix} is the validated table prefix. The file runs once, inside the
-- migration's BEGIN IMMEDIATE transaction, after version 4.
--
-- A backfill is a request like a manual run, with the range of slots it
-- covers (UTC ms, both included); a manual run's request has none.
ALTER TABLE {prefix}_requests ADD COLUMN range_from INTEGER;
ALTER TABLE {prefix}_requests ADD COLUMN range_to INTEGER;
