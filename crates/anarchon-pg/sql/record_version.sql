-- Records a migration as applied, in the transaction that applied it.
INSERT INTO "{{table}}_migrations" (version, description) VALUES ($1, $2)
