//! Statements per call, counted where sqlx sends them.
//!
//! sqlx reports every statement it executes as a `sqlx::query` tracing
//! event carrying the SQL text. This binary installs a subscriber that
//! records those events, and checks that each store call — a claim, a batch
//! claim of 50 runs, a heartbeat, finish, release, peek, history read and
//! garbage collection — is exactly one statement on the wire (and that the
//! store's own counter agrees). A claim that ran BEGIN / SELECT / INSERT /
//! COMMIT from the client would show four or more.

mod common;

use std::sync::{Mutex, Once};
use std::time::Duration;

use anarchon_core::retry::NOT_RETRIED;
use anarchon_core::{
    ClaimOutcome, ClaimRequest, FinalState, InstanceId, JobName, LeaseClaim, LeaseStore,
    MaxAttempts, Overlap, RecordState, Renewal, RetryPlan, RunKey, RunOutcome, Slot, Timestamp,
    Token,
};
use anarchon_testkit::StoreFactory;
use common::PgFactory;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The SQL of every statement sqlx executed in this process.
static SENT: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

struct SqlText(String);

impl Visit for SqlText {
    fn record_str(&mut self, field: &Field, value: &str) {
        if matches!(field.name(), "summary" | "db.statement") {
            self.0.push_str(value);
            self.0.push('\n');
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            let mut text = SqlText(String::new());
            event.record(&mut text);
            SENT.lock().expect("lock").push(text.0);
        }
    }
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only subscriber of this test binary");
    });
}

/// Statements sent so far that name `table`.
fn sent_to(table: &str) -> usize {
    let quoted = format!("\"{table}");
    SENT.lock()
        .expect("lock")
        .iter()
        .filter(|sql| sql.contains(&quoted))
        .count()
}

/// This machine's time, in Unix milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

