-- Removes the pause of scope ?1.
DELETE FROM {prefix}_pauses WHERE scope = ?1;
