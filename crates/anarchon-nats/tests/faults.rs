//! Fault tests: the connection to NATS is cut mid-test by a TCP proxy
//! between the stores and the server (the shared server itself is never
//! stopped). Run alone: `cargo test -p anarchon-nats --test faults`
//! (`cargo xtask test-all` does, one test at a time).

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, Clock, InstanceId, JobName, RunKey, Schedule,
    Scheduler, Slot, StoreError, SystemClock, Token,
};
use anarchon_nats::{ClaimOptions, NatsClaimStore, NatsOptions};
use anarchon_testkit::FaultProxy;
use anarchon_testkit::StoreFactory;
use futures::future::join_all;
use tokio::time::Instant;

use crate::common::{NatsLeaseFactory, StreamGuard, claims, connect, url};

/// The broker's `host:port` from a `nats://host:port` URL.
fn upstream(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = host.trim_end_matches('/');
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:4222")
    }
}

/// A store whose connection goes through `proxy`.
async fn proxied_store(proxy: &FaultProxy, claims: &ClaimOptions) -> NatsClaimStore {
    let options =
        NatsOptions::new(format!("nats://{}", proxy.address())).timeout(Duration::from_secs(1));
    connect(&options, claims.clone()).await
}

async fn start_proxy() -> FaultProxy {
    FaultProxy::start(upstream(&url().await))
        .await
        .expect("a proxy")
}

fn connects(store: &NatsClaimStore) -> u64 {
    store.client().statistics().connects.load(Ordering::SeqCst)
}

fn request(job: &str, slot: i64, instance: &str) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot)),
        token: Token::generate(),
        instance: InstanceId::new(instance).unwrap(),
        max_late: Duration::from_secs(60),
    }
}

