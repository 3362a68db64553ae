-- anarchon-pg schema, version 1: the runs table, the per-job lock rows, and
-- the indexes every claim and heartbeat uses.
--
-- `{{table}}` is replaced with the store's validated table name before this
-- file is sent. Times are bigint milliseconds since the Unix epoch, always
-- read from the server's clock.

-- One row per run (job, slot). The primary key is the claim's lookup.
CREATE TABLE "{{table}}" (
    job         text COLLATE "C" NOT NULL,
    slot        bigint NOT NULL,
    state       text NOT NULL,
    attempt     integer,
    token       uuid,
    fence       bigint,
    instance    text,
    started_at  bigint,
    finished_at bigint,
    lease_until bigint,
    error       text,
    CONSTRAINT "{{table}}_pkey" PRIMARY KEY (job, slot),
    CONSTRAINT "{{table}}_state" CHECK (
        state IN ('running', 'missed', 'succeeded', 'failed', 'interrupted', 'skipped')
    )
);

-- The live runs of each job: the overlap check reads this partial index and
-- never the job's history, so it stays O(log n) however many runs are kept.
CREATE INDEX "{{table}}_live" ON "{{table}}" (job, lease_until) WHERE state = 'running';

-- One row per job. A claim locks its job's row first (INSERT ... ON CONFLICT
-- DO UPDATE), so the claims of one job take turns; the row also keeps the
-- job's fence counter, which must keep growing even after its runs are
-- collected, so these rows are never deleted by garbage collection.
CREATE TABLE "{{table}}_jobs" (
    job        text COLLATE "C" NOT NULL,
    last_fence bigint NOT NULL DEFAULT 0,
    CONSTRAINT "{{table}}_jobs_pkey" PRIMARY KEY (job)
);
