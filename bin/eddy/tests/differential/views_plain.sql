-- Plain views against PostgreSQL 15: expansion in queries (aliases, column lists, CTEs that
-- shadow a view, joins, subqueries, views on views), OR REPLACE's rules, dependencies and
-- DROP VIEW with IF EXISTS and CASCADE.
CREATE TABLE t (k INT PRIMARY KEY, g TEXT, v INT);
INSERT INTO t VALUES (1, 'a', 10), (2, 'b', 20), (3, 'a', 30), (4, NULL, 40);
CREATE VIEW big AS SELECT k, g, v FROM t WHERE v > 10;
SELECT * FROM big ORDER BY k;
SELECT big.g FROM big ORDER BY big.k;
SELECT b.k FROM big AS b WHERE b.g = 'a';
SELECT * FROM big b(kk) ORDER BY kk;
CREATE VIEW sums (grp, total) AS SELECT g, sum(v) FROM big GROUP BY g;
SELECT * FROM sums ORDER BY grp;
SELECT grp FROM sums WHERE total > 25 ORDER BY 1;
WITH big AS (SELECT 1 AS one) SELECT * FROM big;
SELECT count(*) AS n FROM big JOIN t USING (k);
SELECT k FROM t WHERE k IN (SELECT k FROM big) ORDER BY k;
SELECT * FROM (SELECT * FROM big) q WHERE q.k = 3;
CREATE VIEW named (a, b) AS SELECT k, g, v FROM t;
SELECT * FROM named ORDER BY a;
INSERT INTO t VALUES (5, 'c', 50);
SELECT * FROM sums ORDER BY grp;
-- Errors when creating
CREATE VIEW big AS SELECT 1;
CREATE VIEW t AS SELECT 1;
CREATE OR REPLACE VIEW t AS SELECT 1;
CREATE VIEW toomany (a, b, c, d) AS SELECT k, g, v FROM t;
CREATE VIEW twice (x, x) AS SELECT k, g FROM t;
CREATE VIEW nothing AS SELECT * FROM missing;
-- OR REPLACE: columns may be added at the end, never renamed, retyped or removed
CREATE OR REPLACE VIEW big AS SELECT k, g, v, v * 2 AS doubled FROM t WHERE v > 10;
SELECT * FROM big ORDER BY k;
CREATE OR REPLACE VIEW big AS SELECT k AS key, g, v, v * 2 AS doubled FROM t;
CREATE OR REPLACE VIEW big AS SELECT k, g::INT, v, v * 2 AS doubled FROM t;
CREATE OR REPLACE VIEW big AS SELECT k, g, v FROM t;
CREATE OR REPLACE VIEW fresh AS SELECT 1 AS one;
SELECT * FROM fresh;
-- Dependencies
DROP TABLE t;
DROP VIEW big;
DROP VIEW IF EXISTS nope;
DROP VIEW IF EXISTS nope, fresh;
DROP VIEW IF EXISTS t;
DROP VIEW t;
DROP VIEW missing;
DROP TABLE IF EXISTS nope;
DROP MATERIALIZED VIEW IF EXISTS nope;
DROP SCHEMA IF EXISTS nope;
DROP VIEW IF EXISTS nope.v;
DROP TABLE IF EXISTS nope.t;
DROP INDEX IF EXISTS nope_idx;
DROP VIEW sums;
DROP VIEW big CASCADE;
SELECT * FROM sums;
DROP TABLE t CASCADE;
SELECT * FROM named;
DROP TABLE t;
