//! Retries: a failed run is tried again once its retry is due on the
//! store's clock, by exactly one of the instances that race for it.

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::retry::NOT_RETRIED;
use anarchon_core::{
    AttemptCause, AttemptEnd, ClaimOutcome, FinalState, LeaseStore, Overlap, RecordState,
    RetryPlan, RunKey, RunOutcome, RunState, Slot, Timestamp, Token, Win,
};
use futures::future::join_all;

use crate::claim::{RACERS, future_slot, job};
use crate::factory::StoreFactory;

use super::clocks::{SKEW, assert_store_clock, skewed_pair};
use super::{SHORT_LEASE, lease_claim, records_of, store_now, wait_out, won};

/// The wait before the retries these checks ask for.
const BACKOFF: Duration = SHORT_LEASE;

/// A failure asking for a retry `after` from the store's now, with no next
/// slot in the way.
fn failed(error: &str, after: Option<Duration>) -> RunOutcome {
    RunOutcome::Failed {
        error: error.into(),
        retry: after.map(|after| RetryPlan {
            after,
            before: Timestamp::from_millis(i64::MAX),
        }),
    }
}

/// Claims `run` from every one of `racers` at once, each with a fresh
/// token; returns the answers.
async fn race<S: LeaseStore + ?Sized>(racers: &[Arc<S>], run: &RunKey) -> Vec<ClaimOutcome> {
    join_all(racers.iter().enumerate().map(|(i, store)| async move {
        let claim = lease_claim(run.clone(), Token::generate(), &format!("racer-{i}"));
        store.claim_lease(&claim).await.expect("claim")
    }))
    .await
}

/// Races for `run` and returns the one win, with its racer's index.
async fn one_winner<S: LeaseStore + ?Sized>(
    racers: &[Arc<S>],
    run: &RunKey,
    what: &str,
) -> (usize, Token, Win) {
    let answers = join_all(racers.iter().enumerate().map(|(i, store)| async move {
        let token = Token::generate();
        let claim = lease_claim(run.clone(), token, &format!("racer-{i}"));
        (i, token, store.claim_lease(&claim).await.expect("claim"))
    }))
    .await;
    let wins: Vec<(usize, Token, Win)> = answers
        .iter()
        .filter_map(|(i, token, outcome)| match outcome {
            ClaimOutcome::Won(win) => Some((*i, *token, *win)),
            _ => None,
        })
        .collect();
    assert_eq!(
        wins.len(),
        1,
        "{what}: exactly one of {RACERS} racing instances must win the due retry; answers {answers:?}"
    );
    for (_, _, outcome) in &answers {
        assert!(
            matches!(outcome, ClaimOutcome::Won(_) | ClaimOutcome::Running { .. }),
            "{what}: the others are told the retry is running, got {outcome:?}"
        );
    }
    wins[0]
}

/// Every answer is `Running` with the retry's due time as the lease end.
fn all_wait_for(answers: &[ClaimOutcome], retry_at: Timestamp, what: &str) {
    for answer in answers {
        match answer {
            ClaimOutcome::Running { lease_until, .. } => assert_eq!(
                *lease_until, retry_at,
                "{what}: a claim before the retry is due waits for it"
            ),
            other => {
                panic!("{what}: a claim before the retry is due must answer Running, got {other:?}")
            }
        }
    }
}

/// The due time of `run`'s pending retry.
async fn retry_due<S: LeaseStore + ?Sized>(store: &S, run: &RunKey, what: &str) -> Timestamp {
    match store.peek(run).await.expect("peek").state {
        RunState::RetryPending { retry_at, .. } => retry_at,
        other => panic!("{what}: expected a pending retry, got {other:?}"),
    }
}

