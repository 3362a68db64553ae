//! What the holder of a lease does with it: heartbeat, finish, release,
//! give back, hand over; and what a token that holds nothing gets.

use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, FinalState, LeaseStore, MaxAttempts, RecordState, Renewal, RunKey,
    RunOutcome, RunState, Token,
};

use crate::claim::{future_slot, job};
use crate::factory::StoreFactory;

use super::{
    LONG_LEASE, SHORT_LEASE, facts, hold, lease_claim, short, two_instances,
    two_instances_and_a_run, wait_out, won,
};

/// A finished run is `Done` for every later claim; its token is fenced for
/// everything but the same finish sent again.
pub async fn finished_run_is_done<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "finished").await;
    let token = hold(&*a, &run).await;
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
                error: "a different end".to_owned(),
                retry: None
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
    let (a, b) = two_instances(factory).await;
    let failed = |error: &str| RunOutcome::Failed {
        error: error.to_owned(),
        retry: None,
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
        let token = hold(&*a, &run).await;
        assert_eq!(
            a.finish(&run, token, outcome.clone())
                .await
                .expect("finish"),
            Renewal::Renewed
        );
        let recorded = facts(&*a, &run).await;
        // Sent again, through another connection as a retry may be; and again.
        for (call, says) in [
            (
                "finish again",
                "the same finish from the same token gets the same answer",
            ),
            ("finish a third time", "and again"),
        ] {
            assert_eq!(
                b.finish(&run, token, outcome.clone()).await.expect(call),
                Renewal::Renewed,
                "{run}: {says}"
            );
        }
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
    let token = hold(&*store, &run).await;
    let error = "exit status 3: disk full".to_owned();
    let answer = store
        .finish(
            &run,
            token,
            RunOutcome::Failed {
                error: error.clone(),
                retry: None,
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

/// Whatever a handler's error says, its failure is recorded: the finish
/// is `Renewed` and the run ends `failed` with the text. A finish the store
/// refused (for a character it cannot hold, say) would leave the run
/// `running` until a backup took it over and ran the handler again.
///
/// Texts with quotes, backslashes, JSON, a store's own pattern characters,
/// line breaks, other scripts and a NUL are kept as given; a store that
/// cannot hold a NUL may write it as the two characters `\0`, nothing else.
pub async fn an_error_of_any_text_is_recorded<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let texts = [
        r#"said "no" \ {"state":"succeeded","lease":"9"} %d+ ' -- ]] $1"#.to_owned(),
        "line one\nline two\r\n\ttabbed; Grüße, 日本語, 🚫".to_owned(),
        "before\0after: a NUL from a C library".to_owned(),
    ];
    for (i, error) in texts.iter().enumerate() {
        let run = RunKey::new(
            job("failed-text"),
            future_slot(factory, i64::try_from(i).expect("few")),
        );
        let token = hold(&*store, &run).await;
        let answer = store
            .finish(
                &run,
                token,
                RunOutcome::Failed {
                    error: error.clone(),
                    retry: None,
                },
            )
            .await
            .unwrap_or_else(|e| panic!("the finish with the error {error:?} failed: {e}"));
        assert_eq!(
            answer,
            Renewal::Renewed,
            "the finish with the error {error:?}"
        );
        let view = store.peek(&run).await.expect("peek");
        assert_eq!(
            view.state,
            RunState::Finished(FinalState::Failed),
            "the run whose handler failed with {error:?}"
        );
        let history = store.history(&run.job, 10).await.expect("history");
        let recorded = history
            .iter()
            .find(|r| r.run == run)
            .and_then(|r| r.error.clone())
            .unwrap_or_else(|| panic!("no error recorded for {error:?}"));
        let as_written = error.replace('\0', "\\0");
        assert!(
            recorded == *error || recorded == as_written,
            "the error {error:?} was recorded as {recorded:?}"
        );
    }
}

/// A heartbeat moves the lease end forward, so the run is not taken over.
///
/// The claim's lease is short and the heartbeat asks for a long one: the
/// sleeps only set how early the backup's claim can come (past the first
/// lease end, whatever the machine does), and a loaded machine that
/// delays it by a second still finds the renewed lease alive.
pub async fn heartbeat_extends_the_lease<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "heartbeat").await;
    let token = Token::generate();
    let first = Duration::from_millis(600);
    let renewed = Duration::from_millis(2_500);
    let mut claim = lease_claim(run.clone(), token, "a");
    claim.lease = first;
    won(a.claim_lease(&claim).await.expect("claim"));
    let before = match a.peek(&run).await.expect("peek").state {
        RunState::Running { lease_until, .. } => lease_until,
        other => panic!("{other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        a.heartbeat(&run, token, renewed).await.expect("heartbeat"),
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
    // Past the first lease end (300 + 450 ms after the claim, at least),
    // well inside the renewed one.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let now = b.peek(&run).await.expect("peek").store_now;
    assert!(
        now > before,
        "the backup's claim must come after the first lease end: {now} vs {before}"
    );
    let outcome = b
        .claim_lease(&short(lease_claim(run.clone(), Token::generate(), "b")))
        .await
        .expect("claim");
    assert!(
        matches!(outcome, ClaimOutcome::Running { .. }),
        "a renewed lease is not taken over: {outcome:?}"
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
    let (a, b) = two_instances(factory).await;
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
    let (a, b) = two_instances(factory).await;
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

/// `release` ends the lease at once: the next claim takes over.
pub async fn release_hands_over_at_once<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b, run) = two_instances_and_a_run(factory, "release").await;
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

/// `heartbeat`, `finish` and `release` with a token that never won a live
/// run answer `Fenced` and change nothing: not a live run, not a run that
/// was never claimed, not a finished run (whose old token is fenced too,
/// except for the same finish sent again: see
/// [`a_finish_sent_again_gets_the_same_answer`]).
pub async fn tokens_that_hold_nothing_are_fenced_and_change_nothing<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = two_instances(factory).await;
    let stranger = Token::generate();
    let failed = || RunOutcome::Failed {
        error: "a stranger's error".to_owned(),
        retry: None,
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
    let holder = hold(&*a, &live).await;
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
    let runner = hold(&*a, &done).await;
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
