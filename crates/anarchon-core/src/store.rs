//! The store traits: the one atomic step, and the lease around it.
//!
//! # Contract
//!
//! A [`ClaimStore`] answers one question per run — "was I first?" — and
//! must answer it atomically inside the store: for a given [`RunKey`], at most
//! one [`ClaimRequest::token`] is ever told [`ClaimOutcome::Won`] for as long as
//! the store remembers the run ([`BackendInfo::memory`]). The same token asking
//! again is told `Won` again (a retry after a lost reply).
//!
//! A [`LeaseStore`] also keeps a lease per run and implements the flowchart of
//! `docs/writing-a-backend.md` in one atomic step per call, using only its own
//! clock. [`MemoryStore`](crate::MemoryStore) is the reference implementation,
//! and `anarchon-testkit` checks every property against a backend.
//!
//! All methods are cancel-safe in the sense that matters here: if a future is
//! dropped halfway, the store either did the step or did not, and sending the
//! same request again (same token) gives the right answer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::control::{Pause, PauseRequest, PauseScope, Pauses};
use crate::error::StoreError;
use crate::hand_over::HandOvers;
use crate::ids::{Attempt, Fence, InstanceId, MaxAttempts, Token};
use crate::name::JobName;
use crate::request::{RunRequest, RunRequests, TriggerRequest};
use crate::retry::{AttemptCause, PastAttempts, RetryPlan};
use crate::time::{Slot, Timestamp};

/// One run: a job and a slot. The unit that is claimed.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    /// The job.
    pub job: JobName,
    /// The slot.
    pub slot: Slot,
}

impl RunKey {
    /// The run of `job` at `slot`.
    pub fn new(job: JobName, slot: Slot) -> Self {
        Self { job, slot }
    }
}

impl fmt::Display for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.job, self.slot)
    }
}

impl fmt::Debug for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunKey({self})")
    }
}

/// A plain claim: "for this run, am I the one?"
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The run.
    pub run: RunKey,
    /// The caller's token for this claim; the same on every retry.
    pub token: Token,
    /// Who is asking, recorded with a win.
    pub instance: InstanceId,
    /// How late the claim may be. Lease stores compare it with their own
    /// clock; for claim-only stores the scheduler checks it locally.
    pub max_late: Duration,
}

/// What a job does when its previous run is still going.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Run anyway: runs of the job may overlap.
    #[default]
    Allow,
    /// Skip the new slot while another run of the job is live (holds a
    /// live lease, or waits for a retry); the slot is recorded as skipped.
    Skip,
    /// Run the new slot and end every other run of the job still going
    /// (running, or waiting for a retry): they are recorded `replaced`,
    /// and their runners are fenced at their next heartbeat and cancel
    /// their handlers.
    Replace,
    /// While another run of the job is live, the new slot waits (recorded
    /// `waiting`) and runs when that run ends, if that is within the
    /// slot's `max_late`; at most one slot waits, later ones are skipped.
    BufferOne,
}

impl Overlap {
    /// The rule's name as the crontab writes it: `allow`, `skip`,
    /// `replace`, `buffer-one`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
            Overlap::Replace => "replace",
            Overlap::BufferOne => "buffer-one",
        }
    }
}

/// A claim on a lease store: the plain claim plus the lease's terms.
#[derive(Clone, Debug)]
pub struct LeaseClaim {
    /// The plain part.
    pub claim: ClaimRequest,
    /// How long the lease lasts from the store's `now` unless renewed.
    pub lease: Duration,
    /// The overlap rule of the job.
    pub overlap: Overlap,
    /// How many attempts the run may have in all.
    pub max_attempts: MaxAttempts,
    /// Whether the claim may start a slot recorded `paused`, as it may one
    /// recorded `missed`: a backfill's claims may, a schedule's may not.
    pub rerun_paused: bool,
}

impl LeaseClaim {
    /// The lease a plain [`ClaimStore::claim`] on a lease store asks for.
    pub const PLAIN_LEASE: Duration = Duration::from_secs(30);

