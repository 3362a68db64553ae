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
use super::{SHORT_LEASE, lease_claim, records_of, store_now, until_store_clock_passes, won};

/// The wait before the retries these checks ask for.
const BACKOFF: Duration = SHORT_LEASE;

/// A wait no stall of a test machine outlasts: the retry stays pending.
const LONG_BACKOFF: Duration = Duration::from_secs(60);

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

/// A racer's claim: its index, its token, its answer.
type Entry = (usize, Token, ClaimOutcome);

/// Claims `run` from every one of `racers` at once, each with a fresh
/// token.
async fn race<S: LeaseStore + ?Sized>(racers: &[Arc<S>], run: &RunKey) -> Vec<Entry> {
    join_all(racers.iter().enumerate().map(|(i, store)| async move {
        let token = Token::generate();
        let claim = lease_claim(run.clone(), token, &format!("racer-{i}"));
        (i, token, store.claim_lease(&claim).await.expect("claim"))
    }))
    .await
}

/// The wins of a race, each with its racer and token; every other answer
/// must be `Running`, with the lease end `until` when one is given.
fn wins_of(answers: &[Entry], until: Option<Timestamp>, what: &str) -> Vec<(usize, Token, Win)> {
    let mut wins = Vec::new();
    for (i, token, answer) in answers {
        match answer {
            ClaimOutcome::Won(win) => wins.push((*i, *token, *win)),
            ClaimOutcome::Running { lease_until, .. } => {
                if let Some(until) = until {
                    assert_eq!(
                        *lease_until, until,
                        "{what}: a claim before the retry is due waits for it"
                    );
                }
            }
            other => panic!("{what}: the others are told the run is going, got {other:?}"),
        }
    }
    assert!(
        wins.len() <= 1,
        "{what}: at most one of {RACERS} racing instances may win: {answers:?}"
    );
    wins
}

/// When the claim that holds `run` now was decided, on the store's clock:
/// its lease end less the suite's lease (at or after it, for a store that
/// stamps the lease when its write lands).
async fn claimed_at<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> Timestamp {
    let records = records_of(store, run, 20).await;
    let until = records
        .first()
        .and_then(|r| r.lease_until)
        .expect("a running record with a lease end");
    until.saturating_sub(super::LONG_LEASE)
}

/// Races for `run`'s retry right after its failure and, unless a machine
/// slow enough to let it come due meanwhile had one claim win it there,
/// again once the store's clock has passed `retry_at`: the one win, never
/// decided before `retry_at` on the store's clock.
async fn the_retry<S: LeaseStore + ?Sized>(
    racers: &[Arc<S>],
    run: &RunKey,
    retry_at: Timestamp,
    what: &str,
) -> (usize, Token, Win) {
    let early = race(racers, run).await;
    // Told to wait for the retry's due time, unless the retry came due
    // during the race and one claim won it: the claims decided after that
    // win are told the winner's lease end instead.
    let won_early = early
        .iter()
        .any(|(_, _, answer)| matches!(answer, ClaimOutcome::Won(_)));
    let mut wins = wins_of(
        &early,
        (!won_early).then_some(retry_at),
        &format!("{what}, before it is due"),
    );
    if wins.is_empty() {
        until_store_clock_passes(racers[0].as_ref(), run, retry_at).await;
        let due = race(racers, run).await;
        wins = wins_of(&due, None, &format!("{what}, once due"));
        assert_eq!(
            wins.len(),
            1,
            "{what}: exactly one of {RACERS} racing instances must win the due retry: {due:?}"
        );
    }
    assert!(
        claimed_at(racers[0].as_ref(), run).await >= retry_at,
        "{what}: the retry was decided before its due time ({retry_at}) on the store's clock"
    );
    wins[0]
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
        let next = the_retry(&racers, &run, retry_at, &format!("retry {retry}")).await;
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
    for (_, _, answer) in race(&racers, &run).await {
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
    let ahead_won = match ahead
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
            false
        }
        // Only on a machine slow enough that the retry came due before
        // this claim was decided, on the store's clock.
        ClaimOutcome::Won(_) => true,
        other => panic!(
            "an instance {SKEW:?} ahead must wait for a retry due on the store's clock, got {other:?}"
        ),
    };
    if !ahead_won {
        until_store_clock_passes(holder.as_ref(), &run, retry_at).await;
        let win = won(behind
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "behind"))
            .await
            .expect("claim from the instance behind"));
        assert_eq!(win.cause, AttemptCause::Retry);
        assert!(win.fence > first.fence, "a new, higher fence");
    }
    assert!(
        claimed_at(holder.as_ref(), &run).await >= retry_at,
        "the retry was decided before its due time ({retry_at}) on the store's clock"
    );
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
    // A retry due in a minute stays pending whatever the machine's pace.
    a.finish(&failing, token, failed("flaky", Some(LONG_BACKOFF)))
        .await
        .expect("finish");
    assert_eq!(
        b.claim_lease(&skip(&next, "b")).await.expect("claim"),
        ClaimOutcome::Overlap,
        "a pending retry holds off the next slot"
    );
    // Once a retry has run and ended, a later slot runs: another job's
    // failed run, its retry due at once.
    let failing = RunKey::new(job("retry-overlap-ran"), future_slot(factory, 0));
    let later = RunKey::new(failing.job.clone(), later.slot);
    let token = Token::generate();
    won(a
        .claim_lease(&lease_claim(failing.clone(), token, "a"))
        .await
        .expect("claim"));
    a.finish(&failing, token, failed("flaky", Some(BACKOFF)))
        .await
        .expect("finish");
    let due = retry_due(a.as_ref(), &failing, "after the failure").await;
    until_store_clock_passes(a.as_ref(), &failing, due).await;
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
    let window = Duration::from_millis(3_000);
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
    until_store_clock_passes(
        store.as_ref(),
        &pending,
        Timestamp::from_millis(now + 2_800),
    )
    .await;
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
