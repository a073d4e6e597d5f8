-- Q4: average closing price per category (a bid counts while its auction is open).
-- The join is not bounded in time: its state keeps every auction (and person / bid) it joins.
CREATE MATERIALIZED VIEW nexmark_q4 WITH (unbounded_joins = 'allow') AS
SELECT Q.category, AVG(Q.final) AS avg
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category;
