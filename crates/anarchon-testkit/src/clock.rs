//! Clocks for tests: one that tokio's paused time drives, and skewed views of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anarchon_core::time::millis;
use anarchon_core::{Clock, SystemClock, Timestamp};
use tokio::time::Instant;

/// A wall clock that moves with tokio's clock.
///
/// It reads `start + (tokio now - tokio then) + offset`. Under
/// `#[tokio::test(start_paused = true)]` time then moves only when every task
/// waits, so a whole day of a schedule runs in milliseconds, the same way on
/// every run. [`TestClock::step`] moves the wall clock without moving tokio's
/// clock, as an NTP step or a suspend would.
#[derive(Debug)]
pub struct TestClock {
    start: Timestamp,
    origin: Instant,
    offset_ms: AtomicI64,
}

impl TestClock {
    /// A clock that starts at the real wall-clock time now.
    pub fn new() -> Arc<Self> {
        Self::starting_at(SystemClock.now())
    }

    /// A clock that reads `start` now.
    pub fn starting_at(start: Timestamp) -> Arc<Self> {
        Arc::new(Self {
            start,
            origin: Instant::now(),
            offset_ms: AtomicI64::new(0),
        })
    }

    /// Moves the wall clock by `by` (forward if positive) without moving
    /// tokio's clock.
    pub fn step(&self, forward: bool, by: Duration) {
        let ms = millis(by);
        self.offset_ms
            .fetch_add(if forward { ms } else { -ms }, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        let elapsed = millis(self.origin.elapsed());
        Timestamp::from_millis(
            self.start.as_millis() + elapsed + self.offset_ms.load(Ordering::SeqCst),
        )
    }
}

/// Another clock, read `ahead` (or behind) by a fixed amount: an instance
/// whose clock is wrong.
#[derive(Debug)]
pub struct SkewedClock<C: ?Sized> {
    inner: Arc<C>,
    skew_ms: i64,
}

impl<C: Clock + ?Sized> SkewedClock<C> {
    /// `inner` read `by` ahead (`ahead = true`) or behind.
    pub fn new(inner: Arc<C>, ahead: bool, by: Duration) -> Arc<Self> {
        let ms = millis(by);
        Arc::new(Self {
            inner,
            skew_ms: if ahead { ms } else { -ms },
        })
    }
}

impl<C: Clock + ?Sized> Clock for SkewedClock<C> {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.inner.now().as_millis() + self.skew_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn moves_with_paused_time_and_steps() {
        let clock = TestClock::starting_at(Timestamp::from_millis(1_000_000));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(clock.now().as_millis(), 1_005_000);
        clock.step(true, Duration::from_secs(3600));
        assert_eq!(clock.now().as_millis(), 1_005_000 + 3_600_000);
        let behind = SkewedClock::new(clock.clone(), false, Duration::from_secs(30));
        assert_eq!(behind.now().as_millis(), clock.now().as_millis() - 30_000);
    }
}
