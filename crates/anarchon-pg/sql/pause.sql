-- Writes the pause of scope $1 (a job's name, or `*`), replacing the one
-- there was: since $2, until $3 (NULL: until resumed), reason $4, by $5.
-- Sent right after the statement that read the server's clock for `since`
-- (its own transaction: `since` is one round trip older than the write).
INSERT INTO "{{table}}_pauses" AS p (scope, since, until, reason, paused_by)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope) DO UPDATE
   SET since = EXCLUDED.since, until = EXCLUDED.until,
       reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by;
