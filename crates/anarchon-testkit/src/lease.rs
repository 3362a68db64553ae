//! The lease suite: the flowchart, checked property by property.
//!
//! Checks that need a lease to run out use leases of a few hundred
//! milliseconds and wait them out: real time on a server, no time at all
//! under tokio's paused clock.

use std::collections::HashMap;
use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, FinalState, LeaseClaim, LeaseStore, MaxAttempts, Overlap, RecordState,
    Renewal, RunKey, RunOutcome, RunRecord, RunState, RunView, Slot, Timestamp, Token, Win,
};
use futures::future::join_all;

use crate::claim::{RACED_SLOTS, RACERS, claim_request, future_slot, job};
use crate::clock::SkewedClock;
use crate::factory::StoreFactory;

/// The lease of checks that wait for one to run out.
pub const SHORT_LEASE: Duration = Duration::from_millis(300);
/// The lease of checks that need one to stay alive.
pub const LONG_LEASE: Duration = Duration::from_secs(30);

/// A lease claim with the suite's defaults and a long lease.
pub fn lease_claim(run: RunKey, token: Token, instance: &str) -> LeaseClaim {
    LeaseClaim {
        claim: claim_request(run, token, instance),
        lease: LONG_LEASE,
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
    }
}

fn short(mut claim: LeaseClaim) -> LeaseClaim {
    claim.lease = SHORT_LEASE;
    claim
}

async fn wait_out(lease: Duration) {
    tokio::time::sleep(lease + Duration::from_millis(250)).await;
}

fn won(outcome: ClaimOutcome) -> Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// 8 instances race `claim_lease` over 200 slots: one winner per slot.
pub async fn lease_claim_is_exclusive<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let job = job("lease-exclusive");
    let base = future_slot(factory, 0).as_millis();
    let slots: Vec<Slot> = (0..RACED_SLOTS as i64)
        .map(|i| Slot::from_millis(base + i * 1000))
        .collect();
    let mut stores = Vec::new();
    for _ in 0..RACERS {
        stores.push(factory.instance().await);
    }
    let racers = stores.into_iter().enumerate().map(|(i, store)| {
        let job = job.clone();
        let slots = slots.clone();
        async move {
            let mut won = Vec::new();
            for slot in slots {
                crate::claim::interleave(i, slot).await;
                let req = lease_claim(
                    RunKey::new(job.clone(), slot),
                    Token::generate(),
                    &format!("racer-{i}"),
                );
                let outcome = store.claim_lease(&req).await.expect("claim_lease failed");
                match outcome {
                    ClaimOutcome::Won(w) => {
                        assert_eq!(w.attempt, Attempt::FIRST);
                        won.push(slot);
                    }
                    ClaimOutcome::Running { .. } => {}
                    other => panic!("a raced claim must be Won or Running, got {other:?}"),
                }
            }
            won
        }
    });
    let mut winners: HashMap<Slot, usize> = HashMap::new();
    for won in join_all(racers).await {
        for slot in won {
            *winners.entry(slot).or_default() += 1;
        }
    }
    for slot in &slots {
        assert_eq!(winners.get(slot).copied().unwrap_or(0), 1, "slot {slot}");
    }
}

/// `claim_many` answers in order, like claims one by one.
pub async fn claim_many_answers_in_order<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let slot = future_slot(factory, 0);
    let claims_a: Vec<LeaseClaim> = (0..50)
        .map(|i| {
            lease_claim(
                RunKey::new(job(&format!("batch-{i}")), slot),
                Token::generate(),
                "a",
            )
        })
        .collect();
    // b claims every other job first.
    for claim in claims_a.iter().step_by(2) {
        let mine = lease_claim(claim.run().clone(), Token::generate(), "b");
        won(b.claim_lease(&mine).await.expect("claim"));
    }
    let outcomes = a
        .claim_many(&claims_a)
        .await
        .expect("claim_many")
        .all()
        .expect("every claim of the batch answered");
    assert_eq!(outcomes.len(), claims_a.len());
    for (i, outcome) in outcomes.iter().enumerate() {
        if i % 2 == 0 {
            assert!(
                matches!(outcome, ClaimOutcome::Running { .. }),
                "job {i}: {outcome:?}"
            );
        } else {
            assert!(
                matches!(outcome, ClaimOutcome::Won(_)),
                "job {i}: {outcome:?}"
            );
        }
    }
    let again = a
        .claim_many(&claims_a)
        .await
        .expect("claim_many again")
        .all()
        .expect("every claim of the batch answered");
    // The same answers, except the store's clock, which has moved on.
    let without_clock = |outcomes: &[ClaimOutcome]| -> Vec<ClaimOutcome> {
        outcomes
            .iter()
            .map(|o| match o {
                ClaimOutcome::Running { lease_until, .. } => ClaimOutcome::Running {
                    lease_until: *lease_until,
                    store_now: Timestamp::from_millis(0),
                },
                other => other.clone(),
            })
            .collect()
    };
    assert_eq!(
        without_clock(&again),
        without_clock(&outcomes),
        "a retried batch with the same tokens gets the same answers"
    );
    assert!(a.claim_many(&[]).await.expect("empty batch").is_empty());
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
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("live"), future_slot(factory, 0));
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

