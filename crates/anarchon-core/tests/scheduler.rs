//! The scheduler's behaviour over `MemoryStore`, on tokio's paused clock:
//! retries, fencing, failures, timeouts, shutdown, catch-up, jitter, clock
//! steps and skew, batching, and the configuration errors.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::layer::LeaseLayer;
use anarchon_core::scheduler::IntoDynClaim;
use anarchon_core::{
    Attempt, CancelReason, ClaimStore, Clock, ConfigError, FinalState, InstanceId, JobBuilder,
    JobName, JobOptions, LeaseStore, Memory, MemoryStore, MetricsSnapshot, Overlap, RecordState,
    RunContext, RunRecord, Schedule, Scheduler, SchedulerBuilder, SchedulerOptions, Slot,
    Timestamp,
};
use anarchon_testkit::{ClaimOnlyStore, Faulty, SkewedClock, TestClock};
use futures::future::BoxFuture;

/// The record state of a run whose handler succeeded.
const SUCCEEDED: RecordState = RecordState::Finished(FinalState::Succeeded);

type Runs = Arc<Mutex<Vec<(Slot, Attempt, String)>>>;

fn runs() -> Runs {
    Arc::default()
}

fn record(runs: &Runs, ctx: &RunContext) {
    runs.lock()
        .unwrap()
        .push((ctx.slot(), ctx.attempt(), ctx.instance().to_string()));
}

fn by_slot(runs: &Runs) -> BTreeMap<Slot, Vec<(Attempt, String)>> {
    let mut map: BTreeMap<Slot, Vec<(Attempt, String)>> = BTreeMap::new();
    for (slot, attempt, who) in runs.lock().unwrap().iter() {
        map.entry(*slot).or_default().push((*attempt, who.clone()));
    }
    map
}

fn every(secs: u64) -> Schedule {
    Schedule::every(Duration::from_secs(secs)).unwrap()
}

fn id(name: &str) -> InstanceId {
    InstanceId::new(name).unwrap()
}

/// A scheduler instance named `name` on `clock`, claiming through `store`.
fn instance<S: ClaimStore + ?Sized>(
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    name: &str,
) -> SchedulerBuilder<S>
where
    Arc<S>: IntoDynClaim,
{
    Scheduler::builder(store).clock(clock).instance_id(id(name))
}

/// A handler that records each run it is given in `runs` and succeeds.
fn recording(
    runs: &Runs,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    recording_holding(runs, |_| false)
}

/// A handler that records each run it is given in `runs`, holds the
/// attempts `held` picks until they are cancelled, and succeeds.
fn recording_holding(
    runs: &Runs,
    held: fn(Attempt) -> bool,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    let runs = runs.clone();
    move |ctx| {
        let runs = runs.clone();
        Box::pin(async move {
            record(&runs, &ctx);
            if held(ctx.attempt()) {
                ctx.cancelled().await;
            }
            Ok(())
        })
    }
}

/// What a handler waiting for its cancellation saw: its run, and once
/// cancelled, why and when.
#[derive(Clone)]
struct Cancellation {
    ctx: RunContext,
    reason: Option<CancelReason>,
    at: Option<tokio::time::Instant>,
}

/// Where [`start_waiting_for_cancellation`]'s handler notes its run.
type Cancellations = Arc<Mutex<Option<Cancellation>>>;

/// Starts an unnamed instance on `clock` holding leases of `lease`, renewed
/// every second, with one job "long" every minute whose handler notes its
/// run in `seen`, waits for its cancellation, notes why and when, and
/// succeeds.
fn start_waiting_for_cancellation<S: LeaseStore + ?Sized>(
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    seen: &Cancellations,
) -> Scheduler
where
    Arc<S>: IntoDynClaim,
{
    let mut b = Scheduler::builder(store)
        .clock(clock)
        .lease(lease)
        .heartbeat(Duration::from_secs(1));
    let seen = seen.clone();
    b.job("long", every(60))
        .unwrap()
        .run(move |ctx| {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() = Some(Cancellation {
                    ctx: ctx.clone(),
                    reason: None,
                    at: None,
                });
                ctx.cancelled().await;
                if let Some(seen) = seen.lock().unwrap().as_mut() {
                    seen.reason = ctx.cancel_reason();
                    seen.at = Some(tokio::time::Instant::now());
                }
                Ok::<_, String>(())
            }
        })
        .unwrap();
    b.start().unwrap()
}

/// The error `b` refuses a minutely job "j" with, configured by
/// `configure` and given a handler.
fn job_refused<S: ClaimStore + ?Sized>(
    b: &mut SchedulerBuilder<S>,
    configure: impl for<'a> FnOnce(JobBuilder<'a, S>) -> JobBuilder<'a, S>,
) -> ConfigError
where
    Arc<S>: IntoDynClaim,
{
    configure(b.job("j", every(60)).unwrap())
        .run(succeed)
        .unwrap_err()
}

/// Starts `b` with the one job `job` on `schedule`, run by `handler`.
fn start_with_one_job<S: ClaimStore + ?Sized>(
    mut b: SchedulerBuilder<S>,
    job: &str,
    schedule: Schedule,
    handler: impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
) -> Scheduler
where
    Arc<S>: IntoDynClaim,
{
    b.job(job, schedule).unwrap().run(handler).unwrap();
    b.start().unwrap()
}

/// Starts `b` with one job "minutely", every minute, that records its runs
/// in `runs`.
fn start_recording_minutely(b: SchedulerBuilder<MemoryStore>, runs: &Runs) -> Scheduler {
    start_with_one_job(b, "minutely", every(60), recording(runs))
}

/// Default job options with what `set` changes.
fn job_options(set: impl FnOnce(&mut JobOptions)) -> JobOptions {
    let mut options = JobOptions::default();
    set(&mut options);
    options
}

/// Default scheduler options with what `set` changes.
fn scheduler_options(set: impl FnOnce(&mut SchedulerOptions)) -> SchedulerOptions {
    let mut options = SchedulerOptions::default();
    set(&mut options);
    options
}

/// A handler that succeeds at once.
async fn succeed(_: RunContext) -> Result<(), String> {
    Ok(())
}

/// A handler that works for `how_long`, deaf to cancellation, and succeeds.
fn working_for(
    how_long: Duration,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    move |_| {
        Box::pin(async move {
            tokio::time::sleep(how_long).await;
            Ok(())
        })
    }
}

/// Shuts every instance down, one after the other.
async fn shut_down_all(schedulers: Vec<Scheduler>) {
    for s in schedulers {
        s.shutdown().await;
    }
}

/// Lets `scheduler` run for `at` seconds, loses the reply to the next call
/// it makes to `store`, lets it run `then` seconds more, and shuts it down:
/// its metrics, taken before the shutdown.
async fn metrics_with_one_lost_reply(
    scheduler: Scheduler,
    store: &MemoryStore,
    at: f64,
    then: f64,
) -> MetricsSnapshot {
    sleep(at).await;
    store.lose_replies(1);
    sleep(then).await;
    let metrics = scheduler.metrics();
    scheduler.shutdown().await;
    metrics
}

/// The newest `limit` records of the job called `job`, newest first.
async fn history_of(store: &MemoryStore, job: &str, limit: usize) -> Vec<RunRecord> {
    store
        .history(&JobName::new(job).unwrap(), limit)
        .await
        .unwrap()
}

/// A clock and a memory store on it, starting half-way through an hour: on
/// a whole minute (so a per-minute slot is due at once), never on a whole
/// hour (so an hourly job's first slot is 30 minutes away, whatever the
/// real time).
fn setup() -> (Arc<TestClock>, Arc<MemoryStore>) {
    let now = anarchon_core::SystemClock.now().as_millis();
    let half_past = now - now.rem_euclid(3_600_000) + 1_800_000;
    let clock = TestClock::starting_at(Timestamp::from_millis(half_past));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    (clock, store)
}

async fn sleep(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_is_retried_with_the_same_token_and_runs_once() {
    let (clock, store) = setup();
    let runs = runs();
    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let mut b = instance(store.clone(), clock.clone(), name);
        b.job("tick", every(10))
            .unwrap()
            .run(recording(&runs))
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    // The next store call (the first claim) does its work but its reply is lost.
    store.lose_replies(1);
    let first_slot = Slot::from(clock.now());
    sleep(35.0).await;
    shut_down_all(schedulers).await;
    let map = by_slot(&runs);
    assert!(map.len() >= 3, "{map:?}");
    let (lost, _) = map.iter().next().unwrap();
    assert_eq!(
        *lost, first_slot,
        "the slot whose claim reply was lost ran, once: {map:?}"
    );
    for (slot, who) in &map {
        assert_eq!(who.len(), 1, "slot {slot} ran {who:?}");
        assert_eq!(who[0].0, Attempt::FIRST);
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_runner_is_cancelled() {
    let (clock, store) = setup();
    let seen = Cancellations::default();
    let scheduler =
        start_waiting_for_cancellation(store.clone(), clock.clone(), Duration::from_secs(3), &seen);
    sleep(61.0).await;
    let ctx = seen
        .lock()
        .unwrap()
        .as_ref()
        .expect("the run started")
        .ctx
        .clone();
    let run = anarchon_core::RunKey::new(ctx.job().clone(), ctx.slot());
    // Someone else takes the run over: the lease is released (as a test
    // shortcut) and another token claims it.
    store.release(&run, ctx.token()).await.unwrap();
    let thief = anarchon_testkit::lease::lease_claim(
        run.clone(),
        anarchon_core::Token::generate(),
        "thief",
    );
    let mut thief = thief;
    thief.claim.max_late = Duration::from_secs(3600);
    assert!(matches!(
        store.claim_lease(&thief).await.unwrap(),
        anarchon_core::ClaimOutcome::Won(_)
    ));
    sleep(2.0).await;
    assert_eq!(
        seen.lock().unwrap().as_ref().unwrap().reason,
        Some(CancelReason::Fenced)
    );
    // The attempt is counted once, as fenced: the cancelled handler's
    // own `Ok` is not a success of this instance.
    let counted = scheduler.metrics();
    assert_eq!(counted.fenced, 1, "{counted:?}");
    assert_eq!(
        (counted.succeeded, counted.failed, counted.handed_over),
        (0, 0, 0),
        "a fenced attempt counted a second time: {counted:?}"
    );
    scheduler.shutdown().await;
    // The thief's attempt is what the history shows; the fenced runner wrote nothing.
    let history = store.history(&run.job, 1).await.unwrap();
    assert_eq!(history[0].instance.as_ref().unwrap().as_str(), "thief");
    assert_eq!(history[0].state, RecordState::Running);
}

/// Another instance takes the run over in the instant between the
/// runner's last heartbeat and its finish: the store answers the finish
/// `Fenced`, and the attempt is counted once, as fenced, not also as the
/// success its handler returned.
///
/// Failed before the fix: `succeeded` and `fenced` were both 1.
#[tokio::test(start_paused = true)]
async fn a_finish_answered_fenced_counts_the_attempt_once_as_fenced() {
    let (clock, store) = setup();
    let mut b = instance(store.clone(), clock.clone(), "runner")
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1));
    let thief_store = store.clone();
    b.job("stolen", every(60))
        .unwrap()
        .run(move |ctx: RunContext| {
            let store = thief_store.clone();
            async move {
                // The run changes hands as the handler returns (releasing
                // is the test's shortcut to a lapsed lease).
                let run = anarchon_core::RunKey::new(ctx.job().clone(), ctx.slot());
                store.release(&run, ctx.token()).await.unwrap();
                let mut thief = anarchon_testkit::lease::lease_claim(
                    run,
                    anarchon_core::Token::generate(),
                    "thief",
                );
                thief.claim.max_late = Duration::from_secs(3600);
                assert!(matches!(
                    store.claim_lease(&thief).await.unwrap(),
                    anarchon_core::ClaimOutcome::Won(_)
                ));
                Ok::<_, String>(())
            }
        })
        .unwrap();
    let runner = b.start().unwrap();
    // The clock starts on a slot: one run, before the next slot.
    sleep(30.0).await;
    let counted = runner.metrics();
    assert_eq!(counted.wins, 1, "{counted:?}");
    assert_eq!(counted.fenced, 1, "the finish was fenced: {counted:?}");
    assert_eq!(
        (counted.succeeded, counted.failed),
        (0, 0),
        "the store did not take this success: {counted:?}"
    );
    runner.shutdown().await;
    let history = history_of(&store, "stolen", 1).await;
    assert_eq!(history[0].instance.as_ref().unwrap().as_str(), "thief");
}

/// A runner whose heartbeats fail for a whole lease cancels its handler;
/// the handler fails, and the runner hands the run over. That attempt is
/// counted once, as handed over.
///
/// Failed before the fix: `fenced` and `handed_over` were both 1.
#[tokio::test(start_paused = true)]
async fn a_run_handed_over_after_losing_contact_is_counted_once() {
    let (clock, store) = setup();
    let faulty = Faulty::new(store.clone());
    let mut b = instance(faulty.clone(), clock.clone(), "runner")
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1));
    b.job("cut-off", every(60))
        .unwrap()
        .run(|ctx: RunContext| async move {
            ctx.cancelled().await;
            Err::<(), _>("stopped before the work was done".to_owned())
        })
        .unwrap();
    faulty.set_heartbeats_down(true);
    let runner = b.start().unwrap();
    // The clock starts on a slot; a whole lease without a renewal ends
    // that run well before the next slot.
    sleep(30.0).await;
    let counted = runner.metrics();
    assert_eq!(counted.wins, 1, "{counted:?}");
    assert_eq!(counted.handed_over, 1, "{counted:?}");
    assert_eq!(
        (counted.fenced, counted.failed, counted.succeeded),
        (0, 0, 0),
        "the handed-over attempt counted a second time: {counted:?}"
    );
    runner.shutdown().await;
}

