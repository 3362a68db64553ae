//! Claims and takeover: who wins a run, what the others hear, when a
//! lease that ran out is taken over, and how `overlap` and fences go.

use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, FinalState, LeaseStore, MaxAttempts, Overlap, RecordState, Renewal,
    RunKey, RunOutcome, RunState, Slot, Token,
};

use crate::claim::{future_slot, job, past_slot, race};
use crate::factory::StoreFactory;

use super::{
    LONG_LEASE, SHORT_LEASE, hold, lease_claim, short, two_instances, two_instances_and_a_run,
    wait_out, won,
};

/// 8 instances race `claim_lease` over 200 slots: one winner per slot.
pub async fn lease_claim_is_exclusive<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (slots, winners) = race(
        factory,
        job("lease-exclusive"),
        |store, run, racer| async move {
            let req = lease_claim(run, Token::generate(), &racer);
            let outcome = store.claim_lease(&req).await.expect("claim_lease failed");
            match outcome {
                ClaimOutcome::Won(w) => {
                    assert_eq!(w.attempt, Attempt::FIRST);
                    true
                }
                ClaimOutcome::Running { .. } => false,
                other => panic!("a raced claim must be Won or Running, got {other:?}"),
            }
        },
    )
    .await;
    for slot in &slots {
        assert_eq!(winners.get(slot).copied().unwrap_or(0), 1, "slot {slot}");
    }
}

/// A retried claim with the same token is `Won` with the same attempt and fence.
pub async fn own_lease_retry_is_recognised<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let req = lease_claim(
        RunKey::new(job("lease-retry"), future_slot(factory, 0)),
        Token::generate(),
        "a",
    );
    let first = won(store.claim_lease(&req).await.expect("claim"));
    assert!(first.fence.is_some(), "lease stores assign a fence");
    let again = won(store.claim_lease(&req).await.expect("claim again"));
    assert_eq!(again, first);
}

/// Another token on a live lease is told `Running`, with the lease end and
/// the store's clock.
pub async fn live_lease_answers_running<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "live").await;
    won(a
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .expect("claim"));
    match b
        .claim_lease(&lease_claim(run, Token::generate(), "b"))
        .await
        .expect("claim")
    {
        ClaimOutcome::Running {
            lease_until,
            store_now,
        } => {
            let left = lease_until.since(store_now);
            assert!(
                left > LONG_LEASE - Duration::from_secs(5) && left <= LONG_LEASE,
                "lease end must be about now + lease, {left:?} left"
            );
        }
        other => panic!("expected Running, got {other:?}"),
    }
}

/// A claim later than `max_late` records the slot `missed` and is told so
/// (`Missed`); a later one is only `Late`; a catch-up claim with a wider
/// window still runs the slot.
pub async fn late_claim_is_refused_and_recorded_missed<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let slot = past_slot(factory, 3_600_000);
    let run = RunKey::new(job("late"), slot);
    let late = lease_claim(run.clone(), Token::generate(), "a");
    assert_eq!(
        store.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Missed
    );
    let late_again = lease_claim(run.clone(), Token::generate(), "b");
    assert_eq!(
        store.claim_lease(&late_again).await.expect("claim"),
        ClaimOutcome::Late
    );
    let history = store.history(&run.job, 10).await.expect("history");
    assert_eq!(history.len(), 1, "one record for the slot: {history:?}");
    assert_eq!(history[0].state, RecordState::Missed);
    assert_eq!(history[0].run, run);
    assert_eq!(
        store.peek(&run).await.expect("peek").state,
        RunState::Missed
    );

    let mut catch_up = lease_claim(run.clone(), Token::generate(), "c");
    catch_up.claim.max_late = Duration::from_secs(2 * 3600);
    let win = won(store.claim_lease(&catch_up).await.expect("catch-up claim"));
    assert_eq!(win.attempt, Attempt::FIRST);
    let history = store.history(&run.job, 10).await.expect("history");
    assert_eq!(history[0].state, RecordState::Running);
}

