//! EXPLAIN CREATE MATERIALIZED VIEW prints the dataflow: operators, keys and state. The
//! snapshots in `snapshots/` pin a representative set of plans.

use eddy_testkit::{EddyProcess, query_text};

#[tokio::test]
async fn dataflow_plans() {
    let server = EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE users (id INT PRIMARY KEY, name TEXT, country TEXT);
             CREATE TABLE orders (oid INT PRIMARY KEY, user_id INT, amount NUMERIC(10,2));",
        )
        .await
        .unwrap();
    let plans = [
        ("filter_project", "SELECT id, upper(name) AS name FROM users WHERE country = 'FR'"),
        ("aggregate_join", "SELECT u.country, count(*) AS n, sum(o.amount) AS total FROM users u JOIN orders o ON u.id = o.user_id AND o.amount > 1 GROUP BY u.country"),
        ("outer_semi_union", "SELECT u.name, o.amount FROM users u LEFT JOIN orders o ON u.id = o.user_id UNION ALL SELECT name, NULL FROM users WHERE id IN (SELECT user_id FROM orders)"),
        ("distinct_having", "SELECT DISTINCT country FROM users WHERE id IN (SELECT user_id FROM orders GROUP BY user_id HAVING count(*) > 2)"),
    ];
    for (name, query) in plans {
        let rows = query_text(&client, &format!("EXPLAIN CREATE MATERIALIZED VIEW v AS {query}")).await.unwrap();
        let text: Vec<String> = rows.into_iter().map(|r| r[0].clone().unwrap_or_default()).collect();
        insta::assert_snapshot!(name, text.join("\n"));
    }
    // EXPLAIN creates nothing.
    let views = query_text(&client, "SHOW MATERIALIZED VIEWS").await.unwrap();
    assert!(views.is_empty());
}