fn claim(job: &str, slot: i64) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(JobName::new(job).expect("job"), Slot::from_millis(slot)),
            token: Token::generate(),
            instance: InstanceId::new("counter").expect("id"),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(30),
        overlap: Overlap::Skip,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_call_is_one_statement() {
    install();
    let factory = PgFactory::new().await;
    let store = factory.instance().await;
    let table = factory.table().as_str().to_owned();
    let now = now_ms();
    let base = now - now.rem_euclid(1000) + 600_000;

    // One statement per call, checked call by call.
    let expect_one = {
        let table = table.clone();
        let store = store.clone();
        move |what: &str, before: (usize, u64)| {
            let wire = sent_to(&table) - before.0;
            let counted = store.statements_sent() - before.1;
            assert_eq!(wire, 1, "{what}: {wire} statements on the wire");
            assert_eq!(counted, 1, "{what}: the store counted {counted}");
        }
    };
    let mark = || (sent_to(&table), store.statements_sent());

    const CLAIMS: i64 = 100;
    let before = mark();
    let mut held = Vec::new();
    for i in 0..CLAIMS {
        let c = claim(&format!("single-{i}"), base);
        let outcome = store.claim_lease(&c).await.expect("claim");
        assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
        held.push(c);
    }
    assert_eq!(
        sent_to(&table) - before.0,
        CLAIMS as usize,
        "{CLAIMS} claims, one statement each"
    );
    assert_eq!(store.statements_sent() - before.1, CLAIMS as u64);

    let batch: Vec<LeaseClaim> = (0..50)
        .map(|i| claim(&format!("batch-{i}"), base))
        .collect();
    let before = mark();
    let outcomes = anarchon_testkit::fleet::outcomes_of_a_batch(&*store, &batch).await;
    assert_eq!(outcomes.len(), 50);
    expect_one("a batch of 50 claims", before);

    let first = &held[0];
    let (run, token) = (first.run().clone(), first.claim.token);
    let before = mark();
    common::heartbeat_renews(&store, &run, token, "heartbeat").await;
    expect_one("heartbeat", before);
    let before = mark();
    store.peek(&run).await.expect("peek");
    expect_one("peek", before);
    let before = mark();
    assert_eq!(
        store.release(&run, token).await.expect("release"),
        Renewal::Renewed
    );
    expect_one("release", before);
    let second = &held[1];
    let before = mark();
    assert_eq!(
        store
            .finish(second.run(), second.claim.token, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );
    expect_one("finish", before);
    let before = mark();
    store.history(&run.job, 10).await.expect("history");
    expect_one("history", before);
    let before = mark();
    store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("gc");
    expect_one("collect_garbage", before);
}

/// Finishes that arrive together are recorded by one statement, and each is
/// answered for its own run, token and end: a held run is recorded, one
/// held by another token (or by none) is fenced, a failure keeps its retry
/// or, when the retry would not come before the next slot, is final with
/// the note; the same finish twice gets the same answer twice, and the same
/// token with two different ends has one recorded and the other fenced.
/// A finish the server refuses for good fails alone: the others of its
/// statement are sent again one by one and recorded. When the statement
/// cannot be sent at all, every finish it was to carry fails, by name.
///
/// On this single-threaded runtime every finish is queued before the
/// store's sending task first runs, so the statement counts are exact.
#[tokio::test]
async fn finishes_sent_together_are_one_statement_each_answered_for_its_run() {
    install();
    let factory = PgFactory::new().await;
    let store = factory.instance().await;
    let table = factory.table().as_str().to_owned();
    let now = now_ms();
    let slot = now - now.rem_euclid(1000);
    let held: Vec<LeaseClaim> = (0..40)
        .map(|i| claim(&format!("burst-{i}"), slot))
        .collect();
    let outcomes = anarchon_testkit::fleet::outcomes_of_a_batch(&*store, &held).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))),
        "{outcomes:?}"
    );
    let mark = || (sent_to(&table), store.statements_sent());
    let statements_since = |before: (usize, u64)| {
        let wire = sent_to(&table) - before.0;
        let counted = (store.statements_sent() - before.1) as usize;
        assert_eq!(wire, counted, "on the wire and counted by the store");
        wire
    };
    let record = |i: usize| {
        let store = store.clone();
        let job = held[i].run().job.clone();
        async move { store.history(&job, 1).await.expect("history").remove(0) }
    };
    let failed = |error: &str, retry: Option<RetryPlan>| RunOutcome::Failed {
        error: error.into(),
        retry,
    };
    let in_5s_before = |before: Timestamp| {
        Some(RetryPlan {
            after: Duration::from_secs(5),
            before,
        })
    };
    let (own, fenced) = (|i: usize| held[i].claim.token, Renewal::Fenced);
    let run = |i: usize| held[i].run().clone();
    let never_claimed = RunKey::new(
        JobName::new("burst-none").expect("job"),
        Slot::from_millis(slot),
    );
    let ok = RunOutcome::Succeeded;

    // (run, token, end, the answer it must get)
    let mut burst: Vec<(RunKey, Token, RunOutcome, Option<Renewal>)> = vec![
        (run(0), Token::generate(), ok.clone(), Some(fenced)),
        (
            run(1),
            own(1),
            failed(
                "boom",
                in_5s_before(Timestamp::from_millis(now + 3_600_000)),
            ),
            Some(Renewal::Renewed),
        ),
        (
            run(2),
            own(2),
            failed("bang", in_5s_before(Timestamp::from_millis(now))),
            Some(Renewal::Renewed),
        ),
        (never_claimed, Token::generate(), ok.clone(), Some(fenced)),
        (run(3), own(3), ok.clone(), Some(Renewal::Renewed)),
        (run(3), own(3), ok.clone(), Some(Renewal::Renewed)),
        (run(4), Token::generate(), ok.clone(), Some(fenced)),
        (run(4), own(4), ok.clone(), Some(Renewal::Renewed)),
        // Either may be recorded; checked below.
        (run(5), own(5), ok.clone(), None),
        (run(5), own(5), failed("second thoughts", None), None),
    ];
    for i in 12..held.len() {
        burst.push((run(i), own(i), ok.clone(), Some(Renewal::Renewed)));
    }
    let before = mark();
    let answers = futures::future::join_all(
        burst
            .iter()
            .map(|(run, token, end, _)| store.finish(run, *token, end.clone())),
    )
    .await;
    assert_eq!(
        statements_since(before),
        1,
        "{} finishes at once",
        burst.len()
    );
    let answers: Vec<Renewal> = answers.into_iter().map(|a| a.expect("finish")).collect();
    for ((run, _, _, expected), answer) in burst.iter().zip(&answers) {
        if let Some(expected) = expected {
            assert_eq!(answer, expected, "{run}");
        }
    }

    assert_eq!(
        record(0).await.state,
        RecordState::Running,
        "a fenced finish changes nothing"
    );
    let pending = record(1).await;
    assert_eq!(pending.state, RecordState::Finished(FinalState::Failed));
    assert_eq!(pending.error.as_deref(), Some("boom"));
    let (ended, due) = (
        pending.finished_at.expect("finished_at"),
        pending
            .retry_at
            .expect("a retry due before the next slot is kept"),
    );
    assert_eq!(
        due.as_millis() - ended.as_millis(),
        5_000,
        "due its wait after the end"
    );
    let final_failure = record(2).await;
    assert_eq!(final_failure.retry_at, None);
    assert_eq!(
        final_failure.error.as_deref(),
        Some(format!("bang{NOT_RETRIED}").as_str())
    );
    for i in (3..5).chain(12..held.len()) {
        assert_eq!(
            record(i).await.state,
            RecordState::Finished(FinalState::Succeeded),
            "{}",
            run(i)
        );
    }
    // The two ends of run 5: exactly one was recorded, the one the record
    // shows.
    let (succeeded, failed_too) = (answers[8], answers[9]);
    assert_ne!(succeeded, failed_too, "one end recorded, the other fenced");
    let recorded = if succeeded == Renewal::Renewed {
        FinalState::Succeeded
    } else {
        FinalState::Failed
    };
    assert_eq!(record(5).await.state, RecordState::Finished(recorded));

    // A finish the server refuses (here a trigger refuses the end of run 7)
    // fails alone, and the others of its statement are sent again one by
    // one and recorded.
    let refuse = refuse_the_end_of(&table, &held[7].run().job).await;
    let refused = [
        (6, ok.clone()),
        (7, failed("refused", None)),
        (8, ok.clone()),
    ];
    let before = mark();
    let answers = futures::future::join_all(
        refused
            .iter()
            .map(|(i, end)| store.finish(held[*i].run(), own(*i), end.clone())),
    )
    .await;
    assert_eq!(
        statements_since(before),
        4,
        "the three together, then each alone"
    );
    assert_eq!(answers[0].as_ref().expect("recorded"), &Renewal::Renewed);
    let error = answers[1].as_ref().expect_err("the trigger refuses it");
    assert!(!error.is_temporary(), "{error}");
    assert!(error.to_string().contains(&run(7).to_string()), "{error}");
    assert_eq!(answers[2].as_ref().expect("recorded"), &Renewal::Renewed);
    let alone = store
        .finish(&run(7), own(7), failed("refused", None))
        .await
        .expect_err("the trigger refuses it alone too");
    let server_error = std::error::Error::source(&alone).and_then(|store| store.source());
    assert!(
        server_error.is_some_and(|e| e.downcast_ref::<sqlx::Error>().is_some()),
        "a finish sent alone keeps the server's error: {alone:?}"
    );
    assert_eq!(
        record(6).await.state,
        RecordState::Finished(FinalState::Succeeded)
    );
    assert_eq!(
        record(7).await.state,
        RecordState::Running,
        "refused, not recorded"
    );
    assert_eq!(
        record(8).await.state,
        RecordState::Finished(FinalState::Succeeded)
    );
    refuse.lift().await;

    store.close().await;
    let answers = futures::future::join_all(
        (9..12).map(|i| store.finish(held[i].run(), own(i), RunOutcome::Succeeded)),
    )
    .await;
    for (i, answer) in (9..12).zip(answers) {
        let error = answer.expect_err("the pool is closed");
        assert!(
            error
                .to_string()
                .contains(&format!("recording the end of {}", run(i))),
            "{error}"
        );
    }
}

