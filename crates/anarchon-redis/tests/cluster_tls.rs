//! `rediss://` cluster URLs against a real Redis Cluster that speaks only
//! TLS.
//!
//! A TLS terminator cannot stand in front of cluster nodes: each node
//! tells clients its own address (`CLUSTER SLOTS`, `MOVED`), and the
//! client then connects there directly. So each test starts its own
//! cluster of three masters (no replicas) on free loopback ports, every
//! node with `--tls-port`, `--port 0` and `--tls-cluster yes`, with
//! certificates from a fresh private authority
//! ([`anarchon_testkit::write_certificates`]). The stores must trust that
//! authority for every node they discover, through `tls_ca_file`; without
//! it the connect fails with a hint that names `tls_ca_file`.
//!
//! Each test owns its cluster, so the tests run in parallel; the guard
//! kills exactly the `redis-server` processes it started and removes their
//! directory when the test ends, pass or fail. A cluster that cannot be
//! started or formed fails the test with the reason and the nodes' logs.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use anarchon_core::{
    ClaimOutcome, ClaimStore, JobName, LeaseStore, Renewal, RunKey, RunOutcome, Slot, Token,
};
use anarchon_redis::{Error, RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore};
use anarchon_testkit::claim::claim_request;
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::{CertificateFiles, unique_prefix, write_certificates};
use common::within;

/// How long a store may take to connect to the cluster.
const BOUND: Duration = Duration::from_secs(20);

/// The lowest client port tried. Cluster nodes also listen on port + 10000
/// (the cluster bus), which must stay below 65536; this range keeps clear
/// of the shared test cluster on 7000-7005.
const FIRST_PORT: u16 = 7100;
/// How many client ports, from [`FIRST_PORT`], are tried.
const PORTS: u16 = 100;

/// A Redis Cluster of three TLS-only masters, stopped when dropped.
struct TlsCluster {
    /// Every `redis-server` this guard started, with its TLS port.
    nodes: Vec<(u16, Child)>,
    /// Certificates, node configurations and logs; removed when dropped.
    dir: PathBuf,
    certs: CertificateFiles,
    password: Option<String>,
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        // Only the processes started here, each by its own handle.
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port `port` and its cluster bus port `port + 10000`, both
/// free now.
fn both_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
        && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
}

