//! Counters a scheduler keeps about its own claims and runs.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        #[derive(Default, Debug)]
        pub(crate) struct Metrics {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Metrics {
            pub(crate) fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        /// A copy of a scheduler's counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }
    };
}

counters! {
    /// Claims this instance won (first attempts and takeovers).
    wins,
    /// Of the wins, those that took over an expired lease.
    takeovers,
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
    /// Runs whose handler succeeded (not counting runs given up after
    /// losing contact with the store, which are handed over instead).
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
}
