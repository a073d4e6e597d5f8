//! Dev-only tools: start a real `eddy` process on a free loopback port with its own data
//! directory, talk to it with tokio-postgres, and run sqllogictest files over the wire.
//!
//! Entry points: [`EddyProcess`] and [`run_slt_file`].

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub mod kafka;
pub mod postgres;

use anyhow::{Context, Result, anyhow, bail};
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// How long a server may take to start (a debug build opening a large log is slow).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Resource use of a server process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStats {
    /// User + system CPU time.
    pub cpu_seconds: f64,
    /// Peak resident set size.
    pub peak_rss_bytes: u64,
    /// Resident set size now.
    pub rss_bytes: u64,
}

/// A running `eddy serve` child process.
pub struct EddyProcess {
    child: Child,
    pub port: u16,
    /// The HTTP ingest port.
    pub http_port: u16,
    binary: PathBuf,
    pub data_dir: PathBuf,
    /// Arguments after the listen addresses and data directory (`--workers`, ...).
    args: Vec<String>,
    /// Environment variables of the process (and of the ones that restart it).
    envs: Vec<(String, String)>,
    /// A data directory this process owns, removed after the process is killed.
    _owned_dir: Option<tempfile::TempDir>,
}

/// The environment that arms the debug build's failpoints: `EDDY_FAILPOINTS=spec` and, for
/// `block` / `hide` failpoints, `EDDY_FAILPOINTS_GATE=gate` (the file whose creation releases
/// them). Pass it, extended with any other variables, to [`EddyProcess::start_env`].
pub fn failpoint_env(spec: &str, gate: Option<&Path>) -> Vec<(String, String)> {
    let mut envs = vec![("EDDY_FAILPOINTS".to_owned(), spec.to_owned())];
    if let Some(gate) = gate {
        envs.push((
            "EDDY_FAILPOINTS_GATE".to_owned(),
            gate.display().to_string(),
        ));
    }
    envs
}

impl EddyProcess {
    /// Files of views' contents spilled to `spill-files/` (chunks of rows past the budget).
    pub fn contents_spill_files(&self) -> usize {
        std::fs::read_dir(self.data_dir.join("spill-files"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .count()
    }

    /// Starts `binary serve` on 127.0.0.1 with a port the OS picks, and waits until it listens.
    pub fn start(binary: &Path, data_dir: &Path) -> Result<Self> {
        EddyProcess::start_with(binary, data_dir, None)
    }

    /// [`EddyProcess::start`] with `--workers`.
    pub fn start_with(binary: &Path, data_dir: &Path, workers: Option<u32>) -> Result<Self> {
        let args: Vec<String> = workers
            .map(|n| vec!["--workers".to_owned(), n.to_string()])
            .unwrap_or_default();
        EddyProcess::start_args(binary, data_dir, &args)
    }

    fn spawn(
        binary: &Path,
        data_dir: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> Result<Child> {
        let mut command = Command::new(binary);
        command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data_dir)
            .args(args);
        command.envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        command
            .env(
                "EDDY_LOG",
                std::env::var("EDDY_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))
    }

    /// [`EddyProcess::start`] with more server arguments (`--workers 2`, ...).
    pub fn start_args(binary: &Path, data_dir: &Path, args: &[String]) -> Result<Self> {
        EddyProcess::start_env(binary, data_dir, args, &[])
    }

    /// [`EddyProcess::start_args`] with environment variables (`EDDY_FAILPOINTS`, ...).
    pub fn start_env(
        binary: &Path,
        data_dir: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> Result<Self> {
        let mut child = EddyProcess::spawn(binary, data_dir, args, envs)?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut pg = None;
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if pg.is_none()
                    && let Some(rest) = line.split("listening on ").nth(1)
                {
                    pg = Some(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
                if let (Some(pg), Some(rest)) = (&pg, line.split("HTTP ingest on http://").nth(1)) {
                    let http = rest.split('/').next().unwrap_or("").to_owned();
                    let _ = tx.send((pg.clone(), http));
                }
                line.clear();
            }
        });
        let (addr, http) = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(addrs) => addrs,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait()?;
                bail!(
                    "eddy did not start listening within {STARTUP_TIMEOUT:?} (exit status {status})"
                );
            }
        };
        let port_of = |addr: &str| {
            addr.rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| anyhow!("bad address {addr}"))
        };
        let (port, http_port) = (port_of(&addr)?, port_of(&http)?);
        Ok(EddyProcess {
            child,
            port,
            http_port,
            binary: binary.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            args: args.to_vec(),
            envs: envs.to_vec(),
            _owned_dir: None,
        })
    }

    /// Starts a server on a fresh temporary data directory that lives as long as it does.
    pub fn start_fresh(binary: &Path) -> Result<Self> {
        EddyProcess::start_fresh_with(binary, None)
    }

    /// [`EddyProcess::start_fresh`] with `--workers`.
    pub fn start_fresh_with(binary: &Path, workers: Option<u32>) -> Result<Self> {
        let args: Vec<String> = workers
            .map(|n| vec!["--workers".to_owned(), n.to_string()])
            .unwrap_or_default();
        EddyProcess::start_fresh_args(binary, &args)
    }

    /// [`EddyProcess::start_fresh`] with more server arguments.
    pub fn start_fresh_args(binary: &Path, args: &[String]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut server = EddyProcess::start_args(binary, dir.path(), args)?;
        server._owned_dir = Some(dir);
        Ok(server)
    }

    /// CPU time and peak memory of the server process so far (Linux `/proc`).
    pub fn stats(&self) -> Result<ProcessStats> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // USER_HZ is 100 on every Linux configuration we run on.
        let cpu_seconds = (ticks(11) + ticks(12)) as f64 / 100.0;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kb = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(ProcessStats {
            cpu_seconds,
            peak_rss_bytes: kb("VmHWM:") * 1024,
            rss_bytes: kb("VmRSS:") * 1024,
        })
    }

