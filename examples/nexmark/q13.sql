-- Q13: bounded side input join: bids enriched with a side table's value for their auction.
-- Run first:
--   CREATE TABLE side_input (key BIGINT PRIMARY KEY, value VARCHAR);
--   INSERT INTO side_input SELECT v, CAST(v AS VARCHAR) FROM generate_series(0, 9999) AS t(v);
CREATE MATERIALIZED VIEW nexmark_q13 AS
SELECT B.auction, B.bidder, B.price, B.date_time, S.value
FROM bid B JOIN side_input FOR SYSTEM_TIME AS OF PROCTIME() S ON B.auction % 10000 = S.key;
