//! The metrics the scheduler records through the `metrics` facade: names,
//! labels and values after known runs on the memory store, on tokio's
//! paused clock. One test per process: it installs the global recorder.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::scheduler::metrics::names;
use anarchon_core::{InstanceId, MemoryStore, RunContext, Schedule, Scheduler};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod common;
use common::{Taken, half_past, value};

fn counter(snapshotter: &Taken, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snapshotter, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

fn histogram(snapshotter: &Taken, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match value(snapshotter, name, labels) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
        None => Vec::new(),
        other => panic!("{name} {labels:?} is not a histogram: {other:?}"),
    }
}

/// Two instances of a minutely job that succeeds and one that fails, for
/// three slots: each slot is one win and one loss, each run is counted by
/// how it ended, its lateness and duration are observed, the last success
/// is the third slot's, and the store calls are timed by operation.
#[tokio::test(start_paused = true)]
async fn runs_are_counted_by_job_and_outcome_through_the_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let (clock, start) = half_past();
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let mut b = Scheduler::builder(store.clone())
            .clock(clock.clone())
            .instance_id(InstanceId::new(name).unwrap());
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        b.job("metered-ok", every.clone())
            .unwrap()
            .run(|_: RunContext| async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                Ok::<(), String>(())
            })
            .unwrap();
        b.job("metered-fail", every)
            .unwrap()
            .run(|_: RunContext| async { Err::<(), _>("disk full") })
            .unwrap();
        schedulers.push(b.start().unwrap());
    }
    // Slots at 0, 60 and 120 s.
    tokio::time::sleep(Duration::from_secs(150)).await;
    for s in schedulers {
        s.shutdown().await;
    }

    // A snapshot takes the values out (counters too): one, read for all.
    let snapshotter = Taken(snapshotter.snapshot().into_vec());
    let ok = [("job", "metered-ok")];
    let claims = |result: &'static str| {
        counter(
            &snapshotter,
            names::CLAIMS,
            &[("job", "metered-ok"), ("result", result)],
        )
    };
    assert_eq!(claims("won"), 3, "one win per slot across the fleet");
    assert_eq!(claims("lost"), 3, "and one loss");
    let runs = |job: &'static str, outcome: &'static str| {
        counter(
            &snapshotter,
            names::RUNS,
            &[("job", job), ("outcome", outcome)],
        )
    };
    assert_eq!(runs("metered-ok", "succeeded"), 3);
    assert_eq!(runs("metered-fail", "failed"), 3);
    assert_eq!(runs("metered-ok", "failed"), 0);

    let lateness = histogram(&snapshotter, names::LATENESS, &ok);
    assert_eq!(lateness.len(), 3, "{lateness:?}");
    assert!(
        lateness.iter().all(|l| (0.0..1.0).contains(l)),
        "handlers start at their slots on a paused clock: {lateness:?}"
    );
    let durations = histogram(&snapshotter, names::DURATION, &ok);
    assert_eq!(durations.len(), 3, "{durations:?}");
    assert!(
        durations.iter().all(|d| (0.25..1.0).contains(d)),
        "{durations:?}"
    );

    match value(&snapshotter, names::LAST_SUCCESS, &ok) {
        Some(DebugValue::Gauge(at)) => {
            let third_slot = (start + 120_000) as f64 / 1000.0;
            assert!(
                at.into_inner() >= third_slot && at.into_inner() < third_slot + 1.0,
                "the last success is the third slot's run: {at} vs {third_slot}"
            );
        }
        other => panic!("no last-success gauge for the job: {other:?}"),
    }
    assert_eq!(
        value(
            &snapshotter,
            names::LAST_SUCCESS,
            &[("job", "metered-fail")]
        ),
        None,
        "a job that never succeeded has no last success"
    );
    let finishes = histogram(&snapshotter, names::STORE_CALL, &[("operation", "finish")]);
    assert_eq!(finishes.len(), 6, "one finish per run: {finishes:?}");
    assert!(
        !histogram(&snapshotter, names::STORE_CALL, &[("operation", "claim")]).is_empty(),
        "claims are timed"
    );
    assert_eq!(
        counter(&snapshotter, names::STORE_ERRORS, &[("operation", "claim")]),
        0
    );
}
