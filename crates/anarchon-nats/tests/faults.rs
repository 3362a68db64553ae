//! Fault tests: the connection to NATS is cut mid-test by a TCP proxy
//! between the stores and the server, the server itself is restarted
//! (`ServerControl`, which always leaves it running), and the claim suite
//! runs over a slow line. Run alone:
//! `cargo test -p anarchon-nats --test faults -- --test-threads=1`
//! (`cargo xtask test-all` does, one test at a time).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, Clock, JobName, RunKey, Scheduler, SchedulerBuilder,
    Slot, StoreError, SystemClock, Token,
};
use anarchon_nats::{ClaimOptions, NatsClaimStore, NatsOptions, Storage};
use anarchon_testkit::FaultProxy;
use anarchon_testkit::fleet::{
    ClaimRetry, Fleet, RunLog, claim_retrying, claims_resume_across_a_cut,
    fleet_runs_each_slot_once_across_a_cut, now_ms, retry_after_a_lost_reply, slot_request,
};
use anarchon_testkit::restart::{RestartGuard, ServerControl};
use anarchon_testkit::servers::Service;
use anarchon_testkit::{Proxyable, StoreFactory};
use async_nats::jetstream::stream::StorageType;
use tokio::time::Instant;

use crate::common::{NatsFactory, NatsLeaseFactory, StreamGuard, claims, connect, upstream, url};

