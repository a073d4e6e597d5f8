//! EXPLAIN CREATE MATERIALIZED VIEW prints the dataflow: operators, keys and state. The
//! snapshots in `snapshots/` pin a representative set of plans.

use eddy_testkit::{EddyProcess, query_text};

#[tokio::test]
async fn dataflow_plans() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE users (id INT PRIMARY KEY, name TEXT, country TEXT);
             CREATE TABLE orders (oid INT PRIMARY KEY, user_id INT, amount NUMERIC(10,2));
             CREATE TABLE clicks (user_id INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5 seconds') APPEND ONLY;
             CREATE TABLE views (user_id INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5 seconds') APPEND ONLY;",
        )
        .await
        .unwrap();
    let plans = [
        (
            "filter_project",
            "SELECT id, upper(name) AS name FROM users WHERE country = 'FR'",
        ),
        (
            "aggregate_join",
            "SELECT u.country, count(*) AS n, sum(o.amount) AS total FROM users u JOIN orders o ON u.id = o.user_id AND o.amount > 1 GROUP BY u.country",
        ),
        (
            "outer_semi_union",
            "SELECT u.name, o.amount FROM users u LEFT JOIN orders o ON u.id = o.user_id UNION ALL SELECT name, NULL FROM users WHERE id IN (SELECT user_id FROM orders)",
        ),
        (
            "distinct_having",
            "SELECT DISTINCT country FROM users WHERE id IN (SELECT user_id FROM orders GROUP BY user_id HAVING count(*) > 2)",
        ),
        (
            "tumble_top_n",
            "SELECT * FROM (SELECT window_start, user_id, n, rank() OVER (PARTITION BY window_start ORDER BY n DESC) AS r FROM (SELECT window_start, user_id, count(*) AS n FROM TUMBLE(clicks, ts, INTERVAL '1' MINUTE) GROUP BY 1, 2) c) t WHERE r <= 3",
        ),
        (
            "session",
            "SELECT user_id, window_start, window_end, count(*) AS n FROM SESSION(clicks, ts, INTERVAL '30 seconds') GROUP BY 1, 2, 3",
        ),
        (
            "interval_join_enrich",
            "SELECT c.user_id, u.name FROM clicks c JOIN views v ON c.user_id = v.user_id AND v.ts BETWEEN c.ts AND c.ts + INTERVAL '1 minute' JOIN users FOR SYSTEM_TIME AS OF PROCTIME() u ON c.user_id = u.id",
        ),
        (
            "temporal_filter",
            "SELECT user_id FROM clicks WHERE ts > now() - INTERVAL '1 hour'",
        ),
        (
            "append_only_join_aggregate",
            "SELECT c.user_id, max(v.ts) AS last_view, count(*) AS n FROM clicks c JOIN views v ON c.user_id = v.user_id AND v.ts BETWEEN c.ts AND c.ts + INTERVAL '1 minute' GROUP BY c.user_id",
        ),
        (
            "append_only_top_n",
            "SELECT * FROM (SELECT user_id, ts, row_number() OVER (PARTITION BY user_id ORDER BY ts DESC) AS r FROM clicks) t WHERE r <= 1",
        ),
    ];
    for (name, query) in plans {
        let rows = query_text(
            &client,
            &format!("EXPLAIN CREATE MATERIALIZED VIEW v AS {query}"),
        )
        .await
        .unwrap();
        let text: Vec<String> = rows
            .into_iter()
            .map(|r| r[0].clone().unwrap_or_default())
            .collect();
        insta::assert_snapshot!(name, text.join("\n"));
    }
    // EXPLAIN creates nothing.
    let views = query_text(&client, "SHOW MATERIALIZED VIEWS")
        .await
        .unwrap();
    assert!(views.is_empty());
}
