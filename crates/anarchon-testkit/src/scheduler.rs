//! Scheduler-level checks: whole schedulers, several per store, as a
//! fleet of instances would run them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    Attempt, CancelReason, ClaimStore, Clock, Fence, LeaseStore, Schedule, Scheduler, Slot,
    Timestamp,
};
use tokio::time::Instant;

use crate::clock::TestClock;
use crate::factory::StoreFactory;
use crate::stores::Faulty;

/// How long a check waits for something a healthy scheduler does within
/// seconds, before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

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

/// Waits for the frozen run to start and returns its entry.
async fn wait_for_frozen(log: &Log, frozen: &FrozenRun) -> Started {
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

/// Three schedulers on one store run a per-second job: every slot from the
/// first to the last one seen ran its handler exactly once.
pub async fn schedulers_run_each_slot_once<F: StoreFactory>(factory: &F) {
    const SLOTS: usize = 5;
    let log = log();
    let mut schedulers = Vec::new();
    for index in 0..3 {
        let store = factory.instance().await;
        let mut builder = Scheduler::builder(store).clock(factory.clock());
        let log = log.clone();
        builder
            .job(
                "every-second",
                Schedule::every(Duration::from_secs(1)).expect("1 s"),
            )
            .expect("job")
            .run(move |ctx| {
                let log = log.clone();
                async move {
                    log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
                        slot: ctx.slot(),
                        attempt: ctx.attempt(),
                        fence: ctx.fence(),
                        scheduler: index,
                        job: ctx.job().to_string(),
                        at: Instant::now(),
                    });
                    Ok::<_, String>(())
                }
            })
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    let distinct = |e: &[Started]| {
        let mut slots: Vec<Slot> = e.iter().map(|s| s.slot).collect();
        slots.dedup();
        slots.len()
    };
    wait_for(&log, "five slots to run", |e| distinct(e) > SLOTS).await;
    for s in schedulers {
        s.shutdown().await;
    }
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

/// A runner whose heartbeats stop cancels its own handler, and a backup
/// takes the run over (attempt 2, a larger fence) within lease + heartbeat
/// of the heartbeats stopping.
pub async fn backup_takes_over_when_heartbeats_stop<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let lease = Duration::from_millis(600);
    let heartbeat = Duration::from_millis(200);
    let log = log();
    let cancelled: Arc<Mutex<Option<(CancelReason, Instant)>>> = Arc::default();
    let frozen = FrozenRun::default();
    let mut handles = Vec::new();
    let mut schedulers = Vec::new();
    for index in 0..2 {
        let store = Faulty::new(factory.instance().await);
        handles.push(store.clone());
        let mut builder = Scheduler::builder(store)
            .clock(factory.clock())
            .lease(lease)
            .heartbeat(heartbeat);
        let (log, cancelled, frozen) = (log.clone(), cancelled.clone(), frozen.clone());
        builder
            .job(
                "long-runner",
                Schedule::every(Duration::from_secs(1)).expect("1 s"),
            )
            .expect("job")
            .run(move |ctx| {
                let (log, cancelled, frozen) = (log.clone(), cancelled.clone(), frozen.clone());
                async move {
                    log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
                        slot: ctx.slot(),
                        attempt: ctx.attempt(),
                        fence: ctx.fence(),
                        scheduler: index,
                        job: ctx.job().to_string(),
                        at: Instant::now(),
                    });
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
    frozen.arm(factory.clock().as_ref());
    let first = wait_for_frozen(&log, &frozen).await;
    handles[first.scheduler].set_heartbeats_down(true);
    let cut = Instant::now();
    wait_for(&log, "a takeover of the frozen run", |e| {
        e.iter()
            .any(|s| s.slot == first.slot && s.attempt > Attempt::FIRST)
    })
    .await;
    let second = entries(&log)
        .into_iter()
        .find(|s| s.slot == first.slot && s.attempt > Attempt::FIRST)
        .expect("takeover");
    for s in schedulers {
        s.shutdown().await;
    }
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
    let delay = second.at.duration_since(cut);
    assert!(
        delay <= lease + heartbeat,
        "takeover took {delay:?} after heartbeats stopped; the bound is lease + heartbeat = {:?}",
        lease + heartbeat
    );
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
                let log = log.clone();
                builder
                    .job(
                        name,
                        Schedule::cron_in(expr, "Europe/Athens").expect("cron"),
                    )
                    .expect("job")
                    .run(move |ctx| {
                        let log = log.clone();
                        async move {
                            log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
                                slot: ctx.slot(),
                                attempt: ctx.attempt(),
                                fence: ctx.fence(),
                                scheduler: index,
                                job: ctx.job().to_string(),
                                at: Instant::now(),
                            });
                            Ok::<_, String>(())
                        }
                    })
                    .expect("handler");
            }
            schedulers.push(builder.start().expect("start"));
        }
        // Live through the local day.
        tokio::time::sleep(Duration::from_secs(u64::from(hours) * 3600 + 60)).await;
        for s in schedulers {
            s.shutdown().await;
        }
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
    let mut handles = Vec::new();
    let mut schedulers = Vec::new();
    for index in 0..2 {
        let store = Faulty::new(factory.instance().await);
        handles.push(store.clone());
        let mut builder = Scheduler::builder(store)
            .clock(factory.clock())
            .lease(lease)
            .heartbeat(heartbeat);
        let (log, resource, resume, stale_write, frozen) = (
            log.clone(),
            resource.clone(),
            resume.clone(),
            stale_write.clone(),
            frozen.clone(),
        );
        builder
            .job(
                "fenced-writer",
                Schedule::every(Duration::from_secs(1)).expect("1 s"),
            )
            .expect("job")
            .run(move |ctx| {
                let (log, resource, resume, stale_write, frozen) = (
                    log.clone(),
                    resource.clone(),
                    resume.clone(),
                    stale_write.clone(),
                    frozen.clone(),
                );
                async move {
                    let fence = ctx.fence().expect("lease stores give fences");
                    if !frozen.is_frozen(ctx.slot(), ctx.attempt()) {
                        if frozen.slot() == Some(ctx.slot()) {
                            resource.write(fence, "the new runner");
                        }
                        log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
                            slot: ctx.slot(),
                            attempt: ctx.attempt(),
                            fence: ctx.fence(),
                            scheduler: index,
                            job: ctx.job().to_string(),
                            at: Instant::now(),
                        });
                        return Ok::<_, String>(());
                    }
                    log.lock().unwrap_or_else(|p| p.into_inner()).push(Started {
                        slot: ctx.slot(),
                        attempt: ctx.attempt(),
                        fence: ctx.fence(),
                        scheduler: index,
                        job: ctx.job().to_string(),
                        at: Instant::now(),
                    });
                    assert!(resource.write(fence, "the first runner, before the pause"));
                    // Paused: deaf to cancellation until the test wakes it.
                    resume.notified().await;
                    *stale_write.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(resource.write(fence, "the first runner, after the pause"));
                    Ok(())
                }
            })
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    frozen.arm(factory.clock().as_ref());
    let first = wait_for_frozen(&log, &frozen).await;
    handles[first.scheduler].set_heartbeats_hang(true);
    let paused = Instant::now();
    wait_for(&log, "a takeover of the paused run", |e| {
        e.iter()
            .any(|s| s.slot == first.slot && s.attempt > Attempt::FIRST)
    })
    .await;
    let taken = Instant::now();
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
    for s in schedulers {
        s.shutdown().await;
    }
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
    assert!(
        taken.duration_since(paused) <= lease + heartbeat,
        "takeover took {:?}",
        taken.duration_since(paused)
    );
}
