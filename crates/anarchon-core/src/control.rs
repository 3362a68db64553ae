//! Fleet control: pauses an operator sets in the store.
//!
//! Stopping one instance does not stop a job: the others go on claiming
//! it. A pause therefore lives in the store, beside the runs, and every
//! lease store reads it in the same atomic step that claims a slot, on the
//! store's clock (see [`crate::decide::claim`]). A command given on any
//! host, even from a process that runs no scheduler, holds for the whole
//! fleet at once.
//!
//! A pause covers one job or every job of the namespace
//! ([`PauseScope`]), ends when it is resumed or at a time on the store's
//! clock ([`PauseEnd`]), and says why and who ([`PauseRequest`]). A slot
//! claimed while its job is paused is recorded `paused` and runs nowhere;
//! a run already going is not stopped; resuming does not catch paused slots
//! up.
//!
//! [`Control`] is the operator's handle: it needs only a lease store, not a
//! running scheduler.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::name::JobName;
use crate::request::{RunRequest, TriggerRequest};
use crate::scheduler::MANUAL_RUN_WINDOW;
use crate::store::{LeaseStore, RunKey, RunRecord, RunState, RunView};
use crate::time::Timestamp;

/// The longest reason or author a pause keeps, in characters.
pub const MAX_PAUSE_NOTE_LEN: usize = 200;

/// What a pause covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseScope {
    /// One job.
    Job(JobName),
    /// Every job of the store's namespace (table, prefix, bucket).
    All,
}

impl PauseScope {
    /// The key stores file the pause under: the job's name, or `*` for the
    /// whole namespace (`*` is never part of a job name).
    pub fn key(&self) -> &str {
        match self {
            PauseScope::Job(job) => job.as_str(),
            PauseScope::All => "*",
        }
    }

    /// Parses what [`Self::key`] wrote.
    pub fn from_key(key: &str) -> Option<Self> {
        if key == "*" {
            Some(PauseScope::All)
        } else {
            JobName::new(key).ok().map(PauseScope::Job)
        }
    }
}

impl fmt::Display for PauseScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PauseScope::Job(job) => write!(f, "job {job}"),
            PauseScope::All => f.write_str("every job"),
        }
    }
}

/// When a pause ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PauseEnd {
    /// When it is resumed.
    OnResume,
    /// At this time on the store's clock (or when resumed before).
    At(Timestamp),
}

impl PauseEnd {
    /// Whether a pause with this end still holds at `now` (store time).
    pub fn holds_at(self, now: Timestamp) -> bool {
        match self {
            PauseEnd::OnResume => true,
            PauseEnd::At(until) => now < until,
        }
    }

    /// The end as stores keep it: milliseconds, or `None` for
    /// [`PauseEnd::OnResume`].
    pub fn as_millis(self) -> Option<i64> {
        match self {
            PauseEnd::OnResume => None,
            PauseEnd::At(until) => Some(until.as_millis()),
        }
    }

    /// Reads what [`Self::as_millis`] wrote.
    pub fn from_millis(ms: Option<i64>) -> Self {
        ms.map_or(PauseEnd::OnResume, |ms| {
            PauseEnd::At(Timestamp::from_millis(ms))
        })
    }
}

/// The pauses a claim of one job must respect, as the store holds them:
/// the job's own and the namespace's, each by its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paused {
    /// The job's own pause.
    pub job: Option<PauseEnd>,
    /// The pause of every job.
    pub all: Option<PauseEnd>,
}

impl Paused {
    /// No pause at all.
    pub const NONE: Paused = Paused {
        job: None,
        all: None,
    };

    /// Whether either pause holds at `now` (store time).
    pub fn holds_at(&self, now: Timestamp) -> bool {
        [self.job, self.all]
            .into_iter()
            .flatten()
            .any(|end| end.holds_at(now))
    }
}

/// How long a pause asked for lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// Until resumed.
    Resumed,
    /// Until this time on the store's clock; it must be in the future.
    At(Timestamp),
    /// For this long from the store's clock when the pause is written.
    For(Duration),
}

/// An operator's pause, before the store writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseRequest {
    until: Until,
    reason: Option<String>,
    by: Option<String>,
}

impl PauseRequest {
    /// A pause that lasts until resumed, with no reason and no author.
    pub fn new() -> Self {
        Self {
            until: Until::Resumed,
            reason: None,
            by: None,
        }
    }

    /// Sets how long the pause lasts.
    pub fn with_until(mut self, until: Until) -> Self {
        self.until = until;
        self
    }

