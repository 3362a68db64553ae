-- Every pause, each with the server's clock; one row of NULLs but the
-- clock when there is none.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS store_now,
       p.scope, p.since, p.until, p.reason, p.paused_by
  FROM (SELECT 1) AS one
  LEFT JOIN "{{table}}_pauses" AS p ON true;
