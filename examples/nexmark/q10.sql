-- Q10: log every bid to the file system, with the day and minute each bid belongs to (Flink
-- partitions its files by them; Eddy's file sink writes JSON lines carrying them).
CREATE MATERIALIZED VIEW nexmark_q10 AS
SELECT auction, bidder, price, date_time, extra, CAST(date_time AS DATE) AS dt, date_trunc('minute', date_time) AS minute FROM bid;
CREATE SINK nexmark_q10_files FROM nexmark_q10 WITH (connector = 'file', path = '/tmp/eddy-nexmark-q10', rollover_seconds = '1');
