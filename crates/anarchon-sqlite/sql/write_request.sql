-- Writes request ?2 of job ?1 by ?3 (for a backfill, over ?4 to ?5), stamped with the store's clock, or a
-- millisecond past the job's latest request where that is not earlier
-- (`anarchon_core::request::stamp`). Runs inside the request's write
-- transaction, after find_request.sql found none. Returns the stamp.
INSERT INTO {prefix}_requests (job, id, requested_at, requested_by, range_from, range_to)
SELECT ?1, ?2,
       max({now}, coalesce((SELECT max(requested_at) + 1 FROM {prefix}_requests WHERE job = ?1), 0)),
       ?3, ?4, ?5
RETURNING requested_at;
