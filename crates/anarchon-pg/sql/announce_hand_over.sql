-- Tells every listening store that a run was handed over: $1 the channel,
-- $2 the payload (the table, a tab, then the run as `<job> <slot>`).
SELECT pg_notify($1, $2)
