-- The requests stamped at ?1 or later, oldest first.
SELECT job, id, requested_at, requested_by, range_from, range_to
FROM {prefix}_requests
WHERE requested_at >= ?1
ORDER BY requested_at, job, id;