/// A memory store whose heartbeats fail and whose hand-overs never answer:
/// a store that hangs rather than fails.
struct HangsOnHandOver {
    inner: Arc<MemoryStore>,
}

#[anarchon_core::async_trait]
impl LeaseLayer for HangsOnHandOver {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn heartbeat(
        &self,
        _: &anarchon_core::RunKey,
        _: anarchon_core::Token,
        _: Duration,
    ) -> Result<anarchon_core::Renewal, anarchon_core::StoreError> {
        Err(anarchon_core::StoreError::unavailable(
            "test",
            "heartbeats are down",
        ))
    }

    async fn release(
        &self,
        _: &anarchon_core::RunKey,
        _: anarchon_core::Token,
    ) -> Result<anarchon_core::Renewal, anarchon_core::StoreError> {
        std::future::pending().await
    }
}

/// A runner that lost contact hands its run over with one bounded call:
/// a store that never answers the hand-over cannot hold the run's task,
/// and with it shutdown, for ever.
///
/// Failed before the fix: shutdown waited for the hand-over's answer.
#[tokio::test(start_paused = true)]
async fn a_hand_over_the_store_never_answers_does_not_hold_shutdown() {
    let (clock, store) = setup();
    let hanging = Arc::new(HangsOnHandOver {
        inner: store.clone(),
    });
    let mut b = instance(hanging, clock.clone(), "runner")
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1));
    b.job("cut-off", every(60))
        .unwrap()
        .run(|ctx: RunContext| async move {
            ctx.cancelled().await;
            Err::<(), _>("stopped before the work was done".to_owned())
        })
        .unwrap();
    let runner = b.start().unwrap();
    // The clock starts on a slot; a whole lease without a renewal gives
    // that run up well before the next slot.
    sleep(30.0).await;
    assert_eq!(runner.metrics().wins, 1);
    tokio::time::timeout(Duration::from_secs(60), runner.shutdown())
        .await
        .expect("shutdown waited for a hand-over the store never answers");
}

#[tokio::test(start_paused = true)]
async fn errors_panics_and_timeouts_are_recorded_failed() {
    let (clock, store) = setup();
    let mut b = Scheduler::builder(store.clone()).clock(clock.clone());
    b.job("errs", every(60))
        .unwrap()
        .run(|_| async { Err::<(), _>("disk full") })
        .unwrap();
    b.job("panics", every(60))
        .unwrap()
        .run(|_| async {
            if true {
                panic!("oh no");
            }
            Ok::<(), String>(())
        })
        .unwrap();
    b.job("slow", every(60))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .run(|ctx| async move {
            ctx.cancelled().await;
            Err::<(), _>("still copying")
        })
        .unwrap();
    b.job("fine", every(60)).unwrap().run(succeed).unwrap();
    let scheduler = b.start().unwrap();
    // The clock starts on a whole minute: that slot is due at once.
    sleep(30.0).await;
    let m = scheduler.metrics();
    scheduler.shutdown().await;
    let last = |job: &str| {
        let store = store.clone();
        let job = JobName::new(job).unwrap();
        async move { store.history(&job, 1).await.unwrap().remove(0) }
    };
    let errs = last("errs").await;
    assert_eq!(errs.state, RecordState::Finished(FinalState::Failed));
    assert_eq!(errs.error.as_deref(), Some("disk full"));
    let panics = last("panics").await;
    assert_eq!(panics.state, RecordState::Finished(FinalState::Failed));
    assert!(
        panics.error.as_deref().unwrap().contains("panicked: oh no"),
        "{panics:?}"
    );
    let slow = last("slow").await;
    assert_eq!(slow.state, RecordState::Finished(FinalState::Failed));
    assert!(
        slow.error.as_deref() == Some("timed out after 5s: still copying"),
        "{slow:?}"
    );
    assert_eq!(last("fine").await.state, SUCCEEDED);
    assert_eq!((m.failed, m.succeeded), (3, 1), "{m:?}");
}

/// A released lease is taken over at the backup's next read, which comes at
/// the latest one lease period after the release (backups read once per
/// lease period); without the release the backup would find the lease
/// renewed and wait for it to run out.
#[tokio::test(start_paused = true)]
async fn shutdown_hands_a_running_run_over_and_the_backup_takes_it_at_once() {
    let (clock, store) = setup();
    let runs = runs();
    let lease = Duration::from_secs(30);
    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let mut b = instance(store.clone(), clock.clone(), name)
            .lease(lease)
            .shutdown_grace(Duration::from_secs(2));
        b.job("long", every(3600))
            .unwrap()
            // The first attempt runs until cancelled; a takeover finishes.
            .run(recording_holding(&runs, |attempt| {
                attempt == Attempt::FIRST
            }))
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(3601.0).await;
    let first = runs.lock().unwrap()[0].clone();
    let runner = if first.2 == "a" { 0 } else { 1 };
    let backup = schedulers.remove(1 - runner);
    let stopping = schedulers.remove(0);
    let stopped_at = tokio::time::Instant::now();
    let report = stopping.shutdown().await;
    assert_eq!(report.handed_over, 1);
    let released_at = tokio::time::Instant::now();
    // The backup hears of the hand-over and takes the run over at once,
    // not when the released lease would have ended.
    while by_slot(&runs)[&first.0].len() < 2 {
        assert!(
            released_at.elapsed() <= Duration::from_secs(1),
            "no takeover within a second of the release (the lease is {lease:?})"
        );
        sleep(0.01).await;
    }
    let map = by_slot(&runs);
    let attempts = &map[&first.0];
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[1].0, Attempt::FIRST.next());
    assert_ne!(attempts[1].1, first.2);
    assert!(stopped_at.elapsed() <= Duration::from_secs(2) + lease);
    backup.shutdown().await;
    assert_eq!(history_of(&store, "long", 1).await[0].state, SUCCEEDED);
}

#[tokio::test(start_paused = true)]
async fn catch_up_runs_missed_slots_in_order_once() {
    let (clock, store) = setup();
    let runs = runs();
    let start = |name: &'static str| {
        let mut b = instance(store.clone(), clock.clone(), name);
        b.job("minutely", every(60))
            .unwrap()
            .catch_up(Duration::from_secs(600))
            .run(recording(&runs))
            .unwrap();
        b.start().unwrap()
    };
    let a = start("a");
    sleep(1.0).await;
    let b = start("b");
    sleep(1.0).await;
    a.shutdown().await;
    b.shutdown().await;
    let slots: Vec<Slot> = runs.lock().unwrap().iter().map(|r| r.0).collect();
    // Ten minutes of window: the slots at -10 min (exclusive) .. now.
    assert_eq!(slots.len(), 10, "{slots:?}");
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "in slot order: {slots:?}"
    );
    assert!(
        runs.lock().unwrap().iter().all(|r| r.2 == "a"),
        "the second instance found them done"
    );
}

/// Garbage collection keeps every record a late window can still ask
/// about, however short the retention: an instance that starts after a
/// collection and catches up two hours finds every slot of those two hours
/// done and runs none again.
///
/// Seen to fail with `keep` set to the retention alone (the collection at
/// the first hour took every slot, and the second instance ran them again).
#[tokio::test(start_paused = true)]
async fn a_later_instance_never_reruns_a_collected_slot() {
    let (clock, store) = setup();
    let runs = runs();
    let start = |name: &'static str| {
        let mut b =
            instance(store.clone(), clock.clone(), name).history_retention(Duration::from_secs(60));
        b.job("minutely", every(60))
            .unwrap()
            .catch_up(Duration::from_secs(2 * 3600))
            .run(recording(&runs))
            .unwrap();
        b.start().unwrap()
    };
    let first = start("first");
    // Past the first hourly collection.
    sleep(3600.0 + 90.0).await;
    let collected_before = history_of(&store, "minutely", 1000).await;
    let second = start("second");
    sleep(5.0).await;
    first.shutdown().await;
    second.shutdown().await;
    let by_slot = by_slot(&runs);
    for (slot, runners) in &by_slot {
        assert_eq!(runners.len(), 1, "{slot} ran {runners:?}");
    }
    assert!(
        by_slot.values().all(|r| r[0].1 == "first"),
        "the second instance found every slot done: {by_slot:?}"
    );
    assert!(
        by_slot.len() >= 61,
        "about an hour of minutes ran: {}",
        by_slot.len()
    );
    assert_eq!(
        collected_before.len(),
        by_slot.len(),
        "the collection kept every slot inside the two-hour late window"
    );
}

/// Two services share one store. "billing" keeps little history and has
/// the default late window; "reports" catches up on two hours. Billing's
/// hourly collection must leave every reports run that reports' window
/// still covers, so a reports instance started later re-runs none of them.
#[tokio::test(start_paused = true)]
async fn another_services_collection_keeps_this_jobs_late_window() {
    let (clock, store) = setup();
    let runs = runs();
    let start = |name: &'static str, job: &'static str, catch_up: Option<Duration>| {
        let mut b =
            instance(store.clone(), clock.clone(), name).history_retention(Duration::from_secs(60));
        let mut job = b.job(job, every(60)).unwrap();
        if let Some(window) = catch_up {
            job = job.catch_up(window);
        }
        job.run(recording(&runs)).unwrap();
        b.start().unwrap()
    };
    let reports_window = Some(Duration::from_secs(2 * 3600));
    let billing = start("billing", "billing", None);
    let reports = start("reports-1", "reports", reports_window);
    // Past billing's second hourly collection, which (keeping an hour and a
    // minute) would take every reports run of the first hour.
    sleep(2.0 * 3600.0 + 90.0).await;
    reports.shutdown().await;
    let restarted = start("reports-2", "reports", reports_window);
    sleep(5.0).await;
    restarted.shutdown().await;
    billing.shutdown().await;

    let ran = |prefix: &str| -> BTreeMap<Slot, Vec<String>> {
        let mut map: BTreeMap<Slot, Vec<String>> = BTreeMap::new();
        for (slot, _, who) in runs.lock().unwrap().iter() {
            if who.starts_with(prefix) {
                map.entry(*slot).or_default().push(who.clone());
            }
        }
        map
    };
    let reports_runs = ran("reports");
    assert!(
        reports_runs.len() >= 120,
        "two hours of minutes ran: {}",
        reports_runs.len()
    );
    for (slot, runners) in &reports_runs {
        assert_eq!(runners.len(), 1, "reports slot {slot} ran {runners:?}");
    }
    let billing_runs = ran("billing").len();
    let billing_kept = history_of(&store, "billing", 1000).await.len();
    assert!(
        billing_kept < billing_runs - 30,
        "billing's collection ran and took its own old runs: {billing_kept} of \
         {billing_runs} kept"
    );
}

