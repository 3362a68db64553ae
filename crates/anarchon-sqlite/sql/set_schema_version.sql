-- ?1 = the version now in place.
INSERT INTO {prefix}_schema (id, version) VALUES (1, ?1)
    ON CONFLICT (id) DO UPDATE SET version = excluded.version;
