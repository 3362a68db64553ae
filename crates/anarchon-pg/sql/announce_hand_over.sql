-- Tells every listening store that a run was handed over: $1 the channel,
-- $2 the payload (table, job and slot, separated by tabs).
SELECT pg_notify($1, $2)
