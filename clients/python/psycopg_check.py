"""psycopg 3 as its users use it: named (server-side) cursors, lists as arrays, nested
transactions, COPY, typed results and conn.info. Prints one JSON document."""
import datetime
import decimal
import json
import sys

import psycopg


def typed(value):
    """A value with its Python type, JSON-safe."""
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return ["Decimal", str(value)]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)):
        return [type(value).__name__, str(value)]
    if isinstance(value, dict):
        return ["dict", json.dumps(value, sort_keys=True)]
    return [type(value).__name__, value]


def main(url):
    out = {}
    with psycopg.connect(url) as conn:
        out["status_idle"] = conn.info.transaction_status.name
        out["DateStyle"] = conn.info.parameter_status("DateStyle")
        out["client_encoding"] = conn.info.encoding
        with conn.cursor() as cur:
            cur.execute("SELECT 1 AS one, 2147483648 AS big, 1.5 AS dec, 'x'::varchar AS v, true AS b, "
                        "DATE '2024-02-29' AS d, TIMESTAMP '2024-02-29 13:45:01.5' AS ts, 0.5::float8 AS f")
            out["literal_columns"] = [d.name for d in cur.description]
            out["literals"] = [typed(v) for v in cur.fetchone()]
            out["status_in_transaction"] = conn.info.transaction_status.name
        conn.commit()

        # Parameters in the select list come back with the type psycopg sent them as.
        with conn.cursor() as cur:
            params = [1, 2**40, 1.5, decimal.Decimal("1.25"), "x", True, datetime.date(2024, 1, 2), [1, 2]]
            placeholders = ", ".join(["%s"] * len(params))
            cur.execute(f"SELECT {placeholders}", params)
            out["parameter_columns"] = [[d.name, d.type_code] for d in cur.description]
            out["parameters"] = [typed(v) for v in cur.fetchone()]
        conn.commit()

        # Named cursors: DECLARE ... CURSOR, FETCH FORWARD n, CLOSE, inside a transaction.
        with conn.cursor(name="orders_cursor") as cur:
            cur.itersize = 2
            cur.execute("SELECT id, customer, amount FROM orders WHERE amount > %s ORDER BY id", (decimal.Decimal("1.00"),))
            out["named_first_two"] = [typed(r) for r in cur.fetchmany(2)]
            out["named_rest"] = [typed(r) for r in cur]
        conn.commit()
        with conn.cursor(name="held", withhold=True) as cur:
            cur.execute("SELECT customer, total FROM customer_totals ORDER BY customer")
            conn.commit()
            out["held_after_commit"] = [typed(r) for r in cur.fetchall()]

        # Lists as arrays, both ways.
        with conn.cursor() as cur:
            cur.execute("SELECT %s::int[] AS a, %s::text[] AS t", ([1, 2, None], ["a b", "c"]))
            out["array_params"] = [typed(v) for v in cur.fetchone()]
            cur.execute("INSERT INTO tagged (id, tags) VALUES (%s, %s)", (10, ["x", "y"]))
            cur.execute("SELECT tags, cardinality(tags) FROM tagged WHERE id = 10")
            out["array_column"] = [typed(v) for v in cur.fetchone()]
        conn.commit()

        # Nested transactions: savepoints.
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (100, 'nested', 1.00)")
            try:
                with conn.transaction():
                    conn.execute("INSERT INTO orders VALUES (101, 'inner', 2.00)")
                    conn.execute("INSERT INTO orders VALUES (100, 'dup', 3.00)")
            except psycopg.errors.UniqueViolation as e:
                out["inner_error"] = e.sqlstate
            out["status_after_inner"] = conn.info.transaction_status.name
        out["nested_kept"] = conn.execute("SELECT id FROM orders WHERE id >= 100 ORDER BY id").fetchall()
        conn.commit()

        # COPY out and in.
        with conn.cursor() as cur:
            with cur.copy("COPY (SELECT id, customer, amount FROM orders ORDER BY id) TO STDOUT") as copy:
                out["copy_rows"] = [list(r) for r in copy.rows()]
            with cur.copy("COPY orders (id, customer, amount) FROM STDIN") as copy:
                copy.write_row((200, "copied", decimal.Decimal("9.99")))
            out["copied"] = cur.execute("SELECT customer, amount FROM orders WHERE id = 200").fetchone()[0]
        conn.commit()

        # Binary COPY in, every kind of column, NULLs, and a column left to its DEFAULT.
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE binary_copy (id INT PRIMARY KEY, big BIGINT, f DOUBLE PRECISION, ok BOOLEAN, "
                        "name TEXT, price NUMERIC(10,2), d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, j JSONB, b BYTEA, "
                        "tags TEXT[], note TEXT DEFAULT 'dflt')")
            rows = [(1, 2**40, 1.5, True, "héllo", decimal.Decimal("12.34"), datetime.date(2024, 2, 29),
                     datetime.datetime(2024, 1, 2, 3, 4, 5, 600000),
                     datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), {"a": [1, 2]}, b"\x00\xff",
                     ["x", "y z"]),
                    (2, None, None, None, None, decimal.Decimal("-0.5"), None, None, None, None, None, None)]
            with cur.copy("COPY binary_copy (id, big, f, ok, name, price, d, ts, tz, j, b, tags) "
                          "FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "int8", "float8", "bool", "text", "numeric", "date", "timestamp",
                                "timestamptz", "jsonb", "bytea", "text[]"])
                for r in rows:
                    copy.write_row(r)
            out["binary_copy"] = [[typed(v) if not isinstance(v, bytes) else v.hex() for v in r]
                                  for r in cur.execute("SELECT * FROM binary_copy ORDER BY id")]
            # Numerics in binary, rounded to the column's scale as a cast rounds them.
            cur.execute("CREATE TABLE binary_numeric (i INT, p NUMERIC(10,2), u NUMERIC(38,10))")
            numbers = ["1.005", "-2.345", "0", "99999999.99", "0.0000000001", "123456.789", "-0.004", "1e3"]
            with cur.copy("COPY binary_numeric FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "numeric", "numeric"])
                for i, n in enumerate(numbers):
                    copy.write_row((i, decimal.Decimal(n), decimal.Decimal(n)))
            out["binary_numeric"] = cur.execute("SELECT i, p::text, u::text FROM binary_numeric ORDER BY i").fetchall()
        conn.commit()

        # Errors keep their SQLSTATE and the connection.
        try:
            conn.execute("SELECT no_such_function(1)")
        except psycopg.Error as e:
            out["unknown_function"] = e.sqlstate
        conn.rollback()
        out["status_end"] = conn.info.transaction_status.name
    print(json.dumps(out, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
