-- The latest runs of one job, newest slot first (a backward scan of the
-- primary key).
SELECT t.slot, t.state, t.attempt::bigint, t.fence, t.instance,
       t.started_at, t.finished_at, t.lease_until, t.error
  FROM "{{table}}" AS t
 WHERE t.job = $1
 ORDER BY t.slot DESC
 LIMIT $2
