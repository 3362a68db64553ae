//! Faults: Redis unreachable, a line that drops or hangs, scripts flushed
//! mid-run, another server behind the same address, an eviction policy
//! that can forget runs, and the claim suite over a slow line.
//!
//! None of them stops the shared server: a proxy in front of it drops or
//! freezes the line. Two disturb the whole server briefly (SCRIPT FLUSH,
//! CONFIG SET maxmemory-policy, put back by a guard); every store reloads
//! its scripts transparently, and `cargo xtask test-all` runs this file
//! alone, one test at a time, after the other suites.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, ClaimStore, LeaseStore, RunKey, RunOutcome, Slot, StoreErrorKind, Token,
};
use anarchon_redis::{
    Error, EvictionCheck, EvictionFinding, RedisLeaseStore, RedisOptions, RedisScriptStore,
    RedisStreamIdStore,
};
use anarchon_testkit::claim::{claim_request, job};
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::servers::unique_prefix;
use common::proxy::Proxy;
use common::{Cleanup, raw, within};
use deadpool_redis::redis;

const BOUND: Duration = Duration::from_secs(15);

fn ahead(seconds: i64) -> Slot {
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) + 600_000 + seconds * 1000)
}

fn won(outcome: ClaimOutcome) -> anarchon_core::Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

async fn behind_proxy(stem: &str) -> (Proxy, RedisOptions, Cleanup) {
    let url = common::url().await;
    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix(stem);
    let cleanup = Cleanup::new(&url, &prefix);
    let opts = RedisOptions::new(proxy.url(&url))
        .with_prefix(&prefix)
        .unwrap()
        .with_connect_timeout(Duration::from_millis(500))
        // Short enough for the held replies to time out soon, long enough
        // that the healthy calls of these tests never do on a slow machine.
        .with_response_timeout(Duration::from_millis(1_500));
    (proxy, opts, cleanup)
}

/// Log lines written while the guard lives (this thread's subscriber).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_a_temporary_error_in_bounded_time() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let opts = RedisOptions::new(format!("redis://{closed}"))
        .with_connect_timeout(Duration::from_millis(500));
    let err = within(
        BOUND,
        "connecting to nothing",
        RedisLeaseStore::connect(&opts),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_temporary());
    assert_eq!(
        err.into_store_error("redis-lease").kind(),
        StoreErrorKind::Unavailable
    );
}

/// The error `claim` ends in, within [`BOUND`], checked to be
/// `Unavailable`; `what` names the claim.
async fn unavailable_within<T: std::fmt::Debug>(
    what: &str,
    claim: impl std::future::Future<Output = Result<T, anarchon_core::StoreError>>,
) -> anarchon_core::StoreError {
    let err = within(BOUND, what, claim).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    err
}

#[tokio::test]
async fn a_dropped_line_is_unavailable_and_the_next_connection_recovers() {
    let (proxy, opts, _cleanup) = behind_proxy("cut").await;
    let lease = RedisLeaseStore::connect(&opts).await.unwrap();
    let sid = RedisStreamIdStore::connect(&opts).await.unwrap();
    let run = RunKey::new(job("cut"), ahead(0));
    won(lease
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .unwrap());

    // Connections drop, new ones are refused: Redis is gone.
    proxy.cut();
    for _ in 0..2 {
        let cut_claim = lease_claim(run.clone(), Token::generate(), "a");
        let err =
            unavailable_within("a claim over a cut line", lease.claim_lease(&cut_claim)).await;
        assert!(err.is_temporary());
        let sid_claim = claim_request(run.clone(), Token::generate(), "a");
        unavailable_within("a stream-id claim over a cut line", sid.claim(&sid_claim)).await;
    }

    // A line that drops but accepts again: the store reconnects by itself.
    let (proxy, opts, _cleanup) = behind_proxy("drop").await;
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let run = RunKey::new(job("drop"), ahead(0));
    let token = Token::generate();
    let first = won(store
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .unwrap());
    proxy.drop_connections();
    let mut again = None;
    for _ in 0..3 {
        match store
            .claim_lease(&lease_claim(run.clone(), token, "a"))
            .await
        {
            Ok(outcome) => {
                again = Some(outcome);
                break;
            }
            Err(e) => assert!(e.is_temporary(), "{e}"),
        }
    }
    assert_eq!(again.map(won), Some(first), "own retry after reconnecting");
}

