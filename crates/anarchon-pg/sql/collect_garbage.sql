-- Forgets runs whose slot is more than $1 ms, and more than the job's late
-- window, before the server's now (a manual run's slot is its request time
-- negated: its age is abs(slot), so the range is -cutoff < slot < cutoff); except running runs whose lease ended
-- less than $1 ms ago (a backup may still take them over), and failed runs
-- whose retry is due less than $1 ms ago, or later (any claim may still
-- start it).
--
-- The join with the jobs table gives each job its cutoff and lets
-- PostgreSQL walk each job's primary-key range around zero (every run's
-- job has a row there: claims create it first, and it is never deleted).
-- now() is the start of this one-statement transaction, stable within it.
-- The same statement forgets the manual-run requests stamped more than $1
-- ms before now (a data-modifying CTE: it runs whether or not the outer
-- DELETE reads it, and the count the statement reports is the runs').
WITH forgotten_requests AS (
    DELETE FROM "{{table}}_requests"
     WHERE requested_at < floor(extract(epoch FROM now()) * 1000)::bigint - $1
),
cutoff AS (
    SELECT j.job,
           greatest(
               floor(extract(epoch FROM now()) * 1000)::bigint::numeric
                   - greatest($1, j.late_window),
               -9223372036854775807)::bigint AS at,
           greatest(
               floor(extract(epoch FROM now()) * 1000)::bigint::numeric - $1,
               -9223372036854775808)::bigint AS lease_at
      FROM "{{table}}_jobs" AS j
)
DELETE FROM "{{table}}" AS t
 USING cutoff AS c
 WHERE t.job = c.job
   AND t.slot < c.at
   AND t.slot > -c.at
   AND (t.state <> 'running'
        OR t.lease_until IS NULL
        OR t.lease_until < c.lease_at)
   AND (t.state <> 'failed'
        OR t.retry_at IS NULL
        OR t.retry_at < c.lease_at)
