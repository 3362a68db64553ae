-- Every request, oldest first, each with the server's clock; one row of
-- NULLs but the clock when there is none.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS store_now,
       r.job, r.id, r.requested_at, r.requested_by, r.range_from, r.range_to
  FROM (SELECT 1) AS one
  LEFT JOIN "{{table}}_requests" AS r ON true
 ORDER BY r.requested_at, r.job, r.id
