//! Alerts: each run that ends failed, interrupted or missed is told to the
//! hook of exactly one instance of a fleet, the one that recorded the end.
//! Three schedulers share a memory store and a controllable clock; tokio's
//! time is paused, so every wait is exact.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    Alert, AlertKind, Attempt, ClaimRequest, Clock, InstanceId, JobName, LeaseClaim, LeaseStore,
    MaxAttempts, MemoryStore, RetryPolicy, RunKey, Schedule, Scheduler, SchedulerBuilder, Slot,
    Timestamp, Token,
};
use anarchon_testkit::TestClock;

/// The alerts raised by every scheduler of a test.
type Raised = Arc<Mutex<Vec<Alert>>>;

/// How many schedulers race in each test.
const FLEET: usize = 3;

/// A clock on a whole minute half-way through an hour, and a memory store
/// on it.
fn setup() -> (Arc<TestClock>, Arc<MemoryStore>) {
    let now = anarchon_core::SystemClock.now().as_millis();
    let half_past = now - now.rem_euclid(3_600_000) + 1_800_000;
    let clock = TestClock::starting_at(Timestamp::from_millis(half_past));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    (clock, store)
}

/// Scheduler `i` of the fleet, its alerts going to `raised`.
fn member(
    store: &Arc<MemoryStore>,
    clock: &Arc<TestClock>,
    i: usize,
    raised: &Raised,
) -> SchedulerBuilder<MemoryStore> {
    let raised = raised.clone();
    Scheduler::builder(store.clone())
        .clock(clock.clone())
        .instance_id(InstanceId::new(&format!("member-{i}")).unwrap())
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1))
        .on_alert(move |alert| raised.lock().unwrap().push(alert))
}

fn minutely() -> Schedule {
    Schedule::every(Duration::from_secs(60)).unwrap()
}

/// The alerts raised, by slot: the kinds, and who raised them.
fn by_slot(raised: &Raised) -> BTreeMap<Slot, Vec<(AlertKind, String)>> {
    let mut map: BTreeMap<Slot, Vec<_>> = BTreeMap::new();
    for alert in raised.lock().unwrap().iter() {
        map.entry(alert.run.slot)
            .or_default()
            .push((alert.kind, alert.instance.as_str().to_owned()));
    }
    map
}

