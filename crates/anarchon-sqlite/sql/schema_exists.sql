-- Whether the schema-version table ?1 exists: 1 or 0.
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1;
