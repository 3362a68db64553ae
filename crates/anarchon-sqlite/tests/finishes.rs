//! Finishes that arrive together share one write transaction, and each is
//! still answered for its own run.
//!
//! The tests run on Tokio's single-threaded runtime: the finishes of a
//! `join_all` are all queued before the task that sends them first runs,
//! so the groups are the same on every run.

mod common;

use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, FinalState, JobName, LeaseClaim, LeaseStore, RecordState, Renewal, RetryPlan,
    RunKey, RunOutcome, Slot, StoreErrorKind, Timestamp, Token,
};
use anarchon_sqlite::SqliteStore;
use anarchon_testkit::claim::job;
use anarchon_testkit::lease::lease_claim;
use common::SqliteFactory;
use futures::future::join_all;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// `n` runs of jobs `<prefix>-<i>`, won by `store`.
async fn held(store: &SqliteStore, prefix: &str, n: usize) -> Vec<LeaseClaim> {
    let now = now_ms();
    let slot = Slot::from_millis(now - now.rem_euclid(1000));
    let held: Vec<LeaseClaim> = (0..n)
        .map(|i| {
            lease_claim(
                RunKey::new(job(&format!("{prefix}-{i}")), slot),
                Token::generate(),
                "test",
            )
        })
        .collect();
    let outcomes = anarchon_testkit::fleet::outcomes_of_a_batch(store, &held).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))),
        "{outcomes:?}"
    );
    held
}

#[tokio::test]
async fn finishes_sent_together_are_one_transaction_each_answered_for_its_run() {
    let factory = SqliteFactory::new();
    let store = SqliteStore::open(factory.options()).await.unwrap();
    let held = held(&store, "burst", 30).await;
    let now = now_ms();
    let run = |i: usize| held[i].run().clone();
    let own = |i: usize| held[i].claim.token;
    let ok = RunOutcome::Succeeded;
    let failed = |error: &str, before: i64| RunOutcome::Failed {
        error: error.into(),
        retry: Some(RetryPlan {
            after: Duration::from_secs(5),
            before: Timestamp::from_millis(before),
        }),
    };
    let never_claimed = RunKey::new(JobName::new("burst-none").unwrap(), run(0).slot);

    // (run, token, end, the answer it must get)
    let mut burst: Vec<(RunKey, Token, RunOutcome, Renewal)> = vec![
        (run(0), Token::generate(), ok.clone(), Renewal::Fenced),
        (
            run(1),
            own(1),
            failed("boom", now + 3_600_000),
            Renewal::Renewed,
        ),
        (run(2), own(2), failed("bang", now), Renewal::Renewed),
        (
            never_claimed,
            Token::generate(),
            ok.clone(),
            Renewal::Fenced,
        ),
        (run(3), own(3), ok.clone(), Renewal::Renewed),
        (run(3), own(3), ok.clone(), Renewal::Renewed),
        (run(4), Token::generate(), ok.clone(), Renewal::Fenced),
        (run(4), own(4), ok.clone(), Renewal::Renewed),
    ];
    for i in 10..held.len() {
        burst.push((run(i), own(i), ok.clone(), Renewal::Renewed));
    }

    let before = store.finish_transactions();
    let answers = join_all(
        burst
            .iter()
            .map(|(run, token, end, _)| store.finish(run, *token, end.clone())),
    )
    .await;
    assert_eq!(
        store.finish_transactions() - before,
        1,
        "{} finishes at once",
        burst.len()
    );
    for ((run, _, _, expected), answer) in burst.iter().zip(answers) {
        assert_eq!(answer.expect("finish"), *expected, "{run}");
    }

    let record = |i: usize| {
        let (store, job) = (store.clone(), held[i].run().job.clone());
        async move { store.history(&job, 1).await.expect("history").remove(0) }
    };
    assert_eq!(
        record(0).await.state,
        RecordState::Running,
        "a fenced finish changes nothing"
    );
    let pending = record(1).await;
    assert_eq!(pending.state, RecordState::Finished(FinalState::Failed));
    assert_eq!(pending.error.as_deref(), Some("boom"));
    assert!(
        pending.retry_at.is_some(),
        "a retry due before the next slot is kept"
    );
    let late = record(2).await;
    assert_eq!(
        late.retry_at, None,
        "a retry due after the next slot is not kept"
    );
    assert!(
        late.error
            .as_deref()
            .is_some_and(|e| e.starts_with("bang") && e.len() > 4),
        "its error says why it was not retried: {:?}",
        late.error
    );
    for i in [3, 4].into_iter().chain(10..held.len()) {
        assert_eq!(
            record(i).await.state,
            RecordState::Finished(FinalState::Succeeded),
            "{}",
            run(i)
        );
    }

    // Sent again, the same finishes get the same answers.
    let again = join_all(
        burst
            .iter()
            .map(|(run, token, end, _)| store.finish(run, *token, end.clone())),
    )
    .await;
    for ((run, _, _, expected), answer) in burst.iter().zip(again) {
        assert_eq!(answer.expect("finish sent again"), *expected, "{run}");
    }
}