    /// Sets why the job is paused, shown by `status`.
    ///
    /// # Errors
    ///
    /// [`PauseRefused::Note`] for text longer than [`MAX_PAUSE_NOTE_LEN`]
    /// characters or with control characters.
    pub fn with_reason(mut self, reason: &str) -> Result<Self, PauseRefused> {
        self.reason = Some(note("reason", reason)?);
        Ok(self)
    }

    /// Sets who paused it (a person, a deploy job), shown by `status`.
    ///
    /// # Errors
    ///
    /// As [`Self::with_reason`].
    pub fn with_by(mut self, by: &str) -> Result<Self, PauseRefused> {
        self.by = Some(note("by", by)?);
        Ok(self)
    }

    /// How long the pause lasts.
    pub fn until(&self) -> Until {
        self.until
    }

    /// Why, if said.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Who, if said.
    pub fn by(&self) -> Option<&str> {
        self.by.as_deref()
    }

    /// The pause a store writes for this request at `now`, its clock.
    ///
    /// # Errors
    ///
    /// [`PauseRefused::UntilPassed`] when [`Until::At`] is not after `now`;
    /// [`PauseRefused::Empty`] for [`Until::For`] less than a millisecond
    /// (stores keep milliseconds).
    pub fn at(&self, scope: &PauseScope, now: Timestamp) -> Result<Pause, PauseRefused> {
        let end = match self.until {
            Until::Resumed => PauseEnd::OnResume,
            Until::At(until) if until <= now => {
                return Err(PauseRefused::UntilPassed { until, now });
            }
            Until::At(until) => PauseEnd::At(until),
            Until::For(d) if d.as_millis() == 0 => return Err(PauseRefused::Empty),
            Until::For(d) => PauseEnd::At(now.saturating_add(d)),
        };
        Ok(Pause {
            scope: scope.clone(),
            since: now,
            end,
            reason: self.reason.clone(),
            by: self.by.clone(),
        })
    }
}

impl Default for PauseRequest {
    fn default() -> Self {
        Self::new()
    }
}

fn note(what: &'static str, text: &str) -> Result<String, PauseRefused> {
    let len = text.chars().count();
    if len > MAX_PAUSE_NOTE_LEN {
        return Err(PauseRefused::Note {
            what,
            reason: format!("it is {len} characters long; the limit is {MAX_PAUSE_NOTE_LEN}"),
        });
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(PauseRefused::Note {
            what,
            reason: format!("it contains the control character {c:?}; write it on one line"),
        });
    }
    Ok(text.to_owned())
}

/// Why a pause was not written. Nothing is written in any case.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PauseRefused {
    /// The end asked for is not in the future on the store's clock.
    #[error(
        "the pause would end at {until}, which is not after the store's clock ({now}); give a later time or a duration"
    )]
    UntilPassed {
        /// The end asked for.
        until: Timestamp,
        /// The store's clock.
        now: Timestamp,
    },
    /// A pause for no time at all.
    #[error("a pause shorter than a millisecond would not pause anything; give a longer duration")]
    Empty,
    /// A reason or author that cannot be kept.
    #[error("the pause's {what} cannot be kept: {reason}")]
    Note {
        /// `reason` or `by`.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl PauseRefused {
    /// The refusal as a store error of `backend` (not temporary).
    pub fn into_store_error(self, backend: &'static str) -> StoreError {
        StoreError::invalid(backend, self.to_string())
    }
}

/// A pause as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pause {
    /// What it covers.
    pub scope: PauseScope,
    /// When it was written, on the store's clock.
    pub since: Timestamp,
    /// When it ends.
    pub end: PauseEnd,
    /// Why, if said.
    pub reason: Option<String>,
    /// Who, if said.
    pub by: Option<String>,
}

impl Pause {
    /// Whether the pause holds at `now` (store time).
    pub fn holds_at(&self, now: Timestamp) -> bool {
        self.end.holds_at(now)
    }
}

/// The pauses a store holds, read in one step with its clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pauses {
    /// Every pause that still holds at `store_now`, ordered by scope (the
    /// namespace's first, then jobs by name).
    pub pauses: Vec<Pause>,
    /// The store's clock when it read them.
    pub store_now: Timestamp,
}

impl Pauses {
    /// Keeps only the pauses that hold at `store_now` and orders them: for
    /// stores that read every pause they hold.
    pub fn holding(mut pauses: Vec<Pause>, store_now: Timestamp) -> Self {
        pauses.retain(|p| p.holds_at(store_now));
        pauses.sort_by(|a, b| match (&a.scope, &b.scope) {
            (PauseScope::All, PauseScope::All) => std::cmp::Ordering::Equal,
            (PauseScope::All, _) => std::cmp::Ordering::Less,
            (_, PauseScope::All) => std::cmp::Ordering::Greater,
            (x, y) => x.cmp(y),
        });
        Self { pauses, store_now }
    }

