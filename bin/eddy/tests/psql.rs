//! psql's meta-commands against Eddy: each command's output is a golden file
//! (`snapshots/psql__*.snap`), and where Eddy has exactly what PostgreSQL has, the same
//! command against a PostgreSQL 15 started here with the same DDL must print the same.
//! Needs the `psql` binary (and PostgreSQL's server binaries), as bin/test installs them.

use std::process::Command;

use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;

/// What both databases get. Eddy's materialized view is PostgreSQL's too.
const DDL: [&str; 3] = [
    "CREATE TABLE users (user_id BIGINT PRIMARY KEY, name TEXT NOT NULL, country VARCHAR(2), score NUMERIC(10,2), ts TIMESTAMPTZ)",
    "CREATE TABLE clicks (user_id BIGINT, url TEXT DEFAULT 'none', ts TIMESTAMP DEFAULT now())",
    "CREATE MATERIALIZED VIEW by_country AS SELECT country, count(*) AS n FROM users GROUP BY country",
];

/// Meta-commands, and whether PostgreSQL prints the same (others differ by design: Eddy has
/// one database and no extensions, and prints a view's query as it was written).
const COMMANDS: [(&str, &str, bool); 17] = [
    ("list", "\\d", true),
    ("tables", "\\dt", true),
    ("table", "\\d users", true),
    ("table_plain", "\\d clicks", true),
    ("table_verbose", "\\d+ clicks", false),
    ("materialized_view", "\\d by_country", true),
    ("materialized_view_verbose", "\\d+ by_country", false),
    ("views", "\\dv", true),
    ("materialized_views", "\\dm", true),
    ("sequences", "\\ds", true),
    ("indexes", "\\di", true),
    ("schemas", "\\dn", true),
    ("databases", "\\l", false),
    ("roles", "\\du", true),
    ("functions", "\\df", true),
    ("types", "\\dT", true),
    ("extensions", "\\dx", false),
];

fn psql(port: u16, database: &str, command: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "eddy",
            "-d",
            database,
            "-c",
            command,
        ])
        .env("PGTZ", "UTC")
        .output()
        .expect("psql is not installed (bin/test installs it: apt-get install postgresql-client)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Eddy's backfill NOTICEs are not psql's output.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("NOTICE:"))
        .collect();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        errors.join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_commands_print_as_postgres() {
    let eddy = EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = eddy.connect().await.unwrap();
    let postgres = PostgresServer::start().expect("PostgreSQL 15 is needed for the comparison");
    let reference = postgres.connect().await.unwrap();
    // Eddy's own tables live in schema eddy_catalog (SQL.md): the reference has it too.
    reference
        .batch_execute("CREATE SCHEMA eddy_catalog")
        .await
        .unwrap();
    for ddl in DDL {
        client.batch_execute(ddl).await.unwrap();
        reference.batch_execute(ddl).await.unwrap();
    }
    let mut differences = Vec::new();
    for (name, command, same) in COMMANDS {
        let ours = psql(eddy.port, "postgres", command);
        assert!(!ours.contains("ERROR"), "{command} failed on Eddy:\n{ours}");
        insta::assert_snapshot!(name, ours, command);
        if same {
            let theirs = psql(postgres.port, "postgres", command);
            if ours != theirs {
                differences.push(format!(
                    "{command}\n--- Eddy\n{ours}\n--- PostgreSQL\n{theirs}"
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "psql prints differently:\n{}",
        differences.join("\n")
    );
}

/// The queries psql's tab completion sends run (their answers are psql's business).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tab_completion_queries_run() {
    let eddy = EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = eddy.connect().await.unwrap();
    client.batch_execute(DDL[0]).await.unwrap();
    for query in TAB_COMPLETION {
        if let Err(e) = client.simple_query(query).await {
            panic!("{query}\nfailed: {e:?}");
        }
    }
}

/// What psql 15 sends to complete `SELECT * FROM u<TAB>`, `\d u<TAB>`, `SET <TAB>` and the like
/// (psql's tab-complete.c, with the word typed so far filled in).
const TAB_COMPLETION: [&str; 5] = [
    "SELECT pg_catalog.quote_ident(c.relname) FROM pg_catalog.pg_class c WHERE c.relkind IN ('r', 'S', 'v', 'm', 'f', 'p') AND substring(pg_catalog.quote_ident(c.relname),1,1)='u' AND pg_catalog.pg_table_is_visible(c.oid) AND c.relnamespace <> (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'pg_catalog')
UNION
SELECT pg_catalog.quote_ident(n.nspname) || '.' FROM pg_catalog.pg_namespace n WHERE substring(pg_catalog.quote_ident(n.nspname) || '.',1,1)='u' AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_namespace WHERE substring(pg_catalog.quote_ident(nspname) || '.',1,1) = substring('u',1,pg_catalog.length(pg_catalog.quote_ident(nspname))+1)) > 1
LIMIT 1000",
    "SELECT pg_catalog.quote_ident(attname)   FROM pg_catalog.pg_attribute a, pg_catalog.pg_class c  WHERE c.oid = a.attrelid    AND a.attnum > 0    AND NOT a.attisdropped    AND substring(pg_catalog.quote_ident(attname),1,0)=''    AND (pg_catalog.quote_ident(relname)='users'         OR '\"' || relname || '\"'='users')    AND pg_catalog.pg_table_is_visible(c.oid)
LIMIT 1000",
    "SELECT pg_catalog.lower(name) FROM pg_catalog.pg_settings  WHERE context IN ('user', 'superuser')  AND substring(pg_catalog.lower(name),1,0)=''
LIMIT 1000",
    "SELECT pg_catalog.quote_ident(nspname) FROM pg_catalog.pg_namespace  WHERE substring(pg_catalog.quote_ident(nspname),1,0)=''
LIMIT 1000",
    "SELECT pg_catalog.format_type(t.oid, NULL) FROM pg_catalog.pg_type t WHERE (t.typrelid = 0  OR (SELECT c.relkind = 'c' FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid)) AND t.typname !~ '^_' AND substring(pg_catalog.format_type(t.oid, NULL),1,0)='' AND pg_catalog.pg_type_is_visible(t.oid)
LIMIT 1000",
];
