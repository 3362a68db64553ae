-- The migrations' own bookkeeping: one row per applied schema version.
-- Created (if missing) at the start of every migration transaction, after
-- the advisory lock, so instances that start together take turns.
CREATE TABLE IF NOT EXISTS "{{table}}_migrations" (
    version     integer NOT NULL,
    description text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT "{{table}}_migrations_pkey" PRIMARY KEY (version)
)
