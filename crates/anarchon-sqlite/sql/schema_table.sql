-- The schema version of this prefix's tables: one row, id = 1.
CREATE TABLE IF NOT EXISTS {prefix}_schema (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
