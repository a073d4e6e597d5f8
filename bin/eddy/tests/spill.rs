//! State larger than memory (issue 19, ADR 0012): with a memory limit far below what the views'
//! joins and top-N hold, their arrangements spill to disk and keep answering exactly — every view equals
//! its query recomputed in batch — through updates, deletes, a checkpoint, a restart and a
//! SIGKILL in the middle of writes that spill at every batch; checkpoints of their changes only
//! restore exactly too, also after a crash in the middle of writing one. A view that only
//! inserts (a filter over a stream) spills its contents' chunks and equals PostgreSQL 15.

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

/// The arguments of a server with a memory limit far below the views' state, without
/// periodic checkpoints.
fn limited() -> [String; 6] {
    [
        "--workers".to_owned(),
        TEST_WORKERS.to_string(),
        "--memory-limit".to_owned(),
        "256kB".to_owned(),
        "--checkpoint-interval".to_owned(),
        "0".to_owned(),
    ]
}

/// A server with a memory limit far below the views' state, without periodic checkpoints:
/// 1 200 customers, `orders_count` orders and the views over them.
async fn start(orders_count: u32) -> EddyProcess {
    let server = EddyProcess::start_fresh_args(&binary(), &limited()).unwrap();
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
    client
        .batch_execute(&orders(0, orders_count))
        .await
        .unwrap();
    for (view, query) in VIEWS {
        client
            .batch_execute(&format!("CREATE MATERIALIZED VIEW {view} AS {query}"))
            .await
            .unwrap();
    }
    server
}

#[tokio::test]
async fn joins_past_the_memory_limit_spill_and_stay_exact_through_restarts_and_a_crash() {
    let mut server = start(9000).await;
    let client = server.connect().await.unwrap();
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
    client.batch_execute(&orders(9000, 11000)).await.unwrap();
    check_views(&server, "after changes").await;
    // The views' contents (past a chunk of rows, with retractions) spill their chunks too.
    assert!(
        server.contents_spill_files() > 0,
        "no chunk of a view's contents spilled"
    );

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
            .batch_execute(&orders(11000 + round * 300, 11300 + round * 300))
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

/// The newest checkpoint's bytes written.
async fn checkpoint_bytes(server: &EddyProcess) -> u64 {
    let client = server.connect().await.unwrap();
    let rows = query_sorted(&client, "SELECT bytes FROM eddy_checkpoints")
        .await
        .unwrap();
    rows.last().unwrap()[0].as_deref().unwrap().parse().unwrap()
}

/// Bytes of checkpoint files in the server's data directory, and the checkpoints (epochs) whose
/// directories hold them (`<epoch>` for contents, `<epoch>-v<view>` for each view's operators).
fn checkpoint_disk(server: &EddyProcess) -> (u64, usize) {
    let mut bytes = 0;
    let mut epochs = std::collections::BTreeSet::new();
    for dir in std::fs::read_dir(server.data_dir.join("checkpoints"))
        .unwrap()
        .flatten()
    {
        let name = dir.file_name().to_string_lossy().into_owned();
        let epoch: String = name.chars().take_while(char::is_ascii_digit).collect();
        epochs.insert(epoch);
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            bytes += file.metadata().unwrap().len();
        }
    }
    (bytes, epochs.len())
}

