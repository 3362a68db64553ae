-- The store's clock.
SELECT {now};
