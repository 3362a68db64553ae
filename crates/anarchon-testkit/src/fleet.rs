//! Scaffolding the backends' own tests share, kept once here because the
//! backends differ only in how they make their stores and what they
//! disturb.
//!
//! * [`Fleet`] and [`RunLog`]: N schedulers on the per-second job `tick`,
//!   each run logged as (slot, scheduler, fence), for tests that cut a
//!   connection or restart a server under running schedulers and then
//!   check that no slot ran twice ([`fleet_runs_each_slot_once_across_a_cut`]).
//! * Claims retried as the scheduler retries them ([`claim_retrying`]),
//!   races between stores ([`race`], [`winners`]), the race around a cut
//!   line ([`claims_resume_across_a_cut`]) and the retry after a lost reply
//!   ([`retry_after_a_lost_reply`]).
//! * What a claim-only store says of itself ([`claim_only_store_reports`])
//!   and what its scheduler refuses: jobs that claim later than the store
//!   remembers ([`jobs_later_than_a_minute_of_memory_are_refused`]) and the
//!   lease-only options ([`lease_only_options_are_refused_at_run_time`]).
//! * A batch of lease claims: its answers one by one, for the bad-input
//!   tests ([`answers_to_a_batch`]), or its outcomes
//!   ([`outcomes_of_a_batch`]) where a batch sent twice must get the same
//!   ([`assert_same_outcomes_but_for_the_store_clock`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anarchon_core::scheduler::IntoDynClaim;
use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, Clock, ConfigError, InstanceId, JobName, JobOptions,
    LeaseClaim, LeaseStore, Overlap, RunContext, RunKey, Schedule, Scheduler, SchedulerBuilder,
    SchedulerOptions, Slot, StoreError, Token,
};
use futures::future::join_all;
use tokio::time::Instant;

use crate::FaultProxy;

/// The name of the per-second job every scheduler of a [`Fleet`] runs.
pub const TICK_JOB: &str = "tick";

/// One run a fleet's scheduler ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedRun {
    /// The run's slot, UTC milliseconds.
    pub slot: i64,
    /// Which scheduler of the fleet ran it.
    pub scheduler: usize,
    /// The run's fence, on lease stores.
    pub fence: Option<u64>,
}

/// Every run the schedulers of a [`Fleet`] ran, in the order they started.
#[derive(Clone, Debug, Default)]
pub struct RunLog(Arc<Mutex<Vec<LoggedRun>>>);

impl RunLog {
    /// Every run logged so far.
    pub fn runs(&self) -> Vec<LoggedRun> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The distinct slots after `after` (ms) that ran, oldest first.
    pub fn slots_after(&self, after: i64) -> Vec<i64> {
        let mut slots: Vec<i64> = self
            .runs()
            .iter()
            .map(|run| run.slot)
            .filter(|slot| *slot > after)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// The fences of the runs of slots after `after` (ms).
    pub fn fences_after(&self, after: i64) -> Vec<u64> {
        self.runs()
            .iter()
            .filter(|run| run.slot > after)
            .filter_map(|run| run.fence)
            .collect()
    }

    /// Fails unless every slot in the log ran exactly once: the claim let
    /// no two schedulers win one run.
    ///
    /// # Panics
    ///
    /// When a slot ran more than once.
    pub fn assert_each_slot_ran_once(&self) {
        let mut runs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for run in self.runs() {
            runs.entry(run.slot).or_default().push(run.scheduler);
        }
        for (slot, by) in &runs {
            assert_eq!(by.len(), 1, "slot {slot} ran {} times: {runs:?}", by.len());
        }
    }

    /// The handler of scheduler `scheduler`'s job: logs every run.
    fn record(
        &self,
        scheduler: usize,
    ) -> impl Fn(RunContext) -> std::future::Ready<Result<(), String>> + Send + Sync + 'static {
        let log = self.0.clone();
        move |ctx| {
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(LoggedRun {
                    slot: ctx.slot().as_millis(),
                    scheduler,
                    fence: ctx.fence().map(|f| f.get()),
                });
            std::future::ready(Ok(()))
        }
    }
}

/// Schedulers, each on its own store, all running [`TICK_JOB`] every
/// second into one [`RunLog`].
#[derive(Debug)]
pub struct Fleet {
    log: RunLog,
    schedulers: Vec<Scheduler>,
}

