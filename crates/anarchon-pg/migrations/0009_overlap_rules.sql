-- anarchon-pg schema, version 9: the overlap rules `replace` and
-- `buffer-one`.
--
-- Two more states: `replaced`, a run that was still going when a later
-- slot of its job (overlap `replace`) started, ended by that claim; and
-- `waiting`, the one slot of a `buffer-one` job that came while another run
-- of the job was going and waits for it to end, nobody's, its `lease_until`
-- the end of its wait (its slot plus the claim's max_late). As in version
-- 5, the widened state check is added NOT VALID: every existing row
-- satisfies the narrower one, so nothing needs scanning.
--
-- The slots that wait get a partial index of their own, beside the live
-- leases and the pending retries: the claim's "does another slot of the
-- job wait?" reads the job's few waiting rows, never its history.
--
-- The claim function now takes each claim's overlap rule by name (text)
-- where it took a "skip" flag (boolean): a change of its argument types,
-- for which `CREATE OR REPLACE` would add a second function beside the
-- old one. The old one is dropped here (the migration run installs the
-- new one after this step).
--
-- `{{table}}` is replaced with the store's validated table name.

ALTER TABLE "{{table}}" DROP CONSTRAINT "{{table}}_state";
ALTER TABLE "{{table}}" ADD CONSTRAINT "{{table}}_state" CHECK (
    state IN ('running', 'missed', 'succeeded', 'failed', 'interrupted', 'skipped', 'paused',
              'waiting', 'replaced')
) NOT VALID;

CREATE INDEX "{{table}}_waiting" ON "{{table}}" (job, lease_until) WHERE state = 'waiting';

DROP FUNCTION IF EXISTS "{{table}}_claim"(
    text[], bigint[], uuid[], text[], bigint[], bigint[], boolean[], integer[], boolean[]
);
