//! Tables larger than memory (issue 19, ADR 0012): under a memory limit far below a table's
//! rows, a keyed table and a table without a key (both taking updates and deletes) keep their
//! key index and chunks of rows on disk, and every answer — scans, lookups by key, updates,
//! deletes, upserts, a transaction's own view of its writes, a view over the table — equals
//! PostgreSQL 15 doing the same, through a restart and a SIGKILL.

use eddy_testkit::{EddyProcess, TEST_WORKERS, assert_error, query_sorted};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

const TABLES: &str = "CREATE TABLE accounts (id BIGINT PRIMARY KEY, owner TEXT NOT NULL, balance NUMERIC(12,2), rate DOUBLE PRECISION, note TEXT);
     CREATE TABLE ledger (account BIGINT, amount NUMERIC(10,2), memo TEXT)";

/// Each query, run on both.
const QUERIES: [&str; 8] = [
    "SELECT * FROM accounts",
    "SELECT * FROM ledger",
    "SELECT * FROM accounts WHERE id = 4242",
    "SELECT id, balance FROM accounts WHERE id IN (7, 700, 7000, 19999)",
    // Key ranges looked up by the index (its keys on disk brought back first).
    "SELECT * FROM accounts WHERE id BETWEEN 4000 AND 4600",
    "SELECT id, note FROM accounts WHERE id > 19990 AND id <= 20010 AND rate > 1",
    "SELECT owner, count(*), sum(balance), max(rate) FROM accounts GROUP BY owner",
    "SELECT * FROM by_owner",
];

const VIEW: &str = "CREATE MATERIALIZED VIEW by_owner AS SELECT owner, count(*) AS n, sum(balance) AS total FROM accounts a JOIN ledger l ON a.id = l.account GROUP BY owner";

/// Accounts `from..to` and a ledger row for each: owners outside ASCII, balances with cents,
/// doubles with NaN, notes of ~100 characters, some NULL.
fn rows(from: u32, to: u32) -> String {
    let accounts: Vec<String> = (from..to)
        .map(|i| {
            let rate = match i % 17 {
                0 => "'NaN'".to_owned(),
                k => format!("{}.25", k),
            };
            let note = match i % 11 {
                0 => "NULL".to_owned(),
                _ => format!("'account {i} — ✓ {}'", "n".repeat(80 + (i % 9) as usize)),
            };
            format!(
                "({i}, 'owner {} ü', {}.{:02}, {rate}, {note})",
                i % 101,
                i % 5003,
                i % 100
            )
        })
        .collect();
    let ledger: Vec<String> = (from..to)
        .map(|i| format!("({i}, {}.{:02}, 'memo {}')", i % 97, i % 100, i % 31))
        .collect();
    format!(
        "INSERT INTO accounts VALUES {}; INSERT INTO ledger VALUES {}",
        accounts.join(", "),
        ledger.join(", ")
    )
}

async fn check(server: &EddyProcess, pg: &tokio_postgres::Client, when: &str) {
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    for query in QUERIES {
        let got = query_sorted(&client, query).await.unwrap();
        let want = query_sorted(pg, query).await.unwrap();
        assert_eq!(got.len(), want.len(), "{when}: {query} has another count");
        assert!(got == want, "{when}: {query} differs from PostgreSQL");
    }
}