impl Fleet {
    /// Adds [`TICK_JOB`] (every second, logging each run) to every builder
    /// and starts them. The builders carry each scheduler's own store and
    /// options (lease, heartbeat).
    ///
    /// # Panics
    ///
    /// When a scheduler does not start.
    pub fn start<S: ClaimStore + ?Sized>(
        builders: impl IntoIterator<Item = SchedulerBuilder<S>>,
    ) -> Self
    where
        Arc<S>: IntoDynClaim,
    {
        let log = RunLog::default();
        let schedulers = builders
            .into_iter()
            .enumerate()
            .map(|(index, mut builder)| {
                builder
                    .job(TICK_JOB, every_second())
                    .and_then(|job| job.run(log.record(index)))
                    .expect("the tick job is valid");
                builder.start().expect("the scheduler starts")
            })
            .collect();
        Self { log, schedulers }
    }

    /// The fleet's run log.
    pub fn log(&self) -> &RunLog {
        &self.log
    }

    /// Waits until at least `n` distinct slots after `after` (ms) ran.
    ///
    /// # Panics
    ///
    /// When they have not within `within`; the message names `what`.
    pub async fn wait_for_slots(&self, after: i64, n: usize, within: Duration, what: &str) {
        let start = Instant::now();
        while self.log.slots_after(after).len() < n {
            assert!(
                start.elapsed() < within,
                "gave up waiting for {what}: {:?}",
                self.log.runs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Shuts every scheduler down and hands back the complete run log.
    pub async fn shutdown(self) -> RunLog {
        for scheduler in self.schedulers {
            scheduler.shutdown().await;
        }
        self.log
    }
}

/// A [`Fleet`] over `builders`, whose stores connect through `proxy`,
/// runs two slots; the proxy cuts the line for 2.5 s; the fleet runs three
/// slots after the line is back, each within a minute, and no slot ran
/// twice. The caller checks that its stores reconnected.
///
/// # Panics
///
/// When the runs do not come or a slot ran twice.
pub async fn fleet_runs_each_slot_once_across_a_cut<S: ClaimStore + ?Sized>(
    proxy: &FaultProxy,
    builders: impl IntoIterator<Item = SchedulerBuilder<S>>,
) where
    Arc<S>: IntoDynClaim,
{
    let fleet = Fleet::start(builders);
    let within = Duration::from_secs(60);
    fleet
        .wait_for_slots(i64::MIN, 2, within, "two runs before the cut")
        .await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    proxy.restore();
    let restored = now_ms();
    fleet
        .wait_for_slots(restored, 3, within, "three runs after the cut")
        .await;
    fleet.shutdown().await.assert_each_slot_ran_once();
}

/// The schedule of [`TICK_JOB`]: every second.
///
/// # Panics
///
/// Never: one second is a valid interval.
pub fn every_second() -> Schedule {
    Schedule::every(Duration::from_secs(1)).expect("one second is a valid interval")
}

/// Now on the system clock, UTC milliseconds: where "runs after the
/// disturbance" start.
pub fn now_ms() -> i64 {
    anarchon_core::SystemClock.now().as_millis()
}

/// A claim of `job`'s slot `slot` (ms) by `instance`, with a new token and
/// a minute's `max_late`.
///
/// # Panics
///
/// When `job` or `instance` is not a valid name.
pub fn slot_request(job: &str, slot: i64, instance: &str) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(
            JobName::new(job).expect("a valid job name"),
            Slot::from_millis(slot),
        ),
        token: Token::generate(),
        instance: InstanceId::new(instance).expect("a valid instance id"),
        max_late: Duration::from_secs(60),
    }
}

/// How long a claim is sent again, with the same token, while the store
/// answers with a temporary error: as the scheduler retries, every 200 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimRetry {
    /// At most this many retries.
    Times(u32),
    /// Until this long has passed since the first try.
    For(Duration),
}