/// A claim later than `max_late` is `Late` and recorded `missed` once; a
/// catch-up claim with a wider window still runs the slot.
pub async fn late_claim_is_refused_and_recorded_missed<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let slot = Slot::from_millis(now - now.rem_euclid(1000) - 3_600_000);
    let run = RunKey::new(job("late"), slot);
    let late = lease_claim(run.clone(), Token::generate(), "a");
    assert_eq!(
        store.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Late
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

/// A finished run is `Done` for every later claim; its token is fenced for
/// everything but the same finish sent again.
pub async fn finished_run_is_done<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("finished"), future_slot(factory, 0));
    let token = Token::generate();
    won(a
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
    assert_eq!(
        a.finish(&run, token, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );
    for _ in 0..3 {
        let outcome = b
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
            .await
            .expect("claim");
        assert_eq!(outcome, ClaimOutcome::Done(FinalState::Succeeded));
    }
    assert_eq!(
        a.claim_lease(&lease_claim(run.clone(), token, "a"))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Succeeded)
    );
    assert_eq!(
        a.heartbeat(&run, token, LONG_LEASE)
            .await
            .expect("heartbeat"),
        Renewal::Fenced
    );
    assert_eq!(
        a.finish(
            &run,
            token,
            RunOutcome::Failed {
                error: "a different end".to_owned()
            }
        )
        .await
        .expect("finish"),
        Renewal::Fenced
    );
    assert_eq!(
        b.peek(&run).await.expect("peek").state,
        RunState::Finished(FinalState::Succeeded)
    );
}

/// A finish whose answer was lost is sent again with the same token and
/// the same end: it gets the answer of the first (`Renewed`) and changes
/// nothing, for a success and for a failure; anyone else's finish, or a
/// different end, is still `Fenced`.
pub async fn a_finish_sent_again_gets_the_same_answer<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let failed = |error: &str| RunOutcome::Failed {
        error: error.to_owned(),
    };
    for (name, outcome, other) in [
        ("again-succeeded", RunOutcome::Succeeded, failed("other")),
        (
            "again-failed",
            failed("the first error"),
            RunOutcome::Succeeded,
        ),
    ] {
        let run = RunKey::new(job(name), future_slot(factory, 0));
        let token = Token::generate();
        won(a
            .claim_lease(&lease_claim(run.clone(), token, "a"))
            .await
            .expect("claim"));
        assert_eq!(
            a.finish(&run, token, outcome.clone())
                .await
                .expect("finish"),
            Renewal::Renewed
        );
        let recorded = facts(&*a, &run).await;
        // Sent again, through another connection as a retry may be.
        assert_eq!(
            b.finish(&run, token, outcome.clone())
                .await
                .expect("finish again"),
            Renewal::Renewed,
            "{run}: the same finish from the same token gets the same answer"
        );
        assert_eq!(
            b.finish(&run, token, outcome.clone())
                .await
                .expect("finish a third time"),
            Renewal::Renewed,
            "{run}: and again"
        );
        assert_eq!(
            b.finish(&run, token, other).await.expect("finish"),
            Renewal::Fenced,
            "{run}: a different end from the same token is refused"
        );
        assert_eq!(
            b.finish(&run, Token::generate(), outcome)
                .await
                .expect("finish"),
            Renewal::Fenced,
            "{run}: another token is refused"
        );
        assert_eq!(
            facts(&*a, &run).await,
            recorded,
            "{run}: nothing changed after the first finish"
        );
    }
}

/// A failed run is recorded with its error.
pub async fn failed_run_keeps_its_error<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let run = RunKey::new(job("failed"), future_slot(factory, 0));
    let token = Token::generate();
    won(store
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
    let error = "exit status 3: disk full".to_owned();
    let answer = store
        .finish(
            &run,
            token,
            RunOutcome::Failed {
                error: error.clone(),
            },
        )
        .await
        .expect("finish");
    assert_eq!(answer, Renewal::Renewed);
    let history = store.history(&run.job, 1).await.expect("history");
    assert_eq!(history[0].state, RecordState::Finished(FinalState::Failed));
    assert_eq!(history[0].error.as_deref(), Some(error.as_str()));
    assert!(history[0].finished_at.is_some());
}

/// A heartbeat moves the lease end forward, so the run is not taken over.
pub async fn heartbeat_extends_the_lease<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("heartbeat"), future_slot(factory, 0));
    let token = Token::generate();
    let lease = Duration::from_millis(800);
    let mut claim = lease_claim(run.clone(), token, "a");
    claim.lease = lease;
    won(a.claim_lease(&claim).await.expect("claim"));
    let before = match a.peek(&run).await.expect("peek").state {
        RunState::Running { lease_until, .. } => lease_until,
        other => panic!("{other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        a.heartbeat(&run, token, lease).await.expect("heartbeat"),
        Renewal::Renewed
    );
    let after = match a.peek(&run).await.expect("peek").state {
        RunState::Running { lease_until, .. } => lease_until,
        other => panic!("{other:?}"),
    };
    assert!(
        after > before,
        "the heartbeat must move the lease end: {before} -> {after}"
    );
    // Past the first lease end, but inside the renewed one.
    tokio::time::sleep(Duration::from_millis(550)).await;
    let outcome = b
        .claim_lease(&short(lease_claim(run.clone(), Token::generate(), "b")))
        .await
        .expect("claim");
    assert!(
        matches!(outcome, ClaimOutcome::Running { .. }),
        "a renewed lease is not taken over: {outcome:?}"
    );
}