    /// The pause of `job` that holds, if any: its own, else the namespace's.
    pub fn of(&self, job: &JobName) -> Option<&Pause> {
        let own = self
            .pauses
            .iter()
            .find(|p| matches!(&p.scope, PauseScope::Job(j) if j == job));
        own.or_else(|| self.pauses.iter().find(|p| p.scope == PauseScope::All))
    }
}

/// One job's state, as [`Control::status`] reads it from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStatus {
    /// The job.
    pub job: JobName,
    /// The pause that holds the job (its own or the namespace's), if any.
    pub pause: Option<Pause>,
    /// The job's latest runs, newest first (at most the number asked for).
    pub recent: Vec<RunRecord>,
    /// The job's manual-run requests whose run has not ended, oldest
    /// first.
    pub pending: Vec<RunRequest>,
    /// The job's backfill requests the store still keeps, oldest first
    /// (their runs are in the history).
    pub backfills: Vec<RunRequest>,
}

/// What [`Control::status`] read: each job's state and the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetStatus {
    /// The store's clock when it read the pauses.
    pub store_now: Timestamp,
    /// Each job asked about, in the order asked.
    pub jobs: Vec<JobStatus>,
}

/// An operator's handle on a lease store: pause, resume and read the state
/// of jobs for the whole fleet. It needs no running scheduler.
pub struct Control<S: LeaseStore + ?Sized> {
    store: Arc<S>,
}

impl<S: LeaseStore + ?Sized> Clone for Control<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
        }
    }
}

impl<S: LeaseStore + ?Sized> Control<S> {
    /// A handle on `store`.
    pub fn new(store: Arc<S>) -> Self {
        Self { store }
    }

    /// Pauses `scope` for every instance, as of the store's clock; replaces
    /// a pause of the same scope. Returns the pause as written.
    ///
    /// # Errors
    ///
    /// The store's error; an invalid store error (nothing written) when the
    /// request's end is not in the future on the store's clock.
    pub async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        self.store.pause(scope, req).await
    }

    /// Removes the pause of `scope`. Returns whether there was one. Slots
    /// recorded `paused` stay so.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        self.store.resume(scope).await
    }

    /// The pauses that hold now.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.store.pauses().await
    }

    /// Asks for a manual run (see [`LeaseStore::request_run`]): every
    /// instance that has the job hears of it, and one of them runs it. The
    /// same id again is the same request. Returns the request as stored;
    /// its run is [`RunRequest::run`].
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn trigger(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.store.request_run(req).await
    }

    /// Asks for a backfill (see [`TriggerRequest::backfill`]): every
    /// instance that has the job runs the range's slots that never ran (no
    /// record, `missed` or `paused`),
    /// oldest first, one at a time. `retention` is how long the fleet's
    /// stores keep records (the schedulers' history retention): a range
    /// that starts before it is refused, since slots whose records were
    /// already collected would look as if they never ran and run again.
    /// `None` skips that check, for an operator who knows.
    ///
    /// # Errors
    ///
    /// An invalid store error, nothing written, for a range that ends
    /// after the store's clock or starts before `retention`; otherwise the
    /// store's.
    pub async fn backfill(
        &self,
        req: &TriggerRequest,
        retention: Option<Duration>,
    ) -> Result<RunRequest, StoreError> {
        let refuse = |why: String| Err(StoreError::invalid("anarchon", why));
        let Some(range) = req.range() else {
            return refuse("a backfill needs a range".into());
        };
        let now = self.store.run_requests().await?.store_now;
        if range.to() > now {
            return refuse(format!(
                "the range ends at {}, after the store's clock ({now}): only slots that have come can be backfilled",
                range.to()
            ));
        }
        if let Some(keep) = retention
            && range.from() < now.saturating_sub(keep)
        {
            return refuse(format!(
                "the range starts at {}, more than the history retention ({}) ago: records of those slots may have been collected, and they would run again; start later, or force it",
                range.from(),
                humanize(keep)
            ));
        }
        self.store.request_run(req).await
    }

    /// What the store knows of a manual run (or any run): its state on the
    /// store's clock.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn run_state(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.store.peek(run).await
    }

    /// The state of each of `jobs`: its pause and its `recent` latest runs,
    /// with the store's clock from the same read of the pauses.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn status(&self, jobs: &[JobName], recent: usize) -> Result<FleetStatus, StoreError> {
        let pauses = self.store.pauses().await?;
        let requests = self.store.run_requests().await?;
        // A request whose run nobody claimed within the window never runs.
        let oldest = requests.store_now.saturating_sub(MANUAL_RUN_WINDOW);
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            let mut pending = Vec::new();
            let mut backfills = Vec::new();
            for request in requests.requests.iter().filter(|r| &r.job == job) {
                let Some(run) = request.run() else {
                    backfills.push(request.clone());
                    continue;
                };
                let pending_now = match self.store.peek(&run).await?.state {
                    RunState::Running { .. }
                    | RunState::RetryPending { .. }
                    | RunState::Waiting { .. } => true,
                    RunState::Absent => request.requested_at >= oldest,
                    RunState::Missed | RunState::Finished(_) => false,
                };
                if pending_now {
                    pending.push(request.clone());
                }
            }
            out.push(JobStatus {
                job: job.clone(),
                pause: pauses.of(job).cloned(),
                recent: self.store.history(job, recent).await?,
                pending,
                backfills,
            });
        }
        Ok(FleetStatus {
            store_now: pauses.store_now,
            jobs: out,
        })
    }
}

