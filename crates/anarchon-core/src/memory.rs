//! `MemoryStore`: a complete lease store inside one process.
//!
//! It exists for two readers. Users get a store for tests and for a single
//! process that wants the scheduler's features without a server. Backend
//! authors get the smallest example of applying the core's decisions
//! ([`crate::decide`]) inside one atomic step — here a mutex. A backend
//! does the same with its store's atomic primitive (a transaction, a
//! compare-and-swap, a Lua script).
//!
//! The store's clock is a [`Clock`]; by default the system clock, in tests a
//! controllable one shared with the scheduler.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::control::{Pause, PauseRequest, PauseScope, Paused, Pauses};
use crate::decide::{self, ClaimDecision, FinishDecision, LeaseRecord};
use crate::error::StoreError;
use crate::hand_over::HandOvers;
use crate::ids::{Attempt, Fence, InstanceId, Token};
use crate::name::JobName;
use crate::request::{RequestId, RunRequest, RunRequests, TriggerRequest, stamp};
use crate::retry::{PastAttempt, PastAttempts};
use crate::store::{
    ClaimAnswers, ClaimOutcome, FinalState, LeaseClaim, LeaseStore, RecordState, Renewal, RunKey,
    RunOutcome, RunRecord, RunState, RunView,
};
use crate::time::{Slot, Timestamp};

const BACKEND: &str = "memory";

/// A lease store in one process. Cheap to clone handles via `Arc`.
///
/// Besides the store itself it has two fault switches for tests:
/// [`MemoryStore::set_unavailable`] and [`MemoryStore::lose_replies`].
pub struct MemoryStore {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    unavailable: std::sync::atomic::AtomicBool,
    lose_replies: AtomicU32,
    operations: AtomicU64,
    hand_overs: HandOvers,
}

#[derive(Default)]
struct State {
    jobs: HashMap<JobName, JobRuns>,
    /// The operator's pauses, by scope.
    pauses: BTreeMap<PauseScope, Pause>,
    /// The manual-run requests, by job and id.
    requests: BTreeMap<(JobName, RequestId), RunRequest>,
}

impl State {
    /// The pauses a claim of `job` must respect.
    fn paused(&self, job: &JobName) -> Paused {
        let end = |scope: &PauseScope| self.pauses.get(scope).map(|p| p.end);
        Paused {
            job: end(&PauseScope::Job(job.clone())),
            all: end(&PauseScope::All),
        }
    }
}

#[derive(Default)]
struct JobRuns {
    runs: BTreeMap<Slot, Record>,
    /// The slots whose run is live — running, or failed with a retry
    /// pending: the overlap check reads only these, never the whole
    /// history.
    live: BTreeSet<Slot>,
    /// The slots recorded `waiting` (an `Overlap::BufferOne` job's).
    waiting: BTreeSet<Slot>,
    last_fence: u64,
    /// The longest late window any claim of the job carried: collection
    /// keeps the job's runs at least this long.
    window: Duration,
}

struct Record {
    state: RecordState,
    attempt: Option<Attempt>,
    token: Option<Token>,
    fence: Option<Fence>,
    instance: Option<InstanceId>,
    started_at: Option<Timestamp>,
    finished_at: Option<Timestamp>,
    lease_until: Option<Timestamp>,
    error: Option<String>,
    retry_at: Option<Timestamp>,
    earlier: PastAttempts,
}

impl Record {
    /// What the core's decisions read of the record.
    fn lease_record(&self) -> LeaseRecord {
        LeaseRecord {
            state: self.state,
            attempt: self.attempt,
            holder: self.token,
            fence: self.fence,
            lease_until: self.lease_until,
            retry_at: self.retry_at,
        }
    }

    /// The attempt that ends when `end` says so, for the record's past.
    fn past(&self, ended: crate::retry::AttemptEnd) -> Option<PastAttempt> {
        Some(PastAttempt {
            attempt: self.attempt?,
            ended,
            at: match ended {
                crate::retry::AttemptEnd::Failed => self.finished_at,
                crate::retry::AttemptEnd::TakenOver => self.lease_until,
            },
            instance: self.instance.clone(),
            error: self.error.clone(),
        })
    }

