//! The kit judged: each check below is run against a lease store broken on
//! purpose and must fail it, and against the same store unbroken and must
//! pass it. A check that passes a broken store is weaker than its name.
//!
//! The broken stores are [`MemoryStore`] behind [`Mutant`], a wrapper that
//! changes one rule: it decides expiry on the caller's clock, ignores the
//! token of a heartbeat or finish, does nothing on release, answers a batch
//! in the wrong order, or forgets fences at garbage collection.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::layer::LeaseLayer;
use anarchon_core::{
    ClaimAnswers, ClaimOutcome, ClaimRequest, Clock, Fence, JobName, LeaseClaim, LeaseStore,
    MemoryStore, Pause, PauseRequest, PauseScope, Pauses, Renewal, RunKey, RunOutcome, RunRecord,
    RunView, Slot, StoreError, Timestamp, Token,
};
use anarchon_testkit::{StoreFactory, TestClock, differential, lease};
use async_trait::async_trait;

/// The one rule a [`Mutant`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    /// Nothing: the control.
    None,
    /// Lease expiry and `now` come from the calling instance's clock.
    CallerClock,
    /// `heartbeat` renews the run's lease whatever token it is given.
    HeartbeatIgnoresToken,
    /// `finish` records the outcome whatever token it is given.
    FinishIgnoresToken,
    /// `release` answers `Renewed` and does nothing.
    ReleaseDoesNothing,
    /// `release` also clears the holder, as `give_back` does, so the next
    /// takeover runs the same attempt again.
    ReleaseGivesBack,
    /// A claim judges the lease before the token: the holder's own claim,
    /// sent again after its lease ran out, takes the run over as the next
    /// attempt instead of being answered as its own win.
    LeaseBeforeToken,
    /// `claim_many` answers a batch rotated by one place.
    ClaimManyRotated,
    /// `claim_many` swaps two answers of the same kind (two `Running`, or
    /// two `Won`), so only each answer's facts give it away.
    ClaimManySwapsLikeAnswers,
    /// After a collection that leaves some of a job's runs, its fence
    /// counter is rebuilt from the fences of the records that remain.
    FencesRebuiltFromRecords,
    /// A job whose runs were all collected is dropped, counter and all.
    EmptyJobForgotten,
    /// A claim reads the run, and if it was free, claims it and calls any
    /// answer a win: the read and the write are two steps.
    CheckThenAct,
    /// `pause` answers with the pause it would write and writes nothing.
    PausesIgnored,
}

tokio::task_local! {
    /// The clock of the instance whose call is running, for `CallerClock`.
    static CALLER: Arc<dyn Clock>;
}

/// The store's clock, unless a `CallerClock` mutant is calling.
struct ClockOfWhoever(Arc<TestClock>);

impl Clock for ClockOfWhoever {
    fn now(&self) -> Timestamp {
        CALLER
            .try_with(|caller| caller.now())
            .unwrap_or_else(|_| self.0.now())
    }
}

/// What every handle of one mutant store shares.
#[derive(Default)]
struct Shared {
    /// The token that won each run, as the wrapper saw it.
    holders: Mutex<HashMap<RunKey, Token>>,
    /// Per job: the highest fence the real store gave, and how much the
    /// mutant subtracts from it.
    fences: Mutex<HashMap<JobName, (u64, u64)>>,
    /// Who sent each claim, in the order they reached the store.
    claimants: Mutex<Vec<String>>,
}

/// A handle onto a shared [`MemoryStore`] that breaks one rule.
struct Mutant {
    inner: Arc<MemoryStore>,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    mutation: Mutation,
}

impl Mutant {
    /// Runs `call` as the inner store sees it: on the caller's clock for
    /// `CallerClock`, on the store's otherwise.
    async fn on_clock<T>(&self, call: impl Future<Output = T>) -> T {
        if self.mutation == Mutation::CallerClock {
            CALLER.scope(self.clock.clone(), call).await
        } else {
            call.await
        }
    }

