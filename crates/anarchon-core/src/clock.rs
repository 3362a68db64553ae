//! Where "now" comes from.
//!
//! The scheduler reads the wall clock through [`Clock`] to know when a slot is
//! due. It never uses it to decide who owns a run: that is the store's clock.
//! Tests swap in a controllable or skewed clock (see `anarchon-testkit`).

use std::fmt;

use crate::time::Timestamp;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(chrono::Utc::now().timestamp_millis())
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SystemClock")
    }
}
