-- anarchon-pg schema, version 6: manual-run requests (an operator's "run
-- now").
--
-- One row per request, keyed by the job and the id the operator gave it,
-- so the same id twice is one request. `requested_at` is the server's
-- clock when the request was written, moved a millisecond past the job's
-- latest request where it would not be later, and unique per job: the
-- manual run's key in the runs table is its negation (the claim function,
-- from this version on, measures lateness by abs(slot); collection and
-- history likewise). No other table changes.
--
-- `{{table}}` is replaced with the store's validated table name.

CREATE TABLE "{{table}}_requests" (
    job          text COLLATE "C" NOT NULL,
    id           text COLLATE "C" NOT NULL,
    requested_at bigint NOT NULL,
    requested_by text,
    PRIMARY KEY (job, id),
    UNIQUE (job, requested_at)
);
CREATE INDEX "{{table}}_requests_by_time" ON "{{table}}_requests" (requested_at);
