-- Q3: local item suggestion: sellers in some states with auctions in category 10.
-- The join is not bounded in time: its state keeps every auction (and person / bid) it joins.
CREATE MATERIALIZED VIEW nexmark_q3 WITH (unbounded_joins = 'allow') AS
SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