    /// How a lease store treats a plain claim: a [`Self::PLAIN_LEASE`]
    /// lease, overlap allowed, default attempts.
    pub fn from_plain(claim: &ClaimRequest) -> Self {
        Self {
            claim: claim.clone(),
            lease: Self::PLAIN_LEASE,
            overlap: Overlap::Allow,
            max_attempts: MaxAttempts::DEFAULT,
            rerun_paused: false,
        }
    }

    /// The run this claim is for.
    pub fn run(&self) -> &RunKey {
        &self.claim.run
    }
}

/// How a run ended, as the runner reports it to [`LeaseStore::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error, panicked or timed out.
    Failed {
        /// What went wrong, in one line.
        error: String,
        /// The retry the runner asks for, if the job has retries left: the
        /// store records the failure with the retry's due time (see
        /// [`crate::retry`]).
        retry: Option<RetryPlan>,
    },
}

impl RunOutcome {
    /// The state a finish with this outcome records, and the error it
    /// keeps (`None` for a success).
    pub fn into_record(self) -> (FinalState, Option<String>) {
        match self {
            RunOutcome::Succeeded => (FinalState::Succeeded, None),
            RunOutcome::Failed { error, .. } => (FinalState::Failed, Some(error)),
        }
    }
}

/// A state a run never leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinalState {
    /// The handler succeeded.
    Succeeded,
    /// The handler failed.
    Failed,
    /// The lease ran out with no attempts left.
    Interrupted,
    /// Skipped because another run of the job was live (`Overlap::Skip`).
    Skipped,
    /// Not run because the job (or every job) was paused when the slot was
    /// claimed.
    Paused,
    /// Ended by a later slot of a job with [`Overlap::Replace`]: its runner
    /// was fenced, and its handler cancelled at its next heartbeat.
    Replaced,
}

impl FinalState {
    /// The state's name as stores write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            FinalState::Succeeded => "succeeded",
            FinalState::Failed => "failed",
            FinalState::Interrupted => "interrupted",
            FinalState::Skipped => "skipped",
            FinalState::Paused => "paused",
            FinalState::Replaced => "replaced",
        }
    }
}

/// Who won, as told to the winner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Win {
    /// 1 for the first runner, +1 at each takeover or retry.
    pub attempt: Attempt,
    /// The fence the store assigned to this win; `None` on claim-only stores.
    pub fence: Option<Fence>,
    /// How this attempt came to run.
    pub cause: AttemptCause,
    /// How many retries the run has had, this attempt's included.
    pub retries: u32,
}

impl Win {
    /// The first attempt under `fence`: what a claim-only store's win is.
    pub const fn first(fence: Option<Fence>) -> Self {
        Self {
            attempt: Attempt::FIRST,
            fence,
            cause: AttemptCause::First,
            retries: 0,
        }
    }
}

/// The answer to a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller's token holds the run: run it. Also the answer to the
    /// caller's own retried claim.
    Won(Win),
    /// Someone else was first (claim-only stores).
    Lost,
    /// The store may or may not have taken the claim (the connection dropped
    /// before the answer). The scheduler treats it as lost and logs it.
    Unknown,
    /// Another instance holds a live lease (lease stores): become a backup.
    Running {
        /// When the lease ends, on the store's clock.
        lease_until: Timestamp,
        /// The store's clock when it answered.
        store_now: Timestamp,
    },
    /// The run has ended.
    Done(FinalState),
    /// Too late: the slot is older than the claim's `max_late`.
    Late,
    /// Too late, and this very claim recorded the slot `missed` (lease
    /// stores). Every later claim of the slot is answered [`Self::Late`], so
    /// exactly one instance of the fleet hears this: the one that reports
    /// the missed slot (an alert hook, say).
    Missed,
    /// The run's lease ran out with no attempts left, and this very claim
    /// ended it `interrupted` (lease stores). Later claims are answered
    /// [`Self::Done`]`(Interrupted)`, so exactly one instance hears this.
    Interrupted,
    /// Skipped: another run of the job holds a live lease (`Overlap::Skip`).
    Overlap,
}

