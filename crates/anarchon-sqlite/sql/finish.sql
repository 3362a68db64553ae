-- Mirrors `decide::finish` (anarchon-core).
--
-- Ends run (job ?1, slot ?2) held by token ?3 in state ?4 with error ?5.
--
-- A finish sent again by the token that finished the run, with the same
-- state, matches too and changes nothing (the right-hand sides read the
-- row as it was): same token, same answer, when the first answer was lost.
UPDATE {prefix}_runs
SET error = CASE WHEN state = 'running' THEN ?5 ELSE error END,
    finished_at = CASE WHEN state = 'running' THEN {now} ELSE finished_at END,
    state = ?4
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND (state = 'running' OR state = ?4);
