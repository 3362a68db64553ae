-- Forgets requests stamped more than ?1 ms before now.
DELETE FROM {prefix}_requests WHERE requested_at < {now} - ?1;