/// The answers to a batch of claims ([`LeaseStore::claim_many`]), one per
/// claim in the order sent: each an outcome, or the error of that claim
/// alone.
#[derive(Debug, Default)]
pub struct ClaimAnswers(Vec<Result<ClaimOutcome, StoreError>>);

impl ClaimAnswers {
    /// The answers, in the order of the claims.
    pub fn new(answers: Vec<Result<ClaimOutcome, StoreError>>) -> Self {
        Self(answers)
    }

    /// How many answers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The answers, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Result<ClaimOutcome, StoreError>> {
        self.0.iter()
    }

    /// Every outcome, or the error of the first claim that failed.
    ///
    /// # Errors
    ///
    /// The first claim's [`StoreError`].
    pub fn all(self) -> Result<Vec<ClaimOutcome>, StoreError> {
        self.0.into_iter().collect()
    }
}

impl From<Vec<ClaimOutcome>> for ClaimAnswers {
    fn from(outcomes: Vec<ClaimOutcome>) -> Self {
        Self(outcomes.into_iter().map(Ok).collect())
    }
}

impl FromIterator<Result<ClaimOutcome, StoreError>> for ClaimAnswers {
    fn from_iter<I: IntoIterator<Item = Result<ClaimOutcome, StoreError>>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl IntoIterator for ClaimAnswers {
    type Item = Result<ClaimOutcome, StoreError>;
    type IntoIter = std::vec::IntoIter<Result<ClaimOutcome, StoreError>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// What a store says about a run's lease after a heartbeat, finish or release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The token still holds the run; the step was done.
    Renewed,
    /// The token no longer holds the run (taken over, finished, or never
    /// won): the caller must stop.
    Fenced,
}

/// A run as [`LeaseStore::peek`] sees it, without taking any lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunView {
    /// The store's clock when it answered.
    pub store_now: Timestamp,
    /// What the store has for the run.
    pub state: RunState,
}

/// What a lease store knows about a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Nothing: never claimed, or forgotten.
    Absent,
    /// A late claim found it too late; a catch-up claim may still run it.
    Missed,
    /// Someone holds, or held, the lease.
    Running {
        /// The current attempt.
        attempt: Attempt,
        /// When the lease ends, on the store's clock.
        lease_until: Timestamp,
    },
    /// `attempt` failed and its retry is due at `retry_at`: until then the
    /// run counts as still going (for overlap), and from then on any
    /// instance's claim may start the retry.
    RetryPending {
        /// The attempt that failed.
        attempt: Attempt,
        /// When the retry is due, on the store's clock.
        retry_at: Timestamp,
    },
    /// The run has ended.
    Finished(FinalState),
    /// A slot of an [`Overlap::BufferOne`] job waiting for the job's live
    /// run to end; it starts then, if that is before `until`.
    Waiting {
        /// The end of its wait: the slot plus its `max_late`.
        until: Timestamp,
    },
}

impl RunState {
    /// What a stored record says about a run, as `peek` reports it: a
    /// running record without an attempt is attempt 1, one without a lease
    /// end has its lease end `store_now`; a failed one with a retry due is
    /// a pending retry.
    pub fn of_record(
        state: RecordState,
        attempt: Option<Attempt>,
        lease_until: Option<Timestamp>,
        retry_at: Option<Timestamp>,
        store_now: Timestamp,
    ) -> Self {
        match state {
            RecordState::Finished(FinalState::Failed) if retry_at.is_some() => {
                RunState::RetryPending {
                    attempt: attempt.unwrap_or(Attempt::FIRST),
                    retry_at: retry_at.unwrap_or(store_now),
                }
            }
            RecordState::Missed => RunState::Missed,
            RecordState::Waiting => RunState::Waiting {
                until: lease_until.unwrap_or(store_now),
            },
            RecordState::Finished(done) => RunState::Finished(done),
            RecordState::Running => RunState::Running {
                attempt: attempt.unwrap_or(Attempt::FIRST),
                lease_until: lease_until.unwrap_or(store_now),
            },
        }
    }
}

