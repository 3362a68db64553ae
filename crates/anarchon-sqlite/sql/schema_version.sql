-- The schema version, or no row before the first migration.
SELECT version FROM {prefix}_schema WHERE id = 1;