/// An expired lease is taken over: attempt + 1, a larger fence; the old
/// token's heartbeat, finish and release are fenced.
pub async fn expired_lease_is_taken_over<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("takeover"), future_slot(factory, 0));
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

/// With no attempts left, an expired lease ends the run as interrupted.
pub async fn attempts_exhausted_is_interrupted<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("exhausted"), future_slot(factory, 0));
    let mut claim = short(lease_claim(run.clone(), Token::generate(), "a"));
    claim.max_attempts = MaxAttempts::new(1).expect("1");
    won(a.claim_lease(&claim).await.expect("claim"));
    wait_out(SHORT_LEASE).await;
    let mut late = lease_claim(run.clone(), Token::generate(), "b");
    late.max_attempts = MaxAttempts::new(1).expect("1");
    assert_eq!(
        b.claim_lease(&late).await.expect("claim"),
        ClaimOutcome::Done(FinalState::Interrupted)
    );
    let history = b.history(&run.job, 1).await.expect("history");
    assert_eq!(
        history[0].state,
        RecordState::Finished(FinalState::Interrupted)
    );
}

/// A run given back before its handler started keeps its attempt: the
/// next claim takes it over at once as the same attempt, with a new fence,
/// even when that was the only attempt allowed; the giver's token is fenced
/// from then on. After a takeover, a give-back keeps that attempt too.
pub async fn a_run_given_back_keeps_its_attempt<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let only_once = |run: &RunKey, who: &str, n: u32| {
        let mut c = lease_claim(run.clone(), Token::generate(), who);
        c.max_attempts = MaxAttempts::new(n).expect("not zero");
        c
    };

    // The only attempt, given back.
    let run = RunKey::new(job("given-back"), future_slot(factory, 0));
    let first = only_once(&run, "a", 1);
    let first_win = won(a.claim_lease(&first).await.expect("claim"));
    assert_eq!(
        a.give_back(&run, first.claim.token)
            .await
            .expect("give back"),
        Renewal::Renewed
    );
    match b.peek(&run).await.expect("peek").state {
        RunState::Running {
            attempt,
            lease_until,
        } => {
            assert_eq!(attempt, Attempt::FIRST, "the record keeps its attempt");
            let now = b.peek(&run).await.expect("peek").store_now;
            assert!(lease_until < now, "the lease ended: {lease_until} vs {now}");
        }
        other => panic!("a given-back run is still running, unheld: {other:?}"),
    }
    for (call, answer) in [
        (
            "heartbeat",
            a.heartbeat(&run, first.claim.token, LONG_LEASE)
                .await
                .expect("heartbeat"),
        ),
        (
            "finish",
            a.finish(&run, first.claim.token, RunOutcome::Succeeded)
                .await
                .expect("finish"),
        ),
        (
            "release",
            a.release(&run, first.claim.token).await.expect("release"),
        ),
        (
            "give back again",
            a.give_back(&run, first.claim.token)
                .await
                .expect("give back"),
        ),
    ] {
        assert_eq!(answer, Renewal::Fenced, "{call} by the giver's token");
    }
    let second = only_once(&run, "b", 1);
    let second_win = won(b.claim_lease(&second).await.expect("claim"));
    assert_eq!(
        second_win.attempt,
        Attempt::FIRST,
        "the given-back attempt is run again, not spent"
    );
    assert!(
        second_win.fence > first_win.fence,
        "with a new fence: {second_win:?} after {first_win:?}"
    );
    assert_eq!(
        b.finish(&run, second.claim.token, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );

    // A takeover (attempt 2) given back: the next runner is attempt 2 again.
    let run = RunKey::new(job("given-back-later"), future_slot(factory, 0));
    won(a
        .claim_lease(&short(only_once(&run, "a", 2)))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    let takeover = only_once(&run, "b", 2);
    assert_eq!(
        won(b.claim_lease(&takeover).await.expect("takeover")).attempt,
        Attempt::FIRST.next()
    );
    assert_eq!(
        b.give_back(&run, takeover.claim.token)
            .await
            .expect("give back"),
        Renewal::Renewed
    );
    assert_eq!(
        won(a
            .claim_lease(&only_once(&run, "a", 2))
            .await
            .expect("claim"))
        .attempt,
        Attempt::FIRST.next(),
        "the given-back takeover's attempt is run again"
    );
}

/// A backup waiting on one instance hears of a release and of a give-back
/// made through another instance at once, long before the holder's lease
/// would have ended; a wait for a run nobody hands over runs its time.
pub async fn a_hand_over_wakes_a_waiting_backup<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    // Far beyond the time the check allows a wake to take.
    let patience = Duration::from_secs(30);
    let waiting = |run: &RunKey| {
        let (b, run) = (b.clone(), run.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let woken = b.wait_for_hand_over(&run, patience).await;
            (woken, started.elapsed())
        })
    };

    // A release. A store's news may start flowing a little after it opens,
    // so the release is repeated (it is idempotent) until the wait ends.
    let run = RunKey::new(job("news-release"), future_slot(factory, 0));
    let claim = lease_claim(run.clone(), Token::generate(), "a");
    won(a.claim_lease(&claim).await.expect("claim"));
    let waiter = waiting(&run);
    for _ in 0..20 {
        assert_eq!(
            a.release(&run, claim.claim.token).await.expect("release"),
            Renewal::Renewed
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        if waiter.is_finished() {
            break;
        }
    }
    let (woken, after) = waiter.await.expect("waiter");
    assert!(
        woken && after < patience,
        "the backup was not told of the release (waited {after:?})"
    );

    // A give-back, now that news flows: once is enough.
    let run = RunKey::new(job("news-give-back"), future_slot(factory, 0));
    let claim = lease_claim(run.clone(), Token::generate(), "a");
    won(a.claim_lease(&claim).await.expect("claim"));
    let waiter = waiting(&run);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        a.give_back(&run, claim.claim.token)
            .await
            .expect("give back"),
        Renewal::Renewed
    );
    let (woken, after) = waiter.await.expect("waiter");
    assert!(
        woken && after < patience,
        "the backup was not told of the give-back (waited {after:?})"
    );

    // No hand-over: the wait runs out.
    let quiet = RunKey::new(job("news-none"), future_slot(factory, 0));
    assert!(
        !b.wait_for_hand_over(&quiet, Duration::from_millis(300))
            .await,
        "news of a run nobody handed over"
    );
}