/// A store whose connection goes through `proxy`.
async fn proxied_store(proxy: &FaultProxy, claims: &ClaimOptions) -> NatsClaimStore {
    let options = NatsOptions::new(format!("nats://{}", proxy.address()))
        .with_timeout(Duration::from_secs(1));
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

/// How the tests retry a claim that met a temporary error.
const RETRY: ClaimRetry = ClaimRetry::For(Duration::from_secs(20));

/// Claims as the scheduler does, with the same token, retrying temporary
/// errors (here for up to 20 s: the client reconnects with a back-off of
/// up to 4 s).
async fn claim(store: &NatsClaimStore, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    claim_retrying(store, req, RETRY).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_resume_after_the_connection_is_cut() {
    let proxy = start_proxy().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url().await, claims.stream_name());
    let a = proxied_store(&proxy, &claims).await;
    let b = proxied_store(&proxy, &claims).await;
    claims_resume_across_a_cut(&proxy, &a, &b, RETRY, |during| {
        let e = during.expect_err("no claim can be answered while the connection is cut");
        assert!(e.is_temporary(), "{e}");
    })
    .await;
    assert!(connects(&a) >= 2, "a reconnected");
    assert!(connects(&b) >= 2, "b reconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_acknowledgement_is_won() {
    let proxy = start_proxy().await;
    let claims = claims();
    let url = url().await;
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = proxied_store(&proxy, &claims).await;
    let req = slot_request("lost-ack", 1_000, "a");

    proxy.stall_replies_after(b"anarchon-claim");
    let first = store.claim(&req).await;
    let e = first.expect_err("no acknowledgement came back");
    assert!(e.is_temporary(), "{e}");
    proxy.cut();
    proxy.restore();

    // The server did store it: anyone else loses the run, and the same
    // token, sent again, finds its own claim: won.
    let direct = connect(&NatsOptions::new(&url), claims.clone()).await;
    let again = retry_after_a_lost_reply(&store, &direct, &req, RETRY).await;
    assert!(matches!(again, ClaimOutcome::Won(_)), "{again:?}");
    assert!(connects(&store) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_keep_claiming_across_a_cut() {
    let proxy = start_proxy().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url().await, claims.stream_name());
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(Arc::new(proxied_store(&proxy, &claims).await));
    }
    fleet_runs_each_slot_once_across_a_cut(&proxy, stores.iter().cloned().map(Scheduler::builder))
        .await;
    for store in &stores {
        assert!(connects(store) >= 2, "each store reconnected");
    }
}

/// The kit's fault checks on the claim store: the claim suite over a slow
/// line (a claim's publish and acknowledgement take milliseconds, so racers
/// overlap as between hosts), and a claim whose reply is lost after the
/// stream stored it.
mod kit_claims {
    anarchon_testkit::fault_suite!(
        claims: crate::common::NatsFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// The kit's fault checks on the KV lease store: as `kit_claims` (a KV
/// claim reads the job's document and then swaps it, so over a slow line
/// racers' swaps meet revisions that changed since their read), and the
/// random fault history.
mod kit_leases {
    anarchon_testkit::fault_suite!(
        leases: crate::common::NatsLeaseFactory::new().await,
        anarchon_testkit::faults::RetryResolution::Recognised
    );
}

/// A claim, and then a heartbeat, whose reply the proxy swallows after the
/// server stored the swap (the proxy throws away the answer to the request
/// that carries the token) fail with a temporary error; the swap was
/// applied (another instance is told `Running`; the lease end moved), and
/// sent again with the same token the claim is won with attempt 1 and
/// fence 1 and the heartbeat renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_lease_lost_acknowledgements_are_recognised() {
    use anarchon_core::{LeaseStore, Renewal, RunState};
    use anarchon_testkit::faults::token_patterns;
    let direct = NatsLeaseFactory::new().await;
    let proxy = anarchon_testkit::FaultProxy::start(upstream(&url().await))
        .await
        .unwrap();
    let store = direct
        .through(format!("nats://{}", proxy.address()))
        .instance()
        .await;
    let other = direct.instance().await;
    let run = RunKey::new(
        JobName::new("lost-ack").unwrap(),
        Slot::from_millis(SystemClock.now().as_millis() + 600_000),
    );
    let token = Token::generate();
    let patterns = token_patterns(token);
    let patterns: Vec<&[u8]> = patterns.iter().map(Vec::as_slice).collect();
    let claim = anarchon_testkit::lease::lease_claim(run.clone(), token, "a");
    proxy.swallow_reply_to(&patterns);
    let first = store.claim_lease(&claim).await;
    assert_eq!(
        proxy.swallowed(),
        1,
        "the claim's reply was lost: {first:?}"
    );
    let e = first.expect_err("no acknowledgement came back");
    assert!(e.is_temporary(), "{e}");
    let theirs = other
        .claim_lease(&anarchon_testkit::lease::lease_claim(
            run.clone(),
            Token::generate(),
            "b",
        ))
        .await
        .unwrap();
    assert!(
        matches!(theirs, ClaimOutcome::Running { .. }),
        "the swap was stored before its reply was lost: {theirs:?}"
    );
    let mut won = None;
    for _ in 0..100 {
        match store.claim_lease(&claim).await {
            Ok(ClaimOutcome::Won(win)) => {
                won = Some(win);
                break;
            }
            Ok(other) => panic!("the same token must win: {other:?}"),
            Err(e) => {
                assert!(e.is_temporary(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let won = won.expect("the retried claim is won");
    assert_eq!(won.attempt.get(), 1);
    assert_eq!(won.fence.map(|f| f.get()), Some(1));

    let lease_end = |view: anarchon_core::RunView| match view.state {
        RunState::Running { lease_until, .. } => lease_until,
        other => panic!("{other:?}"),
    };
    let before = lease_end(other.peek(&run).await.unwrap());
    proxy.swallow_reply_to(&patterns);
    let lost = store.heartbeat(&run, token, Duration::from_secs(90)).await;
    assert_eq!(
        proxy.swallowed(),
        2,
        "the heartbeat's reply was lost: {lost:?}"
    );
    assert!(lost.is_err(), "no answer came back: {lost:?}");
    let after = lease_end(other.peek(&run).await.unwrap());
    assert!(
        after.since(before) > Duration::from_secs(30),
        "the lost heartbeat was applied: {before} -> {after}"
    );
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

// ---------------------------------------------------------------------
// Real restarts of the NATS server. These stop the shared server (inside
// the lock every NATS test command takes) and always leave it running: the
// testkit's guard starts it again should a test fail half-way.
// ---------------------------------------------------------------------

/// How long a restart test waits for its fleet's runs before and after
/// the restart.
const RESTART_WAIT: Duration = Duration::from_secs(30);

/// Stops nats-server and starts it again, waiting until it answers.
async fn restart_nats() -> RestartGuard {
    let control = ServerControl::for_service(Service::Nats);
    tokio::task::spawn_blocking(move || control.restart())
        .await
        .unwrap()
}

/// The latest message on `subject` of `stream`, read straight from the
/// server.
async fn latest(stream: &str, subject: &str) -> async_nats::jetstream::message::StreamMessage {
    let client = async_nats::connect(url().await.as_str()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let stream = jetstream.get_stream(stream).await.unwrap();
    stream
        .get_last_raw_message_by_subject(subject)
        .await
        .unwrap()
}

/// The storage type of `stream`, read straight from the server.
async fn storage_of(stream: &str) -> StorageType {
    let client = async_nats::connect(url().await.as_str()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream.get_stream(stream).await.unwrap();
    stream.info().await.unwrap().config.storage
}

/// Three instances of `factory`, each with its own connection, and a
/// fleet of schedulers over them (`configure`d) that has run two slots:
/// the set-up of a restart test.
async fn fleet_before_the_restart<F: StoreFactory>(
    factory: &F,
    configure: impl Fn(SchedulerBuilder<F::Store>) -> SchedulerBuilder<F::Store>,
) -> (Vec<Arc<F::Store>>, Fleet) {
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(factory.instance().await);
    }
    let fleet = Fleet::start(
        stores
            .iter()
            .cloned()
            .map(Scheduler::builder)
            .map(configure),
    );
    fleet
        .wait_for_slots(i64::MIN, 2, RESTART_WAIT, "two runs before the restart")
        .await;
    (stores, fleet)
}

/// Waits until `fleet` ran three slots from a second after the restart at
/// `restarted_at` (ms) on, shuts it down and checks no slot ran twice.
async fn fleet_after_the_restart(fleet: Fleet, restarted_at: i64) -> RunLog {
    fleet
        .wait_for_slots(
            restarted_at + 1000,
            3,
            RESTART_WAIT,
            "three runs after the restart",
        )
        .await;
    let ran = fleet.shutdown().await;
    ran.assert_each_slot_ran_once();
    ran
}

/// A proxy in front of the server and an instance of `factory` whose
/// connection goes through it: where a claim's acknowledgement is held
/// back before a restart.
async fn instance_behind_a_proxy<F: Proxyable>(factory: &F) -> (FaultProxy, Arc<F::Store>) {
    let proxy = start_proxy().await;
    let via = factory.through_proxy(&proxy).instance().await;
    (proxy, via)
}

/// The claim store across a real restart of nats-server: three
/// schedulers, each with its own connection, run a per-second job; the
/// server stops and starts again; the stores reconnect by themselves and
/// claims resume; no slot runs twice. The stream is on disk (the default),
/// so its duplicate window survives: a claim stored just before the
/// restart whose acknowledgement never came is won when sent again with
/// the same token right after it, and lost with any other token, as are
/// the runs claimed before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_store_survives_a_server_restart() {
    let factory = NatsFactory::new().await;
    let direct = factory.instance().await;
    assert_eq!(
        storage_of(direct.stream_name()).await,
        StorageType::File,
        "the claims stream is kept on disk by default"
    );
    let (stores, fleet) = fleet_before_the_restart(&factory, |builder| builder).await;

    // A claim the server stores but whose acknowledgement never comes.
    let (proxy, via) = instance_behind_a_proxy(&factory).await;
    let slot = anarchon_testkit::claim::future_slot(&factory, 0).as_millis();
    let held = slot_request("held", slot, "held");
    proxy.stall_replies_after(b"anarchon-claim");
    let first = via.claim(&held).await;
    let e = first.expect_err("the acknowledgement was held back");
    assert!(e.is_temporary(), "{e}");
    let stored = latest(direct.stream_name(), &direct.subject(&held.run.job)).await;
    assert_eq!(
        stored
            .headers
            .get(anarchon_nats::TOKEN_HEADER)
            .map(|v| v.as_str().to_owned()),
        Some(held.token.to_string()),
        "the server stored the held claim before the restart"
    );

    let before = fleet.log().slots_after(i64::MIN);
    let _guard = restart_nats().await;
    let restarted_at = now_ms();
    proxy.cut_connections();

    // Right after the restart, the same token: the stream remembers the
    // claim and whose it is.
    let again = claim(&via, &held).await.unwrap();
    assert!(
        matches!(again, ClaimOutcome::Won(_)),
        "the held claim, sent again with its token after the restart: {again:?}"
    );
    let other = claim(&direct, &slot_request("held", slot, "other"))
        .await
        .unwrap();
    assert_eq!(other, ClaimOutcome::Lost, "another token after the restart");
    // The runs claimed before the restart stay claimed.
    for slot in &before {
        let late = claim(&direct, &slot_request("tick", *slot, "late"))
            .await
            .unwrap();
        assert_eq!(
            late,
            ClaimOutcome::Lost,
            "slot {slot} was won before the restart"
        );
    }

    fleet_after_the_restart(fleet, restarted_at).await;
    for store in stores.iter().chain([&direct, &via]) {
        assert!(connects(store) >= 2, "each store reconnected by itself");
    }
}

/// The KV lease store across a real restart of nats-server: three
/// schedulers, each with its own connection, run a per-second job; the
/// server stops and starts again; the stores reconnect and claims resume;
/// no slot runs twice, and fences keep growing (the bucket, on disk by
/// default, keeps every job's document). A claim whose swap was stored just
/// before the restart but never acknowledged is won when sent again with
/// the same token right after it (attempt 1, fence 1), and another token
/// finds the lease running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kv_lease_store_survives_a_server_restart() {
    use anarchon_core::LeaseStore;
    let factory = NatsLeaseFactory::new().await;
    let direct = factory.instance().await;
    assert_eq!(
        storage_of(&factory.leases.stream_name()).await,
        StorageType::File,
        "the lease bucket is kept on disk by default"
    );
    let (stores, fleet) = fleet_before_the_restart(&factory, |builder| {
        builder
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_millis(500))
    })
    .await;

    // A claim whose swap the server stores but never acknowledges.
    let (proxy, via) = instance_behind_a_proxy(&factory).await;
    let run = RunKey::new(
        JobName::new("held").unwrap(),
        anarchon_testkit::claim::future_slot(&factory, 0),
    );
    let token = Token::generate();
    let held = anarchon_testkit::lease::lease_claim(run.clone(), token, "held");
    let swap = format!("PUB $KV.{}.job.held ", factory.leases.bucket());
    proxy.stall_replies_after(swap.as_bytes());
    let first = via.claim_lease(&held).await;
    let e = first.expect_err("the swap's acknowledgement was held back");
    assert!(e.is_temporary(), "{e}");
    let stored = latest(
        &factory.leases.stream_name(),
        &format!("$KV.{}.job.held", factory.leases.bucket()),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&stored.payload).contains(&token.to_string()),
        "the server stored the held claim's swap before the restart"
    );

    let before = fleet.log().slots_after(i64::MIN);
    let fence_before = fleet
        .log()
        .fences_after(i64::MIN)
        .into_iter()
        .max()
        .expect("runs before the restart have fences");
    let _guard = restart_nats().await;
    let restarted_at = now_ms();
    proxy.cut_connections();

    let again = retry(|| via.claim_lease(&held)).await;
    match again {
        ClaimOutcome::Won(win) => {
            assert_eq!(win.attempt.get(), 1);
            assert_eq!(win.fence.map(|f| f.get()), Some(1));
        }
        other => panic!("the held claim, sent again with its token after the restart: {other:?}"),
    }
    let other_claim = anarchon_testkit::lease::lease_claim(run.clone(), Token::generate(), "other");
    let other = retry(|| direct.claim_lease(&other_claim)).await;
    assert!(
        matches!(other, ClaimOutcome::Running { .. }),
        "another token after the restart finds the lease running: {other:?}"
    );
    for slot in &before {
        let mut late_claim = anarchon_testkit::lease::lease_claim(
            RunKey::new(JobName::new("tick").unwrap(), Slot::from_millis(*slot)),
            Token::generate(),
            "late",
        );
        late_claim.claim.max_late = Duration::from_secs(3600);
        let late = retry(|| direct.claim_lease(&late_claim)).await;
        assert!(
            !matches!(late, ClaimOutcome::Won(_)),
            "slot {slot} ran before the restart: {late:?}"
        );
    }

    let ran = fleet_after_the_restart(fleet, restarted_at).await;
    let fences_after = ran.fences_after(restarted_at + 1000);
    assert!(
        fences_after.iter().all(|fence| *fence > fence_before),
        "fences after the restart continue from {fence_before}: {fences_after:?}"
    );
    for store in stores.iter().chain([&direct, &via]) {
        let connects = store.client().statistics().connects.load(Ordering::SeqCst);
        assert!(connects >= 2, "each store reconnected by itself");
    }
}

/// What the documentation says of `Storage::Memory`: a server restart
/// deletes the in-memory stream and bucket with every run in them. The
/// stores make them again by themselves, empty, so claims resume without
/// restarting the application — and a run claimed before the restart is
/// won again after it by another token, with its job's fences starting
/// from 1 again. (The default, `Storage::File`, forgets nothing:
/// `claim_store_survives_a_server_restart`,
/// `kv_lease_store_survives_a_server_restart`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_storage_forgets_every_run_across_a_restart() {
    use anarchon_core::LeaseStore;
    let url = url().await;
    let claims = claims().with_storage(Storage::Memory);
    let _stream = StreamGuard::new(&url, claims.stream_name());
    let claim_store = connect(&NatsOptions::new(&url), claims.clone()).await;
    assert_eq!(
        storage_of(claim_store.stream_name()).await,
        StorageType::Memory
    );
    let leases = common::leases().with_storage(Storage::Memory);
    let _bucket = StreamGuard::new(&url, leases.stream_name());
    let lease_store = common::connect_leases(&NatsOptions::new(&url), leases.clone()).await;
    assert_eq!(storage_of(&leases.stream_name()).await, StorageType::Memory);

    let slot = now_ms() + 600_000;
    let run = RunKey::new(JobName::new("forgotten").unwrap(), Slot::from_millis(slot));
    let first = claim(&claim_store, &slot_request("forgotten", slot, "a"))
        .await
        .unwrap();
    assert!(matches!(first, ClaimOutcome::Won(_)), "{first:?}");
    for (offset, fence) in [(0, 1), (1000, 2)] {
        let next = RunKey::new(run.job.clone(), Slot::from_millis(slot + offset));
        let mine = anarchon_testkit::lease::lease_claim(next, Token::generate(), "a");
        match retry(|| lease_store.claim_lease(&mine)).await {
            ClaimOutcome::Won(win) => assert_eq!(win.fence.map(|f| f.get()), Some(fence)),
            other => panic!("a new run is won: {other:?}"),
        }
    }

    let _guard = restart_nats().await;

    let again = claim(&claim_store, &slot_request("forgotten", slot, "b"))
        .await
        .unwrap();
    assert!(
        matches!(again, ClaimOutcome::Won(_)),
        "the memory stream forgot the claim: another token wins the run again: {again:?}"
    );
    let theirs = anarchon_testkit::lease::lease_claim(run, Token::generate(), "b");
    match retry(|| lease_store.claim_lease(&theirs)).await {
        ClaimOutcome::Won(win) => assert_eq!(
            win.fence.map(|f| f.get()),
            Some(1),
            "the memory bucket forgot the job's fence counter"
        ),
        other => panic!("the memory bucket forgot the run: another token wins it again: {other:?}"),
    }
    assert_eq!(
        storage_of(claim_store.stream_name()).await,
        StorageType::Memory,
        "the stream was made again as it was"
    );
}

/// Sends `op` until it answers without a temporary error (up to 20 s).
async fn retry<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let start = Instant::now();
    loop {
        match op().await {
            Ok(answer) => return answer,
            Err(e) if e.is_temporary() && start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

// ---------------------------------------------------------------------
// Failover on the three-node NATS cluster: the node that leads a store's
// stream is killed under running schedulers and started again ~5 s later.
// The other two nodes keep a majority, elect a new leader, and the runs go
// on. These stop a cluster node, never the single test server on 4222,
// and always start it again (`NodeGuard`).
// ---------------------------------------------------------------------

/// A node of the test cluster as `cargo xtask services --start` runs it.
struct ClusterNode {
    name: &'static str,
    client: &'static str,
}

const CLUSTER_NODES: [ClusterNode; 3] = [
    ClusterNode {
        name: "n1",
        client: "127.0.0.1:4231",
    },
    ClusterNode {
        name: "n2",
        client: "127.0.0.1:4232",
    },
    ClusterNode {
        name: "n3",
        client: "127.0.0.1:4233",
    },
];

impl ClusterNode {
    /// The node named `name` (a stream leader's server name).
    fn named(name: &str) -> &'static ClusterNode {
        CLUSTER_NODES
            .iter()
            .find(|node| node.name == name)
            .unwrap_or_else(|| panic!("{name:?} is not a node of the test cluster"))
    }

    fn answers(&self) -> bool {
        let address = self.client.parse().expect("an address");
        std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
    }

    /// Kills the node with SIGKILL (no clean shutdown: as a crashed host),
    /// found by the pid listening on its client port, and waits until it
    /// no longer answers. The guard it hands back knows the executable and
    /// arguments the node ran with, and starts it again with them.
    fn kill(&'static self) -> NodeGuard {
        let pid = anarchon_testkit::restart::listener_pid(self.client)
            .unwrap_or_else(|why| panic!("cannot find node {}: {why}", self.name));
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .unwrap_or_else(|e| panic!("the executable of node {} (pid {pid}): {e}", self.name));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("the arguments of node {} (pid {pid}): {e}", self.name));
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let guard = NodeGuard {
            node: self,
            exe,
            args,
        };
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "kill -KILL {pid}: {status:?}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.answers() {
            assert!(
                std::time::Instant::now() < deadline,
                "node {} still answers",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        guard
    }
}

/// A cluster node a failover test killed, and how it ran: starts it again
/// when dropped (or by [`NodeGuard::start`]) if it does not answer.
struct NodeGuard {
    node: &'static ClusterNode,
    exe: std::path::PathBuf,
    args: Vec<String>,
}

impl NodeGuard {
    /// Starts the node in the background with the executable and arguments
    /// it ran with (its own configuration file), matched by its own pid
    /// file as `cargo xtask services --start` does, and waits until it
    /// answers (up to 60 s, starting it again every 5 s while it does not:
    /// the dead node's pid file may name a process still going away).
    fn start(&self) -> Result<(), String> {
        let name = self.node.name;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.node.answers() {
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "node {name} did not come back: see /var/log/nats-cluster-{name}.log"
                ));
            }
            let _ = std::process::Command::new("start-stop-daemon")
                .args(["--start", "--oknodo", "--background", "--pidfile"])
                .arg(format!("/var/lib/nats-cluster/{name}/nats.pid"))
                .arg("--exec")
                .arg(&self.exe)
                .arg("--")
                .args(&self.args)
                .status();
            let again = std::time::Instant::now() + Duration::from_secs(5);
            while !self.node.answers() && std::time::Instant::now() < again {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        if let Err(why) = self.start() {
            eprintln!("{why}");
        }
    }
}

/// The failover tests kill nodes of the local test cluster that `cargo
/// xtask services --start` runs; a cluster named by
/// `ANARCHON_NATS_CLUSTER_URL` is someone else's to kill.
fn refuse_a_cluster_elsewhere() {
    let var = anarchon_testkit::servers::Cluster::Nats.env_var();
    if std::env::var(var).is_ok_and(|url| !url.trim().is_empty()) {
        panic!(
            "the failover tests kill and restart nodes of the local test cluster \
             (127.0.0.1:4231-4233, `cargo xtask services --start`); unset {var} to run them"
        );
    }
}

/// A JetStream context on the test cluster (the client reconnects to any
/// node it has learnt of).
async fn cluster_jetstream() -> async_nats::jetstream::Context {
    let client = async_nats::connect(common::cluster_url().await.as_str())
        .await
        .expect("the cluster answers");
    async_nats::jetstream::new(client)
}

/// The node that leads `stream` now, if the stream has a leader and the
/// cluster says so within a second.
async fn stream_leader(jetstream: &async_nats::jetstream::Context, stream: &str) -> Option<String> {
    let ask = async {
        let mut stream = jetstream.get_stream(stream).await.ok()?;
        let info = stream.info().await.ok()?;
        info.cluster.as_ref()?.leader.clone()
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

/// One run of the failover test's job: its slot, which scheduler ran it,
/// and when its handler started (UTC ms).
#[derive(Clone, Copy, Debug)]
struct TimedRun {
    slot: i64,
    scheduler: usize,
    started: i64,
}

/// What a failover test measured.
#[derive(Debug)]
struct Failover {
    /// The node that was killed: the stream's leader.
    killed: String,
    /// The stream's leader after the election, and how long after the
    /// kill it was first seen (ms).
    new_leader: String,
    elected_after_ms: i64,
    /// When the node was killed and when it answered again (UTC ms).
    killed_at: i64,
    restarted_at: i64,
    runs: Vec<TimedRun>,
}

impl Failover {
    /// The slots between the first and the last run that never ran.
    fn missed(&self) -> Vec<i64> {
        let ran: std::collections::BTreeSet<i64> = self.runs.iter().map(|r| r.slot).collect();
        let (Some(first), Some(last)) = (ran.first(), ran.last()) else {
            return Vec::new();
        };
        (*first..=*last)
            .step_by(1000)
            .filter(|slot| !ran.contains(slot))
            .collect()
    }

    /// The longest stretch without a handler starting (ms), and the two
    /// runs around it.
    fn longest_gap(&self) -> (i64, Option<(TimedRun, TimedRun)>) {
        let mut runs = self.runs.clone();
        runs.sort_by_key(|r| r.started);
        runs.windows(2)
            .map(|pair| (pair[1].started - pair[0].started, Some((pair[0], pair[1]))))
            .max_by_key(|(gap, _)| *gap)
            .unwrap_or((0, None))
    }

    /// Runs whose handler started more than a second after their slot.
    fn late(&self) -> Vec<(i64, i64)> {
        self.runs
            .iter()
            .filter(|r| r.started - r.slot > 1000)
            .map(|r| (r.slot, r.started - r.slot))
            .collect()
    }

    /// Prints the figures (for docs/scaling.md) and checks what a failover
    /// must keep: no slot ran twice, and runs went on while the killed
    /// node was still down — under the new leader — and after it came
    /// back.
    fn report_and_check(&self, store: &str) {
        let (gap, around) = self.longest_gap();
        println!(
            "FAILOVER {store}: killed {} (the stream's leader); new leader {} seen {} ms after the kill; \
             node back after {} ms; longest stretch without a run: {gap} ms {}; missed slots (s after the kill): {:?}; \
             late runs (s after the kill, ms late): {:?}; {} runs",
            self.killed,
            self.new_leader,
            self.elected_after_ms,
            self.restarted_at - self.killed_at,
            around.map_or(String::new(), |(a, b)| format!(
                "(after slot {:+.1} s, until slot {:+.1} s, from the kill)",
                (a.slot - self.killed_at) as f64 / 1000.0,
                (b.slot - self.killed_at) as f64 / 1000.0
            )),
            self.missed()
                .iter()
                .map(|s| (s - self.killed_at) as f64 / 1000.0)
                .collect::<Vec<_>>(),
            self.late()
                .iter()
                .map(|(s, late)| ((s - self.killed_at) as f64 / 1000.0, *late))
                .collect::<Vec<_>>(),
            self.runs.len()
        );
        let mut by_slot: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
        for run in &self.runs {
            by_slot.entry(run.slot).or_default().push(run.scheduler);
        }
        for (slot, by) in &by_slot {
            assert_eq!(
                by.len(),
                1,
                "slot {slot} ran {} times: {by_slot:?}",
                by.len()
            );
        }
        assert_ne!(
            self.new_leader, self.killed,
            "another node leads the stream"
        );
        assert!(
            self.runs
                .iter()
                .any(|r| r.slot > self.killed_at && r.started < self.restarted_at),
            "runs went on under the new leader while {} was down: {:?}",
            self.killed,
            self.runs
        );
        let after_restart = self
            .runs
            .iter()
            .filter(|r| r.slot > self.restarted_at + 1000)
            .count();
        assert!(
            after_restart >= 3,
            "runs went on after {} came back: {:?}",
            self.killed,
            self.runs
        );
    }
}

/// How long the failover test's schedulers run before the kill, how long
/// the node stays down at least (and in any case until the two nodes left
/// elected a new leader, up to `ELECTION_LIMIT`), and how long they run
/// after it is back.
const BEFORE_KILL: Duration = Duration::from_secs(5);
const NODE_DOWN: Duration = Duration::from_secs(5);
const ELECTION_LIMIT: Duration = Duration::from_secs(30);
/// How long the node stays down at least after the new leader was seen, so
/// that runs under the new leader alone are seen.
const UNDER_THE_NEW_LEADER: Duration = Duration::from_secs(3);
const AFTER_RESTART: Duration = Duration::from_secs(10);

/// Three schedulers (`builders`, each on its own store and connection) run
/// a per-second job recording every run; after `BEFORE_KILL` the node that
/// leads `stream` is killed; `UNDER_THE_NEW_LEADER` after the other two
/// elected a new leader, and `NODE_DOWN` after the kill at the earliest,
/// it is started again; after `AFTER_RESTART` more the schedulers stop.
async fn fail_over<S: ClaimStore + ?Sized>(
    stream: &str,
    builders: Vec<SchedulerBuilder<S>>,
) -> Failover
where
    Arc<S>: anarchon_core::scheduler::IntoDynClaim,
{
    let jetstream = cluster_jetstream().await;
    let runs: Arc<std::sync::Mutex<Vec<TimedRun>>> = Arc::default();
    let mut schedulers = Vec::new();
    for (index, mut builder) in builders.into_iter().enumerate() {
        let runs = runs.clone();
        builder
            .job("tick", anarchon_testkit::fleet::every_second())
            .and_then(|job| {
                job.run(move |ctx: anarchon_core::RunContext| {
                    runs.lock().unwrap().push(TimedRun {
                        slot: ctx.slot().as_millis(),
                        scheduler: index,
                        started: now_ms(),
                    });
                    std::future::ready(Ok::<(), String>(()))
                })
            })
            .expect("the tick job is valid");
        schedulers.push(builder.start().expect("the scheduler starts"));
    }
    tokio::time::sleep(BEFORE_KILL).await;

    let killed = stream_leader(&jetstream, stream)
        .await
        .expect("the stream has a leader");
    let node = ClusterNode::named(&killed);
    let guard = Arc::new(
        tokio::task::spawn_blocking(move || node.kill())
            .await
            .unwrap(),
    );
    let killed_at = now_ms();

    // The new leader, as soon as the two nodes left have elected one.
    let mut new_leader = None;
    let mut elected_after_ms = 0;
    while now_ms() - killed_at < ELECTION_LIMIT.as_millis() as i64 {
        if let Some(leader) = stream_leader(&jetstream, stream).await
            && leader != killed
        {
            elected_after_ms = now_ms() - killed_at;
            new_leader = Some(leader);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_leader = new_leader.unwrap_or_else(|| {
        panic!("no new leader for {stream} within {ELECTION_LIMIT:?} of killing {killed}")
    });
    let down_until = (killed_at + NODE_DOWN.as_millis() as i64)
        .max(killed_at + elected_after_ms + UNDER_THE_NEW_LEADER.as_millis() as i64);
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(down_until - now_ms()).unwrap_or(0),
    ))
    .await;
    let restart = guard.clone();
    tokio::task::spawn_blocking(move || restart.start())
        .await
        .unwrap()
        .unwrap_or_else(|why| panic!("{why}"));
    let restarted_at = now_ms();
    drop(guard);
    tokio::time::sleep(AFTER_RESTART).await;

    for scheduler in schedulers {
        scheduler.shutdown().await;
    }
    let runs = runs.lock().unwrap().clone();
    Failover {
        killed,
        new_leader,
        elected_after_ms,
        killed_at,
        restarted_at,
        runs,
    }
}

/// The KV lease store on a bucket with three replicas: the node that
/// leads the bucket's stream is killed (SIGKILL) while three schedulers,
/// each with its own connection, run a per-second job, and started again
/// 5 s later. No slot runs twice; runs go on under the new leader while
/// the node is down and after it is back; the gap is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kv_lease_store_fails_over_when_the_leader_node_dies() {
    refuse_a_cluster_elsewhere();
    let factory = NatsLeaseFactory::on_cluster().await;
    let mut builders = Vec::new();
    for _ in 0..3 {
        builders.push(Scheduler::builder(factory.instance().await));
    }
    let failover = fail_over(&factory.leases.stream_name(), builders).await;
    failover.report_and_check("kv lease store");
}

/// The claim store on a stream with three replicas, as
/// `kv_lease_store_fails_over_when_the_leader_node_dies`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_store_fails_over_when_the_leader_node_dies() {
    refuse_a_cluster_elsewhere();
    let factory = NatsFactory::on_cluster().await;
    let mut builders = Vec::new();
    for _ in 0..3 {
        builders.push(Scheduler::builder(factory.instance().await));
    }
    let failover = fail_over(&factory.claims.stream_name(), builders).await;
    failover.report_and_check("claim store");
}
