//! State larger than memory (issue 19, ADR 0012): with a memory limit far below what the views'
//! joins and top-N hold, their arrangements spill to disk and keep answering exactly — every view equals
//! its query recomputed in batch — through updates, deletes, a checkpoint, a restart and a
//! SIGKILL in the middle of writes that spill at every batch.

use eddy_testkit::{EddyProcess, TEST_WORKERS, query_sorted};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

/// Each view and the query it maintains.
const VIEWS: [(&str, &str); 4] = [
    (
        "orders_by_customer",
        "SELECT o.id, c.name, c.region, o.amount, o.note FROM orders o JOIN customers c ON o.customer = c.id",
    ),
    (
        "orders_with_customer",
        "SELECT o.id, c.name, o.amount FROM orders o LEFT JOIN customers c ON o.customer = c.id",
    ),
    (
        "top_orders",
        "SELECT * FROM (SELECT id, customer, amount, note, ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount DESC, id) AS r FROM orders) x WHERE r <= 2",
    ),
    (
        "region_totals",
        "SELECT c.region, count(*) AS n, sum(o.amount) AS total FROM orders o FULL JOIN customers c ON o.customer = c.id GROUP BY c.region",
    ),
];

async fn check_views(server: &EddyProcess, when: &str) {
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    for (view, query) in VIEWS {
        let got = query_sorted(&client, &format!("SELECT * FROM {view}"))
            .await
            .unwrap();
        let want = query_sorted(&client, query).await.unwrap();
        assert!(!want.is_empty(), "{when}: {view} is empty");
        assert_eq!(got, want, "{when}: {view} differs from its query");
    }
}

async fn spilled_rows(server: &EddyProcess) -> u64 {
    let client = server.connect().await.unwrap();
    let rows = query_sorted(
        &client,
        "SELECT coalesce(sum(spilled_rows), 0) FROM eddy_operators",
    )
    .await
    .unwrap();
    rows[0][0].as_deref().unwrap_or("0").parse().unwrap()
}

/// A batch of orders `from..to`: customers by a stride, amounts with cents, notes of ~100
/// characters with some outside ASCII, some NULL.
fn orders(from: u32, to: u32) -> String {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let note = if i % 11 == 0 {
                "NULL".to_owned()
            } else {
                format!(
                    "'note {i} — façade ✓ {}'",
                    "x".repeat(80 + (i % 7) as usize)
                )
            };
            format!(
                "({i}, {}, {}.{:02}, {note})",
                (i * 7) % 1300,
                i % 997,
                i % 100
            )
        })
        .collect();
    format!("INSERT INTO orders VALUES {}", values.join(", "))
}

#[tokio::test]
async fn joins_past_the_memory_limit_spill_and_stay_exact_through_restarts_and_a_crash() {
    let args = [
        "--workers".to_owned(),
        TEST_WORKERS.to_string(),
        "--memory-limit".to_owned(),
        "256kB".to_owned(),
        "--checkpoint-interval".to_owned(),
        "0".to_owned(),
    ];
    let mut server = EddyProcess::start_fresh_args(&binary(), &args).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT, region TEXT);
             CREATE TABLE orders (id BIGINT PRIMARY KEY, customer BIGINT, amount NUMERIC(10,2), note TEXT);",
        )
        .await
        .unwrap();
    let customers: Vec<String> = (0..1200)
        .map(|i| format!("({i}, 'customer {i} ü', 'region {}')", i % 13))
        .collect();
    client
        .batch_execute(&format!(
            "INSERT INTO customers VALUES {}",
            customers.join(", ")
        ))
        .await
        .unwrap();
    client.batch_execute(&orders(0, 4000)).await.unwrap();
    for (view, query) in VIEWS {
        client
            .batch_execute(&format!("CREATE MATERIALIZED VIEW {view} AS {query}"))
            .await
            .unwrap();
    }
    check_views(&server, "after backfill").await;
    assert!(spilled_rows(&server).await > 0, "nothing spilled");

    // Changes that bring spilled keys back: updates of both sides, deletes, new rows.
    client
        .batch_execute(
            "UPDATE orders SET amount = amount + 1.10 WHERE id % 5 = 0;
             UPDATE customers SET region = 'moved' WHERE id % 17 = 3;
             DELETE FROM orders WHERE id % 9 = 4;
             DELETE FROM customers WHERE id % 23 = 5;",
        )
        .await
        .unwrap();
    client.batch_execute(&orders(4000, 6000)).await.unwrap();
    check_views(&server, "after changes").await;

    // A checkpoint of spilled state, then a clean restart from it.
    client.batch_execute("CHECKPOINT").await.unwrap();
    drop(client);
    server.restart_in_place(false).unwrap();
    check_views(&server, "after a restart").await;

    // Writes that spill at every batch, and a SIGKILL among them.
    let client = server.connect().await.unwrap();
    for round in 0..6u32 {
        client
            .batch_execute(&format!(
                "UPDATE customers SET name = name || '.' WHERE id % 6 = {round};"
            ))
            .await
            .unwrap();
        client
            .batch_execute(&orders(6000 + round * 300, 6300 + round * 300))
            .await
            .unwrap();
    }
    drop(client);
    server.restart_in_place(true).unwrap();
    check_views(&server, "after a crash").await;
    assert!(
        spilled_rows(&server).await > 0,
        "nothing spilled after the crash"
    );
}