/// An expired lease is taken over: attempt + 1, a larger fence; the old
/// token's heartbeat, finish and release are fenced.
pub async fn expired_lease_is_taken_over<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "takeover").await;
    let old = Token::generate();
    let first = won(a
        .claim_lease(&short(lease_claim(run.clone(), old, "a")))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    let new = Token::generate();
    let second = won(b
        .claim_lease(&lease_claim(run.clone(), new, "b"))
        .await
        .expect("takeover"));
    assert_eq!(second.attempt, first.attempt.next());
    assert!(
        second.fence > first.fence,
        "fence must grow: {first:?} -> {second:?}"
    );
    assert_eq!(
        a.heartbeat(&run, old, LONG_LEASE).await.expect("heartbeat"),
        Renewal::Fenced
    );
    assert_eq!(
        a.finish(&run, old, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Fenced
    );
    assert_eq!(
        a.release(&run, old).await.expect("release"),
        Renewal::Fenced
    );
    assert_eq!(
        b.heartbeat(&run, new, LONG_LEASE).await.expect("heartbeat"),
        Renewal::Renewed
    );
    let history = b.history(&run.job, 1).await.expect("history");
    assert_eq!(history[0].attempt, Some(second.attempt));
    assert_eq!(history[0].instance.as_ref().map(|i| i.as_str()), Some("b"));
    assert_eq!(
        b.finish(&run, new, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );
}

/// With no attempts left, an expired lease ends the run as interrupted: the
/// claim that ends it is told `Interrupted`, a later one
/// `Done(Interrupted)`.
pub async fn attempts_exhausted_is_interrupted<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "exhausted").await;
    let mut claim = short(lease_claim(run.clone(), Token::generate(), "a"));
    claim.max_attempts = MaxAttempts::new(1).expect("1");
    won(a.claim_lease(&claim).await.expect("claim"));
    wait_out(SHORT_LEASE).await;
    let mut late = lease_claim(run.clone(), Token::generate(), "b");
    late.max_attempts = MaxAttempts::new(1).expect("1");
    assert_eq!(
        b.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Interrupted
    );
    late.claim.token = Token::generate();
    assert_eq!(
        a.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Done(FinalState::Interrupted)
    );
    let history = b.history(&run.job, 1).await.expect("history");
    assert_eq!(
        history[0].state,
        RecordState::Finished(FinalState::Interrupted)
    );
}

/// `Overlap::Skip`: a slot is skipped (and recorded so) while another run of
/// the job is live, and runs again once that run finished.
pub async fn overlap_skip_waits_for_the_live_run<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = two_instances(factory).await;
    let job = job("overlap");
    let s1 = future_slot(factory, 0);
    let s2 = Slot::from_millis(s1.as_millis() + 60_000);
    let s3 = Slot::from_millis(s1.as_millis() + 120_000);
    let skip = |run: RunKey, who: &str| {
        let mut c = lease_claim(run, Token::generate(), who);
        c.overlap = Overlap::Skip;
        c
    };
    let first = skip(RunKey::new(job.clone(), s1), "a");
    won(a.claim_lease(&first).await.expect("claim"));
    let run2 = RunKey::new(job.clone(), s2);
    assert_eq!(
        b.claim_lease(&skip(run2.clone(), "b"))
            .await
            .expect("claim"),
        ClaimOutcome::Overlap
    );
    let again = a
        .claim_lease(&skip(run2.clone(), "a"))
        .await
        .expect("claim");
    assert!(
        matches!(
            again,
            ClaimOutcome::Overlap | ClaimOutcome::Done(FinalState::Skipped)
        ),
        "every instance must agree the slot is skipped: {again:?}"
    );
    let history = a.history(&job, 10).await.expect("history");
    let rec = history
        .iter()
        .find(|r| r.run == run2)
        .expect("the skipped slot is recorded");
    assert_eq!(rec.state, RecordState::Finished(FinalState::Skipped));

    a.finish(first.run(), first.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    won(b
        .claim_lease(&skip(RunKey::new(job.clone(), s3), "b"))
        .await
        .expect("claim"));
}

/// `Overlap::Skip` ignores a run whose lease has run out, and
/// `Overlap::Allow` lets runs overlap.
pub async fn overlap_ignores_expired_and_allow_overlaps<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("overlap-expired");
    let s1 = future_slot(factory, 0);
    let s2 = Slot::from_millis(s1.as_millis() + 1000);
    let s3 = Slot::from_millis(s1.as_millis() + 2000);
    let by_a = |job: &anarchon_core::JobName, slot: Slot| {
        lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a")
    };
    won(store
        .claim_lease(&short(by_a(&job, s1)))
        .await
        .expect("claim"));
    won(store
        .claim_lease(&by_a(&job, s2))
        .await
        .expect("allow overlaps"));
    let mut c3 = by_a(&job, s3);
    c3.overlap = Overlap::Skip;
    assert_eq!(
        store.claim_lease(&c3).await.expect("claim"),
        ClaimOutcome::Overlap,
        "s2 is live"
    );
    let job2 = crate::claim::job("overlap-expired-2");
    won(store
        .claim_lease(&short(by_a(&job2, s1)))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    let mut c = by_a(&job2, s2);
    c.overlap = Overlap::Skip;
    won(store
        .claim_lease(&c)
        .await
        .expect("an expired lease does not block"));
}

/// `peek` reports absent, running and finished runs and the store's clock.
pub async fn peek_reports_the_state<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let run = RunKey::new(job("peek"), future_slot(factory, 0));
    let view = store.peek(&run).await.expect("peek");
    assert_eq!(view.state, RunState::Absent);
    let local = factory.clock().now();
    let skew = (view.store_now.as_millis() - local.as_millis()).abs();
    assert!(
        skew < 60_000,
        "store clock {} vs local {}",
        view.store_now,
        local
    );
    let token = hold(&*store, &run).await;
    match store.peek(&run).await.expect("peek").state {
        RunState::Running {
            attempt,
            lease_until,
        } => {
            assert_eq!(attempt, Attempt::FIRST);
            assert!(lease_until > view.store_now);
        }
        other => panic!("{other:?}"),
    }
    store
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    assert_eq!(
        store.peek(&run).await.expect("peek").state,
        RunState::Finished(FinalState::Succeeded)
    );
}

