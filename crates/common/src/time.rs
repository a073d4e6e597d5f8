//! The clock everything time-dependent reads: wall-clock time for `proctime`, temporal
//! filters (`now()` in a view), received-at columns and retention by age; monotonic time for
//! idle timeouts. The server runs on [`SystemClock`]; tests drive a [`ManualClock`], so a
//! temporal filter or an idle partition is tested at chosen instants instead of by sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where time comes from.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock time: µs since the Unix epoch.
    fn now_micros(&self) -> i64;

    /// Monotonic time, for durations (never goes back).
    fn instant(&self) -> Instant;

    /// [`Clock::now_micros`] as a `SystemTime`.
    fn now_system(&self) -> SystemTime {
        let micros = self.now_micros();
        if micros >= 0 {
            UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
        } else {
            UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
        }
    }
}

/// The machine's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// The machine's clocks, shared.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to (tests): wall and monotonic time advance together.
#[derive(Debug)]
pub struct ManualClock {
    wall_start: i64,
    start: Instant,
    elapsed_micros: AtomicI64,
}

impl ManualClock {
    /// A clock that reads `now_micros` (µs since the Unix epoch) until advanced.
    pub fn starting_at(now_micros: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            wall_start: now_micros,
            start: Instant::now(),
            elapsed_micros: AtomicI64::new(0),
        })
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.elapsed_micros
            .fetch_add(by.as_micros() as i64, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> i64 {
        self.wall_start + self.elapsed_micros.load(Ordering::Acquire)
    }

    fn instant(&self) -> Instant {
        self.start + Duration::from_micros(self.elapsed_micros.load(Ordering::Acquire) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::starting_at(1_000_000);
        let (wall, mono) = (clock.now_micros(), clock.instant());
        assert_eq!(wall, 1_000_000);
        assert_eq!(clock.instant(), mono, "no time passes by itself");
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now_micros(), 2_500_000);
        assert_eq!(clock.instant() - mono, Duration::from_millis(1500));
        assert_eq!(
            clock.now_system(),
            UNIX_EPOCH + Duration::from_micros(2_500_000)
        );
    }
}
