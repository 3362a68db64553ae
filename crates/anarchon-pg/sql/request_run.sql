-- Request $2 of job $1 by $3 (for a backfill, over $4 to $5): written, stamped with the server's clock or a
-- millisecond past the job's latest request where that is not later
-- (`anarchon_core::request::stamp`), unless the job has a request with this
-- id; then that one is answered. `is_new` says which.
--
-- Two requests of the job sent at once may compute the same stamp: the
-- second fails on the (job, requested_at) key and is sent again. A request
-- with this id committed by another transaction after this statement's
-- snapshot gives no row; it is sent again too, and then finds it.
WITH added AS (
    INSERT INTO "{{table}}_requests" AS n
           (job, id, requested_at, requested_by, range_from, range_to)
    SELECT $1, $2,
           greatest(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                    coalesce(max(r.requested_at) + 1, 0)),
           $3, $4, $5
      FROM "{{table}}_requests" AS r
     WHERE r.job = $1
    ON CONFLICT (job, id) DO NOTHING
    RETURNING n.requested_at, n.requested_by, n.range_from, n.range_to
)
SELECT a.requested_at, a.requested_by, a.range_from, a.range_to, true AS is_new
  FROM added AS a
UNION ALL
SELECT r.requested_at, r.requested_by, r.range_from, r.range_to, false AS is_new
  FROM "{{table}}_requests" AS r
 WHERE r.job = $1 AND r.id = $2
   AND NOT EXISTS (SELECT 1 FROM added)
