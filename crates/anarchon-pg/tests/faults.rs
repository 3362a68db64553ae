//! Faults between the scheduler and a real PostgreSQL: a claim's reply lost
//! on the wire, a random history of faults, a restart, and the whole claim
//! suite over a slow line. Run alone, after the suites, by
//! `cargo xtask test-all` (`cargo test -p anarchon-pg --test faults`).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use anarchon_testkit::StoreFactory;

/// The kit's fault checks: the claim suite over a slow line, a claim's
/// reply lost after the database applied it, and the random fault history.
mod kit {
    anarchon_testkit::fault_suite!(
        leases: crate::common::PgFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// When the server's postmaster started, read from the server itself.
async fn postmaster_start_time(url: &str) -> String {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let (started,): (String,) = sqlx::query_as(
        "SELECT to_char(pg_postmaster_start_time(), 'YYYY-MM-DD\"T\"HH24:MI:SS.US')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let _ = conn.close().await;
    started
}

/// PostgreSQL restarts under two running schedulers: they recover without
/// a restart of their own, no slot runs twice, and a run won before the
/// restart is still won after it (the store is durable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_recover_from_a_database_restart() {
    use anarchon_core::{ClaimOutcome, ClaimStore, RunKey, Schedule, Scheduler, Slot, Token};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    let factory = common::PgFactory::new().await;
    let runs: Arc<Mutex<BTreeMap<i64, u32>>> = Arc::default();
    let mut schedulers = Vec::new();
    for _ in 0..2 {
        let mut b = Scheduler::builder(factory.instance().await)
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(500));
        let runs = runs.clone();
        b.job(
            "through-restart",
            Schedule::every(Duration::from_secs(1)).unwrap(),
        )
        .unwrap()
        .run(move |ctx| {
            *runs
                .lock()
                .unwrap()
                .entry(ctx.slot().as_millis())
                .or_default() += 1;
            async { Ok::<_, String>(()) }
        })
        .unwrap();
        schedulers.push(b.start().unwrap());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: Vec<i64> = runs.lock().unwrap().keys().copied().collect();
    assert!(!before.is_empty(), "runs before the restart");
    let control = anarchon_testkit::restart::ServerControl::for_service(
        anarchon_testkit::servers::Service::Postgres,
    );
    let started_before = postmaster_start_time(factory.url()).await;
    let _guard = tokio::task::spawn_blocking(move || control.restart())
        .await
        .unwrap();
    let started_after = postmaster_start_time(factory.url()).await;
    assert!(
        started_after > started_before,
        "the server the tests use was restarted: it started at {started_before}, and after \
         the restart at {started_after}"
    );
    let restarted_at = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for s in schedulers {
        s.shutdown().await;
    }
    let runs = runs.lock().unwrap().clone();
    assert!(runs.values().all(|n| *n == 1), "a slot ran twice: {runs:?}");
    assert!(
        runs.keys().any(|slot| *slot > restarted_at + 1000),
        "claims resumed after the restart: {runs:?}"
    );
    // A run won before the restart cannot be won again after it.
    let store = factory.instance().await;
    let slot = Slot::from_millis(before[0]);
    let run = RunKey::new(
        anarchon_core::JobName::new("through-restart").unwrap(),
        slot,
    );
    let mut again = anarchon_testkit::claim::claim_request(run, Token::generate(), "late");
    again.max_late = Duration::from_secs(3600);
    let outcome = store.claim(&again).await.unwrap();
    assert!(!matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
}

/// A finish statement whose answer never comes (the server got it, its
/// reply is lost on a line that stays open) is given up within the store's
/// ten-second limit: the finish fails as unavailable, so its runner sends
/// it again, and the store's finishes are not held up behind it for good.
/// Sent again once the line works, the finish gets the same answer as if
/// the first had been answered, and another run's finish is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_statement_with_no_answer_is_given_up() {
    use anarchon_core::{
        ClaimOutcome, ClaimRequest, InstanceId, JobName, LeaseClaim, LeaseStore, MaxAttempts,
        Overlap, Renewal, RunKey, RunOutcome, Slot, Token,
    };
    let factory = common::PgFactory::new().await;
    let proxy = anarchon_testkit::FaultProxy::start(common::upstream(factory.url()))
        .await
        .unwrap();
    let via = common::via(factory.url(), &proxy);
    let factory = factory.through(via);
    let store = factory.instance().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let claim = |job: &str| LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(now)),
            token: Token::generate(),
            instance: InstanceId::new("stuck").unwrap(),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(60),
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    };
    let (stuck, later) = (claim("finish-never-answered"), claim("finish-after-it"));
    for c in [&stuck, &later] {
        let won = store.claim_lease(c).await.unwrap();
        assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
    }

    // The finish's parameters carry the job's name: its reply stalls.
    proxy.stall_replies_after(b"finish-never-answered");
    let sent = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        store.finish(stuck.run(), stuck.claim.token, RunOutcome::Succeeded),
    )
    .await
    .expect("a finish with no answer is given up, not waited for for good");
    let error = answer.expect_err("no answer came");
    assert!(error.is_temporary(), "sent again by its runner: {error}");
    assert!(
        error.to_string().contains("finish-never-answered"),
        "names its run: {error}"
    );
    assert!(
        sent.elapsed() >= Duration::from_secs(9),
        "given up at the limit, not before: {:?}",
        sent.elapsed()
    );

    proxy.cut_connections();
    for c in [&stuck, &later] {
        assert_eq!(
            store
                .finish(c.run(), c.claim.token, RunOutcome::Succeeded)
                .await
                .unwrap(),
            Renewal::Renewed,
            "{}",
            c.run()
        );
    }
}
