-- Reads one run without taking any lock, with the server's clock.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS store_now,
       t.state, t.attempt, t.lease_until, t.retry_at
  FROM (SELECT 1) AS one
  LEFT JOIN "{{table}}" AS t ON t.job = $1 AND t.slot = $2