#[tokio::test]
async fn incremental_checkpoints_write_the_changed_keys_and_restore_exactly() {
    let mut server = start(6000).await;
    let client = server.connect().await.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    let whole = checkpoint_bytes(&server).await;

    // A few keys change: the next checkpoint writes them (and the views' changed rows), and
    // names the files of the first for the rest. The join views only inserted until then:
    // the rows they inserted before their first retraction are among the changes.
    client.batch_execute(&orders(9000, 9040)).await.unwrap();
    client
        .batch_execute(
            "UPDATE orders SET amount = amount + 1 WHERE id < 30;
             UPDATE customers SET region = 'moved' WHERE id = 7;
             DELETE FROM orders WHERE id BETWEEN 100 AND 104;
             CHECKPOINT",
        )
        .await
        .unwrap();
    let changes = checkpoint_bytes(&server).await;
    assert!(
        changes * 5 < whole,
        "a checkpoint of a few changes wrote {changes} bytes, the whole state {whole}"
    );
    let (on_disk, epochs) = checkpoint_disk(&server);
    assert_eq!(epochs, 2, "the second names the first's files");
    assert!(on_disk <= whole + changes, "{on_disk} bytes on disk");
    check_views(&server, "after an incremental checkpoint").await;
    drop(client);
    server.restart_in_place(false).unwrap();
    check_views(&server, "restored from a chain of checkpoints").await;

    // Changes on top of the restored chain, another checkpoint of them, then a crash.
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "DELETE FROM customers WHERE id = 11;
             UPDATE orders SET note = NULL WHERE id BETWEEN 200 AND 210;
             CHECKPOINT;",
        )
        .await
        .unwrap();
    assert!(checkpoint_bytes(&server).await * 5 < whole);
    client.batch_execute(&orders(6000, 6500)).await.unwrap();
    drop(client);
    server.restart_in_place(true).unwrap();
    check_views(&server, "after a crash past a chain of three").await;

    // Checkpoint after checkpoint of changes: parts go whole again once their changes pass
    // half of them, so what is on disk (and what a restart reads) stays within a bound.
    let client = server.connect().await.unwrap();
    for round in 0..10 {
        client
            .batch_execute(&format!(
                "UPDATE orders SET amount = amount + 1 WHERE id % 10 IN ({round}, {}, {}); CHECKPOINT",
                (round + 1) % 10,
                (round + 2) % 10
            ))
            .await
            .unwrap();
        let (on_disk, _) = checkpoint_disk(&server);
        assert!(
            on_disk < whole * 2,
            "round {round}: {on_disk} bytes on disk, whole {whole}"
        );
    }
    drop(client);
    server.restart_in_place(false).unwrap();
    check_views(&server, "after rounds of checkpoints of changes").await;

    // Most keys change: the next checkpoint is whole again, and the older files go.
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "UPDATE orders SET amount = amount + 2;
             UPDATE customers SET name = name || '!', region = region || '!';
             CHECKPOINT;",
        )
        .await
        .unwrap();
    // Files the newest checkpoint does not name are gone (a view of a dozen rows may still
    // name a few small files of changes in older directories).
    let last = checkpoint_bytes(&server).await;
    assert!(last * 2 > whole, "{last} bytes written, whole {whole}");
    let (on_disk, _) = checkpoint_disk(&server);
    assert!(
        on_disk < last + 64 * 1024,
        "{on_disk} bytes on disk, {last} written last"
    );
    drop(client);
    server.restart_in_place(false).unwrap();
    check_views(&server, "restored from a whole checkpoint again").await;
}

#[tokio::test]
async fn a_crash_in_the_middle_of_an_incremental_checkpoint_restores_exactly() {
    let mut server = start(3000).await;
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CHECKPOINT;
             UPDATE orders SET amount = amount + 1 WHERE id < 50;
             CHECKPOINT;",
        )
        .await
        .unwrap();
    drop(client);
    // The writer dies once the files of a checkpoint of changes are written and before its
    // manifest is committed; then once it is committed and before older files are deleted.
    for step in ["checkpoint_commit", "checkpoint_cleanup"] {
        server.set_envs(&[("EDDY_FAILPOINTS", &format!("{step}:writer:abort"))]);
        server.restart_in_place(false).unwrap();
        let client = server.connect().await.unwrap();
        client
            .batch_execute(
                "UPDATE customers SET region = region || '+' WHERE id % 100 = 3;
                 DELETE FROM orders WHERE id % 97 = 5;",
            )
            .await
            .unwrap();
        client.batch_execute(&orders(3000, 3100)).await.unwrap();
        let e = client.batch_execute("CHECKPOINT").await.unwrap_err();
        assert!(e.is_closed() || e.code().is_none(), "{step}: {e:?}");
        drop(client);
        server.set_envs(&[]);
        server.restart_in_place(true).unwrap();
        check_views(&server, &format!("after a crash at {step}")).await;
        // The next checkpoint builds on what was committed, and restores too.
        let client = server.connect().await.unwrap();
        client
            .batch_execute("UPDATE orders SET note = 'again' WHERE id % 50 = 1; CHECKPOINT")
            .await
            .unwrap();
        drop(client);
        server.restart_in_place(false).unwrap();
        check_views(
            &server,
            &format!("after a checkpoint past the crash at {step}"),
        )
        .await;
        // The next round inserts these orders again.
        let client = server.connect().await.unwrap();
        client
            .batch_execute("DELETE FROM orders WHERE id >= 3000")
            .await
            .unwrap();
    }

    // A checkpoint file that does not match its checksum: the views are rebuilt from the log.
    let client = server.connect().await.unwrap();
    client.batch_execute("CHECKPOINT").await.unwrap();
    drop(client);
    server.stop().unwrap();
    let mut largest = None;
    for dir in std::fs::read_dir(server.data_dir.join("checkpoints"))
        .unwrap()
        .flatten()
    {
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let len = file.metadata().unwrap().len();
            if largest.as_ref().is_none_or(|(l, _)| len > *l) {
                largest = Some((len, file.path()));
            }
        }
    }
    let (len, path) = largest.unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[len as usize / 2] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
    server.restart_in_place(true).unwrap();
    check_views(&server, "after a checkpoint file was damaged").await;
    let client = server.connect().await.unwrap();
    let restored = query_sorted(&client, "SELECT DISTINCT restored_from FROM eddy_views")
        .await
        .unwrap();
    assert_eq!(restored, [[Some("log".to_owned())]]);
}