/// A job allowed two retries: the first failure is retried once by one of
/// 8 racing instances when due — not before — as attempt 2 with a higher
/// fence; so is the second; the third failure (no retries left) is final,
/// and every claim then answers `Done(Failed)`. The history keeps both
/// failed attempts, each with its instance and error.
pub async fn a_failed_run_is_retried_once_per_allowed_retry<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        racers.push(factory.instance().await);
    }
    let run = RunKey::new(job("retried"), future_slot(factory, 0));
    let first = Token::generate();
    let win = won(racers[0]
        .claim_lease(&lease_claim(run.clone(), first, "racer-0"))
        .await
        .expect("claim"));
    assert_eq!((win.cause, win.retries), (AttemptCause::First, 0));
    let mut holder = (0, first, win);
    for retry in 1..=2u32 {
        let (i, token, win) = holder;
        let before = store_now(racers[i].as_ref(), &run.job).await;
        assert_eq!(
            racers[i]
                .finish(
                    &run,
                    token,
                    failed(&format!("failure {retry}"), Some(BACKOFF))
                )
                .await
                .expect("finish"),
            anarchon_core::Renewal::Renewed
        );
        let retry_at = retry_due(racers[i].as_ref(), &run, "after a failure with a retry").await;
        assert!(
            retry_at >= before.saturating_add(BACKOFF),
            "the retry is due {BACKOFF:?} after the failure on the store's clock ({before}), got {retry_at}"
        );
        all_wait_for(
            &race(&racers, &run).await,
            retry_at,
            "before the retry is due",
        );
        wait_out(BACKOFF).await;
        let next = one_winner(&racers, &run, &format!("retry {retry}")).await;
        let (_, _, next_win) = next;
        assert_eq!(
            next_win.attempt.get(),
            retry + 1,
            "retry {retry} is the next attempt"
        );
        assert_eq!(next_win.cause, AttemptCause::Retry, "told it is a retry");
        assert_eq!(next_win.retries, retry, "told which retry it is");
        assert!(
            next_win.fence > win.fence,
            "the retry's fence ({:?}) rises above the failed attempt's ({:?})",
            next_win.fence,
            win.fence
        );
        // The failed attempt's token holds nothing any more.
        assert_eq!(
            racers[i]
                .heartbeat(&run, token, SHORT_LEASE)
                .await
                .expect("heartbeat"),
            anarchon_core::Renewal::Fenced,
            "the failed attempt's token is fenced once the retry runs"
        );
        holder = next;
    }
    let (i, token, _) = holder;
    racers[i]
        .finish(&run, token, failed("failure 3", None))
        .await
        .expect("finish");
    for answer in race(&racers, &run).await {
        assert_eq!(
            answer,
            ClaimOutcome::Done(FinalState::Failed),
            "the last failure is final"
        );
    }
    let records = records_of(racers[0].as_ref(), &run, 20).await;
    let record = records.first().expect("the run's record");
    assert_eq!(record.state, RecordState::Finished(FinalState::Failed));
    assert_eq!(record.attempt.map(|a| a.get()), Some(3));
    assert_eq!(record.retry_at, None, "no retry pending");
    assert_eq!(record.error.as_deref(), Some("failure 3"));
    assert_eq!(record.cause(), Some(AttemptCause::Retry));
    let earlier: Vec<(u32, AttemptEnd, Option<&str>)> = record
        .earlier
        .iter()
        .map(|p| (p.attempt.get(), p.ended, p.error.as_deref()))
        .collect();
    assert_eq!(
        earlier,
        vec![
            (1, AttemptEnd::Failed, Some("failure 1")),
            (2, AttemptEnd::Failed, Some("failure 2")),
        ],
        "the history keeps each failed attempt with its error"
    );
    assert!(
        record
            .earlier
            .iter()
            .all(|p| p.instance.is_some() && p.at.is_some()),
        "each past attempt keeps its instance and end: {:?}",
        record.earlier
    );
}

/// A retry is due on the store's clock: an instance a minute ahead is told
/// to wait (with the due time on the store's clock) and one a minute behind
/// wins it once the store's clock reaches it.
pub async fn a_retry_is_never_claimed_before_it_is_due_on_the_store_clock<F: StoreFactory>(
    factory: &F,
) where
    F::Store: LeaseStore,
{
    let store_clock = factory.clock();
    let holder = factory.instance().await;
    let (ahead, behind) = skewed_pair(factory).await;
    let run = RunKey::new(job("retry-skew"), future_slot(factory, 0));
    let token = Token::generate();
    let first = won(holder
        .claim_lease(&lease_claim(run.clone(), token, "holder"))
        .await
        .expect("claim"));
    holder
        .finish(&run, token, failed("flaky", Some(BACKOFF)))
        .await
        .expect("finish");
    let retry_at = retry_due(holder.as_ref(), &run, "after the failure").await;
    match ahead
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "ahead"))
        .await
        .expect("claim")
    {
        ClaimOutcome::Running {
            lease_until,
            store_now,
        } => {
            assert_eq!(lease_until, retry_at, "told when the retry is due");
            assert_store_clock("Running", store_now, store_clock.now());
        }
        other => panic!(
            "an instance {SKEW:?} ahead must wait for a retry due on the store's clock, got {other:?}"
        ),
    }
    wait_out(BACKOFF).await;
    let win = won(behind
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "behind"))
        .await
        .expect("claim from the instance behind"));
    assert_eq!(win.cause, AttemptCause::Retry);
    assert!(win.fence > first.fence, "a new, higher fence");
}