/// `Overlap::Skip`: a slot is skipped (and recorded so) while another run of
/// the job is live, and runs again once that run finished.
pub async fn overlap_skip_waits_for_the_live_run<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
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
    won(store
        .claim_lease(&short(lease_claim(
            RunKey::new(job.clone(), s1),
            Token::generate(),
            "a",
        )))
        .await
        .expect("claim"));
    won(store
        .claim_lease(&lease_claim(
            RunKey::new(job.clone(), s2),
            Token::generate(),
            "a",
        ))
        .await
        .expect("allow overlaps"));
    let mut c3 = lease_claim(RunKey::new(job.clone(), s3), Token::generate(), "a");
    c3.overlap = Overlap::Skip;
    assert_eq!(
        store.claim_lease(&c3).await.expect("claim"),
        ClaimOutcome::Overlap,
        "s2 is live"
    );
    let job2 = crate::claim::job("overlap-expired-2");
    won(store
        .claim_lease(&short(lease_claim(
            RunKey::new(job2.clone(), s1),
            Token::generate(),
            "a",
        )))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    let mut c = lease_claim(RunKey::new(job2, s2), Token::generate(), "a");
    c.overlap = Overlap::Skip;
    won(store
        .claim_lease(&c)
        .await
        .expect("an expired lease does not block"));
}

