-- Every request, oldest first.
SELECT job, id, requested_at, requested_by, range_from, range_to FROM {prefix}_requests ORDER BY requested_at, job, id;
