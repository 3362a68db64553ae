//! Fault tests: the connection to RabbitMQ is cut mid-test by a TCP proxy
//! between the stores and the broker (the shared broker itself is never
//! stopped). Run alone: `cargo test -p anarchon-amqp --test faults`
//! (`cargo xtask test-all` does, one test at a time).

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore};
use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, Clock, InstanceId, JobName, RunKey, Schedule,
    Scheduler, Slot, StoreError, SystemClock, Token,
};
use anarchon_testkit::FaultProxy;
use futures::future::join_all;
use tokio::time::Instant;

use crate::common::{TEST_SLOT_TTL, connect, options, url};

/// `url` pointed at `proxy` instead of the broker, and the broker's
/// `host:port`.
fn through(url: &str, proxy: Option<&FaultProxy>) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let upstream = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5672")
    };
    let target = proxy.map_or(upstream.clone(), |p| p.address().to_string());
    (format!("{scheme}://{userinfo}{target}{tail}"), upstream)
}

async fn proxied_store(proxy: &FaultProxy, prefix: &str, timeout: Duration) -> AmqpStore {
    let (url, _) = through(&url().await, Some(proxy));
    connect(
        AmqpOptions::new(url)
            .prefix(prefix)
            .slot_ttl(TEST_SLOT_TTL)
            .timeout(timeout),
    )
    .await
}

async fn start_proxy() -> FaultProxy {
    let (_, upstream) = through(&url().await, None);
    FaultProxy::start(upstream).await.expect("a proxy")
}

fn request(job: &str, slot: i64, instance: &str) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot)),
        token: Token::generate(),
        instance: InstanceId::new(instance).unwrap(),
        max_late: Duration::from_secs(60),
    }
}

/// Claims as the scheduler does: temporary errors are retried with the same
/// token (a few times, briefly).
async fn claim(store: &AmqpStore, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let mut tries = 0;
    loop {
        match store.claim(req).await {
            Err(e) if e.is_temporary() && tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

async fn race(stores: &[&AmqpStore], job: &str, slot: i64) -> Vec<ClaimOutcome> {
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
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let a = proxied_store(&proxy, &prefix, Duration::from_secs(2)).await;
    let b = proxied_store(&proxy, &prefix, Duration::from_secs(2)).await;

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
            match store.claim(&request("cut", slot, "during")).await {
                Err(e) => assert!(e.is_temporary(), "{e}"),
                Ok(outcome) => assert_eq!(outcome, ClaimOutcome::Unknown),
            }
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
    assert!(a.connections_opened() >= 2, "a reconnected");
    assert!(b.connections_opened() >= 2, "b reconnected");

    // The slots tried during the cut: at most one winner now.
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
async fn a_claim_whose_confirm_is_lost_is_unknown_and_never_won_twice() {
    let proxy = start_proxy().await;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let store = proxied_store(&proxy, &prefix, Duration::from_secs(1)).await;
    let req = request("doubt", 1_000, "a");

    proxy.stall_replies_after(b"anarchon claim");
    let first = store.claim(&req).await.unwrap();
    assert_eq!(first, ClaimOutcome::Unknown, "no confirm came back");
    proxy.cut();
    proxy.restore();

    // The broker did take the claim: anyone else loses the run.
    let direct = connect(options().await.prefix(&prefix)).await;
    let other = direct.claim(&request("doubt", 1_000, "b")).await.unwrap();
    assert_eq!(other, ClaimOutcome::Lost);
    // The same token, sent again after the reconnect, cannot be told it
    // won (its mark was never left) and is not told a false "lost" either.
    let again = claim(&store, &req).await.unwrap();
    assert_eq!(again, ClaimOutcome::Unknown);
    assert!(store.connections_opened() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_keep_claiming_across_a_cut() {
    let proxy = start_proxy().await;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let ran: Arc<Mutex<Vec<(Slot, usize)>>> = Arc::default();
    let mut stores = Vec::new();
    let mut schedulers = Vec::new();
    for index in 0..2 {
        let store = Arc::new(proxied_store(&proxy, &prefix, Duration::from_secs(2)).await);
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
        assert!(store.connections_opened() >= 2, "each store reconnected");
    }
}

/// Instances of one prefix, connecting to `options`' URL.
struct On(anarchon_amqp::AmqpOptions);

#[async_trait::async_trait]
impl anarchon_testkit::StoreFactory for On {
    type Store = anarchon_amqp::AmqpStore;

    async fn instance(&self) -> std::sync::Arc<anarchon_amqp::AmqpStore> {
        std::sync::Arc::new(common::connect(self.0.clone()).await)
    }
}

/// The testkit's lost-reply check: RabbitMQ cannot always tell a retried
/// claim whose confirm was lost, so the run has at most one winner and an
/// `Unknown` that is never run.
#[tokio::test]
async fn testkit_lost_reply_gives_at_most_one_winner() {
    let direct = common::options().await;
    let url = common::url().await;
    let rest = url.split_once("://").expect("a URL").1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = &host[..host.find('/').unwrap_or(host.len())];
    let proxy = anarchon_testkit::FaultProxy::start(host)
        .await
        .expect("proxy");
    let proxied_url = url.replacen(host, &proxy.address().to_string(), 1);
    let via = anarchon_amqp::AmqpOptions::new(proxied_url)
        .prefix(direct.get_prefix())
        .slot_ttl(common::TEST_SLOT_TTL);
    anarchon_testkit::faults::lost_reply_resolves_to_one_winner(
        &On(via),
        &On(direct),
        &proxy,
        anarchon_testkit::faults::RetryResolution::MayStayUnknown,
    )
    .await;
}
