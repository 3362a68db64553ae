//! Scheduler-level checks: whole schedulers, several per store, as a
//! fleet of instances would run them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    Attempt, CancelReason, ClaimStore, Clock, Fence, LeaseStore, RunContext, Schedule, Scheduler,
    SchedulerBuilder, Slot, Timestamp,
};
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::clock::TestClock;
use crate::factory::StoreFactory;
use crate::stores::Faulty;

/// How long a check waits for something a healthy scheduler does within
/// seconds, before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// What a loaded test machine may add to a takeover's time in these checks.
/// They time the takeover from the runner's last renewal, so a backup
/// that waited a second lease still fails them; how close to the lease
/// end a takeover comes is measured by `cargo xtask bench` (its takeover
/// target), where a shared machine's stalls cannot fail a build.
const MACHINE_SLACK: Duration = Duration::from_millis(500);

/// Checks that a backup's handler started (`taken`) within a lease, plus
/// [`MACHINE_SLACK`], of the runner's lease last starting: its last
/// renewal sent through `runner`, or, when none was renewed, its own
/// handler start (`first`, just after its claim).
fn assert_taken_over_within_a_lease<S: LeaseStore>(
    runner: &Faulty<S>,
    first: &Started,
    taken: Instant,
    lease: Duration,
) {
    let since = runner.last_renewal_sent().unwrap_or(first.at);
    let delay = taken.saturating_duration_since(since);
    assert!(
        delay <= lease + MACHINE_SLACK,
        "the backup took over {delay:?} after the runner's lease last started; the bound is \
         the lease ({lease:?}) plus {MACHINE_SLACK:?} for a loaded machine"
    );
}

/// One handler start, as recorded by the checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// The slot.
    pub slot: Slot,
    /// The attempt.
    pub attempt: Attempt,
    /// The fence.
    pub fence: Option<Fence>,
    /// Which scheduler (index in the check).
    pub scheduler: usize,
    /// The job.
    pub job: String,
    /// When the handler started (tokio's clock).
    pub at: Instant,
}

type Log = Arc<Mutex<Vec<Started>>>;

/// Picks the one run a takeover check freezes: the first run of a slot at
/// or after a point set once every scheduler has started. A slot that
/// comes earlier may have been claimed before the last scheduler was
/// watching, and then nobody would be there to take it over.
#[derive(Clone, Default)]
struct FrozenRun {
    from: Arc<Mutex<Option<Slot>>>,
    slot: Arc<Mutex<Option<Slot>>>,
}

impl FrozenRun {
    /// Arms the choice: slots that start at least a second and a half from
    /// now (by `clock`) can be frozen.
    fn arm(&self, clock: &dyn Clock) {
        let from = clock.now().saturating_add(Duration::from_millis(1500));
        *self.from.lock().unwrap_or_else(|p| p.into_inner()) = Some(Slot::from(from));
    }

    /// Whether this handler start is the frozen run: the first attempt of
    /// the first slot after the armed point.
    fn is_frozen(&self, slot: Slot, attempt: Attempt) -> bool {
        let Some(from) = *self.from.lock().unwrap_or_else(|p| p.into_inner()) else {
            return false;
        };
        if slot < from {
            return false;
        }
        let mut frozen = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        let frozen = *frozen.get_or_insert(slot);
        frozen == slot && attempt == Attempt::FIRST
    }