/// `release` ends the lease at once: the next claim takes over.
pub async fn release_hands_over_at_once<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("release"), future_slot(factory, 0));
    let token = Token::generate();
    let first = won(a
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
    assert_eq!(
        a.release(&run, token).await.expect("release"),
        Renewal::Renewed
    );
    let second = won(b
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
        .await
        .expect("takeover after release"));
    assert_eq!(second.attempt, first.attempt.next());
    assert_eq!(
        a.heartbeat(&run, token, LONG_LEASE)
            .await
            .expect("heartbeat"),
        Renewal::Fenced
    );
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
    let token = Token::generate();
    won(store
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
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

/// How long after its claim a run claimed with [`closing_window`] becomes
/// too old for any claim: its window then lies behind it.
const WINDOW_LEFT: Duration = Duration::from_secs(1);

/// A late window that lets a claim sent now win `slot` and ends
/// [`WINDOW_LEFT`] from now, so a collection after [`wait_out_windows`] may
/// take the run.
fn closing_window(now_ms: i64, slot: Slot) -> Duration {
    Duration::from_millis(u64::try_from(now_ms - slot.as_millis()).expect("a past slot"))
        + WINDOW_LEFT
}

/// Waits until every window made by [`closing_window`] before the call has
/// ended on the store's clock.
async fn wait_out_windows() {
    wait_out(WINDOW_LEFT).await;
}

/// `collect_garbage(keep)` deletes ended runs older than `keep` and older
/// than their job's late window, and nothing else: recent runs stay, and so
/// does an old running run whose lease has not been over for `keep`. (That
/// the scheduler's `keep` covers its jobs' late windows is the scheduler's
/// part, checked in the kit's scheduler tests.)
pub async fn garbage_collection_forgets_old_ended_runs_only<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("gc");
    let now = factory.clock().now().as_millis();
    let old = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    // Just older than `old`, so that one window covers both at the claims
    // and neither at the collection.
    let old_running = Slot::from_millis(old.as_millis() - 50);
    let recent = Slot::from_millis(now - now.rem_euclid(1000) - 60_000);
    // The job's window ends shortly: after it only `keep` decides.
    let window = closing_window(now, old_running);
    let catch_up = |slot: Slot| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.claim.max_late = window;
        c
    };
    let c_old = catch_up(old);
    let c_running = catch_up(old_running);
    let c_recent = catch_up(recent);
    won(store.claim_lease(&c_old).await.expect("claim"));
    store
        .finish(c_old.run(), c_old.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    let last = won(store.claim_lease(&c_running).await.expect("claim"));
    won(store.claim_lease(&c_recent).await.expect("claim"));
    store
        .finish(c_recent.run(), c_recent.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    wait_out_windows().await;
    let deleted = store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("gc");
    assert_eq!(deleted, 1, "only the old finished run goes");
    let left: Vec<Slot> = store
        .history(&job, 10)
        .await
        .expect("history")
        .iter()
        .map(|r| r.run.slot)
        .collect();
    assert_eq!(left, [recent, old_running]);
    let next = Slot::from_millis(recent.as_millis() + 1000);
    let mut claim = catch_up(next);
    claim.claim.max_late = Duration::from_secs(3600);
    let after = won(store.claim_lease(&claim).await.expect("claim"));
    assert!(
        after.fence > last.fence,
        "fences keep growing after a collection"
    );
}

/// Collection keeps each job's runs for as long as the job's own late
/// window, whatever `keep` the collecting scheduler passes: another
/// service's scheduler, whose jobs have short windows, shares the
/// namespace. A run kept is never run again; a run whose window is over
/// goes.
pub async fn garbage_collection_keeps_each_jobs_late_window<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let slot = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    let keep = Duration::from_secs(3600);
    let long_window = Duration::from_secs(24 * 3600);
    let short = job("gc-window-short");
    let long = job("gc-window-long");
    let claim = |job: &anarchon_core::JobName, max_late: Duration| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.claim.max_late = max_late;
        c
    };
    for c in [
        claim(&short, closing_window(now, slot)),
        claim(&long, long_window),
    ] {
        won(store.claim_lease(&c).await.expect("claim"));
        store
            .finish(c.run(), c.claim.token, RunOutcome::Succeeded)
            .await
            .expect("finish");
    }
    wait_out_windows().await;
    store.collect_garbage(keep).await.expect("gc");
    let slots = |records: Vec<RunRecord>| records.iter().map(|r| r.run.slot).collect::<Vec<_>>();
    assert_eq!(
        slots(store.history(&long, 10).await.expect("history")),
        [slot],
        "a collection with keep = {keep:?} took a run that its job's late window \
         ({long_window:?}) still covers"
    );
    assert_eq!(
        store
            .claim_lease(&claim(&long, long_window))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Succeeded),
        "a late claim inside the job's window must find the run done"
    );
    assert!(
        store.history(&short, 10).await.expect("history").is_empty(),
        "a run older than both `keep` and its job's window is collected"
    );
}

/// How far off the store's clock the skew checks set an instance's clock:
/// more than any lease the checks use, so a store that decides on the
/// caller's clock gets every answer wrong.
pub const SKEW: Duration = Duration::from_secs(60);

fn lease_end(view: &RunView) -> Timestamp {
    match view.state {
        RunState::Running { lease_until, .. } => lease_until,
        ref other => panic!("expected a running run, got {other:?}"),
    }
}

fn assert_store_clock(what: &str, store_now: Timestamp, reference: Timestamp) {
    let off = (store_now.as_millis() - reference.as_millis()).abs();
    assert!(
        off < SKEW.as_millis() as i64 / 4,
        "{what}: the store reported {store_now} as its clock, {off} ms off the store's \
         clock ({reference}): it must answer with its own clock, not the caller's"
    );
}

