-- Forgets runs whose slot is more than ?1 ms, and more than the job's late
-- window, before now (a manual run's slot is its negated request time: its
-- age is abs(slot)); except running runs whose lease ended less than ?1 ms
-- ago (a backup may still take them over), and failed runs whose retry was
-- due less than ?1 ms ago (one may still claim it). The runs of a job without a row
-- in {prefix}_jobs (none is ever deleted, so only hand-made records) are
-- kept for ?1 ms.
WITH cutoff (job, at) AS (
    SELECT job, {now} - max(?1, late_window) FROM {prefix}_jobs
)
DELETE FROM {prefix}_runs
WHERE abs(slot) < coalesce((SELECT at FROM cutoff WHERE cutoff.job = {prefix}_runs.job), {now} - ?1)
  AND (state <> 'running'
       OR lease_until IS NULL
       OR lease_until < {now} - ?1)
  AND (retry_at IS NULL OR retry_at < {now} - ?1);
