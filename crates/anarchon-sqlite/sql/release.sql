-- Mirrors `decide::release` (anarchon-core).
--
-- Ends the lease of token ?3 on run (job ?1, slot ?2) now: a lease is alive
-- while lease_until >= now, so one millisecond before now has run out.
UPDATE {prefix}_runs
SET lease_until = {now} - 1
WHERE job = ?1 AND slot = ?2 AND token = ?3 AND state = 'running';
