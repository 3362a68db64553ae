-- Forgets runs whose slot is more than $1 ms before the server's now, except
-- running runs whose lease ended less than $1 ms ago.
--
-- The join with the jobs table lets PostgreSQL walk each job's primary-key
-- range `slot < cutoff` (every run's job has a row there: claims create it
-- first, and it is never deleted). now() is the start of this one-statement
-- transaction, stable within it, so the cutoff is one value.
DELETE FROM "{{table}}" AS t
 USING "{{table}}_jobs" AS j
 WHERE t.job = j.job
   AND t.slot < greatest(
           floor(extract(epoch FROM now()) * 1000)::bigint::numeric - $1,
           -9223372036854775808)::bigint
   AND (t.state <> 'running'
        OR t.lease_until IS NULL
        OR t.lease_until < greatest(
               floor(extract(epoch FROM now()) * 1000)::bigint::numeric - $1,
               -9223372036854775808)::bigint)