/// A claim whose reply hangs (the command reached Redis and was applied;
/// the proxy holds the answer) times out as unavailable; the run is taken
/// (another instance is told `Running`), and the retry with the same token
/// is recognised as the winner, attempt 1.
#[tokio::test]
async fn a_claim_whose_reply_hangs_times_out_and_its_retry_is_recognised() {
    let (proxy, opts, _cleanup) = behind_proxy("freeze").await;
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let run = RunKey::new(job("freeze"), ahead(0));
    let claim = lease_claim(run.clone(), Token::generate(), "a");
    proxy.hold_replies(true);
    let err = within(
        BOUND,
        "a claim whose reply hangs",
        store.claim_lease(&claim),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
    let direct = RedisOptions::new(common::url().await)
        .with_prefix(opts.key_prefix().as_str())
        .unwrap();
    let direct = RedisLeaseStore::connect(&direct).await.unwrap();
    let theirs = direct
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
        .await
        .unwrap();
    assert!(
        matches!(theirs, ClaimOutcome::Running { .. }),
        "the held claim reached Redis and holds the run: {theirs:?}"
    );
    proxy.hold_replies(false);
    let mut outcome = None;
    for _ in 0..3 {
        match store.claim_lease(&claim).await {
            Ok(o) => {
                outcome = Some(o);
                break;
            }
            Err(e) => assert!(e.is_temporary(), "{e}"),
        }
    }
    let win = won(outcome.expect("the store recovers once the line is back"));
    assert_eq!(win.attempt, Attempt::FIRST);
}

#[tokio::test]
async fn scripts_flushed_mid_run_are_loaded_again() {
    let url = common::url().await;
    let (proxy, opts, _cleanup) = behind_proxy("flush").await;
    let lease = RedisLeaseStore::connect(&opts).await.unwrap();
    let script = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap();
    let run = RunKey::new(job("flush"), ahead(0));
    let token = Token::generate();
    won(lease
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .unwrap());
    let mut admin = raw(&url).await;
    let flush = || redis::cmd("SCRIPT").arg("FLUSH").to_owned();

    // Other tests load the scripts whenever they connect, so a flush can be
    // undone before our call: flush until a call meets NOSCRIPT.
    let mut reloaded = None;
    for _ in 0..20 {
        let _: () = flush().query_async(&mut admin).await.unwrap();
        proxy.take();
        assert_eq!(
            lease
                .heartbeat(&run, token, Duration::from_secs(30))
                .await
                .unwrap(),
            anarchon_core::Renewal::Renewed
        );
        let traffic = proxy.take();
        if traffic.count("SCRIPT") > 0 {
            reloaded = Some(traffic);
            break;
        }
    }
    let traffic = reloaded.expect("a heartbeat met NOSCRIPT after SCRIPT FLUSH");
    assert_eq!(
        traffic.commands,
        ["EVALSHA", "SCRIPT", "EVALSHA"],
        "{traffic:?}"
    );
    assert_eq!(traffic.round_trips, 2, "the reload travels with the resend");

    let mut reloaded = None;
    for round in 0..20 {
        // Two script calls (a batch script carries a hundred claims), so
        // the reload is seen to be sent once for both.
        let batch: Vec<_> = (0..150)
            .map(|i| {
                lease_claim(
                    RunKey::new(job(&format!("flush-{i}")), ahead(round)),
                    Token::generate(),
                    "a",
                )
            })
            .collect();
        let _: () = flush().query_async(&mut admin).await.unwrap();
        proxy.take();
        let outcomes = lease.claim_many(&batch).await.unwrap().all().unwrap();
        assert!(
            outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))),
            "{outcomes:?}"
        );
        let traffic = proxy.take();
        if traffic.count("SCRIPT") > 0 {
            reloaded = Some(traffic);
            break;
        }
    }
    let traffic = reloaded.expect("a batch met NOSCRIPT after SCRIPT FLUSH");
    assert_eq!(traffic.round_trips, 2, "{traffic:?}");
    assert_eq!(
        traffic.count("SCRIPT"),
        1,
        "the claim script is loaded once: {traffic:?}"
    );
    assert_eq!(traffic.count("EVALSHA"), 4, "{traffic:?}");

    let _: () = flush().query_async(&mut admin).await.unwrap();
    won(script
        .claim(&claim_request(run.clone(), Token::generate(), "a"))
        .await
        .unwrap());
    let _: () = flush().query_async(&mut admin).await.unwrap();
    lease
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .unwrap();
    assert!(
        lease.history(&run.job, 1).await.unwrap()[0]
            .finished_at
            .is_some()
    );
}

#[tokio::test]
async fn another_server_behind_the_address_is_noticed_and_logged_loudly() {
    let captured = Captured::default();
    let _log = captured.install();
    let url = common::url().await;
    let (proxy, opts, _cleanup) = behind_proxy("runid").await;
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let run_id = store.server().run_id.clone();
    let other: String = run_id
        .chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    assert_eq!(store.server_changes(), 0);

    // A restart or a failover: another process answers at the same address.
    proxy.rewrite(&run_id, &other);
    proxy.drop_connections();
    let run = RunKey::new(job("runid"), ahead(0));
    let mut claimed = false;
    for _ in 0..3 {
        if store
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
            .await
            .is_ok()
        {
            claimed = true;
            break;
        }
    }
    assert!(claimed, "the store reconnects");
    assert_eq!(
        store.server_changes(),
        1,
        "the new run_id was noticed on reconnect"
    );
    let log = captured.text();
    assert!(log.contains("REDIS CHANGED UNDER THE STORE"), "{log}");
    assert!(log.contains(&run_id) && log.contains(&other), "{log}");

    // And on demand, without a reconnect.
    proxy.rewrite(&run_id, &run_id);
    assert!(store.check_server().await.unwrap());
    assert_eq!(store.server_changes(), 2);
    assert!(!store.check_server().await.unwrap());
    drop(url);
}

