-- Q6: average selling price of each seller's last 10 closed auctions.
-- The join is not bounded in time: its state keeps every auction (and person / bid) it joins.
CREATE MATERIALIZED VIEW nexmark_q6 WITH (unbounded_joins = 'allow') AS
SELECT Q.seller, AVG(Q.final) AS avg
FROM (
    SELECT seller, final, ROW_NUMBER() OVER (PARTITION BY seller ORDER BY date_time DESC) AS rownum
    FROM (
        SELECT A.seller, A.id, A.date_time, MAX(B.price) AS final
        FROM auction AS A, bid AS B
        WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
        GROUP BY A.id, A.seller, A.date_time
    ) AS CB
) AS Q
WHERE Q.rownum <= 10
GROUP BY Q.seller;