    pub fn connection_string(&self) -> String {
        format!("host=127.0.0.1 port={} user=eddy dbname=eddy", self.port)
    }

    pub async fn connect(&self) -> Result<Client> {
        let (client, connection) =
            tokio_postgres::connect(&self.connection_string(), NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// A connection that collects the NOTICEs the server sends it (in order).
    pub async fn connect_with_notices(
        &self,
    ) -> Result<(Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>)> {
        use futures::StreamExt;
        let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (client, mut connection) =
            tokio_postgres::connect(&self.connection_string(), NoTls).await?;
        let seen = std::sync::Arc::clone(&notices);
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notice(n) = message {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(n.message().to_owned());
                }
            }
        });
        Ok((client, notices))
    }

    /// `POST path` to the server's HTTP port; returns (status, body).
    pub fn post(&self, path: &str, content_type: &str, body: &[u8]) -> Result<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.http_port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("bad HTTP response: {response}"))?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// SIGKILL: the crash case. Nothing acknowledged may be lost.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM failed");
        }
        let status = self.child.wait()?;
        if !status.success() {
            bail!("eddy exited with {status} after SIGTERM");
        }
        Ok(())
    }

    /// Stops this process (SIGTERM, or SIGKILL when `crash`) and starts a new one on the same
    /// data directory in its place (it keeps owning a temporary one).
    pub fn restart_in_place(&mut self, crash: bool) -> Result<()> {
        if crash {
            self.kill()?
        } else {
            self.stop()?
        }
        let next = EddyProcess::start_env(&self.binary, &self.data_dir, &self.args, &self.envs)?;
        let owned = self._owned_dir.take();
        let old = std::mem::replace(self, next);
        drop(old);
        self._owned_dir = owned;
        Ok(())
    }

    /// Starts a new process on the same data directory.
    pub fn restart(&self) -> Result<Self> {
        EddyProcess::start_env(&self.binary, &self.data_dir, &self.args, &self.envs)
    }

    /// The environment of the processes that restart this one.
    pub fn set_envs(&mut self, envs: &[(&str, &str)]) {
        self.envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    }

    /// Starts a new process on the same data directory (after this one was killed) and
    /// SIGKILLs it after `after`, ready or not: a crash during recovery.
    pub fn crash_while_starting(&self, after: Duration) -> Result<()> {
        let mut child = EddyProcess::spawn(&self.binary, &self.data_dir, &self.args, &self.envs)?;
        std::thread::sleep(after);
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for EddyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// sqllogictest's view of a connection. Two statements are the runner's own, not SQL:
/// `RESTART` stops the server cleanly (SIGTERM) and starts it again on the same data, and
/// `CRASH` does so with SIGKILL; the connection then reconnects (and its next statement waits
/// for recovery). A file checks its views again after them: the answer must not change.
pub struct Connection {
    client: Client,
    server: std::sync::Arc<tokio::sync::Mutex<EddyProcess>>,
}

async fn connect_client(connection_string: &str) -> Result<Client, DbError> {
    let (client, connection) = tokio_postgres::connect(connection_string, NoTls)
        .await
        .map_err(DbError::Postgres)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[derive(Debug)]
pub enum DbError {
    Postgres(tokio_postgres::Error),
    /// `RESTART` / `CRASH` could not restart the server.
    Restart(String),
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Postgres(e) => match e.as_db_error() {
                Some(db) => write!(f, "{}", db.message()),
                None => write!(f, "{e}"),
            },
            DbError::Restart(e) => write!(f, "restarting the server: {e}"),
        }
    }
}

impl std::error::Error for DbError {}