/// Handler runs as the handlers saw them: instance, attempt, start, end.
type Spans = Arc<
    Mutex<
        Vec<(
            String,
            Attempt,
            tokio::time::Instant,
            Option<tokio::time::Instant>,
        )>,
    >,
>;

/// A handler that records its span in `spans`: it works for `work` unless
/// cancelled, takes `stop_takes` to stop once cancelled, and returns
/// `result`.
fn span_recording(
    spans: &Spans,
    work: Duration,
    stop_takes: Duration,
    result: Result<(), String>,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    let spans = spans.clone();
    move |ctx| {
        let (spans, result) = (spans.clone(), result.clone());
        Box::pin(async move {
            let index = open_span(&spans, &ctx);
            tokio::select! {
                () = tokio::time::sleep(work) => {}
                () = ctx.cancelled() => {
                    if !stop_takes.is_zero() {
                        tokio::time::sleep(stop_takes).await;
                    }
                }
            }
            close_span(&spans, index);
            result
        })
    }
}

/// Records that the handler of `ctx` starts now; returns the span's index
/// for [`close_span`].
fn open_span(spans: &Spans, ctx: &RunContext) -> usize {
    let mut spans = spans.lock().unwrap();
    spans.push((
        ctx.instance().to_string(),
        ctx.attempt(),
        tokio::time::Instant::now(),
        None,
    ));
    spans.len() - 1
}

/// Records that the handler of the span at `index` returns now.
fn close_span(spans: &Spans, index: usize) {
    spans.lock().unwrap()[index].3 = Some(tokio::time::Instant::now());
}

/// An instance whose claim answers come back 1.2 s late: its first win
/// reaches it 1.2 s into a 3 s lease counted from the send, and afterwards
/// it learns to claim 2 s ahead of each slot, so its lease ends a second
/// after its handler starts. Either way the first renewal must come before
/// the lease ends (here: before the handler starts), or the backup takes
/// the run over while the handler still runs.
///
/// Failed before the fix: the first heartbeat was due 2 s after the
/// handler started, the backup took over first, and both ran the slot
/// until the late runner's heartbeat was fenced.
#[tokio::test(start_paused = true)]
async fn a_run_claimed_ahead_renews_before_its_lease_ends() {
    let (clock, store) = setup();
    let spans: Spans = Arc::default();
    let ahead = Faulty::new(store.clone());
    ahead.set_claim_reply_delay(Duration::from_millis(1200));
    let backup = Faulty::new(store.clone());
    let mut schedulers = Vec::new();
    for (name, handle) in [("ahead", ahead.clone()), ("backup", backup.clone())] {
        let leased = instance(handle, clock.clone(), name)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_secs(2));
        let handler = span_recording(&spans, Duration::from_secs(20), Duration::ZERO, Ok(()));
        schedulers.push(start_with_one_job(leased, "long", every(60), handler));
    }
    sleep(200.0).await;
    shut_down_all(schedulers).await;
    let spans = spans.lock().unwrap().clone();
    assert!(
        spans.iter().filter(|(who, ..)| who == "ahead").count() >= 2,
        "the instance claiming ahead ran its slots: {spans:?}"
    );
    let mut sorted = spans.clone();
    sorted.sort_by_key(|s| s.2);
    for pair in sorted.windows(2) {
        let ended = pair[0].3.expect("every handler returned");
        assert!(
            pair[1].2 >= ended,
            "two handlers of one run at once: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// When the whole fleet wakes late (here: the wall clock jumps ten minutes,
/// as after a suspend), the slots the timer passes over are recorded
/// `missed` by the store, on its clock, so the history says what happened;
/// the first slot inside the late window still runs.
///
/// Failed before the fix: the driver dropped them on its own clock and the
/// history had nothing between the two runs.
#[tokio::test(start_paused = true)]
async fn slots_the_timer_passes_over_are_recorded_missed() {
    let (clock, store) = setup();
    let runs = runs();
    let s = start_recording_minutely(instance(store.clone(), clock.clone(), "sleeper"), &runs);
    sleep(1.0).await;
    let first = Slot::from_millis(clock.now().as_millis() - clock.now().as_millis() % 60_000);
    clock.step(true, Duration::from_secs(600));
    sleep(3.0).await;
    s.shutdown().await;
    let history = history_of(&store, "minutely", 100).await;
    let state_of = |minute: i64| {
        history
            .iter()
            .find(|r| r.run.slot.as_millis() == first.as_millis() + minute * 60_000)
            .map(|r| r.state)
    };
    let ran = Some(SUCCEEDED);
    assert_eq!(state_of(0), ran, "{history:?}");
    for minute in 1..10 {
        assert_eq!(
            state_of(minute),
            Some(RecordState::Missed),
            "minute {minute} was passed over and must be recorded missed: {history:?}"
        );
    }
    assert_eq!(
        state_of(10),
        ran,
        "the slot inside the window ran: {history:?}"
    );
    assert_eq!(by_slot(&runs).len(), 2);
}

/// A runner that lost contact for a whole lease cancels its handler; if
/// the handler completes anyway and the store is back, the success is
/// recorded (`finish` only takes while no backup has taken the run over),
/// and an instance that comes later finds the slot done.
///
/// Failed before the fix: the runner released the run instead, and the
/// later instance ran the slot a second time.
#[tokio::test(start_paused = true)]
async fn a_run_that_succeeded_after_losing_contact_is_recorded_not_released() {
    let (clock, store) = setup();
    let runs = runs();
    let faulty = Faulty::new(store.clone());
    let start = |name: &'static str, handle: Arc<dyn LeaseStore>, catch_up: bool| {
        let mut b = instance(handle, clock.clone(), name)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_secs(1));
        let r = runs.clone();
        let mut job = b.job("stubborn", every(3600)).unwrap();
        if catch_up {
            job = job.catch_up(Duration::from_secs(1800));
        }
        job.run(move |ctx| {
            let r = r.clone();
            async move {
                record(&r, &ctx);
                // Deaf to the cancellation: it finishes its work.
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, String>(())
            }
        })
        .unwrap();
        b.start().unwrap()
    };
    faulty.set_heartbeats_down(true);
    let first = start("first", faulty.clone(), false);
    // Past the first slot (30 minutes in) and the handler's 5 s.
    sleep(1800.0 + 10.0).await;
    // The runner gave the run up, but the store took its success: that
    // is the attempt's one outcome.
    let counted = first.metrics();
    assert_eq!(
        (counted.succeeded, counted.fenced, counted.handed_over),
        (1, 0, 0),
        "{counted:?}"
    );
    let later = start("later", store.clone(), true);
    sleep(10.0).await;
    first.shutdown().await;
    later.shutdown().await;
    let map = by_slot(&runs);
    assert_eq!(map.len(), 1, "{map:?}");
    let (slot, runners) = map.iter().next().unwrap();
    assert_eq!(runners.len(), 1, "slot {slot} ran twice: {runners:?}");
    let history = history_of(&store, "stubborn", 5).await;
    assert_eq!(history[0].state, SUCCEEDED, "{history:?}");
}

/// A claim-only store whose claims never answer: it records when each
/// try reached it.
struct Unanswering {
    clock: Arc<TestClock>,
    tries: Mutex<Vec<Timestamp>>,
}

#[async_trait::async_trait]
impl ClaimStore for Unanswering {
    async fn claim(
        &self,
        _: &anarchon_core::ClaimRequest,
    ) -> Result<anarchon_core::ClaimOutcome, anarchon_core::StoreError> {
        self.tries.lock().unwrap().push(self.clock.now());
        std::future::pending().await
    }

    fn info(&self) -> anarchon_core::BackendInfo {
        anarchon_core::BackendInfo {
            name: "unanswering",
            memory: Memory::Window(Duration::from_secs(25)),
        }
    }

