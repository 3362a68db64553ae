-- anarchon-pg schema, version 7: backfill requests.
--
-- A backfill is a request like a manual run, with the range of slots it
-- covers (server ms, both included); a manual run's request has none. Its
-- claims may start a slot recorded `paused`: the claim function takes one
-- more array from this version on, so the old one is dropped here (the
-- migration run installs the new one after this step).
--
-- `{{table}}` is replaced with the store's validated table name.

ALTER TABLE "{{table}}_requests"
    ADD COLUMN range_from bigint,
    ADD COLUMN range_to bigint,
    ADD CONSTRAINT "{{table}}_requests_range" CHECK ((range_from IS NULL) = (range_to IS NULL));

DROP FUNCTION IF EXISTS "{{table}}_claim"(
    text[], bigint[], uuid[], text[], bigint[], bigint[], boolean[], integer[]
);
