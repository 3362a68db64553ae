-- The request of job ?1 with id ?2, if there is one.
SELECT requested_at, requested_by, range_from, range_to FROM {prefix}_requests WHERE job = ?1 AND id = ?2;
