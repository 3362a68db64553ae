//! Jobs: how one is described ([`JobBuilder`], [`JobOptions`]) and what
//! the scheduler keeps of it once checked ([`JobSpec`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::context::{Handler, RunContext};
use super::{
    DEFAULT_CATCH_UP_LIMIT, DEFAULT_MAX_LATE, IntoDynClaim, MAX_WINDOW, SKEW_MARGIN,
    SchedulerBuilder, positive, unsupported,
};
use crate::error::ConfigError;
use crate::ids::MaxAttempts;
use crate::name::JobName;
use crate::retry::RetryPolicy;
use crate::schedule::Schedule;
use crate::store::{ClaimStore, LeaseStore, Memory, Overlap};

/// Job options read from configuration: the run-time path, checked against
/// the store when the job is added.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct JobOptions {
    /// How late a claim may be.
    pub max_late: Option<Duration>,
    /// Spread claims of each slot over up to this long.
    pub jitter: Option<Duration>,
    /// Cancel the handler after this long.
    pub timeout: Option<Duration>,
    /// The overlap rule (lease stores only).
    pub overlap: Option<Overlap>,
    /// Attempts in all (lease stores only).
    pub max_attempts: Option<u32>,
    /// Catch-up window (lease stores only).
    pub catch_up: Option<Duration>,
    /// The most missed slots caught up at a time (lease stores only).
    pub catch_up_limit: Option<u32>,
    /// How failed runs are retried (lease stores only).
    pub retry: Option<RetryPolicy>,
}

/// A job once validated.
pub(crate) struct JobSpec {
    pub(crate) name: JobName,
    pub(crate) schedule: Schedule,
    pub(crate) max_late: Duration,
    pub(crate) jitter: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) overlap: Overlap,
    pub(crate) max_attempts: MaxAttempts,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) catch_up: Option<Duration>,
    /// At most this many missed slots are caught up at a time.
    pub(crate) catch_up_limit: usize,
    pub(crate) handler: Arc<dyn Handler>,
}

impl JobSpec {
    /// How late a claim of this job may be: `max_late`, or the catch-up
    /// window if that is longer.
    pub(crate) fn window(&self) -> Duration {
        self.catch_up
            .map_or(self.max_late, |w| w.max(self.max_late))
    }

    /// The attempts a claim of this job allows in all: `max_attempts` for
    /// takeovers, plus one per retry.
    pub(crate) fn claim_attempts(&self) -> MaxAttempts {
        let retries = self.retry.map_or(0, |r| r.retries());
        MaxAttempts::new(self.max_attempts.get().saturating_add(retries))
            .unwrap_or(self.max_attempts)
    }
}

/// Describes one job; created by [`SchedulerBuilder::job`].
pub struct JobBuilder<'a, S: ClaimStore + ?Sized> {
    pub(super) builder: &'a mut SchedulerBuilder<S>,
    pub(super) name: JobName,
    pub(super) schedule: Schedule,
    pub(super) options: JobOptions,
}

impl<S: ClaimStore + ?Sized> fmt::Debug for JobBuilder<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobBuilder")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("options", &self.options)
            .finish()
    }
}

