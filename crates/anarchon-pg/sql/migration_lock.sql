-- The first statement of every migration transaction: instances that open
-- a store on the same table at the same time queue here, and the lock goes
-- away with the transaction. $1 is a constant for anarchon, $2 the table.
SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '') || '.' || $2))
