//! Test hooks, in debug builds only:
//! `EDDY_FAILPOINTS=step:view:panic|error|sleep|block|abort[:once][:gated],...` makes a step of one view
//! panic, fail, take 200 ms longer (a slow view), wait until the file named by
//! `EDDY_FAILPOINTS_GATE` exists (a stuck view the test releases) or abort the process (a
//! crash at that very point), so tests can prove what the server does then. Steps:
//! `restore_view` (recovery, from the checkpoint), `rebuild_view` (recovery, from the log),
//! `view_changes` (the live dataflow, on every batch of changes it is handed), `backfill` (a new
//! view's backfill, on every log record it reads; it runs on the runtime thread),
//! `view_contents` (an epoch's output of the view applied to its contents). With `once`, a
//! point fires the first time only (a restart of the view then succeeds); with `gated`, only
//! once the gate file exists.
//! `checkpoint_commit:writer` (a checkpoint's files are written, its manifest not yet
//! committed) and `checkpoint_cleanup:writer` (committed, the files it no longer names not yet
//! deleted) are steps of the checkpoint writer.
//! `kafka_partitions:topic:hide` shows only the first partition of a Kafka topic until the gate
//! file exists (a topic gaining partitions while it is read; the test broker cannot add any).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use eddy_common::{Error, Result};

/// What a failpoint does when it fires.
#[derive(PartialEq)]
enum Action {
    Panic,
    Error,
    Sleep,
    Block,
    /// Asked with [`hidden`]: something is hidden until the gate file exists.
    Hide,
    /// Ends the process at once, as a SIGKILL would.
    Abort,
}

/// How long a `sleep` failpoint holds the step.
const SLEEP: std::time::Duration = std::time::Duration::from_millis(200);

struct Point {
    step: String,
    view: String,
    action: Action,
    /// `Some`: fires once; `true` once it has.
    once: Option<AtomicBool>,
    /// Fires only once the gate file exists.
    gated: bool,
}

fn points() -> &'static [Point] {
    static POINTS: OnceLock<Vec<Point>> = OnceLock::new();
    POINTS.get_or_init(|| {
        let Ok(spec) = std::env::var("EDDY_FAILPOINTS") else {
            return Vec::new();
        };
        spec.split(',')
            .filter_map(|point| {
                let mut parts = point.split(':');
                Some(Point {
                    step: parts.next()?.to_owned(),
                    view: parts.next()?.to_owned(),
                    action: match parts.next() {
                        Some("panic") => Action::Panic,
                        Some("sleep") => Action::Sleep,
                        Some("block") => Action::Block,
                        Some("hide") => Action::Hide,
                        Some("abort") => Action::Abort,
                        _ => Action::Error,
                    },
                    once: None,
                    gated: false,
                })
                .map(|mut point| {
                    for flag in parts {
                        match flag {
                            "once" => point.once = Some(AtomicBool::new(false)),
                            "gated" => point.gated = true,
                            _ => {}
                        }
                    }
                    point
                })
            })
            .collect()
    })
}

/// Panics, fails or sleeps when a failpoint names `step` of `view` (never in release builds).
pub(crate) fn failpoint(step: &str, view: &str) -> Result<()> {
    if !cfg!(debug_assertions) {
        return Ok(());
    }
    let Some(point) = points().iter().find(|p| p.step == step && p.view == view) else {
        return Ok(());
    };
    if point.gated && !gate_open() {
        return Ok(());
    }
    if point
        .once
        .as_ref()
        .is_some_and(|fired| fired.swap(true, Ordering::AcqRel))
    {
        return Ok(());
    }
    let message = format!("failpoint {step} of view {view}");
    match point.action {
        Action::Panic => std::panic::panic_any(message),
        Action::Sleep => {
            std::thread::sleep(SLEEP);
            Ok(())
        }
        Action::Block => {
            let gate = std::env::var_os("EDDY_FAILPOINTS_GATE")
                .ok_or_else(|| Error::internal(format!("{message}: no EDDY_FAILPOINTS_GATE")))?;
            while !std::path::Path::new(&gate).exists() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(())
        }
        Action::Error => Err(Error::internal(message)),
        Action::Hide => Ok(()),
        Action::Abort => {
            eprintln!("{message}: aborting");
            std::process::abort()
        }
    }
}

/// Whether a `hide` failpoint of `step` names `object` and its gate file does not exist yet
/// (never in release builds).
pub(crate) fn hidden(step: &str, object: &str) -> bool {
    cfg!(debug_assertions)
        && points()
            .iter()
            .any(|p| p.step == step && p.view == object && p.action == Action::Hide)
        && !gate_open()
}

/// Whether the file `EDDY_FAILPOINTS_GATE` names exists.
fn gate_open() -> bool {
    std::env::var_os("EDDY_FAILPOINTS_GATE")
        .is_some_and(|gate| std::path::Path::new(&gate).exists())
}
