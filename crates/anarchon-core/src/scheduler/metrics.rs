//! What a scheduler counts about its own claims and runs.
//!
//! Two readers. [`MetricsSnapshot`] is the scheduler's own tally, for a
//! program that wants numbers without any exporter. And every event is also
//! recorded through the `metrics` facade, labelled by job, under the names
//! in [`names`]: a program that installs a recorder (a Prometheus exporter,
//! for one) gets them; one that installs none pays a no-op call. The
//! library never installs a recorder itself.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::name::JobName;
use crate::time::Timestamp;

/// Skew beyond which a warning is logged.
const SKEW_WARNING_MS: i64 = 5_000;

/// The names of the metrics the scheduler records through the `metrics`
/// facade, following Prometheus conventions (`_total` for counters, base
/// units in the name). `docs/observability.md` lists them with their labels.
pub mod names {
    /// Counter, labels `job`, `result`: the answers to this instance's
    /// claims — `won`, `lost` (another instance holds or held the run),
    /// `late`, `skipped`, `paused`, `unknown` (no answer).
    pub const CLAIMS: &str = "anarchon_claims_total";
    /// Counter, labels `job`, `outcome`: each attempt this instance held,
    /// once, by how it ended here — `succeeded`, `failed` (the handler's
    /// outcome, taken by the store), `fenced` (another instance holds the
    /// run now: replaced or taken over; the cancelled handler's result is
    /// not counted too), `handed_over` (given back or released for a
    /// backup) — and the runs this instance recorded as ended without
    /// running them: `missed` (too late) and `interrupted` (the runner's
    /// lease ran out with no attempts left). Each attempt is counted by
    /// one instance, so a sum over the fleet counts each once.
    pub const RUNS: &str = "anarchon_runs_total";
    /// Counter, label `job`: wins that took over a run whose runner lost
    /// its lease.
    pub const TAKEOVERS: &str = "anarchon_takeovers_total";
    /// Counter, label `job`: wins that retried a failed attempt.
    pub const RETRIES: &str = "anarchon_retries_total";
    /// Histogram in seconds, label `job`: how late a handler started after
    /// its slot (a manual run's slot is its request time).
    pub const LATENESS: &str = "anarchon_run_lateness_seconds";
    /// Histogram in seconds, label `job`: how long a handler ran.
    pub const DURATION: &str = "anarchon_run_duration_seconds";
    /// Gauge in seconds since the Unix epoch, label `job`: when a run of the
    /// job last succeeded on this instance — the dead-man's switch: alert
    /// when the newest value over all instances is too old.
    pub const LAST_SUCCESS: &str = "anarchon_last_success_timestamp_seconds";
    /// Histogram in seconds, label `operation` (`claim`, `heartbeat`,
    /// `finish`, `peek`, `release`, `give back`): one store call's time,
    /// each try on its own.
    pub const STORE_CALL: &str = "anarchon_store_call_duration_seconds";
    /// Counter, label `operation`: store calls that failed (each try).
    pub const STORE_ERRORS: &str = "anarchon_store_call_errors_total";
    /// Gauge in seconds: how far the store's clock was ahead of this
    /// instance's (negative: behind) at the last answer that carried it.
    pub const CLOCK_OFFSET: &str = "anarchon_store_clock_offset_seconds";
}

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
    /// Runs lost to another instance: fenced by the store (the handler's
    /// result is then not counted as well), or given up after losing
    /// contact and not handed over.
    fenced,
    /// Store calls that failed after their retries.
    store_errors,
    /// Runs whose handler succeeded, unless fenced (counting those whose
    /// handler completed after this instance lost contact with the store
    /// and whose success the store then took).
    succeeded,
    /// Runs whose handler failed, panicked or timed out, unless fenced.
    failed,
    /// Runs given back or released for a backup: at shutdown, before a
    /// handler started without lease left, or after losing contact.
    handed_over,
}

