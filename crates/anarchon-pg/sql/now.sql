-- The server's clock, in milliseconds since the Unix epoch.
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
