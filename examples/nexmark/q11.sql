-- Q11: user sessions: bids per bidder session (a session ends after 10 seconds without a bid).
CREATE MATERIALIZED VIEW nexmark_q11 AS
SELECT bidder, count(*) AS bid_count, window_start AS starttime, window_end AS endtime
FROM SESSION(bid, date_time, INTERVAL '10' SECOND)
GROUP BY bidder, window_start, window_end;
