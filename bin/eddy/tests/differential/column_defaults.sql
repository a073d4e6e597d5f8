-- Column DEFAULTs: omitted columns, DEFAULT in VALUES and SET, DEFAULT VALUES, how the
-- catalogs print them, and the defaults PostgreSQL refuses at CREATE TABLE.
CREATE TABLE items (id INT PRIMARY KEY, status VARCHAR(10) DEFAULT 'new', qty INT DEFAULT 1 + 1, price NUMERIC(8,2) DEFAULT 9.99, note TEXT DEFAULT 'none', code CHAR(3) DEFAULT 'abc', flag BOOLEAN DEFAULT true, day DATE DEFAULT CURRENT_DATE, neg BIGINT DEFAULT 5);
INSERT INTO items (id) VALUES (1);
INSERT INTO items (id, qty) VALUES (2, DEFAULT), (3, 7);
INSERT INTO items VALUES (4, DEFAULT, DEFAULT, DEFAULT, 'x', DEFAULT, false, DEFAULT, DEFAULT);
INSERT INTO items (id, note) SELECT 5, 'sel';
INSERT INTO items (id, status) VALUES (6, NULL) RETURNING id, status, qty, price, note, code, flag, neg;
INSERT INTO items (note, id) VALUES ('swapped', 7);
UPDATE items SET qty = DEFAULT, note = DEFAULT WHERE id = 3 RETURNING id, qty, note;
SELECT id, status, qty, price, note, code, flag, day = CURRENT_DATE AS today, neg FROM items ORDER BY id;
SELECT column_name, column_default, is_nullable FROM information_schema.columns WHERE table_name = 'items' ORDER BY ordinal_position;
SELECT a.attname, a.atthasdef, pg_get_expr(d.adbin, d.adrelid), pg_get_expr(d.adbin, d.adrelid, true) FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = 'items'::regclass AND a.attnum > 0 ORDER BY a.attnum;
CREATE TABLE plain (a INT, b TEXT);
INSERT INTO plain DEFAULT VALUES;
INSERT INTO plain (b) VALUES (DEFAULT);
SELECT a, b FROM plain;
CREATE TABLE bad1 (a INT DEFAULT 'x');
CREATE TABLE bad2 (a INT, b INT DEFAULT a);
CREATE TABLE bad3 (a INT DEFAULT (SELECT 1));
SELECT count(*) FROM pg_class WHERE relname LIKE 'bad%';
-- What IF NOT EXISTS and transaction statements out of place say, with their SQLSTATEs.
CREATE TABLE IF NOT EXISTS items (a INT);
CREATE SCHEMA IF NOT EXISTS public;
CREATE VIEW items_v AS SELECT id FROM items;
CREATE TABLE IF NOT EXISTS items_v (a INT);
COMMIT;
ROLLBACK;
