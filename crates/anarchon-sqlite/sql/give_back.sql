-- Mirrors `decide::give_back` (anarchon-core).
--
-- Gives run (job ?1, slot ?2) held by token ?3 back before its handler
-- started: the lease ends now and the holder is cleared, which tells the
-- next takeover that this attempt was not used.
UPDATE {prefix}_runs
SET lease_until = {now} - 1, token = NULL
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND state = 'running';
