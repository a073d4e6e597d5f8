//! The `eddy` executable: arguments -> config -> engine -> server.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use eddy_engine::{Engine, EngineConfig};
use tracing_subscriber::EnvFilter;

mod memory;

/// mimalloc instead of glibc malloc: the dataflow allocates and frees many small rows and
/// keys per epoch, where glibc's consolidation showed up as a third of the view thread's time.
/// Built without transparent huge pages (`no_thp`, see the workspace Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "eddy",
    version,
    about = "Eddy, a streaming SQL database that speaks PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `eddy` alone serves with these arguments.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (the default).
    Serve(ServeArgs),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// Address for PostgreSQL clients. Loopback by default; bind 0.0.0.0 deliberately.
    #[arg(long, env = "EDDY_LISTEN", default_value = "127.0.0.1:6877")]
    listen: SocketAddr,
    /// Address for HTTP ingest (`POST /ingest/<table>`). Loopback by default.
    #[arg(long, env = "EDDY_HTTP_LISTEN", default_value = "127.0.0.1:6878")]
    http_listen: SocketAddr,
    /// Directory for the catalog and the log.
    #[arg(long, env = "EDDY_DATA_DIR", default_value = "./eddy-data")]
    data_dir: PathBuf,
    /// Workers each view's dataflow runs on (one copy of its graph per worker, stateful
    /// operators sharded by key across them), and the parts a followed file's chunks are
    /// decoded in at once. Default: every core (docs/operations.md).
    #[arg(long, env = "EDDY_WORKERS", value_parser = clap::value_parser!(u16).range(1..=256))]
    workers: Option<u16>,
    /// Seconds between checkpoints of the views' state while they change (0: only on the
    /// `CHECKPOINT` statement). A restart loads the newest checkpoint and replays the log from
    /// there (docs/operations.md).
    #[arg(long, env = "EDDY_CHECKPOINT_INTERVAL", default_value_t = 10.0)]
    checkpoint_interval: f64,
    /// Seconds between epoch barriers while changes flow (0.001 to 10): how often views and
    /// subscriptions see new changes. Lower means fresher answers (0.01: p99 latency of tens of
    /// milliseconds) at more work per row (docs/operations.md).
    #[arg(long, env = "EDDY_BARRIER_INTERVAL", default_value_t = eddy_engine::BARRIER_INTERVAL.as_secs_f64())]
    barrier_interval: f64,
    /// Bytes after which a table partition's log starts a new segment file (retention deletes
    /// whole segments). Default 64 MiB.
    #[arg(long, env = "EDDY_LOG_SEGMENT_BYTES", value_parser = clap::value_parser!(u64).range(4096..))]
    log_segment_bytes: Option<u64>,
    /// Bytes of a view's changes a sink may have waiting while its target is slow or down;
    /// past that the sink drops them and, once it catches up, writes the view's whole contents
    /// (exactly once all the same). Default 64 MiB.
    #[arg(long, env = "EDDY_SINK_BUFFER_BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    sink_buffer_bytes: Option<u64>,
    /// The most rows of state one operator of a materialized view may hold (groups of an
    /// aggregate, open windows, rows a join keeps); past it the view fails with 54000 instead
    /// of growing without bound. A view can set its own (`WITH (max_state_rows = n)`). 0: no
    /// limit.
    #[arg(long, env = "EDDY_MAX_STATE_ROWS", default_value_t = eddy_engine::MAX_STATE_ROWS)]
    max_state_rows: u64,
    /// The most client connections at once (PostgreSQL's `max_connections`); the next one is
    /// refused with 53300.
    #[arg(long, env = "EDDY_MAX_CONNECTIONS", default_value_t = eddy_engine::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Memory the server is held to (`2GB`, `512MB`; 0: no limit). Views' operator state
    /// keeps half of it in memory and spills the rest to disk under the data directory.
    /// Default: half of the machine's memory (or of its cgroup's limit).
    #[arg(long, env = "EDDY_MEMORY_LIMIT", value_parser = memory::parse_size)]
    memory_limit: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        None => cli.serve,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("EDDY_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let workers = match args.workers {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
    };
    if !args.checkpoint_interval.is_finite() || args.checkpoint_interval < 0.0 {
        anyhow::bail!("--checkpoint-interval must be a number of seconds, 0 or more");
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections must be 1 or more");
    }
    if !(0.001..=10.0).contains(&args.barrier_interval) {
        anyhow::bail!("--barrier-interval must be between 0.001 and 10 seconds");
    }
    let checkpoint_interval = (args.checkpoint_interval > 0.0)
        .then(|| std::time::Duration::from_secs_f64(args.checkpoint_interval));
    let config = EngineConfig {
        data_dir: args.data_dir.clone(),
        workers,
        checkpoint_interval,
        log_segment_bytes: args.log_segment_bytes,
        sink_buffer_bytes: args.sink_buffer_bytes.map(|b| b as usize),
        clock: eddy_common::time::system_clock(),
        barrier_interval: std::time::Duration::from_secs_f64(args.barrier_interval),
        max_state_rows: (args.max_state_rows > 0).then_some(args.max_state_rows),
        max_connections: args.max_connections,
        memory_limit: match args.memory_limit {
            Some(0) => None,
            Some(limit) => Some(limit),
            None => memory::default_limit(),
        },
    };
    let engine = tokio::task::spawn_blocking(move || Engine::open(&config))
        .await?
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", args.data_dir.display()))?;
    // Clients may connect while views are restored: their statements wait, with NOTICEs of
    // each recovery step. A failed recovery stops the server.
    engine.recovering("starting");
    let (recovery_failed, recovery_failure) = tokio::sync::oneshot::channel::<String>();
    let recovering = engine.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let engine = recovering.clone();
        // Its own task, so that a panic in it is heard here (as a JoinError) and stops the
        // server with the reason, instead of leaving every session waiting forever.
        let recovery = tokio::spawn(async move {
            engine.restore_views().await?;
            engine.start_background();
            engine.recovering("starting connectors");
            engine.start_connectors().await
        });
        let result = match recovery.await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(e) if e.is_panic() => {
                Err(eddy_common::panic::panic_error("recovery", e.into_panic().as_ref()).message)
            }
            Err(e) => Err(format!("recovery stopped: {e}")),
        };
        match result {
            Ok(()) => {
                recovering.recovered();
                tracing::info!(
                    seconds = started.elapsed().as_secs_f64(),
                    "recovered; statements run"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "recovery failed; the server stops");
                let _ = recovery_failed.send(e);
            }
        }
    });
    let http = tokio::net::TcpListener::bind(args.http_listen)
        .await
        .with_context(|| format!("listening for HTTP on {}", args.http_listen))?;
    let http_local = http.local_addr()?;
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http_task = tokio::spawn(eddy_server::serve_http(engine.clone(), http, async move {
        let _ = http_stopped.await;
    }));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, data_dir = %args.data_dir.display(), workers, "eddy is listening");
    // Printed (not logged) so that people and test harnesses see it whatever the log level.
    println!(
        "Eddy {} is listening on {local} (data in {})",
        eddy_engine::EDDY_VERSION,
        args.data_dir.display()
    );
    println!(
        "Connect with: psql -h {} -p {} -U eddy",
        local.ip(),
        local.port()
    );
    println!("HTTP ingest on http://{http_local}/ingest/<table>");
    let failure = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let failed = failure.clone();
    let shutdown = async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
            Ok(e) = recovery_failure => {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                return;
            }
        }
        tracing::info!("shutting down");
    };
    eddy_server::serve(engine.clone(), listener, shutdown).await?;
    let _ = http_stop.send(());
    let _ = http_task.await;
    if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        anyhow::bail!("recovery failed: {e}");
    }
    // Answer every queued commit, then stop; acknowledged writes are already durable.
    tokio::task::spawn_blocking(move || engine.shutdown()).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}