/// Rows `from..to` of the `events` stream: amounts with cents, notes with some outside ASCII,
/// some NULL.
fn events(from: u32, to: u32) -> String {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let note = match i % 13 {
                0 => "NULL".to_owned(),
                k => format!("'event {i} — ✓ naïve {}'", "y".repeat(40 + k as usize)),
            };
            format!("({i}, {}, {}.{:02}, {note})", i % 501, i % 89, i % 100)
        })
        .collect();
    format!("INSERT INTO events VALUES {}", values.join(", "))
}

/// Checks the insert-only view against PostgreSQL 15 running its query over the same rows.
async fn check_insert_only(
    server: &EddyProcess,
    pg: &tokio_postgres::Client,
    view: &str,
    query: &str,
    when: &str,
) {
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    let got = query_sorted(&client, &format!("SELECT * FROM {view}"))
        .await
        .unwrap();
    let want = query_sorted(pg, query).await.unwrap();
    assert!(want.len() > 20_000, "{when}: too few rows to spill");
    assert_eq!(got.len(), want.len(), "{when}: {view} has another count");
    assert!(got == want, "{when}: {view} differs from PostgreSQL");
}

#[tokio::test]
async fn insert_only_view_contents_spill_and_equal_postgres_through_restarts_and_a_crash() {
    const TABLE: &str =
        "CREATE TABLE events (id BIGINT, customer BIGINT, amount NUMERIC(10,2), note TEXT)";
    const QUERY: &str = "SELECT id, customer, amount * 2 AS doubled, length(note) AS len, note FROM events WHERE amount > 3";
    let mut server = EddyProcess::start_fresh_args(&binary(), &limited()).unwrap();
    let postgres = eddy_testkit::postgres::PostgresServer::start()
        .expect("PostgreSQL 15 (bin/test installs it)");
    let pg = postgres.connect().await.unwrap();
    pg.batch_execute(TABLE).await.unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "{TABLE} APPEND ONLY; CREATE MATERIALIZED VIEW big_events AS {QUERY}"
        ))
        .await
        .unwrap();
    let write = async |from: u32, to: u32| {
        for start in (from..to).step_by(2000) {
            let insert = events(start, (start + 2000).min(to));
            client.batch_execute(&insert).await.unwrap();
            pg.batch_execute(&insert).await.unwrap();
        }
    };
    write(0, 24_000).await;
    check_insert_only(&server, &pg, "big_events", QUERY, "after inserts").await;
    // Past its share of the budget, the view's chunks of rows went to files: the query above
    // read them back.
    assert!(
        server.contents_spill_files() > 0,
        "no chunk of the insert-only view's contents spilled"
    );

    // A checkpoint writes the contents whole from memory and files; a restart reads it back.
    client.batch_execute("CHECKPOINT").await.unwrap();
    let whole = checkpoint_bytes(&server).await;
    drop(client);
    server.restart_in_place(false).unwrap();
    check_insert_only(&server, &pg, "big_events", QUERY, "after a restart").await;

    // More rows (spilling again); a checkpoint writes only the rows inserted since the last
    // (some read back from files); more rows, then a SIGKILL: the restore applies the rows
    // inserted to the whole contents, and the log replays past the checkpoint.
    let client = server.connect().await.unwrap();
    let write = async |from: u32, to: u32| {
        let insert = events(from, to);
        client.batch_execute(&insert).await.unwrap();
        pg.batch_execute(&insert).await.unwrap();
    };
    write(24_000, 33_000).await;
    client.batch_execute("FLUSH; CHECKPOINT").await.unwrap();
    let inserted = checkpoint_bytes(&server).await;
    assert!(
        inserted * 2 < whole,
        "the checkpoint after 9 000 of 33 000 rows wrote {inserted} bytes, the whole one {whole}"
    );
    write(33_000, 34_000).await;
    drop(client);
    server.restart_in_place(true).unwrap();
    check_insert_only(&server, &pg, "big_events", QUERY, "after a crash").await;
    assert!(
        server.contents_spill_files() > 0,
        "the view's contents did not spill again after the crash"
    );
}