async fn sleep(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

async fn shut_down(fleet: Vec<Scheduler>) {
    for scheduler in fleet {
        scheduler.shutdown().await;
    }
}

/// The clock jumps ten minutes: every instance passes over the same nine
/// slots, and each one's miss is told once, by the instance whose claim
/// recorded it.
#[tokio::test(start_paused = true)]
async fn each_missed_slot_is_alerted_once_across_the_fleet() {
    let (clock, store) = setup();
    let raised = Raised::default();
    let fleet: Vec<Scheduler> = (0..FLEET)
        .map(|i| {
            let mut b = member(&store, &clock, i, &raised);
            b.job("minutely", minutely())
                .unwrap()
                .run(|_| async { Ok::<(), String>(()) })
                .unwrap();
            b.start().unwrap()
        })
        .collect();
    sleep(1.0).await;
    let first = clock.now().as_millis() - clock.now().as_millis() % 60_000;
    clock.step(true, Duration::from_secs(600));
    sleep(3.0).await;
    shut_down(fleet).await;
    let alerts = by_slot(&raised);
    let missed: Vec<i64> = (1..10).map(|m| first + m * 60_000).collect();
    assert_eq!(
        alerts.keys().map(|s| s.as_millis()).collect::<Vec<_>>(),
        missed,
        "one entry per passed-over slot, none for the slots that ran: {alerts:?}"
    );
    for (slot, told) in &alerts {
        assert_eq!(told.len(), 1, "slot {slot} told once: {told:?}");
        assert_eq!(told[0].0, AlertKind::Missed);
    }
}

/// A failure with no retry is told once, by its runner, with the error; a
/// failure that will be retried is not an end, so only the retry's failure
/// is told; a success is never told.
#[tokio::test(start_paused = true)]
async fn only_a_final_failure_is_alerted_once_by_its_runner() {
    let (clock, store) = setup();
    let raised = Raised::default();
    let fleet: Vec<Scheduler> = (0..FLEET)
        .map(|i| {
            let mut b = member(&store, &clock, i, &raised);
            b.job("fails", minutely())
                .unwrap()
                .run(|_| async { Err::<(), _>("disk full") })
                .unwrap();
            b.job("fails-twice", minutely())
                .unwrap()
                .retry(RetryPolicy::new(1, Duration::from_secs(2)).unwrap())
                .run(|_| async { Err::<(), _>("still full") })
                .unwrap();
            b.job("fine", minutely())
                .unwrap()
                .run(|_| async { Ok::<(), String>(()) })
                .unwrap();
            b.start().unwrap()
        })
        .collect();
    // The clock starts on a whole minute: each job's slot is due at once.
    sleep(30.0).await;
    shut_down(fleet).await;
    let raised = raised.lock().unwrap().clone();
    let of = |job: &str| -> Vec<&Alert> {
        raised
            .iter()
            .filter(|a| a.run.job.as_str() == job)
            .collect()
    };
    let fails = of("fails");
    assert_eq!(fails.len(), 1, "{raised:?}");
    assert_eq!(fails[0].kind, AlertKind::Failed);
    assert_eq!(fails[0].attempt, Some(Attempt::FIRST));
    assert_eq!(fails[0].error.as_deref(), Some("disk full"));
    let twice = of("fails-twice");
    assert_eq!(
        twice.len(),
        1,
        "only the retry's failure ends the run: {raised:?}"
    );
    assert_eq!(twice[0].attempt, Some(Attempt::FIRST.next()));
    assert_eq!(twice[0].error.as_deref(), Some("still full"));
    assert!(of("fine").is_empty(), "{raised:?}");
}

/// A runner took the slot with one attempt allowed and died (its lease is
/// never renewed): the fleet watches it as backups, and when the lease runs
/// out exactly one instance ends the run `interrupted` and tells it.
#[tokio::test(start_paused = true)]
async fn a_run_that_ran_out_of_attempts_is_alerted_once() {
    let (clock, store) = setup();
    let raised = Raised::default();
    let job = JobName::new("fragile").unwrap();
    let now = clock.now().as_millis();
    let slot = Slot::from_millis(now - now % 60_000);
    let mut dead = LeaseClaim::from_plain(&ClaimRequest {
        run: RunKey::new(job.clone(), slot),
        token: Token::generate(),
        instance: InstanceId::new("dead").unwrap(),
        max_late: Duration::from_secs(60),
    });
    dead.lease = Duration::from_secs(5);
    dead.max_attempts = MaxAttempts::new(1).unwrap();
    let won = store.claim_lease(&dead).await.unwrap();
    assert!(
        matches!(won, anarchon_core::ClaimOutcome::Won(_)),
        "{won:?}"
    );
    let fleet: Vec<Scheduler> = (0..FLEET)
        .map(|i| {
            let mut b = member(&store, &clock, i, &raised);
            b.job("fragile", minutely())
                .unwrap()
                .max_attempts(1)
                .run(|_| async { Ok::<(), String>(()) })
                .unwrap();
            b.start().unwrap()
        })
        .collect();
    sleep(20.0).await;
    shut_down(fleet).await;
    let alerts = by_slot(&raised);
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    let told = &alerts[&slot];
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, AlertKind::Interrupted);
}

/// A hook that panics is logged; the scheduler goes on running its jobs.
#[tokio::test(start_paused = true)]
async fn a_panicking_hook_does_not_stop_the_scheduler() {
    let (clock, store) = setup();
    let runs = Arc::new(Mutex::new(0));
    let mut b = Scheduler::builder(store.clone())
        .clock(clock.clone())
        .on_alert(|_| panic!("the pager is down"));
    let counted = runs.clone();
    b.job("fails", minutely())
        .unwrap()
        .run(move |_| {
            let counted = counted.clone();
            async move {
                *counted.lock().unwrap() += 1;
                Err::<(), _>("boom")
            }
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    sleep(150.0).await;
    scheduler.shutdown().await;
    assert_eq!(
        *runs.lock().unwrap(),
        3,
        "the slots after the panic still ran"
    );
}
