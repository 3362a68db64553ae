-- Mirrors `decide::finish` (anarchon-core).
--
-- Ends run (job ?1, slot ?2) held by token ?3 in state ?4 with error ?5. A
-- failure whose runner asks for a retry ?6 ms after now is recorded with
-- the retry due then, if that is before the job's next slot ?7; if not, the
-- failure is final and its error ends with ?8 (why it was not retried).
--
-- A finish sent again by the token that finished the run, with the same
-- state, matches too and changes nothing (the right-hand sides read the
-- row as it was): same token, same answer, when the first answer was lost.
UPDATE {prefix}_runs
SET error = CASE
        WHEN state <> 'running' THEN error
        WHEN ?6 IS NOT NULL AND {now} + ?6 >= ?7 THEN ?5 || ?8
        ELSE ?5
    END,
    retry_at = CASE
        WHEN state <> 'running' THEN retry_at
        WHEN ?6 IS NOT NULL AND {now} + ?6 < ?7 THEN {now} + ?6
        ELSE NULL
    END,
    finished_at = CASE WHEN state = 'running' THEN {now} ELSE finished_at END,
    state = ?4
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND (state = 'running' OR state = ?4);