/// The aggregate views of the aggregate test, each with the query PostgreSQL runs for it.
const AGGREGATES: [(&str, &str, &str); 3] = [
    (
        "by_customer",
        "SELECT customer, count(*) AS n, sum(amount) AS total, max(price) AS top, min(note) AS first_note FROM sales GROUP BY customer",
        "SELECT customer, count(*) AS n, sum(amount) AS total, max(price) AS top, min(note) AS first_note FROM sales GROUP BY customer",
    ),
    (
        "by_bucket",
        "SELECT customer % 700 AS bucket, count(DISTINCT customer) AS customers, sum(DISTINCT amount) AS amounts FROM sales GROUP BY customer % 700",
        "SELECT customer % 700 AS bucket, count(DISTINCT customer) AS customers, sum(DISTINCT amount) AS amounts FROM sales GROUP BY customer % 700",
    ),
    (
        "per_user_minute",
        "SELECT window_start, u, count(*) AS n FROM TUMBLE(clicks, ts, INTERVAL '1' MINUTE) GROUP BY 1, 2",
        "SELECT date_bin('1 minute', ts, TIMESTAMP '2000-01-01') AS window_start, u, count(*) AS n FROM clicks GROUP BY 1, 2",
    ),
];

/// Sales `from..to`: 4 001 customers, amounts with cents, doubles with NaN, notes outside
/// ASCII, some NULL.
fn sales(from: u32, to: u32) -> String {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let price = match i % 500 {
                0 => "'NaN'".to_owned(),
                k => format!("{k}.{}", i % 10),
            };
            let note = match i % 17 {
                0 => "NULL".to_owned(),
                k => format!("'sale {i} — ✓ ß {k}'"),
            };
            format!(
                "({i}, {}, {}.{:02}, {price}, {note})",
                (i * 7) % 4001,
                i % 997,
                i % 100
            )
        })
        .collect();
    format!("INSERT INTO sales VALUES {}", values.join(", "))
}

/// Clicks `from..to`, a second apart (`late`: ten minutes behind), 97 users.
fn clicks(from: u32, to: u32, late: bool) -> String {
    let values: Vec<String> = (from..to)
        .map(|i| {
            let at = if late { i - 600 } else { i };
            format!(
                "({i}, {}, TIMESTAMP '2026-01-01' + INTERVAL '{at} seconds')",
                i % 97
            )
        })
        .collect();
    format!("INSERT INTO clicks VALUES {}", values.join(", "))
}

/// Every aggregate view equals PostgreSQL 15 running its query over the same rows.
async fn check_aggregates(server: &EddyProcess, pg: &tokio_postgres::Client, when: &str) {
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    for (view, _, query) in AGGREGATES {
        let got = query_sorted(&client, &format!("SELECT * FROM {view}"))
            .await
            .unwrap();
        let want = query_sorted(pg, query).await.unwrap();
        assert!(want.len() >= 700, "{when}: {view} has too few groups");
        assert_eq!(got.len(), want.len(), "{when}: {view} has another count");
        assert!(got == want, "{when}: {view} differs from PostgreSQL");
    }
}

/// Groups of `view`'s aggregates on disk now.
async fn spilled_groups(server: &EddyProcess, view: &str) -> u64 {
    let client = server.connect().await.unwrap();
    let sql = format!(
        "SELECT coalesce(sum(spilled_rows), 0) FROM eddy_operators WHERE view = '{view}' AND operator LIKE 'Aggregate%'"
    );
    let rows = query_sorted(&client, &sql).await.unwrap();
    rows[0][0].as_deref().unwrap_or("0").parse().unwrap()
}