/// Fence numbers grow across the runs of a job, and history lists runs
/// newest first with who ran them.
pub async fn fences_grow_and_history_lists_runs<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("history");
    let base = future_slot(factory, 0).as_millis();
    let mut fences = Vec::new();
    for i in 0..5 {
        let run = RunKey::new(job.clone(), Slot::from_millis(base + i * 60_000));
        let token = Token::generate();
        let win = won(store
            .claim_lease(&lease_claim(run.clone(), token, &format!("inst-{i}")))
            .await
            .expect("claim"));
        fences.push(win.fence.expect("fence"));
        if i % 2 == 0 {
            store
                .finish(&run, token, RunOutcome::Succeeded)
                .await
                .expect("finish");
        }
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must grow: {fences:?}"
    );
    let history = store.history(&job, 3).await.expect("history");
    assert_eq!(history.len(), 3, "limit is honoured");
    let slots: Vec<i64> = history.iter().map(|r| r.run.slot.as_millis()).collect();
    assert_eq!(
        slots,
        [base + 240_000, base + 180_000, base + 120_000],
        "newest first"
    );
    assert_eq!(
        history[0].state,
        RecordState::Finished(FinalState::Succeeded)
    );
    assert_eq!(history[1].state, RecordState::Running);
    assert_eq!(
        history[1].instance.as_ref().map(|i| i.as_str()),
        Some("inst-3")
    );
    assert_eq!(history[1].fence, Some(fences[3]));
    assert!(
        store
            .history(&crate::claim::job("no-such-job"), 10)
            .await
            .expect("history")
            .is_empty()
    );
}

/// How many instances race to record one end of a run.
const RECORDERS: usize = 8;

/// 8 instances claim the same slots, each an hour too late, at once: for
/// each slot exactly one is told `Missed` (it recorded the miss, and is the
/// one instance of a fleet that raises the alert); the others `Late`.
pub async fn one_of_racing_claimants_records_each_miss<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let mut stores = Vec::new();
    for _ in 0..RECORDERS {
        stores.push(factory.instance().await);
    }
    let name = job("missed-race");
    // Ten distinct slots from one reading of the clock: read again, a
    // second later, "an hour and n seconds ago" would name the slot before.
    let newest = past_slot(factory, 3_600_000).as_millis();
    for n in 0..10 {
        let run = RunKey::new(name.clone(), Slot::from_millis(newest - n * 1000));
        let answers = futures::future::join_all(stores.iter().enumerate().map(|(i, store)| {
            let claim = lease_claim(run.clone(), Token::generate(), &format!("r{i}"));
            async move { store.claim_lease(&claim).await.expect("claim") }
        }))
        .await;
        let missed = answers
            .iter()
            .filter(|a| **a == ClaimOutcome::Missed)
            .count();
        assert_eq!(missed, 1, "one recorder of the miss of {run}: {answers:?}");
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, ClaimOutcome::Missed | ClaimOutcome::Late)),
            "{answers:?}"
        );
        assert_eq!(
            stores[0].peek(&run).await.expect("peek").state,
            RunState::Missed
        );
    }
}

/// A run whose runner's lease ran out with no attempts left: 8 instances
/// claim it at once, exactly one is told `Interrupted` (it ended the run),
/// the others `Done(Interrupted)`.
pub async fn one_of_racing_claimants_ends_an_exhausted_run<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let mut stores = Vec::new();
    for _ in 0..RECORDERS {
        stores.push(factory.instance().await);
    }
    let run = RunKey::new(job("interrupted-race"), future_slot(factory, 0));
    let one_attempt = |claim: anarchon_core::LeaseClaim| {
        let mut claim = claim;
        claim.max_attempts = MaxAttempts::new(1).expect("1");
        claim
    };
    won(stores[0]
        .claim_lease(&one_attempt(short(lease_claim(
            run.clone(),
            Token::generate(),
            "runner",
        ))))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    let answers = futures::future::join_all(stores.iter().enumerate().map(|(i, store)| {
        let claim = one_attempt(lease_claim(
            run.clone(),
            Token::generate(),
            &format!("r{i}"),
        ));
        async move { store.claim_lease(&claim).await.expect("claim") }
    }))
    .await;
    let ended = answers
        .iter()
        .filter(|a| **a == ClaimOutcome::Interrupted)
        .count();
    assert_eq!(ended, 1, "one claim ends the run: {answers:?}");
    assert!(
        answers.iter().all(|a| matches!(
            a,
            ClaimOutcome::Interrupted | ClaimOutcome::Done(FinalState::Interrupted)
        )),
        "{answers:?}"
    );
    assert_eq!(
        stores[0].peek(&run).await.expect("peek").state,
        RunState::Finished(FinalState::Interrupted)
    );
}
