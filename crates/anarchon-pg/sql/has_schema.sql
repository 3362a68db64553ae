-- Whether the migrations table exists ($1: its quoted name), without
-- failing when it does not.
SELECT to_regclass($1) IS NOT NULL