/// Three ports (in [`FIRST_PORT`]..+[`PORTS`]) whose bus ports are free as
/// well. Tests of this binary take turns through one counter; the start
/// depends on the process id, so two runs at once rarely try the same
/// ports (and a node that cannot bind is retried on others).
fn free_ports() -> Vec<u16> {
    static NEXT: AtomicU16 = AtomicU16::new(u16::MAX);
    let _ = NEXT.compare_exchange(
        u16::MAX,
        (std::process::id() % u32::from(PORTS)) as u16,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut ports = Vec::new();
    for _ in 0..PORTS {
        let port = FIRST_PORT + NEXT.fetch_add(1, Ordering::SeqCst) % PORTS;
        if both_free(port) && !ports.contains(&port) {
            ports.push(port);
            if ports.len() == 3 {
                return ports;
            }
        }
    }
    panic!(
        "no three free loopback ports in {FIRST_PORT}-{} with their cluster bus ports (+10000) free too: stop whatever listens there",
        FIRST_PORT + PORTS - 1
    );
}

/// The last lines of a node's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

impl TlsCluster {
    /// Starts three nodes and forms a cluster of them, all slots covered;
    /// with `password`, every node requires it. Panics, saying why, if the
    /// cluster cannot be made.
    fn start(password: Option<&str>) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "anarchon-cluster-tls-{}-{}",
            std::process::id(),
            unique_prefix("")
        ));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot make the directory {}: {e}", dir.display()));
        let certs = write_certificates(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
            certs,
            password: password.map(str::to_owned),
        };
        let mut last_failure = String::new();
        for _attempt in 0..5 {
            match cluster.start_nodes() {
                Ok(()) => {
                    cluster.create();
                    return cluster;
                }
                Err(failure) => {
                    // A port taken between the check and the bind: try others.
                    for (_, mut child) in cluster.nodes.drain(..) {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    last_failure = failure;
                }
            }
        }
        panic!("could not start three TLS redis-server nodes: {last_failure}");
    }

    /// Starts a node on each of three free ports and waits until each
    /// answers `PING` over TLS.
    fn start_nodes(&mut self) -> Result<(), String> {
        for port in free_ports() {
            let mut command = Command::new("redis-server");
            command
                .arg("--port")
                .arg("0")
                .arg("--tls-port")
                .arg(port.to_string())
                .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                .arg("--tls-cert-file")
                .arg(&self.certs.cert_file)
                .arg("--tls-key-file")
                .arg(&self.certs.key_file)
                .arg("--tls-ca-cert-file")
                .arg(&self.certs.ca_file)
                .args(["--tls-auth-clients", "no", "--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(self.dir.join(format!("nodes-{port}.conf")))
                .arg("--dir")
                .arg(&self.dir)
                .arg("--logfile")
                .arg(self.log(port))
                .args(["--save", "", "--appendonly", "no"])
                .args(["--bind", "127.0.0.1", "--daemonize", "no"]);
            if let Some(password) = &self.password {
                command.arg("--requirepass").arg(password);
            }
            let child = command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run redis-server (is it installed and on PATH?): {e}")
                });
            self.nodes.push((port, child));
        }
        let ports = self.ports();
        for port in ports {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (_, child) = self.nodes.iter_mut().find(|(p, _)| *p == port).unwrap();
                if let Ok(Some(status)) = child.try_wait() {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                    }
                    return Err(format!(
                        "redis-server on TLS port {port} exited ({status}): {stderr}{}\n(does this redis-server support TLS? `redis-server --tls-port` needs a build with TLS)",
                        log_tail(&self.log(port))
                    ));
                }
                let pong = self.cli(port, &["PING"]);
                if text(&pong).contains("PONG") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "redis-server on TLS port {port} did not answer PING over TLS within 10s: {}\nits log:\n{}",
                        text(&pong),
                        log_tail(&self.log(port))
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// `redis-cli --cluster create` over the three nodes, then waits until
    /// every node says `cluster_state:ok`.
    fn create(&self) {
        let nodes: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let created = self.cli(self.ports()[0], &args);
        assert!(
            created.status.success(),
            "redis-cli --tls --cluster create {} failed ({}):\n{}\nthe first node's log:\n{}",
            nodes.join(" "),
            created.status,
            text(&created),
            log_tail(&self.log(self.ports()[0]))
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for port in self.ports() {
            loop {
                let info = text(&self.cli(port, &["CLUSTER", "INFO"]));
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the TLS cluster was created, but the node on port {port} did not say cluster_state:ok within 30s (do the nodes reach each other's bus ports over TLS?):\n{info}\nits log:\n{}",
                    log_tail(&self.log(port))
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Runs `redis-cli` over TLS against the node on `port`.
    fn cli(&self, port: u16, args: &[&str]) -> Output {
        let mut command = Command::new("redis-cli");
        command
            .args(["--tls", "--cacert"])
            .arg(&self.certs.ca_file)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        if let Some(password) = &self.password {
            command.args(["-a", password, "--no-auth-warning"]);
        }
        command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (is it installed and on PATH?): {e}"))
    }

    fn log(&self, port: u16) -> PathBuf {
        self.dir.join(format!("redis-{port}.log"))
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|(port, _)| *port).collect()
    }

    /// The cluster URL: the first node, the other two as seeds, and
    /// `password` (if any) as the URL's password.
    fn url(&self, password: Option<&str>) -> String {
        let ports = self.ports();
        let auth = password.map_or(String::new(), |pw| format!(":{pw}@"));
        format!(
            "rediss://{auth}127.0.0.1:{}?cluster=true&seed=127.0.0.1:{}&seed=127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    }

    /// Options for the cluster under `prefix`, trusting its authority.
    fn options(&self, prefix: &str) -> RedisOptions {
        let password = self.password.clone();
        without_ca(&self.url(password.as_deref()), prefix).with_tls_ca_file(&self.certs.ca_file)
    }

    /// How many keys each node holds, in port order.
    fn keys_per_node(&self) -> Vec<u64> {
        self.ports()
            .into_iter()
            .map(|port| {
                let answer = text(&self.cli(port, &["DBSIZE"]));
                answer
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("DBSIZE on port {port} answered {answer:?}"))
            })
            .collect()
    }
}

/// Options from a cluster `url` under `prefix`, no authority set.
fn without_ca(url: &str, prefix: &str) -> RedisOptions {
    let (opts, _) = RedisOptions::from_url(url).unwrap();
    opts.with_cluster(true).with_prefix(prefix).unwrap()
}

/// A slot ten minutes from now, on a whole second: never late.
fn slot_ahead() -> Slot {
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) + 600_000)
}

/// Runs of `count` jobs named `stem-0`, `stem-1`, … at `slot`: each job's
/// keys carry its own hash tag, so they fall in different hash slots.
fn runs(stem: &str, count: usize, slot: Slot) -> Vec<RunKey> {
    (0..count)
        .map(|i| RunKey::new(JobName::new(&format!("{stem}-{i}")).unwrap(), slot))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strategies_win_claims_on_a_tls_cluster() {
    let cluster = TlsCluster::start(None);
    let opts = cluster.options(&unique_prefix("ctls"));
    let slot = slot_ahead();

    // Lease: the first claimant wins each run, another token is told the
    // run is running; the winner heartbeats and finishes one of them.
    let lease = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap();
    let rival = within(
        BOUND,
        "second lease connect",
        RedisLeaseStore::connect(&opts),
    )
    .await
    .unwrap();
    let lease_runs = runs("lease", 8, slot);
    let mut tokens = Vec::new();
    for run in &lease_runs {
        let token = Token::generate();
        let won = lease
            .claim_lease(&lease_claim(run.clone(), token, "a"))
            .await
            .unwrap();
        assert!(matches!(won, ClaimOutcome::Won(_)), "{run:?}: {won:?}");
        let lost = rival
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
            .await
            .unwrap();
        assert!(
            matches!(lost, ClaimOutcome::Running { .. }),
            "{run:?}: the second claimant sees the first one's lease: {lost:?}"
        );
        tokens.push(token);
    }
    let renewed = lease
        .heartbeat(&lease_runs[0], tokens[0], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(renewed, Renewal::Renewed);
    let finished = lease
        .finish(&lease_runs[0], tokens[0], RunOutcome::Succeeded)
        .await
        .unwrap();
    assert_eq!(finished, Renewal::Renewed);
    let after = rival
        .claim_lease(&lease_claim(lease_runs[0].clone(), Token::generate(), "b"))
        .await
        .unwrap();
    assert!(
        matches!(after, ClaimOutcome::Done(_)),
        "a finished run stays finished: {after:?}"
    );

    // Stream-id and script: first claimant wins, another token loses.
    let stream_id = within(
        BOUND,
        "stream-id connect",
        RedisStreamIdStore::connect(&opts),
    )
    .await
    .unwrap();
    let stream_id_rival = within(
        BOUND,
        "second stream-id connect",
        RedisStreamIdStore::connect(&opts),
    )
    .await
    .unwrap();
    let script = within(
        BOUND,
        "script connect",
        RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW),
    )
    .await
    .unwrap();
    let script_rival = within(
        BOUND,
        "second script connect",
        RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW),
    )
    .await
    .unwrap();
    for (name, first, second) in [
        (
            "stream-id",
            &stream_id as &dyn ClaimStore,
            &stream_id_rival as &dyn ClaimStore,
        ),
        ("script", &script, &script_rival),
    ] {
        for run in runs(name, 8, slot) {
            let won = first
                .claim(&claim_request(run.clone(), Token::generate(), "a"))
                .await
                .unwrap();
            assert!(
                matches!(won, ClaimOutcome::Won(_)),
                "{name} {run:?}: {won:?}"
            );
            let lost = second
                .claim(&claim_request(run.clone(), Token::generate(), "b"))
                .await
                .unwrap();
            assert!(
                matches!(lost, ClaimOutcome::Lost),
                "{name} {run:?}: another token loses: {lost:?}"
            );
        }
    }

    let keys = cluster.keys_per_node();
    println!("keys per node (ports {:?}): {keys:?}", cluster.ports());
    assert!(
        keys.iter().filter(|&&n| n > 0).count() >= 2,
        "the jobs' keys lie in different hash slots, so more than one node holds some: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_instances_win_each_run_once_over_tls() {
    let cluster = TlsCluster::start(None);
    let opts = cluster.options(&unique_prefix("ctlsrace"));
    let mut stores = Vec::new();
    for i in 0..4 {
        stores.push(std::sync::Arc::new(
            within(
                BOUND,
                &format!("lease connect {i}"),
                RedisLeaseStore::connect(&opts),
            )
            .await
            .unwrap(),
        ));
    }
    let runs = runs("race", 20, slot_ahead());
    // Each instance claims every run, all at once, starting at a different
    // run, on its own task.
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let (store, runs) = (store.clone(), runs.clone());
            tokio::spawn(async move {
                let n = runs.len();
                let claims = (0..n).map(|k| {
                    let run = runs[(k + i * n / 4) % n].clone();
                    let store = &store;
                    async move {
                        let claim = lease_claim(run.clone(), Token::generate(), &format!("i{i}"));
                        (run, i, store.claim_lease(&claim).await.unwrap())
                    }
                });
                futures::future::join_all(claims).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.extend(within(BOUND, "the race", task).await.unwrap());
    }
    assert_eq!(outcomes.len(), runs.len() * stores.len());
    for run in &runs {
        let winners: Vec<usize> = outcomes
            .iter()
            .filter(|(r, _, o)| r == run && matches!(o, ClaimOutcome::Won(_)))
            .map(|(_, i, _)| *i)
            .collect();
        assert_eq!(winners.len(), 1, "{run:?}: winners {winners:?}");
        for (_, i, outcome) in outcomes.iter().filter(|(r, _, _)| r == run) {
            assert!(
                matches!(outcome, ClaimOutcome::Won(_) | ClaimOutcome::Running { .. }),
                "{run:?}, instance {i}: {outcome:?}"
            );
        }
    }
    let mut wins = [0usize; 4];
    for (_, i, outcome) in &outcomes {
        if matches!(outcome, ClaimOutcome::Won(_)) {
            wins[*i] += 1;
        }
    }
    println!(
        "{} runs, wins per instance: {wins:?}; keys per node: {:?}",
        runs.len(),
        cluster.keys_per_node()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_without_the_ca_is_refused_with_a_hint() {
    let cluster = TlsCluster::start(None);
    let opts = without_ca(&cluster.url(None), &unique_prefix("ctlsnoca"));
    let err = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap_err();
    let message = err.to_string();
    println!("without the CA: {message}");
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        !err.is_temporary(),
        "a refused certificate is not temporary"
    );
    assert!(message.contains("not trusted"), "{message}");
    assert!(message.contains("tls_ca_file"), "{message}");

    let err = within(
        BOUND,
        "script connect",
        RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("tls_ca_file"), "{err}");

    // The same cluster, trusting its authority, connects.
    within(
        BOUND,
        "lease connect with the CA",
        RedisLeaseStore::connect(&opts.with_tls_ca_file(&cluster.certs.ca_file)),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_url_never_prints_its_password() {
    let password = unique_prefix("right-password-");
    let cluster = TlsCluster::start(Some(&password));
    let wrong = unique_prefix("sentinel-wrong-password-");
    let opts = without_ca(&cluster.url(Some(&wrong)), &unique_prefix("ctlspw"))
        .with_tls_ca_file(&cluster.certs.ca_file);
    let err = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    println!("wrong password: {err}");
    assert!(matches!(err, Error::AccessDenied { .. }), "{err:?}");
    assert!(!shown.contains(&wrong), "the password leaked: {shown}");
    assert!(!shown.contains(&password), "the password leaked: {shown}");
    let store_error = err.into_store_error("redis-lease");
    let shown = format!("{store_error} {store_error:?}");
    assert!(!shown.contains(&wrong), "the password leaked: {shown}");

    // With the right password the store connects.
    within(
        BOUND,
        "lease connect",
        RedisLeaseStore::connect(&cluster.options(&unique_prefix("ctlspw"))),
    )
    .await
    .unwrap();
}