    fn ended(state: RecordState, now: Timestamp) -> Self {
        Self {
            state,
            attempt: None,
            token: None,
            fence: None,
            instance: None,
            started_at: None,
            finished_at: Some(now),
            lease_until: None,
            error: None,
            retry_at: None,
            earlier: PastAttempts::NONE,
        }
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("operations", &self.operations())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store whose "store clock" is `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            clock,
            unavailable: Default::default(),
            lose_replies: AtomicU32::new(0),
            operations: AtomicU64::new(0),
            hand_overs: HandOvers::new(),
        }
    }

    /// While `true`, every call fails with a temporary error and changes nothing,
    /// as if the store could not be reached.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// The next `n` calls do their work but their caller gets a temporary
    /// error instead of the answer, as if the reply was lost on the way.
    pub fn lose_replies(&self, n: u32) {
        self.lose_replies.store(n, Ordering::SeqCst);
    }

    /// How many calls reached the store (each call is one round trip).
    pub fn operations(&self) -> u64 {
        self.operations.load(Ordering::SeqCst)
    }

    /// Runs `step` atomically on the state with the store's `now`, applying
    /// the fault switches around it.
    fn step<T>(&self, step: impl FnOnce(&mut State, Timestamp) -> T) -> Result<T, StoreError> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(BACKEND, "switched off for a test"));
        }
        self.operations.fetch_add(1, Ordering::SeqCst);
        let now = self.clock.now();
        let answer = step(&mut self.lock(), now);
        let lose = self
            .lose_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            return Err(StoreError::unavailable(BACKEND, "reply lost for a test"));
        }
        Ok(answer)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written record
        // (each step writes at the end), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One claim: the core's decision ([`decide::claim_at`]) applied to the
/// job's runs.
fn claim_one(state: &mut State, now: Timestamp, req: &LeaseClaim) -> ClaimOutcome {
    let run = req.run();
    let paused = state.paused(&run.job);
    let job = state.jobs.entry(run.job.clone()).or_default();
    job.window = job.window.max(req.claim.max_late);
    let record = job.runs.get(&run.slot).map(Record::lease_record);
    let decision = decide::claim_at(
        record.as_ref(),
        now,
        paused,
        req,
        || another_run_is_live(job, run.slot, now),
        || another_is_waiting(job, run.slot, now),
    );
    let fence = decision.needs_fence().then(|| {
        job.last_fence += 1;
        Fence::new(job.last_fence)
    });
    let lease_until = Some(now.saturating_add(req.lease));
    if let Some(rec) = job.runs.get_mut(&run.slot)
        && let Some(past) = decision
            .ends_attempt(record.as_ref())
            .and_then(|ended| rec.past(ended))
    {
        rec.earlier.push(past);
    }
    if !matches!(
        decision,
        ClaimDecision::Answer(_)
            | ClaimDecision::Resent { .. }
            | ClaimDecision::RecordWaiting { .. }
    ) {
        // Whatever the slot becomes, it no longer waits.
        job.waiting.remove(&run.slot);
    }
    if decision == ClaimDecision::StartReplacing {
        let others: Vec<Slot> = job
            .live
            .iter()
            .filter(|s| **s != run.slot)
            .copied()
            .collect();
        for slot in others {
            if let Some(rec) = job.runs.get_mut(&slot) {
                rec.state = RecordState::Finished(FinalState::Replaced);
                rec.finished_at = Some(now);
                rec.retry_at = None;
            }
            job.live.remove(&slot);
        }
    }
    match &decision {
        ClaimDecision::Answer(_) | ClaimDecision::Resent { .. } => {}
        ClaimDecision::RecordWaiting { until, .. } => {
            let mut waiting = Record::ended(RecordState::Waiting, now);
            waiting.finished_at = None;
            waiting.lease_until = Some(*until);
            job.runs.insert(run.slot, waiting);
            job.waiting.insert(run.slot);
        }
        ClaimDecision::RecordMissed => {
            job.runs
                .insert(run.slot, Record::ended(RecordState::Missed, now));
        }
        ClaimDecision::RecordSkipped => {
            let skipped = RecordState::Finished(FinalState::Skipped);
            job.runs.insert(run.slot, Record::ended(skipped, now));
        }
        ClaimDecision::RecordPaused => {
            let paused = RecordState::Finished(FinalState::Paused);
            job.runs.insert(run.slot, Record::ended(paused, now));
        }
        ClaimDecision::Start | ClaimDecision::StartReplacing => {
            job.runs.insert(
                run.slot,
                Record {
                    state: RecordState::Running,
                    attempt: Some(Attempt::FIRST),
                    token: Some(req.claim.token),
                    fence,
                    instance: Some(req.claim.instance.clone()),
                    started_at: Some(now),
                    finished_at: None,
                    lease_until,
                    error: None,
                    retry_at: None,
                    earlier: PastAttempts::NONE,
                },
            );
            job.live.insert(run.slot);
        }
        ClaimDecision::TakeOver { attempt } | ClaimDecision::Retry { attempt } => {
            if let Some(rec) = job.runs.get_mut(&run.slot) {
                rec.state = RecordState::Running;
                rec.attempt = Some(*attempt);
                rec.token = Some(req.claim.token);
                rec.fence = fence;
                rec.instance = Some(req.claim.instance.clone());
                rec.lease_until = lease_until;
                rec.finished_at = None;
                rec.error = None;
                rec.retry_at = None;
            }
            job.live.insert(run.slot);
        }
        ClaimDecision::Interrupt => {
            if let Some(rec) = job.runs.get_mut(&run.slot) {
                rec.state = RecordState::Finished(FinalState::Interrupted);
                rec.finished_at = Some(now);
            }
            job.live.remove(&run.slot);
        }
    }
    let past = job.runs.get(&run.slot).map(|r| &r.earlier);
    decision.outcome(fence, past.unwrap_or(&PastAttempts::NONE))
}

fn another_is_waiting(job: &JobRuns, slot: Slot, now: Timestamp) -> bool {
    job.waiting.iter().any(|s| {
        *s != slot
            && job
                .runs
                .get(s)
                .filter(|r| r.state == RecordState::Waiting)
                .and_then(|r| r.lease_until)
                .is_some_and(|until| until >= now)
    })
}

fn another_run_is_live(job: &JobRuns, slot: Slot, now: Timestamp) -> bool {
    job.live.iter().any(|s| {
        *s != slot
            && job
                .runs
                .get(s)
                .and_then(|r| r.lease_record().live_until())
                .is_some_and(|until| until >= now)
    })
}

/// How a holder hands its run over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HandOver {
    /// The lease ends; the holder stays, so the next takeover is the next
    /// attempt.
    Release,
    /// The lease ends and the holder is cleared, so the next takeover runs
    /// the same attempt.
    GiveBack,
}

impl MemoryStore {
    /// `release` and `give_back`: the core decides, and a run handed over
    /// has its lease end now and is announced to waiting backups.
    fn hand_over(&self, run: &RunKey, token: Token, how: HandOver) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let rec = record_mut(state, run);
            let record = rec.as_deref().map(Record::lease_record);
            let answer = match how {
                HandOver::Release => decide::release(record.as_ref(), token),
                HandOver::GiveBack => decide::give_back(record.as_ref(), token),
            };
            if let (Renewal::Renewed, Some(rec)) = (answer, rec) {
                // Lease alive means `lease_until >= now`: one millisecond
                // before now has run out.
                rec.lease_until = Some(Timestamp::from_millis(now.as_millis() - 1));
                if how == HandOver::GiveBack {
                    rec.token = None;
                }
                // Told as part of the step: also when its answer is lost.
                self.hand_overs.announce(run);
            }
            answer
        })
    }
}

/// The record of `run`, mutable.
fn record_mut<'a>(state: &'a mut State, run: &RunKey) -> Option<&'a mut Record> {
    state.jobs.get_mut(&run.job)?.runs.get_mut(&run.slot)
}

crate::claims_through_leases!(MemoryStore, BACKEND);

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        self.step(|state, now| claim_one(state, now, req))
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        self.step(|state, now| reqs.iter().map(|r| Ok(claim_one(state, now, r))).collect())
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.step(|state, now| {
            let rec = state.jobs.get(&run.job).and_then(|j| j.runs.get(&run.slot));
            let state = match rec {
                None => RunState::Absent,
                Some(r) => RunState::of_record(r.state, r.attempt, r.lease_until, r.retry_at, now),
            };
            RunView {
                store_now: now,
                state,
            }
        })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let rec = record_mut(state, run);
            let answer =
                decide::heartbeat(rec.as_deref().map(Record::lease_record).as_ref(), token);
            if let (Renewal::Renewed, Some(rec)) = (answer, rec) {
                rec.lease_until = Some(now.saturating_add(lease));
            }
            answer
        })
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let rec = record_mut(state, run);
            let decision = decide::finish(
                rec.as_deref().map(Record::lease_record).as_ref(),
                token,
                &outcome,
                now,
            );
            if let (
                FinishDecision::Finish {
                    state: done,
                    retry_at,
                    not_retried,
                },
                Some(rec),
            ) = (decision, rec)
            {
                rec.state = RecordState::Finished(done);
                rec.finished_at = Some(now);
                rec.retry_at = retry_at;
                rec.error = outcome.into_record().1.map(|mut error| {
                    if not_retried {
                        error.push_str(crate::retry::NOT_RETRIED);
                    }
                    error
                });
                if retry_at.is_none()
                    && let Some(job) = state.jobs.get_mut(&run.job)
                {
                    job.live.remove(&run.slot);
                }
            }
            decision.renewal()
        })
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.hand_over(run, token, HandOver::Release)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.hand_over(run, token, HandOver::GiveBack)
    }

    fn hand_overs(&self) -> &HandOvers {
        &self.hand_overs
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.step(|state, _| {
            let Some(runs) = state.jobs.get(job) else {
                return Vec::new();
            };
            runs.runs
                .iter()
                .rev()
                .take(limit)
                .map(|(slot, r)| RunRecord {
                    run: RunKey::new(job.clone(), *slot),
                    state: r.state,
                    attempt: r.attempt,
                    fence: r.fence,
                    instance: r.instance.clone(),
                    started_at: r.started_at,
                    finished_at: r.finished_at,
                    lease_until: r.lease_until,
                    error: r.error.clone(),
                    retry_at: r.retry_at,
                    earlier: r.earlier.clone(),
                })
                .collect()
        })
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.step(|state, now| {
            let mut deleted = 0;
            let lease_cutoff = now.saturating_sub(keep);
            for job in state.jobs.values_mut() {
                let cutoff = now.saturating_sub(keep.max(job.window));
                let old: Vec<Slot> = job
                    .runs
                    .range(..Slot::from(cutoff))
                    .filter(|(_, r)| {
                        // A live run (a lease, a pending retry) that ended
                        // less than `keep` ago may still be taken on.
                        r.lease_record()
                            .live_until()
                            .is_none_or(|until| until < lease_cutoff)
                    })
                    .map(|(slot, _)| *slot)
                    .collect();
                for slot in old {
                    job.runs.remove(&slot);
                    job.live.remove(&slot);
                    job.waiting.remove(&slot);
                    deleted += 1;
                }
            }
            // Keep each job's entry (and its fence counter) even when empty:
            // fences must keep increasing.
            let cutoff = now.saturating_sub(keep);
            state.requests.retain(|_, r| r.requested_at >= cutoff);
            deleted
        })
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        self.step(|state, now| {
            let pause = req.at(scope, now)?;
            state.pauses.insert(scope.clone(), pause.clone());
            Ok(pause)
        })?
        .map_err(|refused: crate::control::PauseRefused| refused.into_store_error(BACKEND))
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        self.step(|state, _| state.pauses.remove(scope).is_some())
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        self.step(|state, _| {
            let mut jobs: Vec<JobName> = state.jobs.keys().cloned().collect();
            jobs.sort();
            jobs
        })
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.step(|state, now| Pauses::holding(state.pauses.values().cloned().collect(), now))
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        let (request, new) = self.step(|state, now| {
            let key = (req.job().clone(), req.id().clone());
            if let Some(stored) = state.requests.get(&key) {
                return (stored.clone(), false);
            }
            let latest = state
                .requests
                .values()
                .filter(|r| &r.job == req.job())
                .map(|r| r.requested_at)
                .max();
            let request = req.stamped(stamp(now, latest));
            state.requests.insert(key, request.clone());
            (request, true)
        })?;
        if new {
            self.hand_overs.announce(&request.news());
        }
        Ok(request)
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.step(|state, now| {
            let mut requests: Vec<RunRequest> = state.requests.values().cloned().collect();
            requests.sort_by_key(|r| r.requested_at);
            RunRequests {
                store_now: now,
                requests,
            }
        })
    }
}