impl<S: ClaimStore + ?Sized> JobBuilder<'_, S>
where
    Arc<S>: IntoDynClaim,
{
    /// How late a claim may be and still run (default 60 s). A slot whose
    /// claim would be later is recorded as missed instead.
    pub fn max_late(mut self, max_late: Duration) -> Self {
        self.options.max_late = Some(max_late);
        self
    }

    /// Spreads the claims of each slot over up to `jitter`: the claim for a
    /// slot fires at the slot plus an offset computed from the job and the
    /// slot, the same on every instance.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.options.jitter = Some(jitter);
        self
    }

    /// Cancels the handler's context after `timeout`; the run is recorded
    /// as failed.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }

    /// Applies options read from configuration. Lease-only options on a
    /// claim-only store make [`Self::run`] fail with
    /// [`ConfigError::UnsupportedOption`].
    pub fn options(mut self, options: &JobOptions) -> Self {
        let o = &mut self.options;
        o.max_late = options.max_late.or(o.max_late);
        o.jitter = options.jitter.or(o.jitter);
        o.timeout = options.timeout.or(o.timeout);
        o.overlap = options.overlap.or(o.overlap);
        o.max_attempts = options.max_attempts.or(o.max_attempts);
        o.catch_up = options.catch_up.or(o.catch_up);
        o.catch_up_limit = options.catch_up_limit.or(o.catch_up_limit);
        o.retry = options.retry.or(o.retry);
        self
    }

    /// Adds the job with its handler.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero duration, `max_attempts = 0`, a
    /// lease-only option on a claim-only store, or a claim-only store that
    /// forgets runs sooner than `max_late` plus [`SKEW_MARGIN`].
    pub fn run<F, Fut, E>(self, handler: F) -> Result<(), ConfigError>
    where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.run_handler(Arc::new(handler))
    }

    /// Adds the job with a handler that is already a [`Handler`] object.
    ///
    /// # Errors
    ///
    /// As [`Self::run`].
    pub fn run_handler(self, handler: Arc<dyn Handler>) -> Result<(), ConfigError> {
        let Self {
            builder,
            name,
            schedule,
            options: o,
        } = self;
        let info = builder.store.info();
        let is_lease = builder
            .store
            .clone()
            .into_dyn_claim()
            .as_lease_store()
            .is_some();
        if !is_lease {
            for (set, option) in [
                (o.overlap.is_some(), "overlap"),
                (o.max_attempts.is_some(), "max_attempts"),
                (o.catch_up.is_some(), "catch_up"),
                (o.catch_up_limit.is_some(), "catch_up_limit"),
                (o.retry.is_some(), "retries"),
            ] {
                if set {
                    return Err(unsupported(option, info));
                }
            }
        }
        let max_late = o.max_late.unwrap_or(DEFAULT_MAX_LATE);
        if max_late > MAX_WINDOW {
            return Err(ConfigError::OutOfRange {
                option: "max_late",
                reason: "it must be at most 366 days".into(),
            });
        }
        let jitter = o.jitter.map(|j| positive("jitter", j)).transpose()?;
        if let Some(jitter) = jitter
            && jitter >= max_late
        {
            return Err(ConfigError::OutOfRange {
                option: "jitter",
                reason: format!(
                    "{jitter:?} is not shorter than max_late ({max_late:?}): claims fired late in the jitter window would be refused as too late"
                ),
            });
        }
        let timeout = o.timeout.map(|t| positive("timeout", t)).transpose()?;
        let catch_up = o.catch_up.map(|c| positive("catch_up", c)).transpose()?;
        if catch_up.is_some_and(|c| c > MAX_WINDOW) {
            return Err(ConfigError::OutOfRange {
                option: "catch_up",
                reason: "it must be at most 366 days".into(),
            });
        }
        let max_attempts = o
            .max_attempts
            .map(MaxAttempts::new)
            .transpose()?
            .unwrap_or_default();
        let catch_up_limit = match o.catch_up_limit {
            Some(0) => {
                return Err(ConfigError::OutOfRange {
                    option: "catch_up_limit",
                    reason: "it must be at least 1 (leave catch_up out to catch nothing up)".into(),
                });
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => DEFAULT_CATCH_UP_LIMIT,
        };
        if !is_lease {
            let memory = match info.memory {
                Memory::Window(w) => Some(w),
                Memory::Forever | Memory::UntilCollected => None,
            };
            if let Some(memory) = memory
                && memory < max_late + SKEW_MARGIN
            {
                return Err(ConfigError::MemoryTooShort {
                    backend: info.name,
                    job: name.to_string(),
                    memory,
                    max_late,
                    margin: SKEW_MARGIN,
                });
            }
        }
        builder.names.insert(name.clone());
        builder.jobs.push(Arc::new(JobSpec {
            name,
            schedule,
            max_late,
            jitter,
            timeout,
            overlap: o.overlap.unwrap_or_default(),
            max_attempts,
            retry: o.retry,
            catch_up,
            catch_up_limit,
            handler,
        }));
        Ok(())
    }
}

impl<S: LeaseStore + ?Sized> JobBuilder<'_, S> {
    /// What to do when the previous run is still going (default
    /// [`Overlap::Allow`]).
    ///
    /// The store judges "still going" when the slot's claim arrives, so a
    /// job with any rule but `Allow` is claimed at its fire time rather
    /// than ahead of it: its handler starts a store round trip after the
    /// fire time, and a run that ended before the slot does not count.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.options.overlap = Some(overlap);
        self
    }

    /// How many attempts a run may have in all, counting the first (default
    /// 3). With 1, a runner that dies leaves its run interrupted. Retries
    /// ([`Self::retry`]) come on top: each retry adds one attempt, and
    /// takeovers and retries draw on the same count — a run never retried
    /// may be taken over up to `max_attempts + retries − 1` times.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.options.max_attempts = Some(n);
        self
    }

    /// Retries a run whose handler failed (returned an error, panicked or
    /// timed out), as `policy` says: by whichever instance claims it first
    /// once the store's clock reaches the retry's due time. A retry that
    /// would be due at or after the job's next slot is not made. See
    /// [`crate::retry`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = Some(policy);
        self
    }

    /// Runs slots missed while no instance was up, if they are at most
    /// `window` old: at start, and whenever the timer finds it woke late.
    /// Each time, at most [`Self::catch_up_limit`] of them, and over all
    /// jobs at most [`SchedulerBuilder::catch_up_concurrency`] at once.
    pub fn catch_up(mut self, window: Duration) -> Self {
        self.options.catch_up = Some(window);
        self
    }

    /// The most missed slots caught up when the scheduler starts, or when
    /// its timer finds it fell behind (default [`DEFAULT_CATCH_UP_LIMIT`]):
    /// the newest ones, run oldest first. A per-minute job with a day's
    /// catch-up would otherwise queue up to 1,440 runs after an outage.
    /// Older missed slots are not claimed; the log says how many.
    pub fn catch_up_limit(mut self, n: u32) -> Self {
        self.options.catch_up_limit = Some(n);
        self
    }
}