/// An event of a job, as the scheduler counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A claim won; how the attempt came to run.
    Won(crate::retry::AttemptCause),
    /// A claim another instance won, or of a run already over.
    Lost,
    /// A claim whose answer never came.
    Unknown,
    /// A slot too late to run.
    Late,
    /// A slot too late to run, recorded `missed` by this instance.
    Missed,
    /// A run whose lease ran out with no attempts left, recorded
    /// `interrupted` by this instance.
    Interrupted,
    /// A slot skipped for overlap.
    Skipped,
    /// A slot recorded paused.
    Paused,
    /// A run of this instance fenced.
    Fenced,
    /// A run of this instance handed over.
    HandedOver,
    /// A run of this instance whose handler succeeded.
    Succeeded,
    /// A run of this instance whose handler failed.
    Failed,
    /// A store call that failed after its retries.
    StoreError,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `event` of `job`: in the snapshot's tally and through the
    /// `metrics` facade.
    pub(crate) fn count(&self, job: &JobName, event: Event) {
        use crate::retry::AttemptCause;
        let tally = match event {
            Event::Won(_) => &self.wins,
            Event::Lost | Event::Paused | Event::Interrupted => &self.losses,
            Event::Unknown => &self.unknown,
            Event::Late | Event::Missed => &self.late,
            Event::Skipped => &self.skipped,
            Event::Fenced => &self.fenced,
            Event::HandedOver => &self.handed_over,
            Event::Succeeded => &self.succeeded,
            Event::Failed => &self.failed,
            Event::StoreError => &self.store_errors,
        };
        Self::add(tally);
        let job = job.as_str().to_owned();
        let claim = |result: &'static str| {
            ::metrics::counter!(names::CLAIMS, "job" => job.clone(), "result" => result)
                .increment(1);
        };
        let run = |outcome: &'static str| {
            ::metrics::counter!(names::RUNS, "job" => job.clone(), "outcome" => outcome)
                .increment(1);
        };
        match event {
            Event::Won(cause) => {
                claim("won");
                match cause {
                    AttemptCause::First => {}
                    AttemptCause::Takeover => {
                        Self::add(&self.takeovers);
                        ::metrics::counter!(names::TAKEOVERS, "job" => job.clone()).increment(1);
                    }
                    AttemptCause::Retry => {
                        Self::add(&self.retries);
                        ::metrics::counter!(names::RETRIES, "job" => job.clone()).increment(1);
                    }
                }
            }
            Event::Lost => claim("lost"),
            Event::Unknown => claim("unknown"),
            Event::Late => claim("late"),
            Event::Missed => {
                claim("late");
                run("missed");
            }
            Event::Interrupted => {
                claim("lost");
                run("interrupted");
            }
            Event::Skipped => claim("skipped"),
            Event::Paused => claim("paused"),
            Event::Fenced => run("fenced"),
            Event::HandedOver => run("handed_over"),
            Event::Succeeded => run("succeeded"),
            Event::Failed => run("failed"),
            // Store errors are counted per call, by operation (see
            // `calls::timed`); the tally counts those given up on.
            Event::StoreError => {}
        }
    }

    /// Records when a handler of `job` started, against its slot's time.
    pub(crate) fn started(job: &JobName, slot_at: Timestamp, now: Timestamp) {
        let late = now.as_millis().saturating_sub(slot_at.as_millis()).max(0);
        ::metrics::histogram!(names::LATENESS, "job" => job.as_str().to_owned())
            .record(late as f64 / 1000.0);
    }

    /// Records how long a handler of `job` ran.
    pub(crate) fn ended(job: &JobName, took: Duration) {
        ::metrics::histogram!(names::DURATION, "job" => job.as_str().to_owned())
            .record(took.as_secs_f64());
    }

    /// Records that a run of `job` succeeded, and the store took it, at `at`.
    pub(crate) fn succeeded(job: &JobName, at: Timestamp) {
        ::metrics::gauge!(names::LAST_SUCCESS, "job" => job.as_str().to_owned())
            .set(at.as_millis() as f64 / 1000.0);
    }

    /// Notes the store's clock against the local one; warns when they are
    /// far apart (which costs precision, never correctness).
    pub(crate) fn observe_store_clock(&self, store_now: Timestamp, local_now: Timestamp) {
        let skew = store_now.as_millis() - local_now.as_millis();
        self.skew_ms.store(skew, Ordering::Relaxed);
        ::metrics::gauge!(names::CLOCK_OFFSET).set(skew as f64 / 1000.0);
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
