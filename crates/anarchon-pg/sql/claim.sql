-- Mirrors `decide::claim` (anarchon-core): the decision itself is the
-- `{{table}}_claim` function, defined by sql/claim_function.sql.
--
-- Claims a batch of runs (one or many): the whole flowchart runs inside the
-- function, in one transaction and one round trip.
SELECT r_idx, r_outcome, r_attempt, r_fence, r_lease_until, r_store_now, r_earlier
  FROM "{{table}}_claim"($1, $2, $3, $4, $5, $6, $7, $8, $9)