/// One finish the database refuses (here a trigger refuses its error
/// text) ends the group's transaction: the group is sent again one by one,
/// so only that finish fails, and the others are recorded.
#[tokio::test]
async fn a_finish_the_database_refuses_fails_alone() {
    let factory = SqliteFactory::new();
    let store = SqliteStore::open(factory.options()).await.unwrap();
    let held = held(&store, "refused", 4).await;
    let raw = factory.raw_pool().await;
    sqlx::query(
        "CREATE TRIGGER refuse_a_finish BEFORE UPDATE ON anarchon_runs
         WHEN NEW.error = 'refuse me'
         BEGIN SELECT RAISE(ABORT, 'refused by the test''s trigger'); END",
    )
    .execute(&raw)
    .await
    .unwrap();
    let refused = RunOutcome::Failed {
        error: "refuse me".into(),
        retry: None,
    };
    let ends = [
        RunOutcome::Succeeded,
        RunOutcome::Succeeded,
        refused,
        RunOutcome::Succeeded,
    ];

    let before = store.finish_transactions();
    let answers = join_all(
        held.iter()
            .zip(&ends)
            .map(|(c, end)| store.finish(c.run(), c.claim.token, end.clone())),
    )
    .await;
    assert_eq!(
        store.finish_transactions() - before,
        1 + 4,
        "the four together, then each alone"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        let run = held[i].run();
        if i == 2 {
            let err = answer.expect_err("the refused finish fails");
            assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
            assert!(err.to_string().contains(&run.to_string()), "{err}");
            assert!(err.to_string().contains("refused by the test"), "{err}");
        } else {
            assert_eq!(answer.expect("finish"), Renewal::Renewed, "{run}");
            let record = store.history(&run.job, 1).await.unwrap().remove(0);
            assert_eq!(record.state, RecordState::Finished(FinalState::Succeeded));
        }
    }
}

/// While another connection holds the write lock past the busy timeout,
/// every finish of a group fails as temporary, each naming its own run,
/// and nothing is recorded; sent again once the lock is gone, each is.
#[tokio::test]
async fn a_locked_group_fails_each_finish_as_temporary() {
    let factory = SqliteFactory::new();
    let store = SqliteStore::open(
        factory
            .options()
            .with_busy_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let held = held(&store, "locked", 4).await;
    let raw = factory.raw_pool().await;
    let mut holder = raw.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO anarchon_jobs (job, last_fence) VALUES ('holder', 0)")
        .execute(&mut *holder)
        .await
        .unwrap();

    let before = store.finish_transactions();
    let answers = join_all(
        held.iter()
            .map(|c| store.finish(c.run(), c.claim.token, RunOutcome::Succeeded)),
    )
    .await;
    assert_eq!(
        store.finish_transactions() - before,
        1,
        "four finishes at once"
    );
    for (c, answer) in held.iter().zip(answers) {
        let err = answer.expect_err("the file is locked");
        assert!(err.is_temporary(), "{err}");
        assert!(err.to_string().contains(&c.run().to_string()), "{err}");
        assert!(err.to_string().contains("busy timeout"), "{err}");
    }

    for c in &held {
        let record = store.history(&c.run().job, 1).await.unwrap().remove(0);
        assert_eq!(record.state, RecordState::Running, "nothing was recorded");
    }

    // A finish alone keeps the underlying error as its source.
    let lone = store
        .finish(held[0].run(), held[0].claim.token, RunOutcome::Succeeded)
        .await
        .expect_err("the file is locked");
    assert!(
        lone.is_temporary() && lone.to_string().contains("busy timeout"),
        "{lone}"
    );
    assert!(std::error::Error::source(&lone).is_some(), "{lone:?}");
    holder.rollback().await.unwrap();

    let answers = join_all(
        held.iter()
            .map(|c| store.finish(c.run(), c.claim.token, RunOutcome::Succeeded)),
    )
    .await;
    for (c, answer) in held.iter().zip(answers) {
        assert_eq!(answer.expect("sent again"), Renewal::Renewed, "{}", c.run());
    }
}
