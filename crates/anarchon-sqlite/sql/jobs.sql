-- The jobs that have run records, in name order.
SELECT DISTINCT job FROM {prefix}_runs ORDER BY job;
