//! The last-success gauge when the finish's first reply is lost: the
//! store took the outcome, the retry is told `Fenced` (a store whose
//! repeated finish is not answered `Renewed`), and the runner finds the
//! run finished by its own attempt. One test per process: it installs the
//! global recorder.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anarchon_core::layer::LeaseLayer;
use anarchon_core::scheduler::metrics::names;
use anarchon_core::{
    FinalState, InstanceId, JobName, LeaseStore, MemoryStore, RecordState, Renewal, RunContext,
    RunKey, RunOutcome, Schedule, Scheduler, StoreError, Token,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod common;
use common::{Taken, half_past, value};

/// A memory store whose first finish records the outcome but loses its
/// reply, and which answers every later finish `Fenced`.
struct FinishOnceThenFenced {
    inner: MemoryStore,
    finishes: AtomicU32,
}

#[anarchon_core::async_trait]
impl LeaseLayer for FinishOnceThenFenced {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        if self.finishes.fetch_add(1, Ordering::SeqCst) > 0 {
            return Ok(Renewal::Fenced);
        }
        self.inner.finish(run, token, outcome).await?;
        Err(StoreError::unavailable("test", "the reply was lost"))
    }
}

/// A job whose handler works for two seconds; the reply to its finish is
/// lost and the retry is told `Fenced`. The store recorded the success,
/// so the gauge must say so: a dead-man alert on it would otherwise page
/// for a job that ran.
///
/// Failed before the fix: the gauge was set only when a finish was
/// answered `Renewed`, so it stayed absent.
#[tokio::test(start_paused = true)]
async fn a_success_recorded_by_a_finish_whose_reply_was_lost_sets_the_last_success() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let (clock, start) = half_past();
    let store = Arc::new(FinishOnceThenFenced {
        inner: MemoryStore::with_clock(clock.clone()),
        finishes: AtomicU32::new(0),
    });
    let mut b = Scheduler::builder(store.clone())
        .clock(clock.clone())
        .instance_id(InstanceId::new("alone").unwrap());
    b.job("short", Schedule::every(Duration::from_secs(60)).unwrap())
        .unwrap()
        .run(|_: RunContext| async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<(), String>(())
        })
        .unwrap();
    let scheduler = b.start().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counted = scheduler.metrics();
    scheduler.shutdown().await;

    assert!(
        store.finishes.load(Ordering::SeqCst) >= 2,
        "the finish was sent again after the lost reply"
    );
    let history = store
        .inner
        .history(&JobName::new("short").unwrap(), 1)
        .await
        .unwrap();
    assert_eq!(
        history[0].state,
        RecordState::Finished(FinalState::Succeeded),
        "the store took the outcome"
    );
    assert_eq!(counted.fenced, 0, "nobody fenced the runner: {counted:?}");

    let taken = Taken(snapshotter.snapshot().into_vec());
    match value(&taken, names::LAST_SUCCESS, &[("job", "short")]) {
        Some(DebugValue::Gauge(at)) => {
            let slot = start as f64 / 1000.0;
            assert!(
                at.into_inner() >= slot && at.into_inner() < slot + 5.0,
                "the last success is the first slot's run: {at} vs {slot}"
            );
        }
        other => panic!("no last-success gauge after a recorded success: {other:?}"),
    }
}