/// Puts `maxmemory-policy` back when the test ends, pass or fail.
struct PolicyGuard {
    url: String,
    original: String,
}

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        let restored = common::query_blocking::<()>(
            &self.url,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(&self.original),
        );
        if let Err(e) = restored {
            eprintln!("could not restore maxmemory-policy {}: {e}", self.original);
        }
    }
}

#[tokio::test]
async fn an_evicting_server_is_reported_warned_about_or_refused() {
    let captured = Captured::default();
    let _log = captured.install();
    let url = common::url().await;
    let mut admin = raw(&url).await;
    let original = common::config_get(&mut admin, "maxmemory-policy").await;
    let _guard = PolicyGuard {
        url: url.clone(),
        original,
    };
    let prefix = unique_prefix("evict");
    let _cleanup = Cleanup::new(&url, &prefix);
    let opts = RedisOptions::new(url.clone()).with_prefix(&prefix).unwrap();

    for (policy, warning) in [
        ("allkeys-lru", "REDIS MAY EVICT THE STORE'S KEYS"),
        ("volatile-ttl", "maxmemory-policy is not `noeviction`"),
    ] {
        common::set_eviction_policy(&mut admin, policy).await;
        let store = RedisLeaseStore::connect(&opts).await.unwrap();
        assert_eq!(
            store.server().eviction,
            EvictionFinding::from_policy(policy)
        );
        assert!(
            captured.text().contains(warning),
            "{policy}: {}",
            captured.text()
        );
        let err =
            RedisLeaseStore::connect(&opts.clone().with_eviction_check(EvictionCheck::Refuse))
                .await
                .unwrap_err();
        assert!(matches!(err, Error::EvictionPolicy { .. }), "{err:?}");
        assert!(err.to_string().contains(policy), "{err}");
        assert!(err.to_string().contains("noeviction"), "{err}");
    }

    common::set_eviction_policy(&mut admin, "noeviction").await;
    let store = RedisLeaseStore::connect(&opts.clone().with_eviction_check(EvictionCheck::Refuse))
        .await
        .unwrap();
    assert_eq!(store.server().eviction, EvictionFinding::NoEviction);
}

/// The kit's fault checks on each strategy that can sit behind the kit's
/// proxy: the claim suite over a slow line, a claim's reply lost after
/// Redis applied it, and (lease) the random fault history.
mod kit_lease {
    anarchon_testkit::fault_suite!(
        leases: crate::common::LeaseFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// As `kit_lease`, on the claim-only `stream-id` strategy: its claim is one
/// pipelined round trip (`XADD`, then `XRANGE` to recognise an own retry).
mod kit_stream_id {
    anarchon_testkit::fault_suite!(
        claims: crate::common::StreamIdFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// As `kit_lease`, on the claim-only `script` strategy.
mod kit_script {
    anarchon_testkit::fault_suite!(
        claims: crate::common::ScriptFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// A real restart of a Redis without persistence: the store notices that
/// the server changed under it (a new run_id), and a finished run can be won
/// again — the failure mode the docs describe for Redis without AOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_detected() {
    use anarchon_core::{ClaimOutcome, LeaseStore, RunKey, RunOutcome, Token};
    let factory = common::LeaseFactory::new().await;
    let store = factory.connect().await.unwrap();
    let slot = anarchon_testkit::claim::future_slot(&factory, 0);
    let run = RunKey::new(anarchon_core::JobName::new("forgotten").unwrap(), slot);
    let token = Token::generate();
    let won = store
        .claim_lease(&anarchon_testkit::lease::lease_claim(
            run.clone(),
            token,
            "a",
        ))
        .await
        .unwrap();
    assert!(matches!(won, ClaimOutcome::Won(_)));
    store
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .unwrap();
    let control = anarchon_testkit::restart::ServerControl::for_service(
        anarchon_testkit::servers::Service::Redis,
    );
    let _guard = tokio::task::spawn_blocking(move || control.restart())
        .await
        .unwrap();
    // The first call after the restart reconnects and sees the new run_id.
    let mut again = None;
    for _ in 0..50 {
        match store
            .claim_lease(&anarchon_testkit::lease::lease_claim(
                run.clone(),
                Token::generate(),
                "b",
            ))
            .await
        {
            Ok(outcome) => {
                again = Some(outcome);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(
        store.server_changes() >= 1,
        "the changed run_id was noticed"
    );
    assert!(
        matches!(again, Some(ClaimOutcome::Won(_))),
        "without persistence the finished run was forgotten: {again:?}"
    );
}
