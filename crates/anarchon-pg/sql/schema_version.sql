-- The highest applied schema version (0: none yet).
SELECT coalesce(max(version), 0) FROM "{{table}}_migrations"
