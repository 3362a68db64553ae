-- Mirrors `decide::heartbeat` (anarchon-core).
--
-- Extends the lease of token ?3 on run (job ?1, slot ?2) to now + ?4 ms.
UPDATE {prefix}_runs
SET lease_until = {now} + ?4
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND state = 'running';
