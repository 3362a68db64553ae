//! Counters a scheduler keeps about its own claims and runs.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::time::Timestamp;

/// Skew beyond which a warning is logged.
const SKEW_WARNING_MS: i64 = 5_000;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        #[derive(Default, Debug)]
        pub(crate) struct Metrics {
            $(pub(crate) $name: AtomicU64,)*
            /// The last store-minus-local clock difference seen, in ms.
            pub(crate) skew_ms: AtomicI64,
            pub(crate) skew_seen: AtomicBool,
        }

        impl Metrics {
            pub(crate) fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    store_clock_ahead_ms: self
                        .skew_seen
                        .load(Ordering::Relaxed)
                        .then(|| self.skew_ms.load(Ordering::Relaxed)),
                }
            }
        }

        /// A copy of a scheduler's counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
            /// How far the store's clock was ahead of this instance's wall
            /// clock (negative: behind) at the last answer that carried the
            /// store's time, in milliseconds; `None` before any such answer
            /// (claim-only stores never give one). Includes half a round
            /// trip of noise. Exposed, never used to decide anything.
            pub store_clock_ahead_ms: Option<i64>,
        }
    };
}

counters! {
    /// Claims this instance won (first attempts, takeovers and retries).
    wins,
    /// Of the wins, those that took over an expired lease.
    takeovers,
    /// Of the wins, retries of a failed attempt.
    retries,
    /// Claims another instance won (lost, running elsewhere, or already done).
    losses,
    /// Claims whose answer never arrived (treated as lost).
    unknown,
    /// Slots too late to run: refused by the store or skipped locally.
    late,
    /// Slots skipped because another run of the job was live.
    skipped,
    /// Runs whose lease was lost: fenced by the store, or self-fenced after
    /// losing contact.
    fenced,
    /// Store calls that failed after their retries.
    store_errors,
    /// Runs whose handler succeeded (counting those whose handler completed
    /// after this instance lost contact with the store; runs given up
    /// before their handler completed are handed over, not counted).
    succeeded,
    /// Runs whose handler failed, panicked or timed out (same exception).
    failed,
    /// Runs handed over (lease released) at shutdown.
    handed_over,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the store's clock against the local one; warns when they are
    /// far apart (which costs precision, never correctness).
    pub(crate) fn observe_store_clock(&self, store_now: Timestamp, local_now: Timestamp) {
        let skew = store_now.as_millis() - local_now.as_millis();
        self.skew_ms.store(skew, Ordering::Relaxed);
        let first = !self.skew_seen.swap(true, Ordering::Relaxed);
        if skew.abs() > SKEW_WARNING_MS {
            tracing::warn!(
                store_clock_ahead_ms = skew,
                "this instance's clock and the store's disagree by more than 5 s: slots fire early or late by that much (the store still decides who runs)"
            );
        } else if first {
            tracing::debug!(store_clock_ahead_ms = skew, "clock offset to the store");
        }
    }
}
