//! `MemoryStore`: a complete lease store inside one process.
//!
//! It exists for two readers. Users get a store for tests and for a single
//! process that wants the scheduler's features without a server. Backend
//! authors get the reference: every rule of the lease flowchart is written
//! out here once, in plain Rust, under one mutex — which is what makes each
//! call atomic. A backend does the same steps with its store's atomic
//! primitive (a Lua script, a transaction, a compare-and-swap).
//!
//! The store's clock is a [`Clock`]; by default the system clock, in tests a
//! controllable one shared with the scheduler.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::hand_over::HandOvers;
use crate::ids::{Attempt, Fence, InstanceId, Token};
use crate::name::JobName;
use crate::store::{
    BackendInfo, ClaimAnswers, ClaimOutcome, ClaimRequest, ClaimStore, FinalState, LeaseClaim,
    LeaseStore, Memory, Overlap, RecordState, Renewal, RunKey, RunOutcome, RunRecord, RunState,
    RunView, Win,
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
}

#[derive(Default)]
struct JobRuns {
    runs: BTreeMap<Slot, Record>,
    /// The slots whose record is `Running`: the overlap check reads only
    /// these, never the whole history.
    running: BTreeSet<Slot>,
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
}

impl Record {
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

/// The lease flowchart. Every lease backend implements these steps.
fn claim_one(state: &mut State, now: Timestamp, req: &LeaseClaim) -> ClaimOutcome {
    let run = req.run();
    let job = state.jobs.entry(run.job.clone()).or_default();
    job.window = job.window.max(req.claim.max_late);
    let existing = job.runs.get(&run.slot).map(|r| r.state);
    match existing {
        // 1. No record, or only a `missed` one.
        None | Some(RecordState::Missed) => {
            if now.since(run.slot.at()) > req.claim.max_late {
                if existing.is_none() {
                    job.runs
                        .insert(run.slot, Record::ended(RecordState::Missed, now));
                }
                return ClaimOutcome::Late;
            }
            if req.overlap == Overlap::Skip && another_run_is_live(job, run.slot, now) {
                job.runs.insert(
                    run.slot,
                    Record::ended(RecordState::Finished(FinalState::Skipped), now),
                );
                return ClaimOutcome::Overlap;
            }
            job.last_fence += 1;
            let fence = Fence::new(job.last_fence);
            job.runs.insert(
                run.slot,
                Record {
                    state: RecordState::Running,
                    attempt: Some(Attempt::FIRST),
                    token: Some(req.claim.token),
                    fence: Some(fence),
                    instance: Some(req.claim.instance.clone()),
                    started_at: Some(now),
                    finished_at: None,
                    lease_until: Some(now.saturating_add(req.lease)),
                    error: None,
                },
            );
            job.running.insert(run.slot);
            ClaimOutcome::Won(Win {
                attempt: Attempt::FIRST,
                fence: Some(fence),
            })
        }
        // 3. Finished.
        Some(RecordState::Finished(state)) => ClaimOutcome::Done(state),
        Some(RecordState::Running) => {
            let JobRuns {
                runs,
                running,
                last_fence,
                ..
            } = job;
            let Some(rec) = runs.get_mut(&run.slot) else {
                unreachable!("the record was read above under the same lock")
            };
            let attempt = rec.attempt.unwrap_or(Attempt::FIRST);
            let lease_until = rec.lease_until.unwrap_or(now);
            // 2. Our own claim, sent again.
            if rec.token == Some(req.claim.token) {
                return ClaimOutcome::Won(Win {
                    attempt,
                    fence: rec.fence,
                });
            }
            // 4. Someone else's live lease.
            if lease_until >= now {
                return ClaimOutcome::Running {
                    lease_until,
                    store_now: now,
                };
            }
            // 5. The lease ran out. A run given back before its handler
            // started (no holder) runs the same attempt again.
            let given_back = rec.token.is_none();
            if given_back || req.max_attempts.allows_after(attempt) {
                *last_fence += 1;
                let fence = Fence::new(*last_fence);
                let attempt = if given_back { attempt } else { attempt.next() };
                rec.attempt = Some(attempt);
                rec.token = Some(req.claim.token);
                rec.fence = Some(fence);
                rec.instance = Some(req.claim.instance.clone());
                rec.lease_until = Some(now.saturating_add(req.lease));
                ClaimOutcome::Won(Win {
                    attempt,
                    fence: Some(fence),
                })
            } else {
                rec.state = RecordState::Finished(FinalState::Interrupted);
                rec.finished_at = Some(now);
                running.remove(&run.slot);
                ClaimOutcome::Done(FinalState::Interrupted)
            }
        }
    }
}

fn another_run_is_live(job: &JobRuns, slot: Slot, now: Timestamp) -> bool {
    job.running.iter().any(|s| {
        *s != slot
            && job
                .runs
                .get(s)
                .and_then(|r| r.lease_until)
                .is_some_and(|until| until >= now)
    })
}

/// The record of `run` if `token` holds it.
fn held<'a>(state: &'a mut State, run: &RunKey, token: Token) -> Option<&'a mut Record> {
    state
        .jobs
        .get_mut(&run.job)?
        .runs
        .get_mut(&run.slot)
        .filter(|r| r.state == RecordState::Running && r.token == Some(token))
}