/// Claims as the scheduler does, with the same token, retrying temporary
/// errors (here for up to 20 s: the client reconnects with a back-off of
/// up to 4 s).
async fn claim(store: &NatsClaimStore, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let start = Instant::now();
    loop {
        match store.claim(req).await {
            Err(e) if e.is_temporary() && start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

async fn race(stores: &[&NatsClaimStore], job: &str, slot: i64) -> Vec<ClaimOutcome> {
    join_all(stores.iter().enumerate().map(|(i, store)| async move {
        let req = request(job, slot, &format!("racer-{i}"));
        claim(store, &req).await.unwrap()
    }))
    .await
}

fn winners(outcomes: &[ClaimOutcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_resume_after_the_connection_is_cut() {
    let proxy = start_proxy().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url().await, claims.stream_name());
    let a = proxied_store(&proxy, &claims).await;
    let b = proxied_store(&proxy, &claims).await;

    for slot in 0..5 {
        assert_eq!(
            winners(&race(&[&a, &b], "cut", slot).await),
            1,
            "slot {slot}"
        );
    }

    proxy.cut();
    for slot in 5..8 {
        for store in [&a, &b] {
            let during = store.claim(&request("cut", slot, "during")).await;
            let e = during.expect_err("no claim can be answered while the connection is cut");
            assert!(e.is_temporary(), "{e}");
        }
    }

    proxy.restore();
    for slot in 10..15 {
        assert_eq!(
            winners(&race(&[&a, &b], "cut", slot).await),
            1,
            "slot {slot} after the cut"
        );
    }
    assert!(connects(&a) >= 2, "a reconnected");
    assert!(connects(&b) >= 2, "b reconnected");

    // The slots tried during the cut: at most one winner (a claim the client
    // held back while it was away may have won one since).
    for slot in 5..8 {
        assert!(
            winners(&race(&[&a, &b], "cut", slot).await) <= 1,
            "slot {slot}"
        );
    }
    // The runs won before the cut are still remembered.
    for slot in 0..5 {
        for store in [&a, &b] {
            let again = claim(store, &request("cut", slot, "late")).await.unwrap();
            assert_eq!(
                again,
                ClaimOutcome::Lost,
                "slot {slot} was won before the cut"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_acknowledgement_is_won() {
    let proxy = start_proxy().await;
    let claims = claims();
    let url = url().await;
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = proxied_store(&proxy, &claims).await;
    let req = request("lost-ack", 1_000, "a");

    proxy.stall_replies_after(b"anarchon-claim");
    let first = store.claim(&req).await;
    let e = first.expect_err("no acknowledgement came back");
    assert!(e.is_temporary(), "{e}");
    proxy.cut();
    proxy.restore();

    // The server did store it: anyone else loses the run ...
    let direct = connect(&NatsOptions::new(&url), claims.clone()).await;
    let other = direct
        .claim(&request("lost-ack", 1_000, "b"))
        .await
        .unwrap();
    assert_eq!(other, ClaimOutcome::Lost);
    // ... and the same token, sent again, finds its own claim: won.
    let again = claim(&store, &req).await.unwrap();
    assert!(matches!(again, ClaimOutcome::Won(_)), "{again:?}");
    assert!(connects(&store) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_keep_claiming_across_a_cut() {
    let proxy = start_proxy().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url().await, claims.stream_name());
    let ran: Arc<Mutex<Vec<(Slot, usize)>>> = Arc::default();
    let mut stores = Vec::new();
    let mut schedulers = Vec::new();
    for index in 0..2 {
        let store = Arc::new(proxied_store(&proxy, &claims).await);
        stores.push(store.clone());
        let mut builder = Scheduler::builder(store);
        let ran = ran.clone();
        builder
            .job("tick", Schedule::every(Duration::from_secs(1)).unwrap())
            .unwrap()
            .run(move |ctx| {
                let ran = ran.clone();
                async move {
                    ran.lock().unwrap().push((ctx.slot(), index));
                    Ok::<_, String>(())
                }
            })
            .unwrap();
        schedulers.push(builder.start().unwrap());
    }
    let slots_after = |t: i64| {
        let mut slots: Vec<Slot> = ran
            .lock()
            .unwrap()
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| s.as_millis() > t)
            .collect();
        slots.dedup();
        slots.len()
    };
    let wait_for = |what: &'static str, t: i64, n: usize| async move {
        let start = Instant::now();
        while slots_after(t) < n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "gave up waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_for("two runs before the cut", i64::MIN, 2).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    proxy.restore();
    let restored = SystemClock.now().as_millis();
    wait_for("three runs after the cut", restored, 3).await;
    for scheduler in schedulers {
        scheduler.shutdown().await;
    }
    let mut runs: BTreeMap<Slot, Vec<usize>> = BTreeMap::new();
    for (slot, index) in ran.lock().unwrap().iter() {
        runs.entry(*slot).or_default().push(*index);
    }
    for (slot, by) in &runs {
        assert_eq!(by.len(), 1, "slot {slot} ran {} times: {runs:?}", by.len());
    }
    for store in &stores {
        assert!(connects(store) >= 2, "each store reconnected");
    }
}

/// The testkit's lost-reply check on the KV lease store: a claim whose
/// reply is swallowed on the wire, sent again with the same token, is
/// recognised (its swap was stored) or loses to the direct instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_lease_lost_reply_gives_one_winner() {
    let direct = NatsLeaseFactory::new().await;
    let proxy = anarchon_testkit::FaultProxy::start(upstream(&url().await))
        .await
        .unwrap();
    let via = direct.through(format!("nats://{}", proxy.address()));
    anarchon_testkit::faults::lost_reply_resolves_to_one_winner(
        &via,
        &direct,
        &proxy,
        anarchon_testkit::faults::RetryResolution::Recognised,
    )
    .await;
}

/// The testkit's random fault history on the KV lease store: schedulers
/// whose store goes down, whose heartbeats fail or hang, never give a run
/// two runners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_lease_random_faults_never_give_a_run_two_runners() {
    let factory = NatsLeaseFactory::new().await;
    anarchon_testkit::faults::random_faults_never_give_a_run_two_runners(
        &factory,
        Duration::from_secs(15),
    )
    .await;
}

/// A claim, and then a heartbeat, whose reply the proxy swallows (the
/// request reached the server, or the connection dropped under it) fail
/// with a temporary error; sent again with the same token, the claim is
/// won with attempt 1 and fence 1 — whether its swap was stored the first
/// time or not — and the heartbeat renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_lease_lost_acknowledgements_are_recognised() {
    use anarchon_core::{LeaseStore, Renewal};
    let direct = NatsLeaseFactory::new().await;
    let proxy = anarchon_testkit::FaultProxy::start(upstream(&url().await))
        .await
        .unwrap();
    let store = direct
        .through(format!("nats://{}", proxy.address()))
        .instance()
        .await;
    let run = RunKey::new(
        JobName::new("lost-ack").unwrap(),
        Slot::from_millis(SystemClock.now().as_millis() + 600_000),
    );
    let token = Token::generate();
    let claim = anarchon_testkit::lease::lease_claim(run.clone(), token, "a");
    // Swallow replies until one of the claim's requests lost its answer.
    let mut first = None;
    for _ in 0..20 {
        let before = proxy.swallowed();
        proxy.swallow_next_reply();
        let answer = store.claim_lease(&claim).await;
        if proxy.swallowed() > before && answer.is_err() {
            first = Some(answer);
            break;
        }
        if let Ok(ClaimOutcome::Won(_)) = answer {
            break;
        }
    }
    let mut won = None;
    for _ in 0..100 {
        match store.claim_lease(&claim).await {
            Ok(ClaimOutcome::Won(win)) => {
                won = Some(win);
                break;
            }
            Ok(other) => panic!("the same token must win: {other:?} (first answer {first:?})"),
            Err(e) => {
                assert!(e.is_temporary(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let won = won.expect("the retried claim is won");
    assert_eq!(won.attempt.get(), 1);
    assert_eq!(won.fence.map(|f| f.get()), Some(1));

    let before = proxy.swallowed();
    proxy.swallow_next_reply();
    let _ = store.heartbeat(&run, token, Duration::from_secs(30)).await;
    assert!(proxy.swallowed() > before, "a reply was swallowed");
    let mut renewed = None;
    for _ in 0..100 {
        match store.heartbeat(&run, token, Duration::from_secs(30)).await {
            Ok(answer) => {
                renewed = Some(answer);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(renewed, Some(Renewal::Renewed));
}
