-- Removes the pause of scope $1.
DELETE FROM "{{table}}_pauses" WHERE scope = $1;