/// The state of a run in its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Claimed and not finished (or its runner died and nobody asked since).
    Running,
    /// A late claim found no record: nobody ran it in time.
    Missed,
    /// A slot of an [`Overlap::BufferOne`] job that came while another run
    /// of the job was live: it starts when that run ends, if that is within
    /// its `max_late`. Its record's `lease_until` is the end of its wait.
    Waiting,
    /// Ended.
    Finished(FinalState),
}

impl RecordState {
    /// The state's name as stores write it: `running`, `missed`, `succeeded`, …
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordState::Running => "running",
            RecordState::Missed => "missed",
            RecordState::Waiting => "waiting",
            RecordState::Finished(f) => f.as_str(),
        }
    }

    /// Parses what [`Self::as_str`] wrote.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => RecordState::Running,
            "missed" => RecordState::Missed,
            "waiting" => RecordState::Waiting,
            "succeeded" => RecordState::Finished(FinalState::Succeeded),
            "failed" => RecordState::Finished(FinalState::Failed),
            "interrupted" => RecordState::Finished(FinalState::Interrupted),
            "skipped" => RecordState::Finished(FinalState::Skipped),
            "paused" => RecordState::Finished(FinalState::Paused),
            "replaced" => RecordState::Finished(FinalState::Replaced),
            _ => return None,
        })
    }
}

/// One run in a job's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// The run.
    pub run: RunKey,
    /// Its state now.
    pub state: RecordState,
    /// The latest attempt; `None` for runs nobody ran (missed, skipped).
    pub attempt: Option<Attempt>,
    /// The fence of the latest attempt.
    pub fence: Option<Fence>,
    /// The instance that ran the latest attempt.
    pub instance: Option<InstanceId>,
    /// When the first attempt was claimed, on the store's clock.
    pub started_at: Option<Timestamp>,
    /// When the run ended, on the store's clock.
    pub finished_at: Option<Timestamp>,
    /// The lease end of the latest attempt.
    pub lease_until: Option<Timestamp>,
    /// The error of a failed run.
    pub error: Option<String>,
    /// For a failed run whose retry is pending: when the retry is due.
    pub retry_at: Option<Timestamp>,
    /// The run's earlier attempts and how each ended.
    pub earlier: PastAttempts,
}

impl RunRecord {
    /// How the latest attempt came to run (`None` for runs nobody ran).
    pub fn cause(&self) -> Option<AttemptCause> {
        self.attempt.map(|a| self.earlier.cause_of(a))
    }
}

/// How long a store remembers that a run was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Until it is deleted by hand.
    Forever,
    /// For this long after the claim (a duplicate window, a queue TTL, …).
    Window(Duration),
    /// Until the scheduler collects it ([`LeaseStore::collect_garbage`]),
    /// which keeps every run as long as a late claim could ask about it.
    UntilCollected,
}

/// What a backend is, for logs, errors and the scheduler's checks.
#[derive(Clone, Copy, Debug)]
pub struct BackendInfo {
    /// A short name, e.g. `redis-lease`, `postgres`, `nats`.
    pub name: &'static str,
    /// How long the store remembers a run.
    pub memory: Memory,
}

