//! Where "now" comes from.
//!
//! The scheduler reads the wall clock through [`Clock`] to know when a slot is
//! due. It never uses it to decide who owns a run: that is the store's clock.
//! Tests swap in a controllable or skewed clock (see `anarchon-testkit`).

use std::fmt;
use std::time::Duration;

use crate::time::Timestamp;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;

    /// How long from now until `at` by this clock; zero once `at` has
    /// passed. The scheduler sets its timers with this.
    ///
    /// The default counts from [`Clock::now`], which is whole
    /// milliseconds: `now` lies up to a millisecond behind the true time,
    /// so the wait comes out up to a millisecond too long. A clock that
    /// can read finer time answers here with it, so a handler due at a
    /// slot is not started late by the part of a millisecond `now` leaves
    /// out.
    fn until(&self, at: Timestamp) -> Duration {
        at.since(self.now())
    }
}

/// The system's wall clock.
#[derive(Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(chrono::Utc::now().timestamp_millis())
    }

    /// Counted in microseconds: on average half a millisecond sooner
    /// than the default, which the fleet's firing lateness showed.
    fn until(&self, at: Timestamp) -> Duration {
        let now = chrono::Utc::now().timestamp_micros();
        let wait = at.as_millis().saturating_mul(1000).saturating_sub(now);
        Duration::from_micros(u64::try_from(wait).unwrap_or(0))
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SystemClock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_counts_a_wait_finer_than_its_milliseconds() {
        let clock = SystemClock;
        // Ask until a whole millisecond a second ahead until the reading
        // falls inside a millisecond (almost every time): the wait is then
        // not a whole number of milliseconds, and it never exceeds the
        // millisecond-counted one.
        let fine = (0..1000).find_map(|_| {
            let at = Timestamp::from_millis(clock.now().as_millis() + 1000);
            let coarse = at.since(clock.now());
            let fine = clock.until(at);
            (!fine.subsec_micros().is_multiple_of(1000)).then_some((fine, coarse))
        });
        let (fine, coarse) = fine.expect("a wait that is not whole milliseconds");
        assert!(fine <= coarse, "{fine:?} against {coarse:?}");
        assert!(fine > Duration::from_millis(990), "{fine:?}");
        assert_eq!(clock.until(Timestamp::from_millis(0)), Duration::ZERO);
    }
}
