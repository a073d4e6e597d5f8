//! A `SOURCE` read by several views is read and decoded once (issue 18, ADR 0009 step 6):
//! views at the same position of a source partition read it with one reader, which
//! `eddy_source_offsets.reader` shows. A view created later reads the file on its own until it
//! is near the others, then joins them; a view that cannot keep up leaves the shared reader
//! (the others go on) and joins again once it has caught up; after a restart the views read
//! together from the start. Every answer is checked against the file's own sums.

use std::io::Write;
use std::path::Path;

use eddy_testkit::{EddyProcess, eventually, failpoint_env, text, until};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

/// Appends lines `from..=to` of `{"id": i, "pad": "..."}` to `file`.
fn append(file: &Path, from: i64, to: i64, pad: usize) {
    let pad = "x".repeat(pad);
    let lines: String = (from..=to)
        .map(|i| format!("{{\"id\": {i}, \"pad\": \"{pad}\"}}\n"))
        .collect();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
}

/// `count(*) sum(id)` of ids 1..=n.
fn sums(n: i64) -> String {
    format!("{n} {}", n * (n + 1) / 2)
}

/// The reader each of `views` reads `events` with, one line per view; read without FLUSH.
async fn readers(server: &EddyProcess) -> Vec<String> {
    text(
        server,
        "SELECT consumer, reader FROM eddy_source_offsets WHERE object = 'events' ORDER BY consumer",
    )
    .await
    .lines()
    .map(|l| l.split(' ').nth(1).unwrap_or_default().to_owned())
    .collect()
}

/// Waits until the two views read `events` with one reader.
async fn together(server: &EddyProcess) {
    let sql = "SELECT count(*), count(DISTINCT reader), count(reader) FROM eddy_source_offsets WHERE object = 'events'";
    until(server, sql, "2 1 2").await;
}

#[tokio::test]
async fn views_over_one_source_read_it_together() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    append(&file, 1, 30_000, 100);
    let mut server = EddyProcess::start(&binary(), &dir.path().join("data")).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE SOURCE events (id BIGINT, pad TEXT) WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW a AS SELECT count(*) AS n, sum(id) AS s FROM events;",
            file.display()
        ))
        .await
        .unwrap();
    append(&file, 30_001, 60_000, 100);
    // `b` starts at the file's start, 7 MB behind `a`: it reads up to `a`'s position (a read
    // cut exactly there), then joins `a`.
    client
        .batch_execute(
            "CREATE MATERIALIZED VIEW b AS SELECT id % 7 AS k, count(*) AS n FROM events GROUP BY 1",
        )
        .await
        .unwrap();
    together(&server).await;
    append(&file, 60_001, 70_000, 100);
    eventually(&server, "SELECT n, s FROM a", &sums(70_000)).await;
    eventually(&server, "SELECT sum(n) FROM b", "70000").await;
    eventually(
        &server,
        "SELECT k, n FROM b WHERE k IN (0, 6) ORDER BY k",
        "0 10000\n6 10000",
    )
    .await;

    // After a crash both read the file again from their checkpoint (or its start), together.
    server.restart_in_place(true).unwrap();
    eventually(&server, "SELECT n, s FROM a", &sums(70_000)).await;
    eventually(&server, "SELECT sum(n) FROM b", "70000").await;
    together(&server).await;
    append(&file, 70_001, 80_000, 100);
    eventually(&server, "SELECT n, s FROM a", &sums(80_000)).await;
    eventually(&server, "SELECT sum(n) FROM b", "80000").await;
}

/// Two views read a source together; one gets stuck (`EDDY_FAILPOINTS` blocks its dataflow).
/// Once its lane is full it leaves the shared reader: the other view reads the whole file and
/// what is appended while the stuck one waits. Released, the stuck one reads the rest on its
/// own, joins the other's reader again, and both answer exactly.
#[tokio::test]
async fn a_view_that_cannot_keep_up_leaves_the_shared_reader_and_joins_again() {
    leaves_and_joins_again("").await;
}

/// The same over a keyed source: each view resolves the rows against its own copy, so a view
/// leaving must not have applied the chunk it did not get (it reads that chunk again, and a
/// second insert of the same keys would be set aside as duplicates).
#[tokio::test]
async fn a_view_leaving_a_keyed_source_reads_its_chunk_again_exactly() {
    leaves_and_joins_again(" PRIMARY KEY").await;
}

async fn leaves_and_joins_again(key: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, b"").unwrap();
    let gate = dir.path().join("release");
    let server = EddyProcess::start_env(
        &binary(),
        &dir.path().join("data"),
        &[],
        &failpoint_env("view_changes:stuck:block", Some(&gate)),
    )
    .unwrap();
    let client = server.connect().await.unwrap();
    // Both created over the empty file: they start at one position and read together.
    client
        .batch_execute(&format!(
            "CREATE SOURCE events (id BIGINT{key}, pad TEXT) WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW stuck AS SELECT count(*) AS n, sum(id) AS s FROM events;
             CREATE MATERIALIZED VIEW live AS SELECT count(*) AS n, sum(id) AS s FROM events;",
            file.display()
        ))
        .await
        .unwrap();
    together(&server).await;
    // 40 MB: more than the stuck view's lane holds.
    const LINES: i64 = 200_000;
    append(&file, 1, LINES, 200);
    until(&server, "SELECT n, s FROM live", &sums(LINES)).await;
    let apart = readers(&server).await;
    assert_ne!(apart[0], apart[1], "the stuck view left the shared reader");
    append(&file, LINES + 1, LINES + 1000, 200);
    until(&server, "SELECT n, s FROM live", &sums(LINES + 1000)).await;
    std::fs::write(&gate, b"").unwrap();
    eventually(&server, "SELECT n, s FROM stuck", &sums(LINES + 1000)).await;
    together(&server).await;
    append(&file, LINES + 1001, LINES + 2000, 200);
    eventually(&server, "SELECT n, s FROM stuck", &sums(LINES + 2000)).await;
    eventually(&server, "SELECT n, s FROM live", &sums(LINES + 2000)).await;
    eventually(&server, "SELECT count(*) FROM eddy_dead_letters", "0").await;
}