/// Instances whose clocks are [`SKEW`] off the store's decide nothing with
/// them: one a minute ahead is told `Running` on a fresh lease and renews
/// to the store's `now + lease`; one a minute behind still takes over a
/// lease that ran out; `peek` and `Running` report the store's clock.
pub async fn lease_expiry_is_judged_on_the_store_clock<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store_clock = factory.clock();
    let holder = factory.instance().await;
    let ahead = factory
        .instance_with_clock(SkewedClock::new(store_clock.clone(), true, SKEW))
        .await;
    let behind = factory
        .instance_with_clock(SkewedClock::new(store_clock.clone(), false, SKEW))
        .await;

    // A fresh 30 s lease has "run out" on a clock a minute ahead.
    let run = RunKey::new(job("skew-ahead"), future_slot(factory, 0));
    won(holder
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "holder"))
        .await
        .expect("claim"));
    let holders_end = lease_end(&holder.peek(&run).await.expect("peek"));
    match ahead
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "ahead"))
        .await
        .expect("claim from the instance ahead")
    {
        ClaimOutcome::Running {
            lease_until,
            store_now,
        } => {
            assert_eq!(lease_until, holders_end, "the holder's lease is untouched");
            assert_store_clock("Running", store_now, store_clock.now());
        }
        other => panic!(
            "an instance {SKEW:?} ahead must be told Running on a fresh {LONG_LEASE:?} lease, \
             got {other:?}: the store judged the lease on the caller's clock"
        ),
    }
    let view = ahead
        .peek(&run)
        .await
        .expect("peek from the instance ahead");
    assert_store_clock("peek", view.store_now, store_clock.now());

    // A renewal from the instance ahead counts from the store's now.
    let token = Token::generate();
    let run_ahead = RunKey::new(job("skew-renew"), future_slot(factory, 0));
    won(ahead
        .claim_lease(&lease_claim(run_ahead.clone(), token, "ahead"))
        .await
        .expect("claim from the instance ahead"));
    assert_eq!(
        ahead
            .heartbeat(&run_ahead, token, LONG_LEASE)
            .await
            .expect("heartbeat"),
        Renewal::Renewed
    );
    let view = ahead.peek(&run_ahead).await.expect("peek");
    let left = lease_end(&view).since(view.store_now);
    assert!(
        left <= LONG_LEASE,
        "a renewal from an instance {SKEW:?} ahead left {left:?} of a {LONG_LEASE:?} lease: \
         the lease end was counted from the caller's clock"
    );

    // A lease that ran out is still alive on a clock a minute behind.
    let run = RunKey::new(job("skew-behind"), future_slot(factory, 0));
    let first = won(holder
        .claim_lease(&short(lease_claim(
            run.clone(),
            Token::generate(),
            "holder",
        )))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    match behind
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "behind"))
        .await
        .expect("claim from the instance behind")
    {
        ClaimOutcome::Won(win) => assert_eq!(win.attempt, first.attempt.next()),
        other => panic!(
            "an instance {SKEW:?} behind must take over a lease that ran out, got {other:?}: \
             the store judged the lease on the caller's clock"
        ),
    }
    let view = behind
        .peek(&run)
        .await
        .expect("peek from the instance behind");
    assert_store_clock("peek", view.store_now, store_clock.now());
}

/// Collecting every run of a job forgets none of its fences: the next win
/// of the job gets a fence above every earlier one, whether collection took
/// all the job's runs or only its highest-fenced one.
pub async fn fences_outlive_garbage_collection<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let second = now - now.rem_euclid(1000);
    // Old slots lie close together, so one window can cover them all at the
    // claims and none of them at the collection.
    let old = |i: i64| Slot::from_millis(second - 7_200_000 + i * 50);
    let recent = |i: i64| Slot::from_millis(second - 60_000 + i * 1000);
    let keep = Duration::from_secs(3600);
    // Every window ends shortly, so `keep` decides what is collected.
    let window = closing_window(now, old(0));
    let catch_up = |job: &anarchon_core::JobName, slot: Slot| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.claim.max_late = window;
        c
    };
    let fence_of = |outcome: ClaimOutcome| won(outcome).fence.expect("lease stores fence");

    let later = |job: &anarchon_core::JobName, slot: Slot| {
        let mut c = catch_up(job, slot);
        c.claim.max_late = keep;
        c
    };

    // Job one: every run is collected.
    let all_gone = job("gc-fence-all");
    let mut highest = None;
    for i in 0..3 {
        let claim = catch_up(&all_gone, old(i));
        highest = highest.max(Some(fence_of(
            store.claim_lease(&claim).await.expect("claim"),
        )));
        store
            .finish(claim.run(), claim.claim.token, RunOutcome::Succeeded)
            .await
            .expect("finish");
    }
    // Job two: only the highest-fenced run is collected; an older fence stays.
    let top_gone = job("gc-fence-top");
    let kept = catch_up(&top_gone, recent(0));
    let kept_fence = fence_of(store.claim_lease(&kept).await.expect("claim"));
    let collected = catch_up(&top_gone, old(0));
    let top = fence_of(store.claim_lease(&collected).await.expect("claim"));
    assert!(top > kept_fence);
    store
        .finish(
            collected.run(),
            collected.claim.token,
            RunOutcome::Succeeded,
        )
        .await
        .expect("finish");

    wait_out_windows().await;
    store.collect_garbage(keep).await.expect("gc");

    assert!(
        store
            .history(&all_gone, 10)
            .await
            .expect("history")
            .is_empty(),
        "collection takes every finished run older than `keep`"
    );
    let next = fence_of(
        store
            .claim_lease(&later(&all_gone, recent(0)))
            .await
            .expect("claim after collection"),
    );
    assert!(
        Some(next) > highest,
        "after collecting every run of a job its next fence {next:?} must exceed every \
         earlier one (up to {highest:?})"
    );

    let left: Vec<Slot> = store
        .history(&top_gone, 10)
        .await
        .expect("history")
        .iter()
        .map(|r| r.run.slot)
        .collect();
    assert_eq!(left, [recent(0)], "collection took the old run only");
    let next = fence_of(
        store
            .claim_lease(&later(&top_gone, recent(1)))
            .await
            .expect("claim after collection"),
    );
    assert!(
        next > top,
        "the next fence {next:?} must exceed the collected run's {top:?}, not only the \
         fences of the runs that remain ({kept_fence:?})"
    );
}