/// A store that can tell exactly one instance it won each run.
///
/// See the [module documentation](self) for the contract.
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Claims `req.run` for `req.token`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`]; when [`StoreError::is_temporary`], the caller may send
    /// the same request (same token) again.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// The backend's name and memory.
    fn info(&self) -> BackendInfo;

    /// Asks the store one cheap question that needs its server to answer,
    /// and writes nothing: what a health probe calls. `Ok` means the
    /// server answered just now, not that the next claim will succeed.
    ///
    /// No default: a store that cannot reach its server must not look
    /// healthy. Lease stores made with
    /// [`claims_through_leases!`](crate::claims_through_leases) read the
    /// pauses ([`LeaseStore::pauses`]).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] saying why the store did not answer (never a
    /// password).
    async fn ping(&self) -> Result<(), StoreError>;

    /// This store as a lease store, if it is one.
    ///
    /// Claim-only stores return `None`; a lease store returns `Some(self)`.
    /// The scheduler uses it to pick the lease path for stores chosen at run
    /// time. It has no default on purpose: every backend says what it is.
    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>>;
}

/// A store that keeps a lease per run: backups, takeover, overlap rules,
/// catch-up and hand-over.
#[async_trait]
pub trait LeaseStore: ClaimStore {
    /// Claims a run under a lease: the flowchart, as one atomic step on the
    /// store's clock.
    ///
    /// Read the run's record, then, in order:
    ///
    /// 1. **Finished** (succeeded, failed, interrupted, skipped, paused):
    ///    answer `Done` with how it ended; write nothing — except a
    ///    `failed` run whose retry is pending (its finish carried a
    ///    [`RetryPlan`]): before its `retry_at` it answers `Running` with
    ///    `retry_at` as the lease's end; from then on the claim starts the
    ///    retry — the next attempt, a new fence, the claim's token and
    ///    instance, a fresh lease, the failed attempt kept among the
    ///    record's past attempts.
    /// 2. **Running, held by this claim's token** (the same claim sent
    ///    again after a lost reply): answer `Won` with the record's attempt
    ///    and fence; write nothing.
    /// 3. **Running, lease alive** (`lease_until >= now`): answer `Running`
    ///    with the lease's end and the store's `now`, so the caller can wait
    ///    as a backup.
    /// 4. **Running, lease run out**: take it over — a new fence from the
    ///    job's counter, the claim's token and instance, a fresh lease — as
    ///    the next attempt if `max_attempts` allows one, or as the same
    ///    attempt if the run was given back ([`Self::give_back`]) before its
    ///    handler started; with no attempt left, the run ends `interrupted`
    ///    and the answer is `Done(Interrupted)`.
    /// 5. **No record, or `missed`, and paused**: when a pause of the job
    ///    or of every job ([`Self::pause`]) holds at `now`, a slot with no
    ///    record is recorded `paused` and answers `Done(Paused)`; a
    ///    `missed` one stays `missed` and answers `Late`. The pauses are
    ///    read in the same atomic step as the record.
    /// 6. **No record, or `missed`**: a claim later than its `max_late`
    ///    answers `Late` (and records `missed` if there was no record); a
    ///    claim with [`Overlap::Skip`] while another run of the job is live
    ///    (holds a live lease, or has a retry pending not yet due) records
    ///    `skipped` and answers `Overlap`; otherwise the
    ///    run starts: attempt 1, a new fence, the claim's token, a lease from
    ///    `now`.
    ///
    /// Every comparison uses the store's own clock, never the caller's.
    /// [`crate::decide::claim`] is this flowchart as a pure function: a
    /// store that can read, decide and write in one atomic step applies it;
    /// one that decides in its own language (a script, SQL) mirrors it, and
    /// the kit's differential checks hold it to the function's answers.
    ///
    /// # Errors
    ///
    /// A [`StoreError`]; temporary ones may be retried with the same token.
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError>;

    /// Claims several runs, answering each in the same order. Stores that
    /// can should do it in one round trip; the default claims one by one.
    ///
    /// A claim that fails on its own (one job's data is unreadable, one
    /// script call failed) gets its own error among the answers and costs
    /// the others nothing: their answers, wins included, stand.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store gave no answer that can be trusted
    /// for any claim. Some claims may have been made; retrying all of them
    /// with the same tokens is safe.
    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            out.push(self.claim_lease(req).await);
        }
        Ok(ClaimAnswers::new(out))
    }

    /// Reads a run without locking anything: the cheap check a backup makes
    /// before it opens a claim.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError>;

    /// Extends the lease of `token` on `run` to the store's `now + lease`.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError>;

    /// Records how the run ended, if `token` still holds it. A failure
    /// with a [`RetryPlan`] is recorded with its retry due at the store's
    /// `now` plus [`RetryPlan::after`], unless that is not before
    /// [`RetryPlan::before`]: then the failure is final and its error ends
    /// with [`crate::retry::NOT_RETRIED`] ([`crate::decide::finish`]).
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError>;

    /// Ends `token`'s lease now, so a backup can take over at once
    /// (graceful shutdown). The run stays running; a takeover is the next
    /// attempt.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError>;

    /// Gives the run back before its handler started: like
    /// [`Self::release`], but the attempt is not used up. The record stays
    /// running with its lease ended and no holder, and the next takeover
    /// runs the same attempt number again (with a new fence), whatever
    /// `max_attempts` allows. The caller's token is fenced from then on.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError>;

    /// Waits at most `timeout` for news that `run` was released or given
    /// back; `true` when news came, `false` when the time ran out. Backups
    /// wait here instead of sleeping to the holder's lease end, so a
    /// hand-over is taken at once. News is only a hint: the caller reads
    /// the run after either answer. A store hears at least the hand-overs
    /// made through itself; see [`crate::hand_over`].
    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.hand_overs().wait(run, timeout).await
    }

    /// The board on which this handle hears hand-overs and new requests:
    /// its own, and where the store can push news, every other handle's
    /// (see [`crate::hand_over`]). [`Self::wait_for_hand_over`] and
    /// [`Self::announcements`] read it.
    fn hand_overs(&self) -> &HandOvers;

    /// The latest `limit` runs of `job`, newest slot first.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError>;

    /// Deletes the records of runs whose slot is more than `keep` before the
    /// store's `now`, except running runs whose lease ended less than `keep`
    /// ago (a backup may still take them over). Returns how many were deleted.
    ///
    /// The slot's age is also measured against the job's late window: the
    /// store remembers, for each job, the longest `max_late` among its
    /// claims that wrote a record, and keeps a run whose slot is younger
    /// than that, whatever `keep` says. Schedulers of other services
    /// share the namespace and collect with their own `keep`; the job's own
    /// window is what guarantees that no late claim finds a run forgotten
    /// and runs it again.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError>;

    /// Pauses `scope` for every instance: one atomic write on the store's
    /// clock ([`PauseRequest::at`] turns the request into the pause),
    /// replacing a pause of the same scope. From then on, every claim that
    /// would start a slot of a covered job records it `paused` instead
    /// (step 5 of [`Self::claim_lease`]). Returns the pause as written.
    ///
    /// # Errors
    ///
    /// An invalid [`StoreError`] with nothing written when the request is
    /// refused ([`crate::control::PauseRefused`]); otherwise the store's.
    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError>;

    /// Removes the pause of `scope`, if any (one atomic write). Returns
    /// whether a pause was removed, ended or not. Slots already recorded
    /// `paused` stay so.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError>;

    /// Every job the store has claimed a run of, in name order: its job
    /// index, kept as long as the job's fence counter (garbage collection
    /// does not remove it), so an operator's `status` or `history` can find
    /// the jobs without a crontab.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn jobs(&self) -> Result<Vec<JobName>, StoreError>;

    /// The pauses that hold at the store's clock, read with it
    /// ([`Pauses::holding`] drops the ended ones and orders the rest).
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn pauses(&self) -> Result<Pauses, StoreError>;

    /// Asks for a manual run of the request's job under its id: one atomic
    /// write on the store's clock, unless a request of the job with this id
    /// is stored already, in which case that one is answered and nothing changes
    /// (the same id twice is one run). A new request is stamped with the
    /// store's clock, moved on a millisecond past the job's latest request
    /// where it would not be later ([`crate::request::stamp`]), so its run
    /// ([`RunRequest::run`]) is the job's own. The store then announces
    /// that run ([`Self::announcements`]).
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError>;

    /// Every manual-run request the store holds, oldest first, read with
    /// its clock. [`Self::collect_garbage`] forgets requests as it forgets
    /// runs: once they are more than `keep` old.
    ///
    /// # Errors
    ///
    /// A [`StoreError`].
    async fn run_requests(&self) -> Result<RunRequests, StoreError>;

    /// Every run the store hears announced from now on: hand-overs (as
    /// [`Self::wait_for_hand_over`] hears them) and the manual runs of new
    /// requests. Stores that can push news across processes (PostgreSQL
    /// `NOTIFY`, Redis pub/sub, NATS messages) announce what any process
    /// did; others what this process did, or what they find by watching
    /// the store. News is a hint: a scheduler still reads
    /// [`Self::run_requests`] when it starts and when it may have missed
    /// news (a receiver that lagged).
    fn announcements(&self) -> broadcast::Receiver<RunKey> {
        self.hand_overs().subscribe()
    }
}

/// Implements [`ClaimStore`] for a lease store type: a plain claim is a
/// lease claim on [`LeaseClaim::from_plain`] terms, the store remembers runs
/// until they are collected, and `as_lease_store` hands the store itself.
/// Every lease store needs exactly this; the macro keeps it written once.
///
/// ```
/// # use std::time::Duration;
/// # use anarchon_core::*;
/// # struct MyStore(MemoryStore);
/// # #[async_trait]
/// # impl LeaseStore for MyStore {
/// #     async fn claim_lease(&self, r: &LeaseClaim) -> Result<ClaimOutcome, StoreError> { self.0.claim_lease(r).await }
/// #     async fn peek(&self, r: &RunKey) -> Result<RunView, StoreError> { self.0.peek(r).await }
/// #     async fn heartbeat(&self, r: &RunKey, t: Token, l: Duration) -> Result<Renewal, StoreError> { self.0.heartbeat(r, t, l).await }
/// #     async fn finish(&self, r: &RunKey, t: Token, o: RunOutcome) -> Result<Renewal, StoreError> { self.0.finish(r, t, o).await }
/// #     async fn release(&self, r: &RunKey, t: Token) -> Result<Renewal, StoreError> { self.0.release(r, t).await }
/// #     async fn give_back(&self, r: &RunKey, t: Token) -> Result<Renewal, StoreError> { self.0.give_back(r, t).await }
/// #     fn hand_overs(&self) -> &HandOvers { self.0.hand_overs() }
/// #     async fn history(&self, j: &JobName, n: usize) -> Result<Vec<RunRecord>, StoreError> { self.0.history(j, n).await }
/// #     async fn collect_garbage(&self, k: Duration) -> Result<u64, StoreError> { self.0.collect_garbage(k).await }
/// #     async fn pause(&self, s: &PauseScope, r: &PauseRequest) -> Result<Pause, StoreError> { self.0.pause(s, r).await }
/// #     async fn resume(&self, s: &PauseScope) -> Result<bool, StoreError> { self.0.resume(s).await }
/// #     async fn jobs(&self) -> Result<Vec<JobName>, StoreError> { self.0.jobs().await }
/// #     async fn pauses(&self) -> Result<Pauses, StoreError> { self.0.pauses().await }
/// #     async fn request_run(&self, r: &TriggerRequest) -> Result<RunRequest, StoreError> { self.0.request_run(r).await }
/// #     async fn run_requests(&self) -> Result<RunRequests, StoreError> { self.0.run_requests().await }
/// # }
/// anarchon_core::claims_through_leases!(MyStore, "my-store");
/// ```
#[macro_export]
macro_rules! claims_through_leases {
    ($store:ty, $name:expr) => {
        #[$crate::async_trait]
        impl $crate::ClaimStore for $store {
            async fn claim(
                &self,
                req: &$crate::ClaimRequest,
            ) -> ::std::result::Result<$crate::ClaimOutcome, $crate::StoreError> {
                $crate::LeaseStore::claim_lease(self, &$crate::LeaseClaim::from_plain(req)).await
            }

            fn info(&self) -> $crate::BackendInfo {
                $crate::BackendInfo {
                    name: $name,
                    memory: $crate::Memory::UntilCollected,
                }
            }

            async fn ping(&self) -> ::std::result::Result<(), $crate::StoreError> {
                $crate::LeaseStore::pauses(self).await.map(drop)
            }

            fn as_lease_store(
                self: ::std::sync::Arc<Self>,
            ) -> ::std::option::Option<::std::sync::Arc<dyn $crate::LeaseStore>> {
                ::std::option::Option::Some(self)
            }
        }
    };
}