/// (rows on disk, key index entries on disk) of table `name`.
async fn on_disk(server: &EddyProcess, name: &str) -> (i64, i64) {
    let client = server.connect().await.unwrap();
    let row = client
        .query_one(
            "SELECT rows_on_disk, index_entries_on_disk FROM eddy_tables WHERE table_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Runs `sql` on both.
async fn both(client: &tokio_postgres::Client, pg: &tokio_postgres::Client, sql: &str) {
    client.batch_execute(sql).await.unwrap();
    pg.batch_execute(sql).await.unwrap();
}

#[tokio::test]
async fn tables_past_the_memory_limit_spill_and_equal_postgres_through_restarts_and_a_crash() {
    let args = [
        "--workers".to_owned(),
        TEST_WORKERS.to_string(),
        "--memory-limit".to_owned(),
        "256kB".to_owned(),
        "--checkpoint-interval".to_owned(),
        "0".to_owned(),
    ];
    let mut server = EddyProcess::start_fresh_args(&binary(), &args).unwrap();
    let postgres = eddy_testkit::postgres::PostgresServer::start()
        .expect("PostgreSQL 15 (bin/test installs it)");
    let pg = postgres.connect().await.unwrap();
    let client = server.connect().await.unwrap();
    both(&client, &pg, TABLES).await;
    pg.batch_execute(&VIEW.replace("MATERIALIZED VIEW", "VIEW"))
        .await
        .unwrap();
    client.batch_execute(VIEW).await.unwrap();
    for start in (0..20_000).step_by(2_000) {
        both(&client, &pg, &rows(start, start + 2_000)).await;
    }
    check(&server, &pg, "after inserts").await;
    let (rows_on_disk, index_on_disk) = on_disk(&server, "accounts").await;
    assert!(
        rows_on_disk > 10_000 && index_on_disk > 10_000,
        "the keyed table kept its rows in memory: {rows_on_disk} rows and {index_on_disk} index entries on disk"
    );
    assert!(on_disk(&server, "ledger").await.0 > 10_000);

    // Writes that find their rows on disk: updates (by key and by scan), deletes, upserts.
    for sql in [
        "UPDATE accounts SET balance = balance + 1.50, note = 'raised' WHERE id % 7 = 0",
        "UPDATE accounts SET rate = 0.5 WHERE id = 4242",
        "DELETE FROM accounts WHERE id % 13 = 0",
        "DELETE FROM ledger WHERE account % 5 = 0",
        "UPDATE ledger SET amount = amount * 2 WHERE account % 3 = 0",
        "INSERT INTO accounts VALUES (13, 'back', 1.00, 1, 'again'), (20001, 'new ü', 2.00, 2, NULL) ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner",
        "INSERT INTO accounts VALUES (14, 'upserted', 3.00, 3, 'x') ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, balance = EXCLUDED.balance",
    ] {
        both(&client, &pg, sql).await;
    }
    // A key on disk is still taken.
    let taken = client
        .batch_execute("INSERT INTO accounts VALUES (19999, 'dup', 0, 0, NULL)")
        .await
        .unwrap_err();
    assert_error(&taken, "23505", "duplicate key value");
    check(&server, &pg, "after updates and deletes").await;

    // A transaction's copy of the table reads the rows on disk as they were when it began
    // writing, sees its own writes, and commits them; one that lost a race is refused.
    client
        .batch_execute(
            "BEGIN; UPDATE accounts SET note = 'in a transaction' WHERE id BETWEEN 100 AND 400",
        )
        .await
        .unwrap();
    let mine = query_sorted(
        &client,
        "SELECT count(*) FROM accounts WHERE note = 'in a transaction'",
    )
    .await
    .unwrap();
    let expected = query_sorted(
        &pg,
        "SELECT count(*) FROM accounts WHERE id BETWEEN 100 AND 400",
    )
    .await
    .unwrap();
    assert_eq!(mine, expected, "the transaction does not see its writes");
    let other = server.connect().await.unwrap();
    let outside = query_sorted(
        &other,
        "SELECT count(*) FROM accounts WHERE note = 'in a transaction'",
    )
    .await
    .unwrap();
    assert_eq!(
        outside,
        [[Some("0".to_owned())]],
        "an uncommitted write shows"
    );
    client.batch_execute("COMMIT").await.unwrap();
    pg.batch_execute("UPDATE accounts SET note = 'in a transaction' WHERE id BETWEEN 100 AND 400")
        .await
        .unwrap();
    client
        .batch_execute("BEGIN; UPDATE accounts SET owner = 'loser' WHERE id = 15001")
        .await
        .unwrap();
    both(
        &other,
        &pg,
        "UPDATE accounts SET owner = 'winner' WHERE id = 15001",
    )
    .await;
    let lost = client.batch_execute("COMMIT").await.unwrap_err();
    assert_error(&lost, "40001", "could not serialize");
    check(&server, &pg, "after transactions").await;

    // Schema changes of a table on disk: a column made nullable (the chunks on disk are read
    // under the new schema, not brought back), and a column added (the table read back from
    // its log within the limit).
    both(
        &client,
        &pg,
        "ALTER TABLE accounts ALTER COLUMN owner DROP NOT NULL",
    )
    .await;
    let (rows_on_disk, _) = on_disk(&server, "accounts").await;
    assert!(
        rows_on_disk > 10_000,
        "dropping NOT NULL brought the table's rows back into memory: {rows_on_disk} on disk"
    );
    both(
        &client,
        &pg,
        "INSERT INTO accounts VALUES (40001, NULL, 0.10, NULL, 'no owner'); ALTER TABLE ledger ADD COLUMN extra TEXT",
    )
    .await;
    both(
        &client,
        &pg,
        "UPDATE ledger SET extra = 'x' WHERE account % 4 = 1",
    )
    .await;
    check(&server, &pg, "after schema changes").await;
    assert!(on_disk(&server, "ledger").await.0 > 10_000);

    // A restart reads the tables back from their logs within the limit; so does a crash in
    // the middle of writes.
    drop((client, other));
    server.restart_in_place(false).unwrap();
    check(&server, &pg, "after a restart").await;
    assert!(on_disk(&server, "accounts").await.1 > 10_000);
    let client = server.connect().await.unwrap();
    both(&client, &pg, &rows(30_000, 32_000)).await;
    both(
        &client,
        &pg,
        "UPDATE accounts SET balance = balance - 1 WHERE id % 10 = 3",
    )
    .await;
    drop(client);
    server.restart_in_place(true).unwrap();
    check(&server, &pg, "after a crash").await;
}
