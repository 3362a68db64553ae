-- Writes the pause of scope ?1 (a job's name, or `*`), replacing the one
-- there was: since ?2, until ?3 (NULL: until resumed), reason ?4, by ?5.
INSERT INTO {prefix}_pauses (scope, since, until, reason, paused_by)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (scope) DO UPDATE SET
    since = excluded.since,
    until = excluded.until,
    reason = excluded.reason,
    paused_by = excluded.paused_by;
