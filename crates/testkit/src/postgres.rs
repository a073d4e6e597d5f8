//! A throwaway PostgreSQL server for tests (sinks, CDC): `initdb` into a temporary directory,
//! `postgres` on 127.0.0.1 and a free port, trust authentication for the user `eddy`.
//! Run as root, the server runs as the `postgres` user (PostgreSQL refuses root).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub struct PostgresServer {
    child: Child,
    pub port: u16,
    bin: PathBuf,
    root: bool,
    dir: tempfile::TempDir,
}

/// The directory holding `initdb` and `postgres`: on the PATH, or Debian's
/// `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions.into_iter().rev().find(|d| d.join("initdb").is_file()).context("PostgreSQL is not installed (no initdb); bin/test installs it: apt-get install postgresql")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args...`, as the `postgres` user when we are root.
fn command(program: &Path, root: bool) -> Command {
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl PostgresServer {
    pub fn start() -> Result<PostgresServer> {
        let bin = bin_dir()?;
        let root = is_root();
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        if root {
            let status = Command::new("chown")
                .arg("postgres:")
                .arg(dir.path())
                .status()?;
            if !status.success() {
                bail!("chown postgres {} failed", dir.path().display());
            }
        }
        let out = command(&bin.join("initdb"), root)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "eddy", "-E", "UTF8", "--no-sync"])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = launch(&bin, root, dir.path(), port)?;
        let mut server = PostgresServer {
            child,
            port,
            bin,
            root,
            dir,
        };
        server.wait_listening()?;
        Ok(server)
    }

    fn wait_listening(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "postgres did not listen on 127.0.0.1:{} within 30 s",
                    self.port
                );
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("postgres exited at start: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the server (fast shutdown); [`PostgresServer::restart`] starts it again.
    pub fn stop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown. The server process runs as another user when we
        // are root, so signal it with kill(1) through runuser's child too.
        let _ = Command::new("pkill")
            .args(["-INT", "-P", &self.child.id().to_string()])
            .status();
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a stopped server again, same data and port.
    pub fn restart(&mut self) -> Result<()> {
        self.child = launch(&self.bin, self.root, self.dir.path(), self.port)?;
        self.wait_listening()
    }

    /// The options of a postgres sink writing `table` here.
    pub fn sink_options(&self, table: &str) -> String {
        format!(
            "connector = 'postgres', hostname = '127.0.0.1', port = '{}', username = 'eddy', database.name = 'postgres', table.name = '{table}'",
            self.port
        )
    }

    /// Connects, waiting (up to 30 s) while the server is still starting up (57P03).
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match tokio_postgres::connect(
                &format!(
                    "host=127.0.0.1 port={} user=eddy dbname=postgres",
                    self.port
                ),
                tokio_postgres::NoTls,
            )
            .await
            {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    return Ok(client);
                }
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW)
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `postgres` on the data directory under `dir`.
fn launch(bin: &Path, root: bool, dir: &Path, port: u16) -> Result<Child> {
    command(&bin.join("postgres"), root)
        .arg("-D")
        .arg(dir.join("data"))
        .args([
            "-p",
            &port.to_string(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-k",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting postgres")
}
