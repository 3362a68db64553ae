//! The overlap rules that act on the run still going: `Replace` ends it,
//! `BufferOne` keeps one slot waiting for it.

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, FinalState, LeaseClaim, LeaseStore, Overlap, RecordState, Renewal, RunKey,
    RunOutcome, RunState, Slot, Token,
};
use futures::future::join_all;

use crate::claim::{RACERS, future_slot, job};
use crate::factory::StoreFactory;

use super::{lease_claim, records_of, store_now, until_store_clock_passes, won};

/// A claim of `run` with `overlap`, a fresh token, from `instance`.
fn with_rule(run: &RunKey, overlap: Overlap, instance: &str) -> LeaseClaim {
    let mut claim = lease_claim(run.clone(), Token::generate(), instance);
    claim.overlap = overlap;
    claim
}

/// `RACERS` instances of the store.
async fn racers<F: StoreFactory>(factory: &F) -> Vec<Arc<F::Store>> {
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        racers.push(factory.instance().await);
    }
    racers
}

/// Every racer claims `run` with `overlap` at once; the answers in order.
async fn race<S: LeaseStore + ?Sized>(
    racers: &[Arc<S>],
    run: &RunKey,
    overlap: Overlap,
) -> Vec<ClaimOutcome> {
    join_all(racers.iter().enumerate().map(|(i, store)| async move {
        let claim = with_rule(run, overlap, &format!("racer-{i}"));
        store.claim_lease(&claim).await.expect("claim")
    }))
    .await
}

fn wins(answers: &[ClaimOutcome]) -> usize {
    answers
        .iter()
        .filter(|a| matches!(a, ClaimOutcome::Won(_)))
        .count()
}

async fn state_of<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> Option<RecordState> {
    records_of(store, run, 20).await.first().map(|r| r.state)
}

/// `Overlap::Replace`: of 8 instances racing for the next slot while a run
/// of the job holds its lease (and another waits for its retry), exactly
/// one wins; both older runs end `replaced`; the old holder's heartbeat
/// and finish are `Fenced`, and no claim takes a replaced run over.
pub async fn overlap_replace_ends_the_runs_still_going<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let racers = racers(factory).await;
    let name = job("replace");
    let old = RunKey::new(name.clone(), future_slot(factory, 0));
    let retrying = RunKey::new(name.clone(), future_slot(factory, 30_000));
    let new = RunKey::new(name, future_slot(factory, 60_000));
    let holder = Token::generate();
    won(racers[0]
        .claim_lease(&lease_claim(old.clone(), holder, "old"))
        .await
        .expect("claim"));
    let failing = Token::generate();
    won(racers[0]
        .claim_lease(&lease_claim(retrying.clone(), failing, "old"))
        .await
        .expect("claim"));
    let failure = RunOutcome::Failed {
        error: "flaky".into(),
        retry: Some(anarchon_core::RetryPlan {
            after: Duration::from_secs(600),
            before: anarchon_core::Timestamp::from_millis(i64::MAX),
        }),
    };
    racers[0]
        .finish(&retrying, failing, failure)
        .await
        .expect("finish");

    let answers = race(&racers, &new, Overlap::Replace).await;
    assert_eq!(
        wins(&answers),
        1,
        "exactly one instance wins the replacing slot: {answers:?}"
    );
    for run in [&old, &retrying] {
        assert_eq!(
            state_of(racers[1].as_ref(), run).await,
            Some(RecordState::Finished(FinalState::Replaced)),
            "{run} was still going and must end replaced"
        );
        assert_eq!(
            racers[1].peek(run).await.expect("peek").state,
            RunState::Finished(FinalState::Replaced)
        );
    }
    assert_eq!(
        racers[0]
            .heartbeat(&old, holder, Duration::from_secs(30))
            .await
            .expect("heartbeat"),
        Renewal::Fenced,
        "the replaced runner learns it at its next heartbeat"
    );
    assert_eq!(
        racers[0]
            .finish(&old, holder, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Fenced,
        "a replaced run's outcome is not recorded"
    );
    assert_eq!(
        racers[2]
            .claim_lease(&lease_claim(old.clone(), Token::generate(), "backup"))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Replaced),
        "nobody takes a replaced run over"
    );
    assert_eq!(
        state_of(racers[1].as_ref(), &new).await,
        Some(RecordState::Running)
    );
}