/// What `peek` and `history` say about one run, to compare before and after.
async fn facts<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> (RunState, Vec<RunRecord>) {
    let state = store.peek(run).await.expect("peek").state;
    let records = store
        .history(&run.job, 100)
        .await
        .expect("history")
        .into_iter()
        .filter(|r| &r.run == run)
        .collect();
    (state, records)
}

/// `heartbeat`, `finish` and `release` with a token that never won a live
/// run answer `Fenced` and change nothing: not a live run, not a run that
/// was never claimed, not a finished run (whose old token is fenced too,
/// except for the same finish sent again: see
/// [`a_finish_sent_again_gets_the_same_answer`]).
pub async fn tokens_that_hold_nothing_are_fenced_and_change_nothing<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let stranger = Token::generate();
    let failed = || RunOutcome::Failed {
        error: "a stranger's error".to_owned(),
    };
    let try_everything = |run: RunKey, token: Token, finished_by_token: bool| {
        let b = b.clone();
        async move {
            let answers = [
                (
                    "heartbeat",
                    b.heartbeat(&run, token, Duration::from_secs(3600))
                        .await
                        .expect("heartbeat"),
                ),
                (
                    "finish(succeeded)",
                    b.finish(&run, token, RunOutcome::Succeeded)
                        .await
                        .expect("finish"),
                ),
                (
                    "finish(failed)",
                    b.finish(&run, token, failed()).await.expect("finish"),
                ),
                ("release", b.release(&run, token).await.expect("release")),
                (
                    "give back",
                    b.give_back(&run, token).await.expect("give back"),
                ),
            ];
            for (call, answer) in answers {
                if finished_by_token && call == "finish(succeeded)" {
                    // The same finish sent again: its own check.
                    continue;
                }
                assert_eq!(
                    answer,
                    Renewal::Fenced,
                    "{call} of {run} with a token that holds nothing must be fenced"
                );
            }
        }
    };

    // A live run held by someone else.
    let live = RunKey::new(job("stranger-live"), future_slot(factory, 0));
    let holder = Token::generate();
    won(a
        .claim_lease(&lease_claim(live.clone(), holder, "a"))
        .await
        .expect("claim"));
    let before = facts(&*a, &live).await;
    try_everything(live.clone(), stranger, false).await;
    assert_eq!(
        facts(&*a, &live).await,
        before,
        "fenced calls must not change the live run"
    );
    match b
        .claim_lease(&lease_claim(live.clone(), Token::generate(), "b"))
        .await
        .expect("claim")
    {
        ClaimOutcome::Running { .. } => {}
        other => panic!("a stranger's release must not hand the run over: {other:?}"),
    }
    assert_eq!(
        a.heartbeat(&live, holder, LONG_LEASE)
            .await
            .expect("heartbeat"),
        Renewal::Renewed,
        "the holder still holds the run"
    );

    // A run nobody claimed: nothing may appear.
    let absent = RunKey::new(job("stranger-absent"), future_slot(factory, 0));
    try_everything(absent.clone(), stranger, false).await;
    assert_eq!(
        facts(&*a, &absent).await,
        (RunState::Absent, Vec::new()),
        "fenced calls must not create a record"
    );

    // A finished run: neither a stranger nor its old runner changes it.
    let done = RunKey::new(job("stranger-done"), future_slot(factory, 0));
    let runner = Token::generate();
    won(a
        .claim_lease(&lease_claim(done.clone(), runner, "a"))
        .await
        .expect("claim"));
    a.finish(&done, runner, RunOutcome::Succeeded)
        .await
        .expect("finish");
    let before = facts(&*a, &done).await;
    try_everything(done.clone(), stranger, false).await;
    try_everything(done.clone(), runner, true).await;
    assert_eq!(
        facts(&*a, &done).await,
        before,
        "fenced calls must not change a finished run"
    );
}

/// A permutation of `0..n` from `seed` (Fisher–Yates on splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = crate::faults::SplitMix(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// What a claim in a batch should meet, set up before the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Free,
    HeldByOther,
    Finished,
    Old,
}