    async fn ping(&self) -> Result<(), anarchon_core::StoreError> {
        std::future::pending().await
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

/// On a claim-only store that remembers a run for `max_late` plus the
/// margin, a claim whose tries time out is retried only inside the slot's
/// late window: a try that reached the store later could find the
/// winner's record forgotten and win the run a second time.
///
/// Failed before the fix: the 3rd and 4th tries went out 20 s and 30 s
/// after the slot, past its 15 s window.
#[tokio::test(start_paused = true)]
async fn claim_only_retries_stay_inside_the_late_window() {
    let (clock, _) = setup();
    let store = Arc::new(Unanswering {
        clock: clock.clone(),
        tries: Mutex::new(Vec::new()),
    });
    let mut b = instance(store.clone(), clock.clone(), "patient");
    b.job("minutely", every(60))
        .unwrap()
        .max_late(Duration::from_secs(15))
        .run(succeed)
        .unwrap();
    let s = b.start().unwrap();
    sleep(50.0).await;
    s.shutdown().await;
    let tries = store.tries.lock().unwrap().clone();
    assert!(tries.len() >= 2, "the claim was retried: {tries:?}");
    let slot = tries[0].as_millis() - tries[0].as_millis().rem_euclid(60_000);
    for at in &tries {
        assert!(
            at.as_millis() - slot <= 15_000,
            "a try went out {} ms after the slot, past its 15 s late window: {tries:?}",
            at.as_millis() - slot
        );
    }
}

/// A claim the store answered `Overlap` (and recorded skipped), whose reply
/// was lost, is told `Done(Skipped)` on its retry: it is counted as a
/// skipped slot, not as a claim another instance won.
///
/// Failed before the fix: the retry's answer was counted as a loss.
#[tokio::test(start_paused = true)]
async fn a_skip_whose_reply_was_lost_is_still_counted_as_a_skip() {
    let (clock, store) = setup();
    let mut b = instance(store.clone(), clock.clone(), "alone")
        .lease(Duration::from_secs(60))
        .heartbeat(Duration::from_secs(20));
    b.job("slow", every(10))
        .unwrap()
        .overlap(Overlap::Skip)
        .run(working_for(Duration::from_secs(25)))
        .unwrap();
    // The second slot's claim goes out at its fire time (a job whose
    // overlap rule looks at its other runs is not claimed ahead); the
    // store records the skip, and its answer is lost.
    let metrics = metrics_with_one_lost_reply(b.start().unwrap(), &store, 9.5, 1.0).await;
    assert_eq!(metrics.skipped, 1, "{metrics:?}");
    assert_eq!(metrics.losses, 0, "one instance loses nothing: {metrics:?}");
}

/// Under `overlap = skip`, a run that ends just before the next slot does
/// not get that slot skipped: a job whose overlap rule looks at its other
/// runs is claimed at the slot's fire time, not ahead of it, so the store
/// judges "another run is still going" at the slot's time.
///
/// Failed before the fix: the claim went out ahead of the slot (450 ms
/// here) and found the run that was to end 200 ms before it still live.
#[tokio::test(start_paused = true)]
async fn a_run_that_ends_just_before_the_next_slot_does_not_get_it_skipped() {
    let (clock, store) = setup();
    let mut b = instance(store.clone(), clock.clone(), "alone");
    b.job("nearly", every(10))
        .unwrap()
        .overlap(Overlap::Skip)
        .run(working_for(Duration::from_millis(9_800)))
        .unwrap();
    let scheduler = b.start().unwrap();
    // Slots at 0, 10 and 20 s; each run ends 200 ms before the next slot.
    sleep(25.0).await;
    let metrics = scheduler.metrics();
    scheduler.shutdown().await;
    assert_eq!(metrics.skipped, 0, "{metrics:?}");
    assert_eq!(metrics.wins, 3, "every slot ran: {metrics:?}");
    let history = history_of(&store, "nearly", 3).await;
    assert_eq!(history[1].state, SUCCEEDED, "{history:?}");
}

/// A `finish` the store applied but whose reply was lost is sent again
/// and told `Fenced` (the run is finished): the runner checks the record
/// — finished by this very attempt — and does not report the outcome as
/// lost to another instance.
///
/// Failed before the fix: the run was counted as fenced and logged "the
/// outcome was not recorded" although it was.
#[tokio::test(start_paused = true)]
async fn a_finish_whose_reply_was_lost_is_not_reported_as_fenced() {
    let (clock, store) = setup();
    let mut b = instance(store.clone(), clock.clone(), "alone");
    b.job("short", every(60))
        .unwrap()
        .run(working_for(Duration::from_secs(2)))
        .unwrap();
    // The next store call after 1.5 s is the finish at 2 s.
    let metrics = metrics_with_one_lost_reply(b.start().unwrap(), &store, 1.5, 2.0).await;
    assert_eq!(metrics.succeeded, 1, "{metrics:?}");
    assert_eq!(metrics.fenced, 0, "nobody fenced the runner: {metrics:?}");
    assert_eq!(history_of(&store, "short", 1).await[0].state, SUCCEEDED);
}

#[tokio::test(start_paused = true)]
async fn without_catch_up_a_new_instance_waits_for_the_next_slot() {
    let (clock, store) = setup();
    let runs = runs();
    clock.step(true, Duration::from_secs(30));
    let s = start_recording_minutely(
        Scheduler::builder(store.clone()).clock(clock.clone()),
        &runs,
    );
    sleep(29.0).await;
    assert!(runs.lock().unwrap().is_empty());
    sleep(2.0).await;
    assert_eq!(runs.lock().unwrap().len(), 1);
    s.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_claims_the_same_way_on_every_instance() {
    let (clock, store) = setup();
    let started: Arc<Mutex<Vec<(String, Slot, Timestamp)>>> = Arc::default();
    let claims = anarchon_testkit::history::History::new();
    let mut schedulers = Vec::new();
    for (index, name) in ["a", "b", "c"].into_iter().enumerate() {
        let recorded =
            anarchon_testkit::history::Recorder::new(store.clone(), index, claims.clone());
        let mut b = instance(recorded, clock.clone(), name);
        for job in 0..20 {
            let st = started.clone();
            let clk = clock.clone();
            b.job(format!("j{job}"), every(60))
                .unwrap()
                .jitter(Duration::from_secs(10))
                .run(move |ctx| {
                    let st = st.clone();
                    let now = clk.now();
                    async move {
                        st.lock()
                            .unwrap()
                            .push((ctx.job().to_string(), ctx.slot(), now));
                        Ok::<_, String>(())
                    }
                })
                .unwrap();
        }
        schedulers.push(b.start().unwrap());
    }
    sleep(30.0).await;
    shut_down_all(schedulers).await;
    let started = started.lock().unwrap().clone();
    assert_eq!(started.len(), 20, "each job's slot ran once: {started:?}");
    let offsets: Vec<i64> = started
        .iter()
        .map(|(_, slot, at)| at.as_millis() - slot.as_millis())
        .collect();
    assert!(
        offsets.iter().all(|o| (0..10_000).contains(o)),
        "{offsets:?}"
    );
    let distinct: std::collections::HashSet<i64> = offsets.iter().map(|o| o / 1000).collect();
    assert!(distinct.len() > 3, "jitter spreads the jobs: {offsets:?}");
    // Every instance sent its claim of a run at the same moment.
    let mut sent: BTreeMap<anarchon_core::RunKey, BTreeMap<usize, tokio::time::Instant>> =
        BTreeMap::new();
    for e in claims.events() {
        sent.entry(e.run.clone())
            .or_default()
            .entry(e.instance)
            .or_insert(e.invoked);
    }
    assert_eq!(sent.len(), 20, "{sent:?}");
    for (run, by_instance) in &sent {
        assert_eq!(by_instance.len(), 3, "every instance claimed {run}");
        let first = by_instance.values().min().unwrap();
        let last = by_instance.values().max().unwrap();
        assert!(
            last.duration_since(*first) <= Duration::from_millis(1),
            "{run}: the instances claimed it {:?} apart",
            last.duration_since(*first)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn due_jobs_are_claimed_in_one_round_trip() {
    let (clock, store) = setup();
    let faulty = Faulty::new(store.clone());
    let mut b = Scheduler::builder(faulty.clone()).clock(clock.clone());
    for job in 0..500 {
        b.job(format!("job{job}"), every(60))
            .unwrap()
            .run(succeed)
            .unwrap();
    }
    let s = b.start().unwrap();
    // The clock starts on a whole minute: that slot is due at once.
    sleep(30.0).await;
    assert_eq!(
        faulty.claim_calls(),
        1,
        "500 jobs due at one slot: one claim_many; {:?}",
        s.metrics()
    );
    assert_eq!(s.metrics().wins, 500);
    s.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_backup_reads_once_per_lease_period() {
    let (clock, store) = setup();
    let lease = Duration::from_secs(10);
    let mut handles = Vec::new();
    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let f = Faulty::new(store.clone());
        handles.push(f.clone());
        let mut b = instance(f, clock.clone(), name).lease(lease);
        b.job("long", every(3600))
            .unwrap()
            .run(|ctx| async move {
                tokio::select! {
                    () = ctx.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(100)) => {}
                }
                Ok::<_, String>(())
            })
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(3600.0 + 100.0 + 5.0).await;
    let peeks: u64 = handles.iter().map(|h| h.peeks()).sum();
    // 100 s of a live 10 s lease: about 10 reads, never a claim.
    assert!((9..=11).contains(&peeks), "{peeks} peeks");
    let claims: u64 = handles.iter().map(|h| h.claim_calls()).sum();
    assert_eq!(
        claims, 2,
        "one claim each; the backup never claimed a live lease"
    );
    shut_down_all(schedulers).await;
}

#[tokio::test(start_paused = true)]
async fn overlap_skip_never_runs_two_at_once() {
    let (clock, store) = setup();
    let active = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let max_active = Arc::new(std::sync::atomic::AtomicI32::new(0));
    let mut schedulers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut b = instance(store.clone(), clock.clone(), name);
        let (act, max) = (active.clone(), max_active.clone());
        b.job("slow", every(1))
            .unwrap()
            .overlap(Overlap::Skip)
            .run(move |_| {
                let (act, max) = (act.clone(), max.clone());
                async move {
                    let now = act.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    max.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3500)).await;
                    act.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, String>(())
                }
            })
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(30.0).await;
    let skipped: u64 = schedulers.iter().map(|s| s.metrics().skipped).sum();
    shut_down_all(schedulers).await;
    assert_eq!(max_active.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(skipped > 10, "{skipped}");
    let history = history_of(&store, "slow", 100).await;
    assert!(
        history
            .iter()
            .any(|r| r.state == RecordState::Finished(FinalState::Skipped))
    );
}

#[tokio::test(start_paused = true)]
async fn skewed_and_stepping_clocks_never_run_a_slot_twice() {
    let (clock, store) = setup();
    let runs = runs();
    let stepper = TestClock::starting_at(clock.now());
    let clocks: Vec<(&str, Arc<dyn Clock>)> = vec![
        (
            "ahead",
            SkewedClock::new(clock.clone(), true, Duration::from_secs(30)),
        ),
        (
            "behind",
            SkewedClock::new(clock.clone(), false, Duration::from_secs(30)),
        ),
        ("true", clock.clone()),
        ("stepper", stepper.clone()),
    ];
    let mut schedulers = Vec::new();
    for (name, c) in clocks {
        let mut b = instance(store.clone(), c, name);
        b.job("tick", every(5))
            .unwrap()
            .max_late(Duration::from_secs(60))
            .run(recording(&runs))
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(100.0).await;
    stepper.step(true, Duration::from_secs(3600));
    sleep(100.0).await;
    shut_down_all(schedulers).await;
    let map = by_slot(&runs);
    for (slot, who) in &map {
        assert_eq!(who.len(), 1, "slot {slot} ran {who:?}");
    }
    // Every slot of the true timeline, from the first run to now, ran once;
    // the stepped instance ran slots an hour ahead, which nobody runs again.
    let first = *map.keys().next().unwrap();
    let now = clock.now();
    let mut slot = first;
    let mut checked = 0;
    while slot.at().as_millis() + 5000 <= now.as_millis() {
        assert_eq!(
            map.get(&slot).map_or(0, Vec::len),
            1,
            "slot {slot}: {map:?}"
        );
        slot = Slot::from_millis(slot.as_millis() + 5000);
        checked += 1;
    }
    assert!(checked >= 35, "{checked}");
    assert!(
        map.keys()
            .any(|s| s.as_millis() > now.as_millis() + 3_000_000),
        "the stepped clock claims slots an hour ahead"
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_only_store_skips_late_slots_locally_after_a_clock_step() {
    // Start 3 s past a 10 s slot, whatever the real time: after 25 s and a
    // one-hour step the clock reads 8 s past a slot, so exactly one slot
    // lies inside the 15 s late window and none comes due in the next 1.5 s.
    let now = anarchon_core::SystemClock.now().as_millis();
    let clock =
        TestClock::starting_at(Timestamp::from_millis(now - now.rem_euclid(10_000) + 3_000));
    let store = Arc::new(ClaimOnlyStore::default());
    let runs = runs();
    let mut b = Scheduler::builder(store).clock(clock.clone());
    b.job("tick", every(10))
        .unwrap()
        .max_late(Duration::from_secs(15))
        .run(recording(&runs))
        .unwrap();
    let s = b.start().unwrap();
    sleep(25.0).await;
    let before = runs.lock().unwrap().len();
    clock.step(true, Duration::from_secs(3600));
    sleep(1.5).await;
    let after_step = runs.lock().unwrap().len();
    let m = s.metrics();
    s.shutdown().await;
    assert!(before >= 2);
    // At most the one slot inside the 15 s late window right after the step.
    assert!(after_step - before <= 2, "{before} -> {after_step}");
    assert!(m.late >= 1, "{m:?}");
}

#[tokio::test]
async fn lease_only_options_from_configuration_are_refused_for_claim_only_stores() {
    let store: Arc<dyn ClaimStore> = Arc::new(ClaimOnlyStore::default());
    let cases: [(&str, JobOptions); 3] = [
        ("overlap", job_options(|o| o.overlap = Some(Overlap::Skip))),
        ("max_attempts", job_options(|o| o.max_attempts = Some(2))),
        (
            "catch_up",
            job_options(|o| o.catch_up = Some(Duration::from_secs(60))),
        ),
    ];
    for (option, opts) in cases {
        let mut b = Scheduler::builder(store.clone());
        let err = job_refused(&mut b, |job| job.options(&opts));
        match &err {
            ConfigError::UnsupportedOption { option: o, backend } => {
                assert_eq!(*o, option);
                assert_eq!(*backend, "claim-only-test");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains(option), "{err}");
    }
    let scheduler_cases: [(&str, SchedulerOptions); 2] = [
        (
            "lease",
            scheduler_options(|o| o.lease = Some(Duration::from_secs(30))),
        ),
        (
            "heartbeat",
            scheduler_options(|o| o.heartbeat = Some(Duration::from_secs(5))),
        ),
    ];
    for (option, opts) in scheduler_cases {
        let err = Scheduler::builder(store.clone())
            .options(&opts)
            .start()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::UnsupportedOption { option: o, .. } if o == option),
            "{err}"
        );
    }
    // The same options are fine on a lease store chosen at run time.
    let lease: Arc<dyn ClaimStore> = Arc::new(MemoryStore::new());
    let mut opts = JobOptions::default();
    opts.overlap = Some(Overlap::Skip);
    opts.max_attempts = Some(2);
    opts.catch_up = Some(Duration::from_secs(60));
    let mut sopts = SchedulerOptions::default();
    sopts.lease = Some(Duration::from_secs(30));
    let mut b = Scheduler::builder(lease).options(&sopts);
    b.job("j", every(60))
        .unwrap()
        .options(&opts)
        .run(succeed)
        .unwrap();
    b.start().unwrap().shutdown().await;
}

#[tokio::test]
async fn bad_configuration_is_a_typed_error_at_build_time() {
    let store = Arc::new(MemoryStore::new());
    let err = Scheduler::builder(store.clone())
        .lease(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(10))
        .start()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::HeartbeatNotShorterThanLease { .. }),
        "{err}"
    );
    let err = Scheduler::builder(store.clone())
        .lease(Duration::ZERO)
        .start()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::ZeroDuration { option: "lease" }),
        "{err}"
    );

    let mut b = Scheduler::builder(store.clone());
    let err = job_refused(&mut b, |job| job.max_attempts(0));
    assert!(matches!(err, ConfigError::ZeroMaxAttempts), "{err}");
    let err = job_refused(&mut b, |job| job.timeout(Duration::ZERO));
    assert!(
        matches!(err, ConfigError::ZeroDuration { option: "timeout" }),
        "{err}"
    );
    let err = b.job("bad name", every(60)).unwrap_err();
    assert!(matches!(err, ConfigError::InvalidJobName { .. }), "{err}");
    b.job("j", every(60)).unwrap().run(succeed).unwrap();
    let err = b.job("j", every(60)).unwrap_err();
    assert!(matches!(err, ConfigError::DuplicateJob { .. }), "{err}");

    let short = Arc::new(ClaimOnlyStore::remembering(Memory::Window(
        Duration::from_secs(60),
    )));
    let mut b = Scheduler::builder(short);
    let err = job_refused(&mut b, |job| job.max_late(Duration::from_secs(55)));
    assert!(matches!(err, ConfigError::MemoryTooShort { .. }), "{err}");
    assert!(
        err.to_string().contains("could win the run a second time"),
        "{err}"
    );
    b.job("j", every(60))
        .unwrap()
        .max_late(Duration::from_secs(50))
        .run(succeed)
        .unwrap();

    let mut opts = SchedulerOptions::default();
    opts.instance_id = Some("has space".into());
    let err = Scheduler::builder(store)
        .options(&opts)
        .start()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::InvalidInstanceId { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn jitter_must_be_shorter_than_max_late() {
    let mut b = Scheduler::builder(Arc::new(MemoryStore::new()));
    let err = job_refused(&mut b, |job| job.jitter(Duration::from_secs(90)));
    assert!(
        matches!(
            err,
            ConfigError::OutOfRange {
                option: "jitter",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_scheduler_stops_it_and_hands_its_runs_over() {
    let (clock, store) = setup();
    let runs = runs();
    let s = start_with_one_job(
        instance(store.clone(), clock.clone(), "dropped"),
        "long",
        every(60),
        recording_holding(&runs, |_| true),
    );
    sleep(1.0).await;
    assert_eq!(runs.lock().unwrap().len(), 1);
    drop(s);
    // A moment later, far inside the 30 s lease: released, not run out.
    sleep(0.1).await;
    let history = history_of(&store, "long", 5).await;
    assert_eq!(history.len(), 1);
    let view = store.peek(&history[0].run).await.unwrap();
    match view.state {
        anarchon_core::RunState::Running { lease_until, .. } => assert!(
            lease_until < view.store_now,
            "dropping the scheduler released the lease at once: it ends {lease_until}, now is {}",
            view.store_now
        ),
        other => panic!("{other:?}"),
    }
    sleep(120.0).await;
    assert_eq!(runs.lock().unwrap().len(), 1, "no claims after the drop");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_heartbeat_does_not_hold_the_runner_past_its_lease() {
    let (clock, store) = setup();
    let faulty = Faulty::new(store.clone());
    let lease = Duration::from_secs(3);
    let cancelled = Cancellations::default();
    let s = start_waiting_for_cancellation(faulty.clone(), clock.clone(), lease, &cancelled);
    sleep(1.5).await;
    faulty.set_heartbeats_hang(true);
    sleep(10.0).await;
    let renewed = faulty
        .last_renewal_sent()
        .expect("a heartbeat was renewed before the hang");
    let Some(Cancellation {
        reason: Some(reason),
        at: Some(at),
        ..
    }) = cancelled.lock().unwrap().clone()
    else {
        panic!(
            "not cancelled; {:?}, {} heartbeats",
            s.metrics(),
            faulty.heartbeats()
        )
    };
    assert_eq!(reason, CancelReason::LostContact);
    assert!(
        at <= renewed + lease,
        "cancelled {:?} after the last renewal was sent, past the {lease:?} lease",
        at.duration_since(renewed)
    );
    drop(s);
}

/// When each run's handler started, by the instance's clock.
type HandlerStarts = Arc<Mutex<Vec<(Slot, Timestamp)>>>;

/// Adds `job` on `schedule` to `b`, with a handler that records its slot
/// and the time on `clock` when it starts.
fn recording_start_times<S: ClaimStore + ?Sized>(
    b: &mut SchedulerBuilder<S>,
    clock: &Arc<TestClock>,
    job: &str,
    schedule: Schedule,
) -> HandlerStarts
where
    Arc<S>: IntoDynClaim,
{
    let started: HandlerStarts = Arc::default();
    let (st, clk) = (started.clone(), clock.clone());
    b.job(job, schedule)
        .unwrap()
        .run(move |ctx| {
            st.lock().unwrap().push((ctx.slot(), clk.now()));
            async { Ok::<_, String>(()) }
        })
        .unwrap();
    started
}

#[tokio::test(start_paused = true)]
async fn claims_go_out_ahead_and_handlers_start_on_the_slot() {
    let (clock, store) = setup();
    let mut b = Scheduler::builder(store.clone()).clock(clock.clone());
    let started = recording_start_times(&mut b, &clock, "on-time", every(60));
    let s = b.start().unwrap();
    sleep(150.0).await;
    s.shutdown().await;
    let started = started.lock().unwrap().clone();
    // The first slot was due at start; the next two are claimed ahead.
    assert_eq!(started.len(), 3, "{started:?}");
    for (slot, at) in &started[1..] {
        assert_eq!(
            at,
            &slot.at(),
            "the handler starts on the slot, not after the claim"
        );
    }
    let history = history_of(&store, "on-time", 3).await;
    for record in &history[..2] {
        let claimed = record.started_at.unwrap();
        assert!(
            claimed < record.run.slot.at(),
            "claimed at {claimed}, before the slot {}",
            record.run.slot
        );
    }
}

/// Before any batch has been timed, the first claims go out half a second
/// ahead: a fleet started together sends them all at once, and on a store
/// where they contend that first batch takes a few hundred milliseconds.
/// Here the answer takes 300 ms, and the first slot still starts on time.
#[tokio::test(start_paused = true)]
async fn the_first_claims_get_a_head_start_a_contended_batch_needs() {
    let (clock, store) = setup();
    let slow = Faulty::new(store.clone());
    slow.set_claim_reply_delay(Duration::from_millis(300));
    let mut b = instance(slow.clone(), clock.clone(), "slow");
    let started = recording_start_times(&mut b, &clock, "every-second", every(1));
    // Started 200 ms into a second: the first slot is 800 ms away.
    sleep(0.2).await;
    let s = b.start().unwrap();
    sleep(1.5).await;
    s.shutdown().await;
    let started = started.lock().unwrap().clone();
    assert_eq!(started.len(), 1, "{started:?}");
    let (slot, at) = started[0];
    assert_eq!(at, slot.at(), "the first slot starts on time: {started:?}");
}

/// A batch that takes longer than its head start teaches the scheduler a
/// longer one, and the very next slot's claim already goes out with it:
/// when the store turns slow, one slot starts late, not two.
///
/// Failed before the fix: the timer had gone to sleep until the next
/// claim time as the shorter head start put it, so the slot after the
/// slow batch was as late as the slow batch's own.
#[tokio::test(start_paused = true)]
async fn a_longer_head_start_applies_from_the_next_slot() {
    let (clock, store) = setup();
    let slow = Faulty::new(store.clone());
    let mut b = instance(slow.clone(), clock.clone(), "slow");
    let started = recording_start_times(&mut b, &clock, "every-second", every(1));
    let s = b.start().unwrap();
    // Eleven quick slots: the head start shrinks towards its least.
    sleep(10.5).await;
    slow.set_claim_reply_delay(Duration::from_millis(400));
    sleep(3.0).await;
    s.shutdown().await;
    let started = started.lock().unwrap().clone();
    assert_eq!(started.len(), 14, "{started:?}");
    let late: Vec<usize> = started
        .iter()
        .enumerate()
        .filter(|(_, (slot, at))| at != &slot.at())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        late,
        vec![11],
        "only the first slot claimed once the store is slow starts late: {started:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_offset_to_the_store_clock_is_measured_and_exposed() {
    let (clock, store) = setup();
    let mut schedulers = Vec::new();
    for (name, c) in [
        ("true", clock.clone() as Arc<dyn Clock>),
        (
            "behind",
            SkewedClock::new(clock.clone(), false, Duration::from_secs(30)) as Arc<dyn Clock>,
        ),
    ] {
        let mut b = instance(store.clone(), c, name);
        b.job("long", every(120))
            .unwrap()
            .run(working_for(Duration::from_secs(60)))
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(200.0).await;
    let behind = schedulers[1].metrics();
    shut_down_all(schedulers).await;
    let ahead = behind
        .store_clock_ahead_ms
        .expect("the late instance met a live lease");
    assert!((29_000..=31_000).contains(&ahead), "{ahead} ms");
}

/// A memory store whose claims of one job do their work but answer with an
/// error of that claim alone, as a store does when that job's data cannot
/// be read back.
struct OneJobUnreadable {
    inner: Arc<MemoryStore>,
    job: JobName,
}

impl OneJobUnreadable {
    fn error(&self) -> anarchon_core::StoreError {
        anarchon_core::StoreError::protocol("memory", "this job's record cannot be read back")
    }
}

#[anarchon_core::async_trait]
impl LeaseLayer for OneJobUnreadable {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn claim(
        &self,
        req: &anarchon_core::ClaimRequest,
    ) -> Result<anarchon_core::ClaimOutcome, anarchon_core::StoreError> {
        LeaseLayer::claim_lease(self, &anarchon_core::LeaseClaim::from_plain(req)).await
    }

    async fn claim_lease(
        &self,
        req: &anarchon_core::LeaseClaim,
    ) -> Result<anarchon_core::ClaimOutcome, anarchon_core::StoreError> {
        let outcome = self.inner.claim_lease(req).await?;
        if req.run().job == self.job {
            return Err(self.error());
        }
        Ok(outcome)
    }

    async fn claim_many(
        &self,
        reqs: &[anarchon_core::LeaseClaim],
    ) -> Result<anarchon_core::ClaimAnswers, anarchon_core::StoreError> {
        let answers = self.inner.claim_many(reqs).await?;
        Ok(reqs
            .iter()
            .zip(answers)
            .map(|(req, answer)| {
                if req.run().job == self.job {
                    Err(self.error())
                } else {
                    answer
                }
            })
            .collect())
    }
}

/// Three jobs are claimed in one batch; the store cannot answer one of
/// them. The other two run every slot, and each win of the unreadable job
/// (taken by the store, its answer lost) is released at once for a backup,
/// not left to hold its slot for a whole lease.
#[tokio::test(start_paused = true)]
async fn one_unreadable_job_costs_its_batch_nothing() {
    let (clock, memory) = setup();
    let broken = JobName::new("broken").unwrap();
    let store = Arc::new(OneJobUnreadable {
        inner: memory.clone(),
        job: broken.clone(),
    });
    let runs = runs();
    let mut b = instance(store, clock.clone(), "a");
    for name in ["first", "broken", "last"] {
        b.job(name, every(10))
            .unwrap()
            .run(recording(&runs))
            .unwrap();
    }
    let scheduler = b.start().unwrap();
    sleep(35.0).await;
    scheduler.shutdown().await;

    let ran: Vec<String> = runs.lock().unwrap().iter().map(|r| r.2.clone()).collect();
    let mut per_job: BTreeMap<JobName, usize> = BTreeMap::new();
    for name in ["first", "last"] {
        let job = JobName::new(name).unwrap();
        let records = memory.history(&job, 100).await.unwrap();
        per_job.insert(job, records.len());
        assert!(
            records.len() >= 3 && records.iter().all(|r| r.state == SUCCEEDED),
            "job {name} ran every slot: {records:?}"
        );
    }
    assert_eq!(
        ran.len(),
        per_job.values().sum::<usize>(),
        "only the readable jobs ran"
    );
    let broken_records = memory.history(&broken, 100).await.unwrap();
    assert!(broken_records.len() >= 3, "{broken_records:?}");
    for record in &broken_records {
        let (Some(started), Some(lease_until)) = (record.started_at, record.lease_until) else {
            panic!("a won run has a start and a lease end: {record:?}");
        };
        assert!(
            lease_until.since(started) < Duration::from_secs(1),
            "a win whose answer was lost is released, not held for its 30 s lease: {record:?}"
        );
    }
}

/// A memory store that notes each release in a shared log.
struct NotingReleases {
    inner: Arc<MemoryStore>,
    log: Arc<Mutex<Vec<&'static str>>>,
}

#[anarchon_core::async_trait]
impl LeaseLayer for NotingReleases {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn release(
        &self,
        run: &anarchon_core::RunKey,
        token: anarchon_core::Token,
    ) -> Result<anarchon_core::Renewal, anarchon_core::StoreError> {
        self.log.lock().unwrap().push("released");
        self.inner.release(run, token).await
    }
}

/// Notes in the log when it is dropped: the end of a handler's future.
struct NotesDrop(Arc<Mutex<Vec<&'static str>>>);

impl Drop for NotesDrop {
    fn drop(&mut self) {
        self.0.lock().unwrap().push("handler dropped");
    }
}

/// At shutdown, a handler that ignores its cancellation is aborted, and
/// its run is released to a backup only once the handler's task is gone:
/// whatever its future holds (a child process killed on drop, say) ends
/// before a backup may start the run.
///
/// Failed before the fix: the release went out before the aborted task
/// was dropped.
#[tokio::test(start_paused = true)]
async fn a_run_is_handed_over_only_once_its_aborted_handler_is_gone() {
    let (clock, store) = setup();
    let log: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let layered = Arc::new(NotingReleases {
        inner: store.clone(),
        log: log.clone(),
    });
    let mut b = instance(layered, clock.clone(), "a").shutdown_grace(Duration::from_secs(1));
    let held = log.clone();
    b.job("stubborn", every(60))
        .unwrap()
        .run(move |_| {
            let guard = NotesDrop(held.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok::<_, String>(())
            }
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(5.0).await;
    let report = scheduler.shutdown().await;
    assert_eq!(report.handed_over, 1, "the run was handed over");
    assert_eq!(
        *log.lock().unwrap(),
        ["handler dropped", "released"],
        "the run was released before its handler was gone"
    );
}

/// A handler that returns at the very moment shutdown's grace ends (the
/// run's task finds its handler done and the hand-over due together) has
/// its outcome recorded, not handed over: a backup would run it again.
/// Twenty jobs, each handler returning exactly at the grace's end; every
/// one ends `succeeded`.
///
/// Failed before the fix: the run's task picked one of the two at random,
/// and about half the runs were released although their handler had
/// returned.
#[tokio::test(start_paused = true)]
async fn a_handler_that_returned_as_shutdown_came_is_recorded_not_handed_over() {
    const JOBS: usize = 20;
    let grace = Duration::from_secs(3);
    let (clock, store) = setup();
    let mut b = instance(store.clone(), clock.clone(), "a").shutdown_grace(grace);
    // The clock starts on a slot: every handler starts now and works for
    // a second more than the grace; shutdown comes a second from now.
    for i in 0..JOBS {
        b.job(format!("on-time-{i}"), every(60))
            .unwrap()
            .run(working_for(Duration::from_secs(1) + grace))
            .unwrap();
    }
    let scheduler = b.start().unwrap();
    sleep(1.0).await;
    let report = scheduler.shutdown().await;
    assert_eq!(report.handed_over, 0, "{report:?}");
    let mut ended = Vec::new();
    for i in 0..JOBS {
        ended.push(history_of(&store, &format!("on-time-{i}"), 1).await[0].state);
    }
    assert!(
        ended.iter().all(|state| *state == SUCCEEDED),
        "handed over although its handler had returned: {ended:?} (report {report:?})"
    );
}

/// A run handed over before its handler started does not use up an
/// attempt: with `max_attempts = 1`, the backup still runs it (as attempt
/// 1), rather than finding its only attempt spent and marking it
/// interrupted.
#[tokio::test(start_paused = true)]
async fn a_run_handed_over_before_its_handler_started_keeps_its_attempt() {
    let (clock, store) = setup();
    let runs = runs();
    let start = |name: &'static str, instance_clock: Arc<dyn Clock>| {
        let mut b = instance(store.clone(), instance_clock, name)
            // No grace: a run still waiting for its fire time is handed
            // over at once.
            .shutdown_grace(Duration::ZERO);
        b.job("once", every(60))
            .unwrap()
            .max_attempts(1)
            .run(recording(&runs))
            .unwrap();
        b.start().unwrap()
    };
    // "a" claims every slot first; "b", a second behind, is the backup.
    let a = start("a", clock.clone());
    let b = start(
        "b",
        SkewedClock::new(clock.clone(), false, Duration::from_secs(1)),
    );
    // The next slot is a minute away. "a" claims it a little ahead and
    // waits for its fire time; it shuts down in that wait.
    sleep(60.0 - 0.05).await;
    let next = Slot::from_millis(clock.now().as_millis() + 50);
    let claimed = history_of(&store, "once", 1).await;
    assert_eq!(
        claimed[0].instance.as_ref().map(|i| i.as_str()),
        Some("a"),
        "a holds the next slot before its fire time: {claimed:?}"
    );
    assert_eq!(claimed[0].run.slot, next);
    let report = a.shutdown().await;
    assert_eq!(report.handed_over, 1, "a handed the waiting run over");
    sleep(40.0).await;
    b.shutdown().await;
    let ran = by_slot(&runs);
    assert_eq!(
        ran.get(&next),
        Some(&vec![(Attempt::FIRST, "b".to_owned())]),
        "the backup ran the handed-over slot, as attempt 1: {ran:?}"
    );
    let record = history_of(&store, "once", 10)
        .await
        .into_iter()
        .find(|r| r.run.slot == next)
        .unwrap();
    assert_eq!(record.state, SUCCEEDED, "{record:?}");
}

/// A runner that cannot renew gives its run up `stop_grace` before the
/// lease could end, so a handler that takes that long to stop (a command
/// between SIGTERM and SIGKILL) has stopped before the backup starts the
/// run: the two never run at once.
#[tokio::test(start_paused = true)]
async fn a_handler_given_a_stop_grace_has_stopped_before_the_backup_starts() {
    let (clock, store) = setup();
    let faulty = Faulty::new(store.clone());
    let spans: Spans = Arc::default();
    let stop_takes = Duration::from_millis(900);
    let start =
        |name: &'static str, handle: Arc<dyn LeaseStore>, instance_clock: Arc<dyn Clock>| {
            let leased = instance(handle, instance_clock, name)
                .lease(Duration::from_secs(3))
                .heartbeat(Duration::from_millis(500))
                .stop_grace(Duration::from_secs(1));
            let handler = span_recording(
                &spans,
                Duration::from_secs(60),
                stop_takes,
                Err("stopped".to_owned()),
            );
            start_with_one_job(leased, "slow-to-stop", every(3600), handler)
        };
    faulty.set_heartbeats_down(true);
    let runner = start("runner", faulty.clone(), clock.clone());
    // A second behind: the runner claims first, and this one backs it up.
    let backup = start(
        "backup",
        store.clone(),
        SkewedClock::new(clock.clone(), false, Duration::from_secs(1)),
    );
    sleep(1800.0 + 30.0).await;
    runner.shutdown().await;
    backup.shutdown().await;
    let spans = spans.lock().unwrap().clone();
    let ran = |who: &str| {
        spans
            .iter()
            .find(|s| s.0 == who)
            .cloned()
            .unwrap_or_else(|| panic!("{who} never ran: {spans:?}"))
    };
    let (_, _, _, runner_end) = ran("runner");
    let (_, _, backup_start, _) = ran("backup");
    let runner_end = runner_end.expect("the runner's handler stopped");
    assert!(
        runner_end <= backup_start,
        "the runner's handler stopped {:?} after the backup's started",
        runner_end - backup_start
    );
}

/// A day's catch-up of a per-minute job after an outage: only the newest
/// `catch_up_limit` missed slots run, oldest first, not 1,440 at once.
#[tokio::test(start_paused = true)]
async fn catch_up_runs_only_the_newest_missed_slots_oldest_first() {
    let (clock, store) = setup();
    let runs = runs();
    let started_at = clock.now();
    let mut b = instance(store.clone(), clock.clone(), "after-outage");
    b.job("minutely", every(60))
        .unwrap()
        .catch_up(Duration::from_secs(24 * 3600))
        .catch_up_limit(5)
        .run(recording(&runs))
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(30.0).await;
    scheduler.shutdown().await;
    let caught_up: Vec<Slot> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0)
        .filter(|slot| slot.at() < started_at)
        .collect();
    let expected: Vec<Slot> = (1..=5)
        .rev()
        .map(|m| Slot::from_millis(started_at.as_millis() - m * 60_000))
        .collect();
    assert_eq!(
        caught_up, expected,
        "the newest five missed minutes, in the order they ran"
    );
}

/// Handlers that each hold on for ten seconds and count how many of them
/// run at once; every start is recorded with its job and slot.
type Starts = Arc<Mutex<Vec<(String, Slot)>>>;

fn counted_job(
    b: &mut anarchon_core::SchedulerBuilder<MemoryStore>,
    name: &'static str,
    starts: &Starts,
    running: &Arc<std::sync::atomic::AtomicUsize>,
    most: &Arc<std::sync::atomic::AtomicUsize>,
    catch_up_limit: Option<u32>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let (starts, running, most) = (starts.clone(), running.clone(), most.clone());
    let mut job = b.job(name, every(60)).unwrap();
    if let Some(limit) = catch_up_limit {
        job = job
            .max_late(Duration::from_secs(30))
            .catch_up(Duration::from_secs(3600))
            .catch_up_limit(limit);
    }
    job.run(move |ctx| {
        let (starts, running, most) = (starts.clone(), running.clone(), most.clone());
        async move {
            starts.lock().unwrap().push((name.to_string(), ctx.slot()));
            let now = running.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            sleep(10.0).await;
            running.fetch_sub(1, SeqCst);
            Ok::<_, String>(())
        }
    })
    .unwrap();
}

/// Three jobs each catch up four missed minutes at start, with room for
/// two caught-up runs at once: never more than two run together, all
/// twelve and then each job's slot due now run, the oldest first over all
/// jobs; a job without catch-up runs its slot at once beside them.
#[tokio::test(start_paused = true)]
async fn caught_up_runs_over_all_jobs_take_turns_oldest_first() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (clock, store) = setup();
    let started_at = clock.now();
    let starts: Starts = Arc::default();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut b = instance(store.clone(), clock.clone(), "after-outage").catch_up_concurrency(2);
    for name in ["a", "b", "c"] {
        counted_job(&mut b, name, &starts, &running, &most, Some(4));
    }
    counted_job(&mut b, "on-time", &starts, &running, &most, None);
    let scheduler = b.start().unwrap();
    sleep(1.0).await;
    let first_second: Vec<(String, Slot)> = starts.lock().unwrap().clone();
    sleep(80.0).await;
    scheduler.shutdown().await;
    let now_slot = Slot::from_millis(started_at.as_millis());
    assert!(
        first_second.contains(&("on-time".to_string(), now_slot)),
        "the job without catch-up did not wait: {first_second:?}"
    );
    let caught_up: Vec<(String, Slot)> = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, slot)| name != "on-time" && *slot <= now_slot)
        .cloned()
        .collect();
    let mut expected = Vec::new();
    for minutes_ago in (0..=4).rev() {
        for name in ["a", "b", "c"] {
            let slot = Slot::from_millis(started_at.as_millis() - minutes_ago * 60_000);
            expected.push((name.to_string(), slot));
        }
    }
    assert_eq!(
        caught_up, expected,
        "four missed minutes and the current one of each job, oldest first, two at a time"
    );
    // The job without catch-up, plus two caught up.
    assert_eq!(most.load(SeqCst), 3, "at most two caught-up runs at once");
}

/// A slot claimed a little after its fire time but well inside its job's
/// `max_late` (an instance that starts two seconds after it, a timer that
/// wakes late) is on time: it runs at once, even for a job with catch-up,
/// while a caught-up run of another job holds the only catch-up place.
#[tokio::test(start_paused = true)]
async fn a_slot_claimed_a_little_late_does_not_wait_for_a_catch_up_place() {
    let (clock, store) = setup();
    let slot_now = Slot::from_millis(clock.now().as_millis());
    clock.step(true, Duration::from_secs(2));
    let starts: Starts = Arc::default();
    let mut b = instance(store.clone(), clock.clone(), "busy").catch_up_concurrency(1);
    for (name, max_late, catch_up, limit) in [
        // Fell behind: its slot of a minute ago is caught up and holds the
        // one place for far longer than the test.
        ("long", 30, 3600, 2),
        // Nothing to catch up: its slot two seconds ago is on time.
        ("tick", 5, 10, 1),
    ] {
        let starts = starts.clone();
        b.job(name, every(60))
            .unwrap()
            .max_late(Duration::from_secs(max_late))
            .catch_up(Duration::from_secs(catch_up))
            .catch_up_limit(limit)
            .run(move |ctx| {
                starts.lock().unwrap().push((name.to_string(), ctx.slot()));
                async {
                    sleep(1000.0).await;
                    Ok::<_, String>(())
                }
            })
            .unwrap();
    }
    let scheduler = b.start().unwrap();
    sleep(1.0).await;
    let started = starts.lock().unwrap().clone();
    scheduler.shutdown().await;
    let minute_ago = Slot::from_millis(slot_now.as_millis() - 60_000);
    assert!(
        started.contains(&("long".to_string(), minute_ago)),
        "the caught-up run took the catch-up place: {started:?}"
    );
    assert!(
        started.contains(&("tick".to_string(), slot_now)),
        "a slot two seconds into a 5 s max_late waited for a catch-up place: {started:?}"
    );
}

/// An instance that falls two hours behind (a suspend, a clock step) with
/// a day's catch-up claims only the newest `catch_up_limit` slots of the
/// two hours, not 120.
#[tokio::test(start_paused = true)]
async fn a_fall_behind_catches_up_only_the_newest_slots() {
    let (clock, store) = setup();
    let starts: Starts = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut b = instance(store.clone(), clock.clone(), "suspended");
    counted_job(&mut b, "a", &starts, &running, &most, Some(3));
    let scheduler = b.start().unwrap();
    sleep(90.0).await;
    let before = starts.lock().unwrap().len();
    let woke_at = {
        clock.step(true, Duration::from_secs(2 * 3600));
        clock.now()
    };
    sleep(50.0).await;
    scheduler.shutdown().await;
    let after: Vec<Slot> = starts.lock().unwrap()[before..]
        .iter()
        .map(|s| s.1)
        .filter(|slot| slot.at() < woke_at)
        .collect();
    let last_minute = woke_at.as_millis() - woke_at.as_millis().rem_euclid(60_000);
    let expected: Vec<Slot> = (0..3)
        .rev()
        .map(|m| Slot::from_millis(last_minute - m * 60_000))
        .filter(|slot| slot.at() < woke_at)
        .collect();
    assert_eq!(
        before, 5,
        "three caught up at start and two minutes on time ran"
    );
    assert_eq!(after, expected, "the newest three minutes before the wake");
}

/// A handler that fails its first `failures` attempts of every slot (with
/// the attempt's number in its error) and succeeds after; every attempt
/// notes its slot, number, cause, retries and instance in `seen`.
type Attempts = Arc<Mutex<Vec<(Slot, u32, anarchon_core::AttemptCause, u32, String)>>>;

fn failing_first(
    seen: &Attempts,
    failures: u32,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    let seen = seen.clone();
    move |ctx| {
        let seen = seen.clone();
        Box::pin(async move {
            let n = ctx.attempt().get();
            seen.lock().unwrap().push((
                ctx.slot(),
                n,
                ctx.cause(),
                ctx.retries(),
                ctx.instance().to_string(),
            ));
            if n <= failures {
                Err(format!("attempt {n} failed"))
            } else {
                Ok(())
            }
        })
    }
}

/// Three schedulers of a job that retries twice: a handler that fails
/// twice is retried once per failure, by one instance each time, after the
/// backoff; the third attempt succeeds, and the record keeps both failures.
/// A single scheduler retries its own failure too (nobody else would).
#[tokio::test(start_paused = true)]
async fn a_failed_run_is_retried_once_per_retry_among_the_schedulers() {
    use anarchon_core::{AttemptCause, RetryPolicy};
    let (clock, store) = setup();
    let seen = Attempts::default();
    let policy = RetryPolicy::new(2, Duration::from_secs(5)).unwrap();
    let mut schedulers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut b = instance(store.clone(), clock.clone(), name);
        b.job("flaky", every(60))
            .unwrap()
            .retry(policy)
            .run(failing_first(&seen, 2))
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    sleep(40.0).await;
    let metrics: u64 = schedulers.iter().map(|s| s.metrics().retries).sum();
    shut_down_all(schedulers).await;
    let seen = seen.lock().unwrap().clone();
    let how: Vec<(u32, AttemptCause, u32)> = seen.iter().map(|s| (s.1, s.2, s.3)).collect();
    assert_eq!(
        how,
        vec![
            (1, AttemptCause::First, 0),
            (2, AttemptCause::Retry, 1),
            (3, AttemptCause::Retry, 2),
        ],
        "one slot, three attempts: {seen:?}"
    );
    assert_eq!(metrics, 2, "two retries won in all");
    let record = history_of(&store, "flaky", 1).await.remove(0);
    assert_eq!(record.state, SUCCEEDED);
    assert_eq!(record.attempt, Attempt::new(3));
    let errors: Vec<Option<&str>> = record.earlier.iter().map(|p| p.error.as_deref()).collect();
    assert_eq!(errors, [Some("attempt 1 failed"), Some("attempt 2 failed")]);
    let (first, second) = (
        record.earlier.iter().next().unwrap().at.unwrap(),
        record.earlier.iter().nth(1).unwrap().at.unwrap(),
    );
    assert!(
        second.since(first) >= Duration::from_millis(4_500),
        "the second failure came at least the backoff (less its jitter) after the first"
    );

    // Alone, an instance retries its own failures.
    let (clock, store) = setup();
    let alone = Attempts::default();
    let mut b = instance(store.clone(), clock.clone(), "alone");
    b.job("flaky", every(60))
        .unwrap()
        .retry(policy)
        .run(failing_first(&alone, 1))
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(30.0).await;
    scheduler.shutdown().await;
    assert_eq!(
        alone.lock().unwrap().len(),
        2,
        "{:?}",
        alone.lock().unwrap()
    );
    assert_eq!(history_of(&store, "flaky", 1).await[0].state, SUCCEEDED);
}

/// A retry that would come after the job's next slot is not made: the run
/// ends failed at once and its error says why; the next slot runs on time.
#[tokio::test(start_paused = true)]
async fn a_retry_is_never_made_past_the_next_slot() {
    use anarchon_core::RetryPolicy;
    let (clock, store) = setup();
    let seen = Attempts::default();
    let mut b = instance(store.clone(), clock.clone(), "a");
    b.job("flaky", every(60))
        .unwrap()
        .retry(RetryPolicy::new(3, Duration::from_secs(120)).unwrap())
        .run(failing_first(&seen, 1))
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(70.0).await;
    scheduler.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "two slots, one attempt each: {seen:?}");
    assert_ne!(seen[0].0, seen[1].0, "{seen:?}");
    let records = history_of(&store, "flaky", 2).await;
    let first = &records[1];
    assert_eq!(first.state, RecordState::Finished(FinalState::Failed));
    assert_eq!(first.retry_at, None);
    assert_eq!(
        first.error.as_deref(),
        Some(format!("attempt 1 failed{}", anarchon_core::retry::NOT_RETRIED).as_str())
    );
}

/// Retries are a lease-store option: a claim-only store refuses them by
/// name.
#[test]
fn retries_are_refused_on_a_claim_only_store() {
    let mut b = Scheduler::builder(Arc::new(ClaimOnlyStore::default()));
    let err = job_refused(&mut b, |j| {
        j.options(&job_options(|o| {
            o.retry = Some(anarchon_core::RetryPolicy::new(1, Duration::from_secs(1)).unwrap());
        }))
    });
    assert!(
        err.to_string().contains("retries"),
        "the refusal names the option: {err}"
    );
}

/// `Overlap::Replace`: a run still going when the next slot comes is
/// replaced — its handler is cancelled as fenced at its next heartbeat,
/// its record says `replaced` — and the new slot runs.
#[tokio::test(start_paused = true)]
async fn replace_cancels_the_run_still_going_and_runs_the_new_slot() {
    let (clock, store) = setup();
    type Stops = Arc<Mutex<Vec<(Slot, Option<CancelReason>)>>>;
    let seen = Stops::default();
    let mut b = instance(store.clone(), clock.clone(), "a");
    let noted = seen.clone();
    b.job("long", every(60))
        .unwrap()
        .overlap(Overlap::Replace)
        .run(move |ctx: RunContext| {
            let noted = noted.clone();
            async move {
                ctx.cancelled().await;
                noted
                    .lock()
                    .unwrap()
                    .push((ctx.slot(), ctx.cancel_reason()));
                Err::<(), _>("stopped")
            }
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(100.0).await;
    scheduler.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.first().map(|s| s.1),
        Some(Some(CancelReason::Fenced)),
        "the first run is fenced when the second slot replaces it: {seen:?}"
    );
    let records = history_of(&store, "long", 5).await;
    let first = records.last().unwrap();
    assert_eq!(
        first.state,
        RecordState::Finished(FinalState::Replaced),
        "{records:?}"
    );
    assert!(
        records.len() >= 2 && records.iter().rev().nth(1).unwrap().attempt.is_some(),
        "the second slot ran: {records:?}"
    );
}

/// `Overlap::BufferOne`: a slot that comes while the previous run is live
/// waits and runs when that run ends; with one slot waiting, the next one
/// is skipped.
#[tokio::test(start_paused = true)]
async fn buffer_one_runs_the_waiting_slot_when_the_live_run_ends() {
    let (clock, store) = setup();
    let started: HandlerStarts = Arc::default();
    let mut b = instance(store.clone(), clock.clone(), "a");
    let noted = started.clone();
    let test_clock = clock.clone();
    b.job("slow", every(60))
        .unwrap()
        .overlap(Overlap::BufferOne)
        .max_late(Duration::from_secs(90))
        .run(move |ctx: RunContext| {
            let noted = noted.clone();
            let clock = test_clock.clone();
            async move {
                let first = noted.lock().unwrap().is_empty();
                noted.lock().unwrap().push((ctx.slot(), clock.now()));
                if first {
                    // Through the next slot and the one after.
                    tokio::time::sleep(Duration::from_secs(130)).await;
                }
                Ok::<(), String>(())
            }
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(200.0).await;
    scheduler.shutdown().await;
    let started = started.lock().unwrap().clone();
    assert!(started.len() >= 2, "{started:?}");
    let (first, first_at) = started[0];
    let (second, second_at) = started[1];
    assert_eq!(second.at().since(first.at()), Duration::from_secs(60));
    assert!(
        second_at.since(first_at) >= Duration::from_secs(130),
        "the waiting slot started only after the live run ended: {started:?}"
    );
    let records = history_of(&store, "slow", 10).await;
    let third = records
        .iter()
        .find(|r| r.run.slot.at() == first.at().saturating_add(Duration::from_secs(120)))
        .expect("the third slot's record");
    assert_eq!(
        third.state,
        RecordState::Finished(FinalState::Skipped),
        "one slot waits; the next is skipped: {records:?}"
    );
}

/// A backfill of a job that skips overlapping runs and retries failures
/// runs its slots one at a time through their retries: each slot's first
/// attempt fails, its retry succeeds, and the next slot is not skipped for
/// the retry still pending.
#[tokio::test(start_paused = true)]
async fn a_backfill_waits_for_each_slots_retry_before_the_next() {
    use anarchon_core::RetryPolicy;
    let (clock, store) = setup();
    let seen = Attempts::default();
    let mut b = instance(store.clone(), clock.clone(), "a");
    b.job("bf", every(3600))
        .unwrap()
        .overlap(Overlap::Skip)
        .retry(RetryPolicy::new(1, Duration::from_secs(5)).unwrap())
        .run(failing_first(&seen, 1))
        .unwrap();
    let scheduler = b.start().unwrap();
    let range = request_backfill(
        &store,
        &clock,
        ("bf", "past"),
        Duration::from_secs(3 * 3600 + 60),
    )
    .await;
    sleep(120.0).await;
    scheduler.shutdown().await;
    let records = history_of(&store, "bf", 10).await;
    let backfilled: Vec<&RunRecord> = records
        .iter()
        .filter(|r| r.run.slot.at() <= range.to())
        .collect();
    assert_eq!(backfilled.len(), 3, "three past slots: {records:?}");
    for r in backfilled {
        assert_eq!(r.state, SUCCEEDED, "{records:?}");
        assert_eq!(r.attempt, Attempt::new(2), "failed once, retried: {r:?}");
    }
}

/// A memory store that loses the answer of the first backfill claim (one
/// that may start a `paused` slot), after the store took it, `delay` after
/// it was sent; while `renewals_fail`, every heartbeat fails.
struct LosesFirstBackfillAnswer {
    inner: Arc<MemoryStore>,
    lost: std::sync::atomic::AtomicBool,
    delay: Duration,
    renewals_fail: bool,
}

#[anarchon_core::async_trait]
impl LeaseLayer for LosesFirstBackfillAnswer {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn claim_lease(
        &self,
        req: &anarchon_core::LeaseClaim,
    ) -> Result<anarchon_core::ClaimOutcome, anarchon_core::StoreError> {
        let answer = self.inner.claim_lease(req).await;
        if req.rerun_paused && !self.lost.swap(true, std::sync::atomic::Ordering::SeqCst) {
            answer?;
            tokio::time::sleep(self.delay).await;
            return Err(anarchon_core::StoreError::unavailable(
                "test",
                "the answer was lost",
            ));
        }
        answer
    }

    async fn heartbeat(
        &self,
        run: &anarchon_core::RunKey,
        token: anarchon_core::Token,
        lease: Duration,
    ) -> Result<anarchon_core::Renewal, anarchon_core::StoreError> {
        if self.renewals_fail {
            return Err(anarchon_core::StoreError::unavailable(
                "test",
                "renewals fail",
            ));
        }
        self.inner.heartbeat(run, token, lease).await
    }
}

/// Asks `store` to backfill `job` (with request id `id`) from `from_ago`
/// before the clock's now to a minute before it; returns the range.
async fn request_backfill(
    store: &Arc<MemoryStore>,
    clock: &TestClock,
    (job, id): (&str, &str),
    from_ago: Duration,
) -> anarchon_core::Backfill {
    use anarchon_core::{Backfill, Control, RequestId, TriggerRequest};
    let now = clock.now();
    let range = Backfill::new(
        now.saturating_sub(from_ago),
        now.saturating_sub(Duration::from_secs(60)),
    )
    .unwrap();
    let job = anarchon_core::JobName::new(job).unwrap();
    Control::new(store.clone())
        .backfill(
            &TriggerRequest::backfill(job, RequestId::new(id).unwrap(), range),
            None,
        )
        .await
        .unwrap();
    range
}

/// A backfill claim whose answer was lost is sent again with its token: the
/// store took it, so the claim sent again is told it won, and the slot
/// runs at once as attempt 1.
///
/// Failed before the fix: the claim sent again had a new token, was told
/// the slot is running, and the slot ran only when that lease had run out,
/// as a takeover (attempt 2).
#[tokio::test(start_paused = true)]
async fn a_backfill_claim_whose_answer_was_lost_runs_its_slot_at_once() {
    let (slot, starts) = backfill_through_a_lost_answer(
        Duration::ZERO,
        false,
        (Duration::from_secs(60), Duration::from_secs(20)),
        20.0,
    )
    .await;
    assert_eq!(
        starts.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
        [(slot, 1)],
        "the backfilled slot ran once, at once, as attempt 1"
    );
}

/// A backfill claim sent again and told it won counts the lease from the
/// claim's first send, when the store's lease began: here the lost answer
/// came 5 s after the send and the claim went again 3 s later, past the
/// 6 s lease, so the handler must not start on that win (a backup could
/// hold the run by then): the win is handed over, and the run starts on
/// the next claim's own win, with a new fence.
///
/// Failed before the fix: the lease was counted from the second send, and
/// the handler started on the first win (fence 1) two seconds after its
/// lease had ended on the store.
#[tokio::test(start_paused = true)]
async fn a_backfill_win_told_late_counts_its_lease_from_the_first_send() {
    let (_, starts) = backfill_through_a_lost_answer(
        Duration::from_secs(5),
        true,
        (Duration::from_secs(6), Duration::from_secs(2)),
        12.0,
    )
    .await;
    let fences: Vec<u64> = starts.iter().map(|s| s.2).collect();
    assert!(!fences.is_empty(), "the slot ran");
    assert!(
        !fences.contains(&1),
        "a handler started on the first win, whose lease had ended: fences {fences:?}"
    );
}

/// Backfills the hour of half an hour ago of a job on a store that loses
/// the first backfill claim's answer `delay` after taking it (with every
/// heartbeat failing when `renewals_fail`), with this `(lease, heartbeat)`,
/// for `secs` of paused time. Returns the slot and each handler start's
/// slot, attempt and fence.
async fn backfill_through_a_lost_answer(
    delay: Duration,
    renewals_fail: bool,
    (lease, heartbeat): (Duration, Duration),
    secs: f64,
) -> (Slot, Vec<(Slot, u32, u64)>) {
    let (clock, store) = setup();
    let slot = Slot::from_millis(clock.now().as_millis() - 1_800_000);
    let layered = Arc::new(LosesFirstBackfillAnswer {
        inner: store.clone(),
        lost: std::sync::atomic::AtomicBool::new(false),
        delay,
        renewals_fail,
    });
    let starts: Arc<Mutex<Vec<(Slot, u32, u64)>>> = Arc::default();
    let mut b = instance(layered.clone(), clock.clone(), "a")
        .lease(lease)
        .heartbeat(heartbeat);
    let seen = starts.clone();
    b.job("backfilled", every(3600))
        .unwrap()
        .run(move |ctx: RunContext| {
            let fence = ctx.fence().map_or(0, |f| f.get());
            seen.lock()
                .unwrap()
                .push((ctx.slot(), ctx.attempt().get(), fence));
            async { Ok::<_, String>(()) }
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    // The clock of `setup` is at half past: the hour half an hour ago alone.
    request_backfill(
        &store,
        &clock,
        ("backfilled", "lost"),
        Duration::from_secs(3600),
    )
    .await;
    sleep(secs).await;
    scheduler.shutdown().await;
    assert!(
        layered.lost.load(std::sync::atomic::Ordering::SeqCst),
        "the backfill claimed"
    );
    let starts = starts.lock().unwrap().clone();
    (slot, starts)
}

/// Everything the start-before-finish test sees, in order: a handler
/// starting (`true`) or a finish reaching the store (`false`), by slot.
type StartsAndFinishes = Arc<Mutex<Vec<(Slot, bool)>>>;

/// A memory store that notes each finish in the shared log.
struct NotingFinishes {
    inner: Arc<MemoryStore>,
    log: StartsAndFinishes,
}

#[anarchon_core::async_trait]
impl LeaseLayer for NotingFinishes {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn finish(
        &self,
        run: &anarchon_core::RunKey,
        token: anarchon_core::Token,
        outcome: anarchon_core::RunOutcome,
    ) -> Result<anarchon_core::Renewal, anarchon_core::StoreError> {
        self.log.lock().unwrap().push((run.slot, false));
        self.inner.finish(run, token, outcome).await
    }
}

/// 300 per-second jobs whose handlers return at once, on one worker
/// thread of tokio's multi-threaded runtime (where a task woken by the task
/// that runs is run next, so a run that ended would record its outcome
/// between two starts). Every handler of a slot starts before any run of
/// that slot reaches the store with its outcome. Real time: the paused
/// clock needs the current-thread runtime, which never runs a woken task
/// ahead of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_handlers_due_at_one_instant_start_before_any_run_records_its_outcome() {
    const JOBS: usize = 300;
    let log: StartsAndFinishes = Arc::default();
    let store = Arc::new(NotingFinishes {
        inner: Arc::new(MemoryStore::new()),
        log: log.clone(),
    });
    let mut b = Scheduler::builder(store);
    for i in 0..JOBS {
        let log = log.clone();
        b.job(format!("burst-{i}"), every(1))
            .unwrap()
            .run(move |ctx| {
                log.lock().unwrap().push((ctx.slot(), true));
                async { Ok::<_, String>(()) }
            })
            .unwrap();
    }
    let scheduler = b.start().unwrap();
    // The first slot may be claimed late; the second and third are not.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    scheduler.shutdown().await;

    let log = log.lock().unwrap().clone();
    let mut slots: Vec<Slot> = log.iter().map(|(slot, _)| *slot).collect();
    slots.sort();
    slots.dedup();
    let full: Vec<Slot> = slots
        .into_iter()
        .filter(|slot| log.iter().filter(|(s, start)| s == slot && *start).count() == JOBS)
        .collect();
    assert!(
        full.len() >= 2,
        "fewer than two slots ran all {JOBS} jobs: {full:?}"
    );
    for slot in full {
        let last_start = log.iter().rposition(|(s, start)| *s == slot && *start);
        let first_finish = log.iter().position(|(s, start)| *s == slot && !*start);
        let (Some(last_start), Some(first_finish)) = (last_start, first_finish) else {
            panic!("slot {slot:?} has starts but no finish");
        };
        assert!(
            last_start < first_finish,
            "slot {slot:?}: a finish reached the store (entry {first_finish}) before the last handler started (entry {last_start})"
        );
    }
}