    /// The frozen slot, once a handler has started it.
    fn slot(&self) -> Option<Slot> {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

fn entries(log: &Log) -> Vec<Started> {
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Waits until `done` holds for the log, or fails after [`PATIENCE`].
async fn wait_for(log: &Log, what: &str, done: impl Fn(&[Started]) -> bool) {
    let start = Instant::now();
    loop {
        if done(&entries(log)) {
            return;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "gave up waiting for {what}; handlers started: {:?}",
            entries(log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Arms `frozen` on `clock`, waits for the frozen run to start and returns
/// its entry.
async fn wait_for_frozen(log: &Log, frozen: &FrozenRun, clock: &dyn Clock) -> Started {
    frozen.arm(clock);
    wait_for(log, "the frozen run to start", |e| {
        frozen
            .slot()
            .is_some_and(|slot| e.iter().any(|s| s.slot == slot))
    })
    .await;
    let slot = frozen.slot().expect("waited for it");
    entries(log)
        .into_iter()
        .find(|s| s.slot == slot)
        .expect("waited for it")
}

/// Waits for a later attempt of `first`'s slot to start (`what` names it
/// in the failure), and returns its entry.
async fn wait_for_takeover(log: &Log, what: &str, first: &Started) -> Started {
    let is_takeover = |s: &Started| s.slot == first.slot && s.attempt > Attempt::FIRST;
    wait_for(log, what, |e| e.iter().any(is_takeover)).await;
    entries(log)
        .into_iter()
        .find(is_takeover)
        .expect("waited for it")
}

/// Records in `log` that the handler of `ctx` started, on the scheduler at
/// `scheduler` in the check.
fn note_start(log: &Log, ctx: &RunContext, scheduler: usize) {
    log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
        slot: ctx.slot(),
        attempt: ctx.attempt(),
        fence: ctx.fence(),
        scheduler,
        job: ctx.job().to_string(),
        at: Instant::now(),
    });
}

/// A handler that records each start in `log`, as the scheduler at
/// `index`, and succeeds.
fn noting_starts(
    log: &Log,
    index: usize,
) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
    let log = log.clone();
    move |ctx| {
        let log = log.clone();
        Box::pin(async move {
            note_start(&log, &ctx, index);
            Ok(())
        })
    }
}

fn every_second() -> Schedule {
    Schedule::every(Duration::from_secs(1)).expect("1 s")
}

async fn shut_down_all(schedulers: Vec<Scheduler>) {
    for s in schedulers {
        s.shutdown().await;
    }
}

/// Two instances of `factory`'s store behind fault wrappers (the handles,
/// by index), and a scheduler builder on each, holding leases of `lease`
/// renewed every `heartbeat`: the runner and the backup of a takeover
/// check.
async fn leased_pair<F: StoreFactory>(
    factory: &F,
    lease: Duration,
    heartbeat: Duration,
) -> (
    Vec<Arc<Faulty<F::Store>>>,
    Vec<SchedulerBuilder<Faulty<F::Store>>>,
)
where
    F::Store: LeaseStore,
{
    let mut handles = Vec::new();
    let mut builders = Vec::new();
    for _ in 0..2 {
        let store = Faulty::new(factory.instance().await);
        handles.push(store.clone());
        builders.push(
            Scheduler::builder(store)
                .clock(factory.clock())
                .lease(lease)
                .heartbeat(heartbeat),
        );
    }
    (handles, builders)
}

/// Three schedulers, each on its own instance of `factory`'s store, with
/// the one job `name` on `schedule`, noting their starts in `log`.
async fn three_schedulers<F: StoreFactory>(
    factory: &F,
    name: &str,
    schedule: &Schedule,
    log: &Log,
) -> Vec<Scheduler> {
    let mut schedulers = Vec::new();
    for index in 0..3 {
        let store = factory.instance().await;
        let mut builder = Scheduler::builder(store).clock(factory.clock());
        builder
            .job(name, schedule.clone())
            .expect("job")
            .run(noting_starts(log, index))
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    schedulers
}

/// Three schedulers on one store run a per-second job: every slot from the
/// first to the last one seen ran its handler exactly once.
pub async fn schedulers_run_each_slot_once<F: StoreFactory>(factory: &F) {
    const SLOTS: usize = 5;
    let log = log();
    let schedulers = three_schedulers(factory, "every-second", &every_second(), &log).await;
    let distinct = |e: &[Started]| {
        let mut slots: Vec<Slot> = e.iter().map(|s| s.slot).collect();
        slots.dedup();
        slots.len()
    };
    wait_for(&log, "five slots to run", |e| distinct(e) > SLOTS).await;
    shut_down_all(schedulers).await;
    let mut runs: BTreeMap<Slot, Vec<usize>> = BTreeMap::new();
    for e in entries(&log) {
        runs.entry(e.slot).or_default().push(e.scheduler);
    }
    let first = *runs.keys().next().expect("slots ran");
    let last = *runs.keys().last().expect("slots ran");
    let mut slot = first;
    while slot <= last {
        let ran = runs.get(&slot).map_or(0, Vec::len);
        assert_eq!(ran, 1, "slot {slot} ran {ran} times: {runs:?}");
        slot = Slot::from_millis(slot.as_millis() + 1000);
    }
}

/// An operator's trigger, sent twice with one id and once with another
/// from a process that runs no scheduler, gives exactly two manual runs
/// among three schedulers of the job: one handler start each, none for the
/// repeated id.
pub async fn a_trigger_runs_once_among_the_schedulers<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let log = log();
    // New Year's midnight only: every start in the check is manual.
    let yearly = Schedule::cron("0 0 1 1 *").expect("cron");
    let schedulers = three_schedulers(factory, "on-demand", &yearly, &log).await;
    let operator = anarchon_core::Control::new(factory.instance().await);
    let job = anarchon_core::JobName::new("on-demand").expect("job");
    let press = anarchon_core::RequestId::new("press-1").expect("id");
    let pressed = anarchon_core::TriggerRequest::new(job.clone(), press);
    let first = operator.trigger(&pressed).await.expect("trigger");
    let again = operator.trigger(&pressed).await.expect("trigger");
    assert_eq!(first, again, "one id is one request");
    let other = anarchon_core::RequestId::new("press-2").expect("id");
    let second = operator
        .trigger(&anarchon_core::TriggerRequest::new(job, other))
        .await
        .expect("trigger");
    wait_for(&log, "both manual runs to start", |e| {
        [first.news().slot, second.news().slot]
            .iter()
            .all(|slot| e.iter().any(|s| s.slot == *slot))
    })
    .await;
    // Give a duplicate every chance to show before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    shut_down_all(schedulers).await;
    let starts = entries(&log);
    assert_eq!(
        starts.len(),
        2,
        "two requests, two runs, each on one scheduler: {starts:?}"
    );
    assert!(
        starts
            .iter()
            .all(|s| s.slot.is_manual() && s.attempt == Attempt::FIRST)
    );
}

/// A backfill over six past slots of a per-second job, asked by a process
/// that runs no scheduler, runs among three schedulers each slot that has
/// no record or a `missed` or `paused` one, once, oldest first, and not the
/// slot that already ran.
pub async fn a_backfill_runs_each_slot_that_never_ran_once<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    use anarchon_core::{
        Backfill, ClaimOutcome, Control, JobName, LeaseClaim, MaxAttempts, Overlap, RequestId,
        RunKey, RunOutcome, Token, TriggerRequest,
    };
    let name = "backfilled";
    let job = JobName::new(name).expect("job");
    let operator = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let base = now - now.rem_euclid(1000) - 10_000;
    let slot = |i: i64| Slot::from_millis(base + i * 1000);
    let claim = |i: i64, max_late: Duration| LeaseClaim {
        claim: anarchon_core::ClaimRequest {
            run: RunKey::new(job.clone(), slot(i)),
            token: Token::generate(),
            instance: anarchon_core::InstanceId::new("operator").expect("id"),
            max_late,
        },
        lease: Duration::from_secs(30),
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    };
    // Slot 1 ran; slot 2 was missed.
    let ran = claim(1, Duration::from_secs(3600));
    assert!(matches!(
        operator.claim_lease(&ran).await.expect("claim"),
        ClaimOutcome::Won(_)
    ));
    operator
        .finish(&ran.claim.run, ran.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    let late = claim(2, Duration::ZERO);
    assert_eq!(
        operator.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Missed
    );
    // Slot 3 was claimed while the job was paused.
    let scope = anarchon_core::PauseScope::Job(job.clone());
    operator
        .pause(&scope, &anarchon_core::PauseRequest::new())
        .await
        .expect("pause");
    assert_eq!(
        operator
            .claim_lease(&claim(3, Duration::from_secs(3600)))
            .await
            .expect("claim"),
        ClaimOutcome::Done(anarchon_core::FinalState::Paused)
    );
    operator.resume(&scope).await.expect("resume");

    let log = log();
    let schedulers = three_schedulers(factory, name, &every_second(), &log).await;
    let range = Backfill::new(slot(0).at(), slot(5).at()).expect("range");
    let request = TriggerRequest::backfill(job, RequestId::new("fill-1").expect("id"), range);
    let stored = Control::new(operator)
        .backfill(&request, None)
        .await
        .expect("backfill");
    assert_eq!(stored.backfill, Some(range));
    assert_eq!(stored.run(), None, "a backfill has no manual run");
    // 0, 4 and 5 had no record, 2 was missed, 3 was paused.
    let wanted: Vec<Slot> = [0, 2, 3, 4, 5].into_iter().map(slot).collect();
    wait_for(&log, "the backfilled slots to run", |e| {
        wanted.iter().all(|w| e.iter().any(|s| s.slot == *w))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    shut_down_all(schedulers).await;
    let backfilled: Vec<Slot> = entries(&log)
        .into_iter()
        .map(|s| s.slot)
        .filter(|s| *s <= slot(5))
        .collect();
    let mut sorted = backfilled.clone();
    sorted.sort();
    assert_eq!(
        sorted, wanted,
        "each slot that never ran runs once, the one that ran does not: {backfilled:?}"
    );
    assert_eq!(
        backfilled, wanted,
        "a backfill runs its slots oldest first, one at a time"
    );
}

/// A runner whose heartbeats stop cancels its own handler, and a backup
/// takes the run over (attempt 2, a larger fence) within a lease of the
/// runner's last renewal (so within lease + heartbeat of the heartbeats
/// stopping), plus half a second for a loaded machine.
pub async fn backup_takes_over_when_heartbeats_stop<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let lease = Duration::from_millis(600);
    let heartbeat = Duration::from_millis(200);
    let log = log();
    let cancelled: Arc<Mutex<Option<(CancelReason, Instant)>>> = Arc::default();
    let frozen = FrozenRun::default();
    let (handles, builders) = leased_pair(factory, lease, heartbeat).await;
    let mut schedulers = Vec::new();
    for (index, mut builder) in builders.into_iter().enumerate() {
        let (log, cancelled, frozen) = (log.clone(), cancelled.clone(), frozen.clone());
        builder
            .job("long-runner", every_second())
            .expect("job")
            .run(move |ctx| {
                let (log, cancelled, frozen) = (log.clone(), cancelled.clone(), frozen.clone());
                async move {
                    note_start(&log, &ctx, index);
                    // The frozen run hangs until it is told to stop, and
                    // then says it did not finish its work.
                    if frozen.is_frozen(ctx.slot(), ctx.attempt()) {
                        ctx.cancelled().await;
                        let reason = ctx.cancel_reason().expect("reason");
                        *cancelled.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((reason, Instant::now()));
                        return Err(format!("stopped early: {reason}"));
                    }
                    Ok::<_, String>(())
                }
            })
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    let first = wait_for_frozen(&log, &frozen, factory.clock().as_ref()).await;
    handles[first.scheduler].set_heartbeats_down(true);
    let cut = Instant::now();
    let second = wait_for_takeover(&log, "a takeover of the frozen run", &first).await;
    shut_down_all(schedulers).await;
    assert_eq!(second.attempt, first.attempt.next());
    assert_ne!(
        second.scheduler, first.scheduler,
        "the backup, not the runner, takes over"
    );
    assert!(second.fence > first.fence, "{first:?} -> {second:?}");
    let (reason, cancelled_at) = cancelled
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .expect("the stalled runner's handler was cancelled");
    assert_eq!(reason, CancelReason::LostContact);
    assert!(
        cancelled_at <= second.at,
        "the runner must stop before the backup's handler starts: cancelled {:?} after it",
        cancelled_at.duration_since(second.at)
    );
    assert!(
        second.at >= cut,
        "the takeover came after the heartbeats stopped"
    );
    assert_taken_over_within_a_lease(&handles[first.scheduler], &first, second.at, lease);
}

/// Two schedulers over a store on a [`TestClock`] live through the
/// Europe/Athens spring-forward day (2027-03-28) and fall-back day
/// (2027-10-31): a fixed local time fires once each day, an hourly job fires
/// once per real hour (23 and 25 times), and no slot runs twice.
///
/// Needs tokio's paused clock and a store whose clock is the one given to
/// `store` (so: in-process stores).
pub async fn dst_days_fire_each_local_slot_once<S, M>(store: M)
where
    S: ClaimStore,
    M: Fn(Arc<dyn Clock>) -> Arc<S>,
{
    for (day_start_utc, hours) in [
        // 2027-03-28 00:00 EET = 2027-03-27 22:00 UTC
        (Timestamp::from_millis(1_806_184_800_000), 23u32),
        // 2027-10-31 00:00 EEST = 2027-10-30 21:00 UTC
        (Timestamp::from_millis(1_824_930_000_000), 25),
    ] {
        let clock =
            TestClock::starting_at(Timestamp::from_millis(day_start_utc.as_millis() - 1000));
        let store = store(clock.clone());
        let log = log();
        let mut schedulers = Vec::new();
        for index in 0..2 {
            let mut builder = Scheduler::builder(store.clone()).clock(clock.clone());
            for (name, expr) in [("fixed", "30 3 * * *"), ("hourly", "0 * * * *")] {
                builder
                    .job(
                        name,
                        Schedule::cron_in(expr, "Europe/Athens").expect("cron"),
                    )
                    .expect("job")
                    .run(noting_starts(&log, index))
                    .expect("handler");
            }
            schedulers.push(builder.start().expect("start"));
        }
        // Live through the local day.
        tokio::time::sleep(Duration::from_secs(u64::from(hours) * 3600 + 60)).await;
        shut_down_all(schedulers).await;
        let day_end = day_start_utc.as_millis() + i64::from(hours) * 3_600_000;
        let runs: Vec<Started> = entries(&log)
            .into_iter()
            .filter(|s| {
                s.slot.as_millis() >= day_start_utc.as_millis() && s.slot.as_millis() < day_end
            })
            .collect();
        let fixed: Vec<Slot> = runs
            .iter()
            .filter(|s| s.job == "fixed")
            .map(|s| s.slot)
            .collect();
        let mut hourly: Vec<Slot> = runs
            .iter()
            .filter(|s| s.job == "hourly")
            .map(|s| s.slot)
            .collect();
        hourly.sort();
        assert_eq!(fixed.len(), 1, "the fixed local time fires once: {fixed:?}");
        let n = hourly.len();
        hourly.dedup();
        assert_eq!(hourly.len(), n, "no hourly slot ran twice");
        assert_eq!(
            n, hours as usize,
            "an hourly job fires once per real hour of the local day"
        );
    }
}

/// What the handlers of [`a_paused_runner_cannot_write_after_a_takeover`]
/// share with the check.
#[derive(Clone)]
struct PausedWriter {
    log: Log,
    resource: Arc<crate::stores::FencedResource>,
    resume: Arc<tokio::sync::Notify>,
    stale_write: Arc<Mutex<Option<bool>>>,
    frozen: FrozenRun,
}

impl PausedWriter {
    /// One handler run on the scheduler at `index`: the frozen run writes,
    /// pauses (deaf to cancellation) until the check wakes it, and writes
    /// again with its old fence; the takeover of that slot writes once.
    async fn write(self, ctx: RunContext, index: usize) -> Result<(), String> {
        let Self {
            log,
            resource,
            resume,
            stale_write,
            frozen,
        } = self;
        let fence = ctx.fence().expect("lease stores give fences");
        if !frozen.is_frozen(ctx.slot(), ctx.attempt()) {
            if frozen.slot() == Some(ctx.slot()) {
                resource.write(fence, "the new runner");
            }
            note_start(&log, &ctx, index);
            return Ok(());
        }
        note_start(&log, &ctx, index);
        assert!(resource.write(fence, "the first runner, before the pause"));
        // Paused: deaf to cancellation until the test wakes it.
        resume.notified().await;
        *stale_write.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(resource.write(fence, "the first runner, after the pause"));
        Ok(())
    }
}

/// The scheduler checks every store passes, as one test each.
#[doc(hidden)]
#[macro_export]
macro_rules! __scheduler_claim_checks {
    ($factory:expr, $attr:meta) => {
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::scheduler,
            schedulers_run_each_slot_once,
        );
    };
}

/// The scheduler checks lease stores pass, as one test each.
#[doc(hidden)]
#[macro_export]
macro_rules! __scheduler_lease_checks {
    ($factory:expr, $attr:meta) => {
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::scheduler,
            backup_takes_over_when_heartbeats_stop,
            a_paused_runner_cannot_write_after_a_takeover,
            a_trigger_runs_once_among_the_schedulers,
            a_backfill_runs_each_slot_that_never_ran_once,
        );
    };
}

/// A runner that is paused past its lease (its heartbeats hang, its handler
/// ignores the cancellation) is taken over; when it wakes up, the write it
/// makes with its old fence is refused by a resource that checks fences,
/// while the new runner's write, with a larger fence, is accepted.
pub async fn a_paused_runner_cannot_write_after_a_takeover<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    use crate::stores::FencedResource;
    let lease = Duration::from_millis(600);
    let heartbeat = Duration::from_millis(150);
    let resource = Arc::new(FencedResource::default());
    let resume = Arc::new(tokio::sync::Notify::new());
    let log = log();
    let stale_write: Arc<Mutex<Option<bool>>> = Arc::default();
    let frozen = FrozenRun::default();
    let writer = PausedWriter {
        log: log.clone(),
        resource: resource.clone(),
        resume: resume.clone(),
        stale_write: stale_write.clone(),
        frozen: frozen.clone(),
    };
    let (handles, builders) = leased_pair(factory, lease, heartbeat).await;
    let mut schedulers = Vec::new();
    for (index, mut builder) in builders.into_iter().enumerate() {
        let writer = writer.clone();
        builder
            .job("fenced-writer", every_second())
            .expect("job")
            .run(move |ctx| writer.clone().write(ctx, index))
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    let first = wait_for_frozen(&log, &frozen, factory.clock().as_ref()).await;
    handles[first.scheduler].set_heartbeats_hang(true);
    let paused = Instant::now();
    // When the new runner's handler started, not when the poll saw it (the
    // log is read every 20 ms, later on a loaded machine).
    let taken = wait_for_takeover(&log, "a takeover of the paused run", &first)
        .await
        .at;
    resume.notify_one();
    let start = Instant::now();
    while stale_write
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_none()
    {
        assert!(start.elapsed() < PATIENCE, "the paused runner never woke");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handles[first.scheduler].set_heartbeats_hang(false);
    shut_down_all(schedulers).await;
    assert_eq!(
        *stale_write.lock().unwrap_or_else(|p| p.into_inner()),
        Some(false),
        "the stale runner's write must be refused: {:?}",
        resource.accepted()
    );
    let accepted = resource.accepted();
    assert!(
        accepted.iter().any(|(_, w)| w == "the new runner"),
        "{accepted:?}"
    );
    assert!(taken >= paused, "the takeover came after the pause");
    assert_taken_over_within_a_lease(&handles[first.scheduler], &first, taken, lease);
}
