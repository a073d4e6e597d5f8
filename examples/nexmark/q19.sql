-- Q19: the ten highest bids of each auction.
CREATE MATERIALIZED VIEW nexmark_q19 AS
SELECT *
FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
    FROM bid
) AS B
WHERE rank_number <= 10;
