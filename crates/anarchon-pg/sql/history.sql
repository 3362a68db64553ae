-- The latest runs of one job, newest first by instant. A manual run's key
-- is its request time negated, so the scheduled runs (newest first: a
-- backward scan of the primary key) and the manual ones (smallest key
-- first: a forward scan) are read as two ranges and merged; at one instant
-- the manual run comes first. The columns are `RunColumns` (anarchon-core)
-- in its order; the past attempts are read as their JSON text.
SELECT r.slot, r.state, r.attempt, r.fence, r.instance,
       r.started_at, r.finished_at, r.lease_until, r.error, r.retry_at, r.earlier
  FROM ((SELECT t.slot, t.state, t.attempt::bigint AS attempt, t.fence, t.instance,
                t.started_at, t.finished_at, t.lease_until, t.error,
                t.retry_at, t.earlier::text AS earlier
           FROM "{{table}}" AS t
          WHERE t.job = $1 AND t.slot >= 0
          ORDER BY t.slot DESC
          LIMIT $2)
        UNION ALL
        (SELECT t.slot, t.state, t.attempt::bigint AS attempt, t.fence, t.instance,
                t.started_at, t.finished_at, t.lease_until, t.error,
                t.retry_at, t.earlier::text AS earlier
           FROM "{{table}}" AS t
          WHERE t.job = $1 AND t.slot < 0
          ORDER BY t.slot
          LIMIT $2)) AS r
 ORDER BY abs(r.slot) DESC, r.slot
 LIMIT $2
