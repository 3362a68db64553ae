//! Faults between the scheduler and a real PostgreSQL: a claim's reply lost
//! on the wire, a random history of faults, a restart, and the whole claim
//! suite over a slow line. Run alone, after the suites, by
//! `cargo xtask test-all` (`cargo test -p anarchon-pg --test faults`).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use anarchon_pg::{PgOptions, PgStore};
use anarchon_testkit::faults::{self, RetryResolution};
use anarchon_testkit::{FaultProxy, StoreFactory};
use async_trait::async_trait;

/// Instances of one table, connecting to `url`.
struct On {
    url: String,
    table: anarchon_pg::TableName,
}

#[async_trait]
impl StoreFactory for On {
    type Store = PgStore;

    /// As `PgFactory`: nothing on the client side reads a clock.
    async fn instance_with_clock(&self, _clock: Arc<dyn anarchon_core::Clock>) -> Arc<PgStore> {
        Arc::new(
            PgStore::connect_with(
                PgOptions::new(&self.url)
                    .table_name(self.table.clone())
                    .pool_size(1),
            )
            .await
            .unwrap(),
        )
    }
}

/// The whole claim suite, with every instance connecting through a
/// [`FaultProxy`] that adds [`SLOW_LINK_LATENCY`](anarchon_testkit::SLOW_LINK_LATENCY) each way.
///
/// `tests/suite.rs` runs it over loopback, where a claim's one round trip
/// comes back in microseconds and racing instances hardly overlap. Here
/// each round trip takes milliseconds on a real TCP path, so claims of the
/// same run are in flight together far more often, as between hosts:
/// exclusivity, own-retry recognition and whole schedulers are checked
/// under that interleaving too (the reliability issue: "run the claim suite through the
/// proxy for every backend").
mod claim_suite_through_a_slow_proxy {
    anarchon_testkit::claim_suite!(
        crate::common::PgFactory::new()
            .await
            .behind_a_slow_proxy()
            .await
    );
}

#[tokio::test]
async fn a_lost_claim_reply_still_gives_the_run_one_winner() {
    let url = common::url().await;
    let table = common::fresh_table();
    let proxy = FaultProxy::start(common::upstream(&url)).await.unwrap();
    let proxied = common::via(&url, &proxy);
    let direct = On {
        url: url.clone(),
        table: table.clone(),
    };
    let via = On {
        url: proxied,
        table: table.clone(),
    };
    faults::lost_reply_resolves_to_one_winner(&via, &direct, &proxy, RetryResolution::Recognised)
        .await;
    direct.instance().await.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_give_a_run_two_runners() {
    let factory = common::PgFactory::new().await;
    faults::random_faults_never_give_a_run_two_runners(&factory, Duration::from_secs(15)).await;
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
    let _guard = tokio::task::spawn_blocking(move || control.restart())
        .await
        .unwrap();
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
