-- The rows of a group of orderIds, whatever voucher each belongs to: what a core answers a
-- refusal or a retry from when its gate has no record (`OrderReader::rows`).
--
-- One statement, so one round trip, planned with sequential scans off: the lookup ran as a
-- transaction of four statements (BEGIN, SET LOCAL enable_seqscan = off, the SELECT,
-- COMMIT) because with the table never analyzed (autovacuum off) a plan cached while the
-- table was small can go on scanning all of it once it holds a million rows. A function's
-- SET clause holds the setting for the function's own statements, whose plans PL/pgSQL
-- keeps for the session.
CREATE FUNCTION redemptions_of_orders(wanted text[]) RETURNS SETOF redemptions
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
        SELECT r.*
        FROM unnest(wanted) AS w(order_id),
             LATERAL (SELECT * FROM redemptions WHERE redemptions.order_id = w.order_id) AS r;
END
$$;