    /// Notes the winner and translates the fence of one answer.
    fn seen(&self, run: &RunKey, token: Token, outcome: ClaimOutcome) -> ClaimOutcome {
        let ClaimOutcome::Won(mut win) = outcome else {
            return outcome;
        };
        self.shared
            .holders
            .lock()
            .unwrap()
            .insert(run.clone(), token);
        let mut fences = self.shared.fences.lock().unwrap();
        let (last, offset) = fences.entry(run.job.clone()).or_default();
        let real = win.fence.map_or(0, Fence::get);
        *last = (*last).max(real);
        win.fence = win
            .fence
            .map(|f| Fence::new(f.get().saturating_sub(*offset)));
        ClaimOutcome::Won(win)
    }

    fn fence_offset(&self, job: &JobName) -> u64 {
        self.shared
            .fences
            .lock()
            .unwrap()
            .get(job)
            .map_or(0, |(_, offset)| *offset)
    }

    /// The token the mutant uses: the run's winner when it ignores tokens.
    fn token_for(&self, run: &RunKey, token: Token, ignores: bool) -> Token {
        if ignores {
            self.shared
                .holders
                .lock()
                .unwrap()
                .get(run)
                .copied()
                .unwrap_or(token)
        } else {
            token
        }
    }
}

#[async_trait]
impl LeaseLayer for Mutant {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        LeaseLayer::claim_lease(self, &LeaseClaim::from_plain(req)).await
    }

    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        if self.mutation == Mutation::CheckThenAct {
            let free = matches!(
                self.inner.peek(req.run()).await?.state,
                anarchon_core::RunState::Absent
            );
            tokio::task::yield_now().await;
            let outcome = self.inner.claim_lease(req).await?;
            return Ok(match outcome {
                ClaimOutcome::Running { .. } if free => {
                    ClaimOutcome::Won(anarchon_core::Win::first(None))
                }
                other => other,
            });
        }
        if self.mutation == Mutation::LeaseBeforeToken {
            let view = self.inner.peek(req.run()).await?;
            let run_out = matches!(
                view.state,
                anarchon_core::RunState::Running { lease_until, .. } if lease_until < view.store_now
            );
            if run_out {
                // Claimed as if by a stranger.
                let mut stranger = req.clone();
                stranger.claim.token = Token::generate();
                return self.inner.claim_lease(&stranger).await;
            }
        }
        self.shared
            .claimants
            .lock()
            .unwrap()
            .push(req.claim.instance.to_string());
        let outcome = self.on_clock(self.inner.claim_lease(req)).await?;
        Ok(self.seen(req.run(), req.claim.token, outcome))
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        // The memory store answers every claim of a batch.
        let outcomes = self.on_clock(self.inner.claim_many(reqs)).await?.all()?;
        let mut outcomes: Vec<ClaimOutcome> = reqs
            .iter()
            .zip(outcomes)
            .map(|(req, outcome)| self.seen(req.run(), req.claim.token, outcome))
            .collect();
        match self.mutation {
            Mutation::ClaimManyRotated if outcomes.len() > 1 => outcomes.rotate_left(1),
            Mutation::ClaimManySwapsLikeAnswers => {
                let kind = |o: &ClaimOutcome| std::mem::discriminant(o);
                'swap: for i in 0..outcomes.len() {
                    for j in i + 1..outcomes.len() {
                        let alike = kind(&outcomes[i]) == kind(&outcomes[j])
                            && matches!(
                                outcomes[i],
                                ClaimOutcome::Won(_) | ClaimOutcome::Running { .. }
                            );
                        if alike {
                            outcomes.swap(i, j);
                            break 'swap;
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(outcomes.into())
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.on_clock(self.inner.peek(run)).await
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        let ignores = self.mutation == Mutation::HeartbeatIgnoresToken;
        let token = self.token_for(run, token, ignores);
        self.on_clock(self.inner.heartbeat(run, token, lease)).await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        let ignores = self.mutation == Mutation::FinishIgnoresToken;
        let token = self.token_for(run, token, ignores);
        self.on_clock(self.inner.finish(run, token, outcome)).await
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.on_clock(self.inner.give_back(run, token)).await
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        if self.mutation == Mutation::ReleaseDoesNothing {
            return Ok(Renewal::Renewed);
        }
        if self.mutation == Mutation::ReleaseGivesBack {
            return self.on_clock(self.inner.give_back(run, token)).await;
        }
        self.on_clock(self.inner.release(run, token)).await
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let offset = self.fence_offset(job);
        let mut records = self.on_clock(self.inner.history(job, limit)).await?;
        for record in &mut records {
            record.fence = record
                .fence
                .map(|f| Fence::new(f.get().saturating_sub(offset)));
        }
        Ok(records)
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        if self.mutation == Mutation::PausesIgnored {
            let probe = RunKey::new(JobName::new("pause-probe").unwrap(), Slot::from_millis(0));
            let now = self.inner.peek(&probe).await?.store_now;
            return req.at(scope, now).map_err(|e| e.into_store_error("mutant"));
        }
        self.on_clock(self.inner.pause(scope, req)).await
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.on_clock(self.inner.pauses()).await
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        let deleted = self.on_clock(self.inner.collect_garbage(keep)).await?;
        if matches!(
            self.mutation,
            Mutation::FencesRebuiltFromRecords | Mutation::EmptyJobForgotten
        ) {
            let jobs: Vec<JobName> = self.shared.fences.lock().unwrap().keys().cloned().collect();
            for job in jobs {
                let left = self.inner.history(&job, usize::MAX).await?;
                let real_max = left.iter().filter_map(|r| r.fence).map(Fence::get).max();
                let mut fences = self.shared.fences.lock().unwrap();
                let (last, offset) = fences.get_mut(&job).unwrap();
                match (self.mutation, real_max) {
                    // Counting on from the highest fence that remains.
                    (Mutation::FencesRebuiltFromRecords, Some(max)) => *offset += *last - max,
                    // Nothing remains: the counter starts again at 1.
                    (Mutation::EmptyJobForgotten, None) => *offset = *last,
                    _ => {}
                }
            }
        }
        Ok(deleted)
    }
}

/// A shared memory store on a paused [`TestClock`]; every instance is a
/// [`Mutant`] handle with its own process clock.
struct MutantFactory {
    store: Arc<MemoryStore>,
    clock: Arc<TestClock>,
    shared: Arc<Shared>,
    mutation: Mutation,
}

impl MutantFactory {
    fn new(mutation: Mutation) -> Self {
        let clock = TestClock::new();
        Self {
            store: Arc::new(MemoryStore::with_clock(Arc::new(ClockOfWhoever(
                clock.clone(),
            )))),
            clock,
            shared: Arc::default(),
            mutation,
        }
    }
}

#[async_trait]
impl StoreFactory for MutantFactory {
    type Store = Mutant;

    async fn instance_with_clock(&self, clock: Arc<dyn Clock>) -> Arc<Mutant> {
        Arc::new(Mutant {
            inner: self.store.clone(),
            clock,
            shared: self.shared.clone(),
            mutation: self.mutation,
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }
}

/// Runs `check` on a fresh factory with `mutation`; `Err` with the panic
/// message when the check failed.
async fn judge<C, Fut>(mutation: Mutation, check: C) -> Result<(), String>
where
    C: FnOnce(MutantFactory) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let factory = MutantFactory::new(mutation);
    match tokio::spawn(check(factory)).await {
        Ok(()) => Ok(()),
        Err(e) => {
            let panic = e.into_panic();
            Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default())
        }
    }
}

/// `check` passes the unbroken store and fails the one with `mutation`,
/// with a message that contains `says`.
macro_rules! caught {
    ($check:path, $mutation:expr, $says:expr) => {{
        judge(Mutation::None, |f| async move { $check(&f).await })
            .await
            .unwrap_or_else(|e| panic!("{} fails the unbroken store: {e}", stringify!($check)));
        match judge($mutation, |f| async move { $check(&f).await }).await {
            Ok(()) => panic!("{} passed a store with {:?}", stringify!($check), $mutation),
            Err(message) => assert!(
                message.contains($says),
                "{} failed {:?} for another reason than expected: {message}",
                stringify!($check),
                $mutation
            ),
        }
    }};
}

#[tokio::test(start_paused = true)]
async fn a_store_that_drops_pauses_or_times_them_by_the_caller_is_caught() {
    caught!(
        lease::paused_slots_run_nowhere_and_are_recorded_paused,
        Mutation::PausesIgnored,
        "must be recorded paused"
    );
    caught!(
        lease::pausing_every_job_holds_each_until_resumed,
        Mutation::PausesIgnored,
        "must be recorded paused"
    );
    caught!(
        lease::a_pause_ends_on_the_store_clock,
        Mutation::CallerClock,
        "the pause's start"
    );
}

#[tokio::test(start_paused = true)]
async fn expiry_on_the_callers_clock_is_caught() {
    caught!(
        lease::lease_expiry_is_judged_on_the_store_clock,
        Mutation::CallerClock,
        "judged the lease on the caller's clock"
    );
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_that_ignores_the_token_is_caught() {
    caught!(
        lease::tokens_that_hold_nothing_are_fenced_and_change_nothing,
        Mutation::HeartbeatIgnoresToken,
        "heartbeat of"
    );
}

#[tokio::test(start_paused = true)]
async fn a_finish_that_ignores_the_token_is_caught() {
    caught!(
        lease::tokens_that_hold_nothing_are_fenced_and_change_nothing,
        Mutation::FinishIgnoresToken,
        "finish(succeeded) of"
    );
    caught!(
        lease::expired_lease_is_taken_over,
        Mutation::FinishIgnoresToken,
        "Fenced"
    );
}

#[tokio::test(start_paused = true)]
async fn a_release_that_does_nothing_is_caught() {
    caught!(
        lease::release_hands_over_at_once,
        Mutation::ReleaseDoesNothing,
        "expected Won"
    );
    caught!(
        lease::tokens_that_hold_nothing_are_fenced_and_change_nothing,
        Mutation::ReleaseDoesNothing,
        "release of"
    );
}

/// The differential checks catch a store whose answers or writes drift
/// from the core's decision, on the claim path and the renewal path.
#[tokio::test(start_paused = true)]
async fn a_store_that_drifts_from_the_core_decision_is_caught() {
    caught!(
        differential::renewals_follow_the_core_decision,
        Mutation::HeartbeatIgnoresToken,
        "store answered"
    );
    caught!(
        differential::renewals_follow_the_core_decision,
        Mutation::FinishIgnoresToken,
        "store answered"
    );
    caught!(
        differential::renewals_follow_the_core_decision,
        Mutation::ReleaseGivesBack,
        "building an interrupted record"
    );
    caught!(
        differential::claims_follow_the_core_decision,
        Mutation::ReleaseGivesBack,
        "building an interrupted record"
    );
    // Records build as they should; only the answer to a late own claim
    // drifts, and the comparison with the core catches it.
    caught!(
        differential::claims_follow_the_core_decision,
        Mutation::LeaseBeforeToken,
        "core decision"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_answered_out_of_order_is_caught() {
    caught!(
        lease::claim_many_answers_with_each_runs_facts,
        Mutation::ClaimManyRotated,
        "batch of"
    );
    caught!(
        lease::claim_many_answers_with_each_runs_facts,
        Mutation::ClaimManySwapsLikeAnswers,
        "batch of"
    );
}

#[tokio::test(start_paused = true)]
async fn fences_rebuilt_after_collection_are_caught() {
    caught!(
        lease::fences_outlive_garbage_collection,
        Mutation::FencesRebuiltFromRecords,
        "not only the fences of the runs that remain"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_forgotten_after_collection_is_caught() {
    caught!(
        lease::fences_outlive_garbage_collection,
        Mutation::EmptyJobForgotten,
        "after collecting every run of a job"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_read_and_written_in_two_steps_is_caught() {
    caught!(
        anarchon_testkit::claim::claim_is_exclusive,
        Mutation::CheckThenAct,
        "exactly one winner"
    );
    caught!(
        lease::lease_claim_is_exclusive,
        Mutation::CheckThenAct,
        "slot"
    );
}

/// The exclusivity checks make racers take turns even on one thread over a
/// store that never waits: the claims of each racer do not all come first.
#[tokio::test(start_paused = true)]
async fn racers_take_turns_on_an_in_process_store() {
    let factory = MutantFactory::new(Mutation::None);
    lease::lease_claim_is_exclusive(&factory).await;
    let claimants = factory.shared.claimants.lock().unwrap().clone();
    let switches = claimants.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches > claimants.len() / 2,
        "racers' claims must alternate: {switches} switches in {} claims",
        claimants.len()
    );
}