fn renewal(held: bool) -> Renewal {
    if held {
        Renewal::Renewed
    } else {
        Renewal::Fenced
    }
}

#[async_trait]
impl ClaimStore for MemoryStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_lease(&LeaseClaim::from_plain(req)).await
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: BACKEND,
            memory: Memory::UntilCollected,
        }
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        Some(self)
    }
}

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
                Some(r) => RunState::of_record(r.state, r.attempt, r.lease_until, now),
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
            let rec = held(state, run, token);
            let ok = rec.is_some();
            if let Some(rec) = rec {
                rec.lease_until = Some(now.saturating_add(lease));
            }
            renewal(ok)
        })
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let (done, error) = match outcome {
                RunOutcome::Succeeded => (FinalState::Succeeded, None),
                RunOutcome::Failed { error } => (FinalState::Failed, Some(error)),
            };
            let Some(rec) = held(state, run, token) else {
                // The same finish sent again by the token that finished the
                // run: it was recorded, and gets the same answer.
                let finished_by_token = state
                    .jobs
                    .get(&run.job)
                    .and_then(|j| j.runs.get(&run.slot))
                    .is_some_and(|r| {
                        r.token == Some(token) && r.state == RecordState::Finished(done)
                    });
                return renewal(finished_by_token);
            };
            rec.state = RecordState::Finished(done);
            rec.finished_at = Some(now);
            rec.error = error;
            if let Some(job) = state.jobs.get_mut(&run.job) {
                job.running.remove(&run.slot);
            }
            Renewal::Renewed
        })
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let rec = held(state, run, token);
            let ok = rec.is_some();
            if let Some(rec) = rec {
                // Lease alive means `lease_until >= now`: one millisecond
                // before now has run out.
                rec.lease_until = Some(Timestamp::from_millis(now.as_millis() - 1));
                // Told as part of the step: also when its answer is lost.
                self.hand_overs.announce(run);
            }
            renewal(ok)
        })
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.step(|state, now| {
            let rec = held(state, run, token);
            let ok = rec.is_some();
            if let Some(rec) = rec {
                rec.lease_until = Some(Timestamp::from_millis(now.as_millis() - 1));
                rec.token = None;
                self.hand_overs.announce(run);
            }
            renewal(ok)
        })
    }

    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.hand_overs.wait(run, timeout).await
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
                        r.state != RecordState::Running
                            || r.lease_until.is_none_or(|until| until < lease_cutoff)
                    })
                    .map(|(slot, _)| *slot)
                    .collect();
                for slot in old {
                    job.runs.remove(&slot);
                    job.running.remove(&slot);
                    deleted += 1;
                }
            }
            // Keep each job's entry (and its fence counter) even when empty:
            // fences must keep increasing.
            deleted
        })
    }
}