#[tokio::test]
async fn aggregates_past_the_memory_limit_spill_and_equal_postgres_through_restarts_and_a_crash() {
    const SALES: &str = "CREATE TABLE sales (id BIGINT PRIMARY KEY, customer BIGINT, amount NUMERIC(10,2), price DOUBLE PRECISION, note TEXT)";
    let mut server = EddyProcess::start_fresh_args(&binary(), &limited()).unwrap();
    let postgres = eddy_testkit::postgres::PostgresServer::start()
        .expect("PostgreSQL 15 (bin/test installs it)");
    let pg = postgres.connect().await.unwrap();
    pg.batch_execute(&format!(
        "{SALES}; CREATE TABLE clicks (id BIGINT, u BIGINT, ts TIMESTAMP)"
    ))
    .await
    .unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "{SALES}; CREATE TABLE clicks (id BIGINT, u BIGINT, ts TIMESTAMP, \
             WATERMARK FOR ts AS ts - INTERVAL '5 seconds') APPEND ONLY"
        ))
        .await
        .unwrap();
    let both = async |sql: &str| {
        client.batch_execute(sql).await.unwrap();
        pg.batch_execute(sql).await.unwrap();
    };
    for start in (0..12_000).step_by(2000) {
        both(&sales(start, start + 2000)).await;
        both(&clicks(start, start + 2000, false)).await;
    }
    for (view, query, _) in AGGREGATES {
        // Windows keep their state for 30 minutes after they close: late rows correct them.
        let with = match view {
            "per_user_minute" => "WITH (late_events = 'retract', allowed_lateness = '30 minutes')",
            _ => "",
        };
        client
            .batch_execute(&format!(
                "CREATE MATERIALIZED VIEW {view} {with} AS {query}"
            ))
            .await
            .unwrap();
    }
    check_aggregates(&server, &pg, "after backfill").await;
    for (view, _, _) in AGGREGATES {
        assert!(
            spilled_groups(&server, view).await > 0,
            "no group of {view} went to disk"
        );
    }

    // Changes to groups on disk: updates, deletes, new sales, clicks on time and late ones
    // (their windows closed and spilled, within the allowed lateness).
    let change = async |round: u32| {
        both(&format!(
            "UPDATE sales SET amount = amount + 1.25, note = 'round {round} ü' WHERE id % {} = 0",
            9 + round
        ))
        .await;
        both(&format!("DELETE FROM sales WHERE id % {} = 3", 13 + round)).await;
        let from = 12_000 + round * 1000;
        both(&sales(from, from + 1000)).await;
        both(&clicks(from, from + 1000, false)).await;
        both(&clicks(from + 500, from + 600, true)).await;
    };
    change(0).await;
    check_aggregates(&server, &pg, "after changes").await;

    // A whole checkpoint, changes, a checkpoint of them, a restart from the chain.
    client.batch_execute("CHECKPOINT").await.unwrap();
    change(1).await;
    client.batch_execute("FLUSH; CHECKPOINT").await.unwrap();
    drop(client);
    server.restart_in_place(false).unwrap();
    check_aggregates(&server, &pg, "after a restart").await;

    // Changes past the checkpoint, then a SIGKILL: the restore replays them from the log.
    let client = server.connect().await.unwrap();
    let both = async |sql: &str| {
        client.batch_execute(sql).await.unwrap();
        pg.batch_execute(sql).await.unwrap();
    };
    both(&sales(20_000, 22_000)).await;
    both("UPDATE sales SET price = price * 2 WHERE customer % 5 = 1").await;
    both(&clicks(20_000, 22_000, false)).await;
    drop(client);
    server.restart_in_place(true).unwrap();
    check_aggregates(&server, &pg, "after a crash").await;
    assert!(
        spilled_groups(&server, "by_customer").await > 0,
        "the aggregate did not spill again after the crash"
    );
    // Windows the watermark passed by more than the lateness left the disk too: of the
    // ~22 000 (window, user) groups ever made, about 31 windows of 60 are kept.
    let windows = spilled_groups(&server, "per_user_minute").await;
    assert!(
        windows < 4000,
        "{windows} groups of passed windows are still on disk"
    );
}