/// `Overlap::BufferOne`: while a run of the job is live, 8 racing
/// instances leave the next slot `waiting` (each told `Running`) and skip
/// the one after; once the live run ends, exactly one of them starts the
/// waiting slot, and the skipped one stays skipped.
pub async fn overlap_buffer_one_runs_one_waiting_slot_after_the_live_run<F: StoreFactory>(
    factory: &F,
) where
    F::Store: LeaseStore,
{
    let racers = racers(factory).await;
    let name = job("buffer-one");
    let now = store_now(racers[0].as_ref(), &name).await.as_millis();
    let live = RunKey::new(name.clone(), Slot::from_millis(now - 3_000));
    let next = RunKey::new(name.clone(), Slot::from_millis(now - 2_000));
    let after = RunKey::new(name, Slot::from_millis(now - 1_000));
    let holder = Token::generate();
    won(racers[0]
        .claim_lease(&lease_claim(live.clone(), holder, "holder"))
        .await
        .expect("claim"));

    let answers = race(&racers, &next, Overlap::BufferOne).await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, ClaimOutcome::Running { .. })),
        "a slot that waits is `Running` for every claimant: {answers:?}"
    );
    assert_eq!(
        state_of(racers[1].as_ref(), &next).await,
        Some(RecordState::Waiting)
    );
    assert!(matches!(
        racers[1].peek(&next).await.expect("peek").state,
        RunState::Waiting { .. }
    ));
    let skipped = race(&racers, &after, Overlap::BufferOne).await;
    assert!(
        skipped.iter().all(|a| matches!(
            a,
            ClaimOutcome::Overlap | ClaimOutcome::Done(FinalState::Skipped)
        )) && skipped.contains(&ClaimOutcome::Overlap),
        "one slot waits at most: the next is skipped: {skipped:?}"
    );

    racers[0]
        .finish(&live, holder, RunOutcome::Succeeded)
        .await
        .expect("finish");
    let answers = race(&racers, &next, Overlap::BufferOne).await;
    assert_eq!(
        wins(&answers),
        1,
        "exactly one instance starts the waiting slot once the live run ended: {answers:?}"
    );
    assert_eq!(
        state_of(racers[1].as_ref(), &next).await,
        Some(RecordState::Running)
    );
    assert_eq!(
        state_of(racers[1].as_ref(), &after).await,
        Some(RecordState::Finished(FinalState::Skipped))
    );
}

/// The `max_late` of the waiting slot whose wait runs out.
const WAIT: Duration = Duration::from_millis(3_000);

/// A waiting slot whose live run outlasts its `max_late` is recorded
/// `missed` at its next claim; it no longer counts as waiting, so the
/// slot after it may wait in its place.
pub async fn a_waiting_slot_past_its_max_late_is_missed<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let name = job("buffer-late");
    let now = store_now(store.as_ref(), &name).await.as_millis();
    let live = RunKey::new(name.clone(), Slot::from_millis(now - 3_000));
    let next = RunKey::new(name.clone(), Slot::from_millis(now - 1_000));
    won(store
        .claim_lease(&lease_claim(live.clone(), Token::generate(), "holder"))
        .await
        .expect("claim"));
    let waiting = |run: &RunKey| {
        let mut claim = with_rule(run, Overlap::BufferOne, "b");
        claim.claim.max_late = WAIT;
        claim
    };
    assert!(matches!(
        store.claim_lease(&waiting(&next)).await.expect("claim"),
        ClaimOutcome::Running { .. }
    ));
    assert_eq!(
        state_of(store.as_ref(), &next).await,
        Some(RecordState::Waiting)
    );
    // Its wait (the slot plus its max_late) ends while the run is still
    // live.
    until_store_clock_passes(store.as_ref(), &next, next.slot.at().saturating_add(WAIT)).await;
    let later = RunKey::new(
        name,
        Slot::from_millis(store_now(store.as_ref(), &next.job).await.as_millis()),
    );
    assert!(
        matches!(
            store.claim_lease(&waiting(&later)).await.expect("claim"),
            ClaimOutcome::Running { .. }
        ),
        "a slot whose wait is over no longer holds the place: the next slot waits"
    );
    assert_eq!(
        store.claim_lease(&waiting(&next)).await.expect("claim"),
        ClaimOutcome::Missed,
        "the claim that ends the wait records the miss"
    );
    assert_eq!(
        state_of(store.as_ref(), &next).await,
        Some(RecordState::Missed),
        "a slot that waited past its max_late is recorded missed"
    );
}