/// `d` in hours, minutes or seconds, for a message.
fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs.is_multiple_of(3600) {
        format!("{} h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_pause_ends_on_the_store_clock() {
        let job = PauseScope::Job(JobName::new("a").unwrap());
        let timed = PauseRequest::new().with_until(Until::For(Duration::from_secs(2)));
        let pause = timed.at(&job, t(10_000)).unwrap();
        assert_eq!(pause.end, PauseEnd::At(t(12_000)));
        assert!(pause.holds_at(t(11_999)));
        assert!(!pause.holds_at(t(12_000)));
        assert!(PauseEnd::OnResume.holds_at(t(i64::MAX)));
    }

    #[test]
    fn an_end_in_the_past_or_a_zero_pause_is_refused() {
        let all = PauseScope::All;
        let past = PauseRequest::new().with_until(Until::At(t(5)));
        assert_eq!(
            past.at(&all, t(5)),
            Err(PauseRefused::UntilPassed {
                until: t(5),
                now: t(5)
            })
        );
        for nothing in [Duration::ZERO, Duration::from_micros(500)] {
            let zero = PauseRequest::new().with_until(Until::For(nothing));
            assert_eq!(zero.at(&all, t(5)), Err(PauseRefused::Empty));
        }
    }

    #[test]
    fn notes_are_one_line_and_bounded() {
        assert!(PauseRequest::new().with_reason("deploy of v2").is_ok());
        let long = "x".repeat(MAX_PAUSE_NOTE_LEN + 1);
        let err = PauseRequest::new().with_reason(&long).unwrap_err();
        assert!(err.to_string().contains("reason"), "{err}");
        let err = PauseRequest::new().with_by("a\nb").unwrap_err();
        assert!(err.to_string().contains("one line"), "{err}");
    }

    #[test]
    fn the_namespace_key_is_never_a_job_name() {
        assert_eq!(PauseScope::from_key("*"), Some(PauseScope::All));
        assert!(JobName::new("*").is_err());
        let job = PauseScope::Job(JobName::new("nightly").unwrap());
        assert_eq!(PauseScope::from_key(job.key()), Some(job));
    }

    #[test]
    fn either_pause_holds_a_job_and_its_own_is_shown_first() {
        let paused = Paused {
            job: Some(PauseEnd::At(t(100))),
            all: None,
        };
        assert!(paused.holds_at(t(99)));
        assert!(!paused.holds_at(t(100)));
        assert!(!Paused::NONE.holds_at(t(0)));
        let job = JobName::new("a").unwrap();
        let own = PauseRequest::new()
            .at(&PauseScope::Job(job.clone()), t(0))
            .unwrap();
        let all = PauseRequest::new().at(&PauseScope::All, t(0)).unwrap();
        let gone = PauseRequest::new()
            .with_until(Until::For(Duration::from_millis(5)))
            .at(&PauseScope::Job(JobName::new("b").unwrap()), t(0))
            .unwrap();
        let pauses = Pauses::holding(vec![own.clone(), gone, all.clone()], t(10));
        assert_eq!(pauses.pauses, vec![all.clone(), own.clone()]);
        assert_eq!(pauses.of(&job), Some(&own));
        assert_eq!(pauses.of(&JobName::new("b").unwrap()), Some(&all));
    }
}
