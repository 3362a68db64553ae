-- Forgets runs whose slot is more than ?1 ms before now, except running runs
-- whose lease ended less than ?1 ms ago (a backup may still take them over).
WITH cutoff (at) AS (SELECT {now} - ?1)
DELETE FROM {prefix}_runs
WHERE slot < (SELECT at FROM cutoff)
  AND (state <> 'running'
       OR lease_until IS NULL
       OR lease_until < (SELECT at FROM cutoff));
