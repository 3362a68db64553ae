-- Removes every object of one store's table. Not a migration: for tests and
-- for taking a store out of service.
DROP FUNCTION IF EXISTS "{{table}}_claim";
DROP TABLE IF EXISTS "{{table}}", "{{table}}_jobs", "{{table}}_pauses", "{{table}}_requests",
    "{{table}}_migrations";