/// A trigger on the runs table that refuses (with a data exception, as the
/// server refuses a value it cannot store) every end of one job's runs.
struct Refusal {
    admin: sqlx::PgConnection,
    function: String,
}

/// Installs a [`Refusal`] of `job`'s ends on `table`.
async fn refuse_the_end_of(table: &str, job: &anarchon_core::JobName) -> Refusal {
    let mut admin = common::admin(&common::url().await).await;
    let function = format!("{table}_refuse");
    let create = format!(
        r#"CREATE FUNCTION "{function}"() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.job = '{job}' AND NEW.state <> 'running' THEN
               RAISE EXCEPTION 'the test refuses this end' USING ERRCODE = 'data_exception';
             END IF;
             RETURN NEW;
           END $$"#
    );
    let trigger = format!(
        r#"CREATE TRIGGER "{function}" BEFORE UPDATE ON "{table}"
           FOR EACH ROW EXECUTE FUNCTION "{function}"()"#
    );
    for statement in [create, trigger] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    Refusal { admin, function }
}

impl Refusal {
    /// Drops the trigger and its function.
    async fn lift(mut self) {
        let drop = format!(r#"DROP FUNCTION "{}"() CASCADE"#, self.function);
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop.clone()))
            .execute(&mut self.admin)
            .await
            .unwrap_or_else(|e| panic!("{drop}: {e}"));
    }
}
