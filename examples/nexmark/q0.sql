-- Q0: pass-through. Measures the cost of reading and keeping the stream.
CREATE MATERIALIZED VIEW nexmark_q0 AS
SELECT auction, bidder, price, date_time FROM bid;