/// `claim_many` answers each claim with that run's own facts, in the
/// batch's order, for odd-sized and shuffled batches mixing jobs, runs of
/// one job, live leases, finished and late runs: a `Won` carries the fence
/// `history` records for that run, a `Running` the lease end its holder
/// sees, a `Done` the run's own end.
pub async fn claim_many_answers_with_each_runs_facts<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let a = factory.instance().await;
    let b = factory.instance().await;
    let base = future_slot(factory, 0).as_millis();
    let now = factory.clock().now().as_millis();
    let old_base = now - now.rem_euclid(1000) - 3_600_000;
    for (round, size) in [1usize, 3, 7, 13].into_iter().enumerate() {
        let setups: Vec<Setup> = (0..size)
            .map(|i| match (i * 7 + round) % 4 {
                0 => Setup::Free,
                1 => Setup::HeldByOther,
                2 => Setup::Finished,
                _ => Setup::Old,
            })
            .collect();
        let runs: Vec<RunKey> = (0..size)
            .map(|i| {
                let job = job(&format!("facts-{round}-{}", i % 3));
                let slot = match setups[i] {
                    Setup::Old => old_base + i as i64 * 1000,
                    _ => base + i as i64 * 1000,
                };
                RunKey::new(job, Slot::from_millis(slot))
            })
            .collect();
        // b holds or finishes some runs, each with its own lease length,
        // so every `Running` answer names one holder.
        let mut holders_end = HashMap::new();
        for (i, run) in runs.iter().enumerate() {
            let token = Token::generate();
            let mut claim = lease_claim(run.clone(), token, "b");
            claim.lease = LONG_LEASE + Duration::from_millis(100 * i as u64);
            match setups[i] {
                Setup::HeldByOther => {
                    won(b.claim_lease(&claim).await.expect("claim"));
                    holders_end.insert(i, lease_end(&b.peek(run).await.expect("peek")));
                }
                Setup::Finished => {
                    won(b.claim_lease(&claim).await.expect("claim"));
                    let outcome = if i % 2 == 0 {
                        RunOutcome::Succeeded
                    } else {
                        RunOutcome::Failed {
                            error: "set up".to_owned(),
                        }
                    };
                    b.finish(run, token, outcome).await.expect("finish");
                }
                Setup::Free | Setup::Old => {}
            }
        }
        let order = shuffled(size, 0x5eed + round as u64);
        let batch: Vec<LeaseClaim> = order
            .iter()
            .map(|&i| lease_claim(runs[i].clone(), Token::generate(), "a"))
            .collect();
        let answers = a
            .claim_many(&batch)
            .await
            .expect("claim_many")
            .all()
            .expect("every claim of the batch answered");
        assert_eq!(answers.len(), batch.len(), "one answer per claim");
        let mut fences = Vec::new();
        for (answer, &i) in answers.iter().zip(&order) {
            let run = &runs[i];
            let context = format!("batch of {size}, claim of {run} ({:?})", setups[i]);
            match (setups[i], answer) {
                (Setup::Free, ClaimOutcome::Won(win)) => {
                    assert_eq!(win.attempt, Attempt::FIRST, "{context}");
                    let record = a
                        .history(&run.job, 100)
                        .await
                        .expect("history")
                        .into_iter()
                        .find(|r| &r.run == run)
                        .unwrap_or_else(|| panic!("{context}: won but not in the history"));
                    assert_eq!(record.fence, win.fence, "{context}: the fence of this run");
                    assert_eq!(
                        record.instance.as_ref().map(|i| i.as_str()),
                        Some("a"),
                        "{context}"
                    );
                    fences.push((run.job.clone(), win.fence));
                }
                (Setup::HeldByOther, ClaimOutcome::Running { lease_until, .. }) => {
                    assert_eq!(
                        Some(lease_until),
                        holders_end.get(&i),
                        "{context}: the lease end of this run's holder"
                    );
                }
                (Setup::Finished, ClaimOutcome::Done(state)) => {
                    let expected = if i % 2 == 0 {
                        FinalState::Succeeded
                    } else {
                        FinalState::Failed
                    };
                    assert_eq!(*state, expected, "{context}: this run's own end");
                }
                (Setup::Old, ClaimOutcome::Late) => {}
                (_, other) => panic!("{context}: answered {other:?}"),
            }
        }
        let distinct: std::collections::HashSet<_> = fences.iter().collect();
        assert_eq!(
            distinct.len(),
            fences.len(),
            "each win of a job has its own fence: {fences:?}"
        );
    }
}

/// The lease suite as one `#[tokio::test]` per check; arguments as for
/// [`claim_suite!`](crate::claim_suite).
#[macro_export]
macro_rules! lease_suite {
    ($factory:expr) => {
        $crate::lease_suite!(
            $factory,
            tokio::test(flavor = "multi_thread", worker_threads = 4)
        );
    };
    ($factory:expr, $attr:meta) => {
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::lease,
            lease_claim_is_exclusive,
            claim_many_answers_in_order,
            own_lease_retry_is_recognised,
            live_lease_answers_running,
            late_claim_is_refused_and_recorded_missed,
            finished_run_is_done,
            a_finish_sent_again_gets_the_same_answer,
            failed_run_keeps_its_error,
            heartbeat_extends_the_lease,
            expired_lease_is_taken_over,
            attempts_exhausted_is_interrupted,
            a_run_given_back_keeps_its_attempt,
            a_hand_over_wakes_a_waiting_backup,
            overlap_skip_waits_for_the_live_run,
            overlap_ignores_expired_and_allow_overlaps,
            release_hands_over_at_once,
            peek_reports_the_state,
            fences_grow_and_history_lists_runs,
            garbage_collection_forgets_old_ended_runs_only,
            garbage_collection_keeps_each_jobs_late_window,
            lease_expiry_is_judged_on_the_store_clock,
            fences_outlive_garbage_collection,
            tokens_that_hold_nothing_are_fenced_and_change_nothing,
            claim_many_answers_with_each_runs_facts,
        );
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::differential,
            claims_follow_the_core_decision,
            renewals_follow_the_core_decision,
        );
        $crate::__scheduler_lease_checks!($factory, $attr);
    };
}