/// A retry that would be due at or after the job's next slot is not made:
/// the failure is final at once, its error says why, and claims answer
/// `Done(Failed)`.
pub async fn a_retry_due_after_the_next_slot_is_not_made<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = super::two_instances(factory).await;
    let run = RunKey::new(job("retry-too-late"), future_slot(factory, 0));
    let token = Token::generate();
    won(a
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
    let now = store_now(a.as_ref(), &run.job).await;
    let outcome = RunOutcome::Failed {
        error: "broken".into(),
        retry: Some(RetryPlan {
            after: Duration::from_secs(60),
            before: now.saturating_add(Duration::from_secs(30)),
        }),
    };
    a.finish(&run, token, outcome).await.expect("finish");
    assert_eq!(
        b.peek(&run).await.expect("peek").state,
        RunState::Finished(FinalState::Failed),
        "no retry pending"
    );
    assert_eq!(
        b.claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Failed)
    );
    let records = records_of(b.as_ref(), &run, 20).await;
    let record = records.first().expect("a record");
    assert_eq!(record.retry_at, None);
    assert_eq!(
        record.error.as_deref(),
        Some(format!("broken{NOT_RETRIED}").as_str()),
        "the history says why it was not retried"
    );
}

/// With `Overlap::Skip`, a run whose retry is pending is still going: the
/// job's next slot is skipped until the retry has run and ended.
pub async fn overlap_skip_sees_a_pending_retry_as_the_run_still_going<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = super::two_instances(factory).await;
    let name = job("retry-overlap");
    let failing = RunKey::new(name.clone(), future_slot(factory, 0));
    let next = RunKey::new(name.clone(), future_slot(factory, 60_000));
    let later = RunKey::new(name, future_slot(factory, 120_000));
    let skip = |run: &RunKey, instance: &str| {
        let mut claim = lease_claim(run.clone(), Token::generate(), instance);
        claim.overlap = Overlap::Skip;
        claim
    };
    let token = Token::generate();
    won(a
        .claim_lease(&lease_claim(failing.clone(), token, "a"))
        .await
        .expect("claim"));
    a.finish(&failing, token, failed("flaky", Some(BACKOFF)))
        .await
        .expect("finish");
    assert_eq!(
        b.claim_lease(&skip(&next, "b")).await.expect("claim"),
        ClaimOutcome::Overlap,
        "a pending retry holds off the next slot"
    );
    wait_out(BACKOFF).await;
    let retry_token = Token::generate();
    won(b
        .claim_lease(&lease_claim(failing.clone(), retry_token, "b"))
        .await
        .expect("retry"));
    b.finish(&failing, retry_token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    won(a.claim_lease(&skip(&later, "a")).await.expect("claim"));
}

/// Garbage collection keeps a failed run whose retry is pending, however
/// old its slot, as it keeps a run whose lease a backup may still take
/// over; a failed run without a retry goes as usual.
pub async fn garbage_collection_keeps_a_pending_retry<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let name = job("retry-gc");
    let now = store_now(store.as_ref(), &name).await.as_millis();
    let window = Duration::from_millis(1_000);
    let pending = RunKey::new(name.clone(), Slot::from_millis(now - 500));
    let final_failure = RunKey::new(name.clone(), Slot::from_millis(now - 400));
    for (run, retry) in [
        (&pending, Some(Duration::from_secs(60))),
        (&final_failure, None),
    ] {
        let token = Token::generate();
        let mut claim = lease_claim(run.clone(), token, "a");
        claim.claim.max_late = window;
        won(store.claim_lease(&claim).await.expect("claim"));
        store
            .finish(run, token, failed("flaky", retry))
            .await
            .expect("finish");
    }
    // Both slots leave the job's late window and the collection's keep.
    tokio::time::sleep(window + Duration::from_millis(300)).await;
    store
        .collect_garbage(Duration::from_millis(500))
        .await
        .expect("collect garbage");
    assert!(
        records_of(store.as_ref(), &final_failure, 20)
            .await
            .is_empty(),
        "a failed run without a retry is collected as usual"
    );
    let kept = records_of(store.as_ref(), &pending, 20).await;
    assert!(
        kept.first().is_some_and(|r| r.retry_at.is_some()),
        "a pending retry is kept: {kept:?}"
    );
}