#[async_trait::async_trait]
impl AsyncDB for Connection {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        let command = sql.trim().trim_end_matches(';').trim();
        if command == "RESTART" || command == "CRASH" {
            let mut server = self.server.lock().await;
            server
                .restart_in_place(command == "CRASH")
                .map_err(|e| DbError::Restart(format!("{e:#}")))?;
            self.client = connect_client(&server.connection_string()).await?;
            return Ok(DBOutput::StatementComplete(0));
        }
        let messages = self
            .client
            .simple_query(sql)
            .await
            .map_err(DbError::Postgres)?;
        let mut rows = Vec::new();
        let mut columns = None;
        let mut affected = 0;
        for message in messages {
            match message {
                SimpleQueryMessage::RowDescription(d) => columns = Some(d.len()),
                SimpleQueryMessage::Row(row) => {
                    columns = Some(row.len());
                    rows.push(
                        (0..row.len())
                            .map(|i| match row.get(i) {
                                None => "NULL".to_owned(),
                                Some("") => "(empty)".to_owned(),
                                Some(v) => v.to_owned(),
                            })
                            .collect(),
                    );
                }
                SimpleQueryMessage::CommandComplete(n) => affected = n,
                _ => {}
            }
        }
        match columns {
            Some(n) => Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Any; n],
                rows,
            }),
            None => Ok(DBOutput::StatementComplete(affected)),
        }
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "eddy"
    }

    fn error_sql_state(err: &Self::Error) -> Option<String> {
        match err {
            DbError::Postgres(e) => e.code().map(|c| c.code().to_owned()),
            DbError::Restart(_) => None,
        }
    }
}

/// `--workers` of the servers that `.slt` files and the oracle tests run against: two
/// whatever the machine, so that what they check is the sharded operators.
pub const TEST_WORKERS: u32 = 2;

/// Runs one `.slt` file against a fresh server with its own data directory.
pub async fn run_slt_file(binary: &Path, file: &Path) -> Result<()> {
    let server = std::sync::Arc::new(tokio::sync::Mutex::new(EddyProcess::start_fresh_with(
        binary,
        Some(TEST_WORKERS),
    )?));
    let shared = std::sync::Arc::clone(&server);
    let mut runner = sqllogictest::Runner::new(move || {
        let server = std::sync::Arc::clone(&shared);
        async move {
            let connection_string = server.lock().await.connection_string();
            let client = connect_client(&connection_string).await?;
            Ok::<_, DbError>(Connection { client, server })
        }
    });
    runner
        .run_file_async(file)
        .await
        .map_err(|e| anyhow!("{}", e.display(true)))?;
    drop(runner);
    drop(server);
    Ok(())
}

/// Runs a query with the simple protocol and returns every value as PostgreSQL text.
pub async fn query_text(client: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
    let mut rows = Vec::new();
    for message in client.simple_query(sql).await? {
        if let SimpleQueryMessage::Row(row) = message {
            rows.push(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            );
        }
    }
    Ok(rows)
}

/// The same rows in a canonical order, to compare results as multisets.
pub async fn query_sorted(client: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
    let mut rows = query_text(client, sql).await?;
    rows.sort();
    Ok(rows)
}

/// Waits until `sql` answers `want`, reading without FLUSH (which would wait for a view behind).
pub async fn until(server: &EddyProcess, sql: &str, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = text(server, sql).await;
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: still {got:?}, waiting for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (FLUSH after FLUSH, for at most a minute) until `sql` returns `want` — rows joined by
/// newlines, cells by spaces, NULL as `NULL`. For state reached on a source's own schedule
/// (connectors), where a test waits for the state rather than for a time.
pub async fn eventually(server: &EddyProcess, sql: &str, want: &str) {
    let client = server
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting: {e:#}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        client
            .batch_execute("FLUSH")
            .await
            .unwrap_or_else(|e| panic!("FLUSH: {e:#}"));
        let got = query_text(&client, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:#}"));
        let text = rows_as_text(&got);
        if text == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: still {text:?}, waiting for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Rows as one text: rows joined by newlines, cells by spaces, NULL as `NULL`.
pub fn rows_as_text(rows: &[Vec<Option<String>>]) -> String {
    rows.iter()
        .map(|r| {
            r.iter()
                .map(|c| c.clone().unwrap_or_else(|| "NULL".into()))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts that some NOTICE a [`EddyProcess::connect_with_notices`] connection got contains
/// every one of `parts`.
pub fn assert_noticed(notices: &std::sync::Mutex<Vec<String>>, parts: &[&str]) {
    let notices = notices.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        notices
            .iter()
            .any(|n| parts.iter().all(|part| n.contains(part))),
        "no NOTICE says {parts:?}: {notices:?}"
    );
}

/// Asserts that `error` came from the server with SQLSTATE `sqlstate` and a message that
/// contains `message`.
pub fn assert_error(error: &tokio_postgres::Error, sqlstate: &str, message: &str) {
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not an error from the server: {error:?}"));
    assert_eq!(db.code().code(), sqlstate, "{error:?}");
    assert!(db.message().contains(message), "{error:?}");
}

/// [`rows`] as [`rows_as_text`].
pub async fn text(server: &EddyProcess, sql: &str) -> String {
    rows_as_text(&rows(server, sql).await)
}

/// The rows of `sql` as text, on a new connection; panics (a test helper) on failure.
pub async fn rows(server: &EddyProcess, sql: &str) -> Vec<Vec<Option<String>>> {
    let client = server
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting: {e:#}"));
    query_text(&client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:#}"))
}