/// Claims `req` as the scheduler does: a temporary error is retried with
/// the same token, every 200 ms, as long as `retry` allows.
///
/// # Errors
///
/// The store's error once `retry` is used up, or any lasting error.
pub async fn claim_retrying<S: ClaimStore + ?Sized>(
    store: &S,
    req: &ClaimRequest,
    retry: ClaimRetry,
) -> Result<ClaimOutcome, StoreError> {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        let patient = match retry {
            ClaimRetry::Times(most) => tries < most,
            ClaimRetry::For(within) => start.elapsed() < within,
        };
        match store.claim(req).await {
            Err(e) if e.is_temporary() && patient => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// Every store claims `job`'s slot `slot` (ms) at once, each with its own
/// token as instance `racer-{i}`, retrying as `retry` allows.
///
/// # Panics
///
/// When a claim still fails after its retries.
pub async fn race<S: ClaimStore + ?Sized>(
    stores: &[&S],
    job: &str,
    slot: i64,
    retry: ClaimRetry,
) -> Vec<ClaimOutcome> {
    join_all(stores.iter().enumerate().map(|(i, store)| async move {
        let req = slot_request(job, slot, &format!("racer-{i}"));
        claim_retrying(*store, &req, retry)
            .await
            .expect("the racer's claim is answered")
    }))
    .await
}

/// How many of `outcomes` won.
pub fn winners(outcomes: &[ClaimOutcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count()
}

/// After a claim `req` whose reply was lost on its way back through a
/// cut line: another instance's claim of the run, straight to the store
/// through `direct`, loses (the store took the lost claim); then `req` is
/// sent again through `store` with its own token, retried as `retry`
/// allows, and its answer is handed back for the caller to judge.
///
/// # Panics
///
/// When the other instance does not lose, or the retry stays unanswered.
pub async fn retry_after_a_lost_reply<S: ClaimStore + ?Sized, D: ClaimStore + ?Sized>(
    store: &S,
    direct: &D,
    req: &ClaimRequest,
    retry: ClaimRetry,
) -> ClaimOutcome {
    let other = ClaimRequest {
        token: Token::generate(),
        instance: InstanceId::new("b").expect("a valid instance id"),
        ..req.clone()
    };
    let other = direct
        .claim(&other)
        .await
        .expect("the other claim is answered");
    assert_eq!(other, ClaimOutcome::Lost, "the store took the lost claim");
    claim_retrying(store, req, retry)
        .await
        .expect("the retried claim is answered")
}

/// Two stores whose connections go through `proxy` race for the job
/// `cut`: slots 0..5 each get one winner; while the proxy cuts the line,
/// each claim of slots 5..8 gets an answer `while_cut` accepts; after it
/// restores the line, slots 10..15 each get one winner, the slots tried
/// during the cut at most one, and the runs won before the cut stay lost
/// to a late claim. The caller checks that its stores reconnected.
///
/// # Panics
///
/// When any of that does not hold.
pub async fn claims_resume_across_a_cut<S: ClaimStore + ?Sized>(
    proxy: &FaultProxy,
    a: &S,
    b: &S,
    retry: ClaimRetry,
    while_cut: impl Fn(Result<ClaimOutcome, StoreError>),
) {
    for slot in 0..5 {
        assert_eq!(
            winners(&race(&[a, b], "cut", slot, retry).await),
            1,
            "slot {slot}"
        );
    }

    proxy.cut();
    for slot in 5..8 {
        for store in [a, b] {
            while_cut(store.claim(&slot_request("cut", slot, "during")).await);
        }
    }

    proxy.restore();
    for slot in 10..15 {
        assert_eq!(
            winners(&race(&[a, b], "cut", slot, retry).await),
            1,
            "slot {slot} after the cut"
        );
    }

    // The slots tried during the cut: at most one winner (a claim the
    // client held back while it was away may have won one since).
    for slot in 5..8 {
        assert!(
            winners(&race(&[a, b], "cut", slot, retry).await) <= 1,
            "slot {slot}"
        );
    }
    // The runs won before the cut are still remembered.
    for slot in 0..5 {
        for store in [a, b] {
            let again = claim_retrying(store, &slot_request("cut", slot, "late"), retry)
                .await
                .expect("the late claim is answered");
            assert_eq!(
                again,
                ClaimOutcome::Lost,
                "slot {slot} was won before the cut"
            );
        }
    }
}

/// What a claim-only `store` says of itself: it names `backend`,
/// remembers a run for `window`, and is no lease store. Hands back how it
/// shows itself in `Debug`, for the caller to check no secret shows.
///
/// # Panics
///
/// When it says otherwise.
pub fn claim_only_store_reports<S: ClaimStore + std::fmt::Debug>(
    store: &Arc<S>,
    backend: &str,
    window: Duration,
) -> String {
    let info = store.info();
    assert_eq!(info.name, backend);
    assert_eq!(info.memory, anarchon_core::Memory::Window(window));
    assert!(store.clone().as_lease_store().is_none());
    format!("{store:?}")
}

/// On a claim-only store that remembers a run for one minute, a
/// per-minute job whose claims may come as late as `max_late` (`None`: the
/// default) is refused with [`ConfigError::MemoryTooShort`] naming
/// `backend` and the minute, and one whose claims come at most 50 s late
/// is accepted.
///
/// # Panics
///
/// When the first job is not refused so, or the second is refused.
pub fn jobs_later_than_a_minute_of_memory_are_refused<S: ClaimStore + ?Sized>(
    store: Arc<S>,
    backend: &str,
    max_late: Option<Duration>,
) where
    Arc<S>: IntoDynClaim,
{
    let mut builder = Scheduler::builder(store);
    let mut too_late = builder
        .job("too-late", every_minute())
        .expect("a valid job name");
    if let Some(max_late) = max_late {
        too_late = too_late.max_late(max_late);
    }
    let err = too_late
        .run(|_ctx| async { Ok::<_, String>(()) })
        .expect_err("the job may claim later than the store remembers");
    assert!(
        matches!(&err, ConfigError::MemoryTooShort { backend: named, memory, .. }
            if *named == backend && *memory == Duration::from_secs(60)),
        "expected MemoryTooShort from {backend}, got {err:?}"
    );
    builder
        .job("in-time", every_minute())
        .expect("a valid job name")
        .max_late(Duration::from_secs(50))
        .run(|_ctx| async { Ok::<_, String>(()) })
        .expect("a job within the store's memory is accepted");
}

/// A scheduler over a claim-only `store` refuses each lease-only job
/// option (`overlap`, `max_attempts`, `catch_up`) with
/// [`ConfigError::UnsupportedOption`] naming the option and `backend`, in
/// a message that names the option and contains `shown`; and each
/// lease-only scheduler option (`lease`, `heartbeat`) when it starts.
///
/// # Panics
///
/// When an option is accepted or refused otherwise.
pub fn lease_only_options_are_refused_at_run_time(
    store: &Arc<dyn ClaimStore>,
    backend: &str,
    shown: &str,
) {
    type SetJobOption = fn(&mut JobOptions);
    type SetSchedulerOption = fn(&mut SchedulerOptions);
    let job_options: [(&str, SetJobOption); 3] = [
        ("overlap", |o| o.overlap = Some(Overlap::Skip)),
        ("max_attempts", |o| o.max_attempts = Some(2)),
        ("catch_up", |o| o.catch_up = Some(Duration::from_secs(30))),
    ];
    for (option, set) in job_options {
        let mut options = JobOptions::default();
        set(&mut options);
        let mut builder = Scheduler::builder(store.clone());
        let err = builder
            .job("configured", every_minute())
            .expect("a valid job name")
            .options(&options)
            .run(|_ctx| async { Ok::<_, String>(()) })
            .expect_err("a lease-only option on a claim-only store");
        assert!(
            matches!(&err, ConfigError::UnsupportedOption { option: named, backend: by }
                if *named == option && *by == backend),
            "{option}: expected UnsupportedOption, got {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(option) && text.contains(shown), "{text}");
    }
    let scheduler_options: [(&str, SetSchedulerOption); 2] = [
        ("lease", |o| o.lease = Some(Duration::from_secs(30))),
        ("heartbeat", |o| o.heartbeat = Some(Duration::from_secs(5))),
    ];
    for (option, set) in scheduler_options {
        let mut options = SchedulerOptions::default();
        set(&mut options);
        let err = Scheduler::builder(store.clone())
            .options(&options)
            .start()
            .expect_err("a lease-only scheduler option on a claim-only store");
        assert!(
            matches!(&err, ConfigError::UnsupportedOption { option: named, backend: by }
                if *named == option && *by == backend),
            "{option}: expected UnsupportedOption, got {err:?}"
        );
    }
}

fn every_minute() -> Schedule {
    Schedule::every(Duration::from_secs(60)).expect("one minute is a valid interval")
}

/// Sends `batch` to `store` in one `claim_many` and hands back its answers,
/// one per claim in the order sent, checking there is one for each.
///
/// # Panics
///
/// When the batch as a whole fails, or the answers are not one per claim.
pub async fn answers_to_a_batch<S: LeaseStore + ?Sized>(
    store: &S,
    batch: &[LeaseClaim],
) -> Vec<Result<ClaimOutcome, StoreError>> {
    let answers: Vec<_> = store
        .claim_many(batch)
        .await
        .expect("the batch is answered")
        .into_iter()
        .collect();
    assert_eq!(answers.len(), batch.len(), "one answer per claim");
    answers
}

/// Every outcome of one `claim_many` of `batch` on `store`, in order.
///
/// # Panics
///
/// When the batch, or any claim in it, fails.
pub async fn outcomes_of_a_batch<S: LeaseStore + ?Sized>(
    store: &S,
    batch: &[LeaseClaim],
) -> Vec<ClaimOutcome> {
    store
        .claim_many(batch)
        .await
        .expect("the batch is answered")
        .all()
        .expect("every claim in the batch is answered")
}

/// Fails unless `first` and `again`, the outcomes of one batch sent twice,
/// are the same but for the store's clock a `Running` answer carries
/// (`store_now`, which moved between the two): the same lease ends, the
/// same wins and ends.
///
/// # Panics
///
/// When they differ otherwise.
pub fn assert_same_outcomes_but_for_the_store_clock(
    first: &[ClaimOutcome],
    again: &[ClaimOutcome],
) {
    let without_clock = |o: &ClaimOutcome| match o {
        ClaimOutcome::Running { lease_until, .. } => format!("running until {lease_until}"),
        other => format!("{other:?}"),
    };
    assert_eq!(
        first.iter().map(without_clock).collect::<Vec<_>>(),
        again.iter().map(without_clock).collect::<Vec<_>>()
    );
}
