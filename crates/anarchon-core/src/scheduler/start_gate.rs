//! Starts before finishes: the handlers due at one instant all start before
//! any run of this instance records its outcome.
//!
//! Why: a scheduler with many jobs on one schedule wakes hundreds of runs
//! at the same instant, on a runtime with a thread or two. A handler that
//! returns at once (or any run that happens to end then) would otherwise
//! make its store call — client work, a lock, a round trip's bookkeeping —
//! between two starts, and the last handler of the instant would start
//! only after most of the finishes. Measured with 1,000 per-second jobs on
//! the in-memory store, the finishes were a third of the last starts'
//! lateness. Deferring a finish costs nothing: its run is over, and its
//! record is written a few hundred microseconds later.
//!
//! Every run announces when its handler is due ([`StartGate::expect`]) and
//! withdraws once the handler has been called (dropping the guard). A run
//! that ends waits in [`StartGate::settled`] while any announced start is
//! due by now, never longer than it is given: a start held up by a store
//! call (a renewal before the handler) must not hold finishes for long,
//! and a finish must land well inside its lease.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The handler starts this instance expects, by when they are due.
#[derive(Debug, Default)]
pub(crate) struct StartGate {
    /// Due instant → how many starts are due then.
    due: Mutex<BTreeMap<Instant, usize>>,
    /// Told whenever no announced start is due any more.
    settled: Notify,
}

/// A start announced to a [`StartGate`]; dropping it withdraws it.
#[derive(Debug)]
pub(crate) struct Expected<'a> {
    gate: &'a StartGate,
    at: Instant,
}

impl StartGate {
    /// Announces a handler start due at `at`.
    pub(crate) fn expect(&self, at: Instant) -> Expected<'_> {
        *self.lock().entry(at).or_default() += 1;
        Expected { gate: self, at }
    }

    /// Waits until no announced start is due at the current instant, or
    /// for `longest`, whichever comes first.
    pub(crate) async fn settled(&self, longest: Duration) {
        let give_up = Instant::now() + longest;
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check: a withdrawal between the check
            // and the wait is not missed.
            notified.as_mut().enable();
            if !due_by(&self.lock(), Instant::now()) {
                return;
            }
            if tokio::time::timeout_at(give_up, notified).await.is_err() {
                return;
            }
        }
    }

    fn withdraw(&self, at: Instant) {
        let none_due = {
            let mut due = self.lock();
            if let Some(count) = due.get_mut(&at) {
                *count -= 1;
                if *count == 0 {
                    due.remove(&at);
                }
            }
            !due_by(&due, Instant::now())
        };
        if none_due {
            self.settled.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Instant, usize>> {
        // The map holds plain counts: a panic elsewhere leaves it whole.
        self.due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `due` holds a start due at or before `now` (not made yet).
fn due_by(due: &BTreeMap<Instant, usize>, now: Instant) -> bool {
    due.first_key_value().is_some_and(|(at, _)| *at <= now)
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        self.gate.withdraw(self.at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_finish_waits_only_while_a_start_is_due() {
        let gate = StartGate::default();
        let now = Instant::now();
        // Due later: nothing to wait for now.
        let later = gate.expect(now + Duration::from_secs(1));
        let begun = Instant::now();
        gate.settled(Duration::from_secs(5)).await;
        assert_eq!(Instant::now(), begun, "a start due later held a finish");

        // Due now: the finish waits until it is made.
        let due = gate.expect(now);
        let waiting = gate.settled(Duration::from_secs(5));
        let made = async {
            tokio::time::sleep(Duration::from_millis(3)).await;
            drop(due);
        };
        tokio::join!(waiting, made);
        assert_eq!(
            Instant::now() - begun,
            Duration::from_millis(3),
            "the finish did not go as soon as the due start was made"
        );
        drop(later);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_never_comes_holds_a_finish_no_longer_than_it_is_given() {
        let gate = StartGate::default();
        let _stuck = gate.expect(Instant::now());
        let begun = Instant::now();
        gate.settled(Duration::from_millis(20)).await;
        assert_eq!(Instant::now() - begun, Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_that_becomes_due_while_a_finish_waits_holds_it_too() {
        let gate = StartGate::default();
        let first = gate.expect(Instant::now());
        let second = gate.expect(Instant::now() + Duration::from_millis(2));
        let begun = Instant::now();
        let made = async {
            // `second` is due by the time `first` is made.
            tokio::time::sleep(Duration::from_millis(3)).await;
            drop(first);
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(second);
        };
        tokio::join!(gate.settled(Duration::from_secs(5)), made);
        assert_eq!(Instant::now() - begun, Duration::from_millis(5));
    }
}
