//! Failover on the test Redis Cluster: a master is killed (SIGKILL, found
//! by the pid listening on its port, never by name) while stores race
//! claims on many jobs; its replica takes over; the claims go on. The
//! test measures what Redis's asynchronous replication lost — wins the old
//! master acknowledged that the new master does not have — and how long
//! the claims of the killed master's slots could not be answered, then
//! starts the killed node again with the arguments it ran with, so it
//! rejoins as a replica, and waits until the cluster is whole. One more
//! test flushes the script cache of every node.
//!
//! Run alone, after the suites: `cargo test -p anarchon-redis --test
//! cluster_faults -- --test-threads=1 --nocapture` (`cargo xtask test-all`
//! does). It kills nodes of the local test cluster only (127.0.0.1:7000-
//! 7005, `cargo xtask services --start`), and afterwards the masters are
//! other nodes than before.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::{ClaimOutcome, JobName, LeaseStore, RunKey, Slot, Token};
use anarchon_redis::RedisLeaseStore;
use anarchon_testkit::fleet::now_ms;
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::restart::listener_pid;
use deadpool_redis::redis;

use crate::common::ClusterLeaseFactory;

/// The nodes of the local test cluster.
const NODES: [&str; 6] = [
    "127.0.0.1:7000",
    "127.0.0.1:7001",
    "127.0.0.1:7002",
    "127.0.0.1:7003",
    "127.0.0.1:7004",
    "127.0.0.1:7005",
];

/// How many jobs the racers claim at each instant (their keys spread over
/// the three masters), how many stores race, and how often they claim.
const JOBS: usize = 24;
const RACERS: usize = 3;
const EVERY: Duration = Duration::from_millis(50);
/// How long the race runs before the kill, and after the claims of every
/// job are answered again.
const BEFORE_KILL: Duration = Duration::from_secs(2);
const AFTER_FAILOVER: Duration = Duration::from_secs(2);
/// How long the cluster may take to promote the replica (node timeout
/// 2 s, plus the election).
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// How many lines of the client's log a failed failover prints.
const LOG_LINES: usize = 120;

fn refuse_a_cluster_elsewhere() {
    let var = anarchon_testkit::servers::Cluster::Redis.env_var();
    if std::env::var(var).is_ok_and(|url| !url.trim().is_empty()) {
        panic!(
            "the failover test kills and restarts nodes of the local test cluster \
             (127.0.0.1:7000-7005, `cargo xtask services --start`); unset {var} to run it"
        );
    }
}

fn answers(node: &str) -> bool {
    let address = node.parse().expect("an address");
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300)).is_ok()
}

/// `CLUSTER INFO`'s `field` on `node`, if it answers.
fn cluster_info(node: &str, field: &str) -> Option<String> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("INFO");
    let info: String = common::query_blocking(&format!("redis://{node}"), &cmd).ok()?;
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(str::to_owned)
}

/// The settings a test cluster node runs with, as `redis-server`
/// arguments read back with `CONFIG GET` (redis-server rewrites its
/// process title, so `/proc/<pid>/cmdline` no longer shows them).
const NODE_SETTINGS: [&str; 10] = [
    "port",
    "bind",
    "cluster-enabled",
    "cluster-config-file",
    "cluster-node-timeout",
    "dir",
    "save",
    "appendonly",
    "pidfile",
    "logfile",
];

fn node_arguments(node: &str) -> Vec<String> {
    let mut args = vec!["--daemonize".to_owned(), "yes".to_owned()];
    for setting in NODE_SETTINGS {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(setting);
        let pair: Vec<String> = common::query_blocking(&format!("redis://{node}"), &cmd)
            .unwrap_or_else(|e| panic!("CONFIG GET {setting} on {node}: {e}"));
        let value = pair.get(1).cloned().unwrap_or_default();
        args.push(format!("--{setting}"));
        if setting == "bind" {
            args.extend(value.split_whitespace().map(str::to_owned));
        } else {
            args.push(value);
        }
    }
    args
}

/// Whether every node in `nodes` says `cluster_state:ok` with all slots
/// assigned and served, flags no node as failed, lists every one of
/// `nodes` in its `CLUSTER SLOTS` (the table a client builds its view of
/// the cluster from), and every replica among them has its link to its
/// master up (its first sync done).
///
/// A node that came back after a kill rejoins as a replica, and the
/// others learn that by gossip: for a moment after the flags clear, a
/// node's `CLUSTER SLOTS` may still leave it out, and a client that
/// connects then does not know the node at all.
fn whole(nodes: &[&str]) -> bool {
    nodes.iter().all(|node| {
        cluster_info(node, "cluster_state").as_deref() == Some("ok")
            && cluster_info(node, "cluster_slots_ok").as_deref() == Some("16384")
            && flags_none_failed(node, nodes)
            && slots_list_every_node(node, nodes)
            && (cluster_role(node).as_deref() != Some("slave") || replica_linked(node))
    })
}

/// Whether `CLUSTER SLOTS` on `node` names each of `nodes` as a master or
/// a replica of some slot range.
fn slots_list_every_node(node: &str, nodes: &[&str]) -> bool {
    slot_table(node).is_some_and(|ranges| {
        nodes.iter().all(|n| {
            ranges
                .iter()
                .any(|(_, _, serving)| serving.iter().any(|s| s == n))
        })
    })
}

/// `CLUSTER SLOTS` on `node`: each slot range (first, last) with the
/// nodes serving it (`host:port`), the master first; `None` if it does not
/// answer or answers something else.
fn slot_table(node: &str) -> Option<Vec<(i64, i64, Vec<String>)>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let redis::Value::Array(ranges) =
        common::query_blocking::<redis::Value>(&format!("redis://{node}"), &cmd).ok()?
    else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let redis::Value::Array(fields) = range else {
                return None;
            };
            let (Some(redis::Value::Int(first)), Some(redis::Value::Int(last))) =
                (fields.first(), fields.get(1))
            else {
                return None;
            };
            // Then one entry per node serving the range: [host, port, id, ...].
            let serving = fields
                .iter()
                .skip(2)
                .map(|entry| match entry {
                    redis::Value::Array(parts) => match (parts.first(), parts.get(1)) {
                        (Some(redis::Value::BulkString(host)), Some(redis::Value::Int(port))) => {
                            Some(format!("{}:{port}", String::from_utf8_lossy(host)))
                        }
                        _ => None,
                    },
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some((*first, *last, serving))
        })
        .collect()
}

/// Whether `CLUSTER NODES` on `node` flags none of `nodes` `fail` or
/// `fail?` (a node left out of `nodes`, the one a test killed, may be).
fn flags_none_failed(node: &str, nodes: &[&str]) -> bool {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    let table: Result<String, _> = common::query_blocking(&format!("redis://{node}"), &cmd);
    table.is_ok_and(|table| {
        table.lines().all(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let (Some(address), Some(flags)) = (fields.next(), fields.next()) else {
                return false;
            };
            let address = address.split('@').next().unwrap_or(address);
            !nodes.contains(&address) || !flags.split(',').any(|f| f.starts_with("fail"))
        })
    })
}

/// Waits (up to 60 s) until the cluster is [`whole`]: an earlier test of
/// this binary may have restarted a node moments ago.
async fn until_whole() {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tokio::task::spawn_blocking(|| whole(&NODES)).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the test cluster (127.0.0.1:7000-7005) is not whole after 60 s: \
             run `cargo xtask services --start`"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the replica `node` says `master_link_status:up`.
fn replica_linked(node: &str) -> bool {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let info: Result<String, _> = common::query_blocking(&format!("redis://{node}"), &cmd);
    info.is_ok_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"))
}

/// A cluster node the test killed, and how it ran: starts it again (with
/// the executable and arguments it ran with) when dropped, if it does not
/// answer, so the cluster is left whole even when the test fails.
struct NodeGuard {
    node: &'static str,
    exe: std::path::PathBuf,
    args: Vec<String>,
}

impl NodeGuard {
    /// Kills the node at `node` with SIGKILL (no clean shutdown: as a
    /// crashed host), found by the pid listening on its port.
    fn kill(node: &'static str) -> Self {
        let pid = listener_pid(node).unwrap_or_else(|why| panic!("cannot find node {node}: {why}"));
        // The program by the name it ran under: Debian's redis-server is a
        // link to redis-check-rdb, which acts by the name it is called by.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("the command line of node {node} (pid {pid}): {e}"));
        let title = String::from_utf8_lossy(&cmdline);
        let exe = std::path::PathBuf::from(
            title
                .split(['\0', ' '])
                .next()
                .filter(|name| name.contains("redis-server"))
                .unwrap_or("redis-server"),
        );
        let args = node_arguments(node);
        let guard = Self { node, exe, args };
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "kill -KILL {pid}: {status:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while answers(node) {
            assert!(Instant::now() < deadline, "node {node} still answers");
            std::thread::sleep(Duration::from_millis(20));
        }
        guard
    }

    /// Starts the node again and waits until it answers (up to 30 s).
    fn start(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut next_try = Instant::now();
        while !answers(self.node) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "node {} did not come back: see its log under /var/lib/anarchon-redis-cluster",
                    self.node
                ));
            }
            if Instant::now() >= next_try {
                let _ = std::process::Command::new(&self.exe)
                    .args(&self.args)
                    .status();
                next_try = Instant::now() + Duration::from_secs(5);
            }
            std::thread::sleep(Duration::from_millis(100));
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

/// One acknowledged win: which racer, at what time (ms), with what fence.
#[derive(Clone, Copy, Debug)]
struct Win {
    racer: usize,
    at: i64,
    fence: u64,
}

/// What one race measured.
struct Race {
    killed: &'static str,
    killed_at: i64,
    /// When the nodes left said the cluster was ok again (ms after the kill).
    failed_over_after: i64,
    /// When every job's claims were answered again (ms after the kill).
    answered_again_after: i64,
    /// Acknowledged wins by (job, slot).
    wins: BTreeMap<(usize, i64), Vec<Win>>,
    /// Claims that ended in an error (not acknowledged), and the longest
    /// stretch of each job without an acknowledged claim answer (ms).
    errors: usize,
    longest_gaps: Vec<i64>,
    /// The master of each job's keys when the master was killed.
    masters: Vec<String>,
}

impl Race {
    /// The longest stretch of any job without an answer (ms).
    fn longest_gap(&self) -> i64 {
        self.longest_gaps.iter().copied().max().unwrap_or(0)
    }

    /// The longest stretch without an answer of a job whose keys are on a
    /// master that was not killed (ms), and that job.
    fn longest_gap_elsewhere(&self) -> Option<(usize, i64)> {
        self.longest_gaps
            .iter()
            .enumerate()
            .filter(|(job, _)| self.masters[*job] != self.killed)
            .map(|(job, gap)| (job, *gap))
            .max_by_key(|(_, gap)| *gap)
    }
}

fn run(job: usize, slot: i64) -> RunKey {
    RunKey::new(
        JobName::new(&format!("job-{job}")).unwrap(),
        Slot::from_millis(slot),
    )
}

/// Races `RACERS` stores over `JOBS` jobs, a new slot every `EVERY`, each
/// racer claiming all jobs of the slot in one batch, once (an error is an
/// unacknowledged claim, not retried). Kills a master after
/// `BEFORE_KILL`; goes on until every job's claims are answered again and
/// `AFTER_FAILOVER` more; then waits until the cluster is whole again.
async fn race(
    stores: Vec<Arc<RedisLeaseStore>>,
    prefix: &str,
    restart_early: bool,
) -> (Race, NodeGuard) {
    let started = Instant::now();
    let wins: Arc<std::sync::Mutex<BTreeMap<(usize, i64), Vec<Win>>>> = Arc::default();
    let last_answer: Arc<std::sync::Mutex<Vec<i64>>> =
        Arc::new(std::sync::Mutex::new(vec![now_ms(); JOBS]));
    let gaps: Arc<std::sync::Mutex<Vec<i64>>> = Arc::new(std::sync::Mutex::new(vec![0; JOBS]));
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let last_errors: Arc<std::sync::Mutex<Vec<Option<(i64, String)>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; RACERS]));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (racer, store) in stores.iter().enumerate() {
        let (store, wins, last_answer, gaps, errors, last_errors, stop) = (
            store.clone(),
            wins.clone(),
            last_answer.clone(),
            gaps.clone(),
            errors.clone(),
            last_errors.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            let mut slot = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                tick.tick().await;
                // The same slot for every racer: the tick's instant, rounded.
                slot = (now_ms() / EVERY.as_millis() as i64 * EVERY.as_millis() as i64).max(slot);
                let claims: Vec<_> = (0..JOBS)
                    .map(|job| {
                        lease_claim(run(job, slot), Token::generate(), &format!("racer-{racer}"))
                    })
                    .collect();
                let answers = match store.claim_many(&claims).await {
                    Ok(answers) => answers,
                    Err(error) => {
                        errors.fetch_add(JOBS, std::sync::atomic::Ordering::SeqCst);
                        last_errors.lock().unwrap()[racer] =
                            Some((now_ms(), format!("the batch: {error}")));
                        continue;
                    }
                };
                let at = now_ms();
                for (job, answer) in answers.into_iter().enumerate() {
                    match answer {
                        Ok(outcome) => {
                            {
                                let mut last = last_answer.lock().unwrap();
                                let mut gaps = gaps.lock().unwrap();
                                gaps[job] = gaps[job].max(at - last[job]);
                                last[job] = at;
                            }
                            if let ClaimOutcome::Won(win) = outcome {
                                wins.lock()
                                    .unwrap()
                                    .entry((job, slot))
                                    .or_default()
                                    .push(Win {
                                        racer,
                                        at,
                                        fence: win.fence.map_or(0, |f| f.get()),
                                    });
                            }
                        }
                        Err(error) => {
                            errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            last_errors.lock().unwrap()[racer] =
                                Some((now_ms(), format!("job-{job}: {error}")));
                        }
                    }
                }
            }
        }));
    }
    tokio::time::sleep(BEFORE_KILL).await;

    let url = common::cluster_url().await;
    // Not the master of the namespace's pause, which every batch of
    // claims reads first: then the jobs on the other masters must go on.
    let spared = master_of(&format!("{{{prefix}}}:pause"));
    let killed = *NODES
        .iter()
        .find(|node| {
            common::is_master(&common::node_url(&url, node)) && Some(**node) != spared.as_deref()
        })
        .expect("a master among the test cluster's nodes");
    let masters: Vec<String> = (0..JOBS)
        .map(|job| {
            master_of(&format!("{{{prefix}:job-{job}}}:x"))
                .unwrap_or_else(|| panic!("no master for the keys of job-{job}"))
        })
        .collect();
    let replica = *NODES
        .iter()
        .find(|node| replica_of(node).as_deref() == Some(killed))
        .unwrap_or_else(|| panic!("master {killed} has no replica in the test cluster"));
    let guard = tokio::task::spawn_blocking(move || NodeGuard::kill(killed))
        .await
        .unwrap();
    let killed_at = now_ms();

    // The replica promoted, and the five nodes left agree the cluster is
    // ok with every slot served.
    let left: Vec<&'static str> = NODES.iter().copied().filter(|n| *n != killed).collect();
    let deadline = Instant::now() + FAILOVER_LIMIT;
    while !tokio::task::spawn_blocking({
        let left = left.clone();
        move || cluster_role(replica).as_deref() == Some("master") && whole(&left)
    })
    .await
    .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "no replica took over from {killed} within {FAILOVER_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed_over_after = now_ms() - killed_at;
    if restart_early {
        // With WAIT, the new master needs a replica before its claims can
        // be acknowledged: the killed node comes back as that replica.
        let node = killed;
        let args = guard.args.clone();
        let exe = guard.exe.clone();
        tokio::task::spawn_blocking(move || NodeGuard { node, exe, args }.start())
            .await
            .unwrap()
            .unwrap_or_else(|why| panic!("{why}"));
    }

    // Claims of every job answered again (the replica promoted, the
    // stores' slot maps refreshed).
    let mut answered_again_after = None;
    while now_ms() - killed_at < FAILOVER_LIMIT.as_millis() as i64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = last_answer.lock().unwrap().clone();
        if let Some(oldest) = last.iter().min()
            && *oldest > killed_at + failed_over_after
        {
            answered_again_after = Some(oldest - killed_at);
            break;
        }
    }
    let answered_again_after = answered_again_after.unwrap_or_else(|| {
        let since_kill = |at: i64| format!("{:+} ms", at - killed_at);
        let last = last_answer.lock().unwrap().clone();
        let silent: Vec<String> = last
            .iter()
            .enumerate()
            .filter(|(_, at)| **at <= killed_at + failed_over_after)
            .map(|(job, at)| format!("job-{job} (last answer {})", since_kill(*at)))
            .collect();
        let racers: Vec<String> = last_errors
            .lock()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(racer, e)| match e {
                Some((at, e)) => format!("racer-{racer} at {}: {e}", since_kill(*at)),
                None => format!("racer-{racer}: no error"),
            })
            .collect();
        let views: Vec<String> = left
            .iter()
            .map(|node| format!("{node}:\n{}", cluster_nodes(node)))
            .collect();
        panic!(
            "the claims of some jobs were not answered within {FAILOVER_LIMIT:?} of killing \
             {killed} (its replica {replica} took over {failed_over_after} ms after the kill)\n\
             jobs without an answer since: {}\nlast errors: {}\nCLUSTER NODES of the nodes \
             left:\n{}\nthe client's log (last {LOG_LINES} lines):\n{}",
            silent.join(", "),
            racers.join("; "),
            views.join("\n"),
            common::log::tail(LOG_LINES),
        )
    });
    tokio::time::sleep(AFTER_FAILOVER).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let wins = wins.lock().unwrap().clone();
    let longest_gaps = gaps.lock().unwrap().clone();
    println!(
        "race of {RACERS} stores over {JOBS} jobs ran {:.1} s",
        started.elapsed().as_secs_f64()
    );
    (
        Race {
            killed,
            killed_at,
            failed_over_after,
            answered_again_after,
            wins,
            errors: errors.load(std::sync::atomic::Ordering::SeqCst),
            longest_gaps,
            masters,
        },
        guard,
    )
}

/// The acknowledged wins the store no longer has: their run's record (on
/// the new master) is missing, or names another winner (fence).
async fn lost_wins(store: &RedisLeaseStore, race: &Race) -> Vec<((usize, i64), Win)> {
    let mut lost = Vec::new();
    let mut records: BTreeMap<usize, BTreeMap<i64, Option<u64>>> = BTreeMap::new();
    for job in 0..JOBS {
        let history = store
            .history(&JobName::new(&format!("job-{job}")).unwrap(), usize::MAX)
            .await
            .unwrap();
        records.insert(
            job,
            history
                .into_iter()
                .map(|r| (r.run.slot.as_millis(), r.fence.map(|f| f.get())))
                .collect(),
        );
    }
    for (&(job, slot), wins) in &race.wins {
        let kept = records[&job].get(&slot).copied().flatten();
        for win in wins {
            if kept != Some(win.fence) {
                lost.push(((job, slot), *win));
            }
        }
    }
    lost
}

/// Starts the killed node again, waits until it is a replica and the
/// whole cluster (six nodes) is ok with every slot served.
async fn heal(guard: NodeGuard) -> i64 {
    let back_from = now_ms();
    let node = guard.node;
    tokio::task::spawn_blocking(move || guard.start())
        .await
        .unwrap()
        .unwrap_or_else(|why| panic!("{why}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = tokio::task::spawn_blocking(|| whole(&NODES)).await.unwrap();
        let role = tokio::task::spawn_blocking(move || cluster_role(node))
            .await
            .unwrap();
        if ok && role.as_deref() == Some("slave") {
            return now_ms() - back_from;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster is not whole 60 s after {node} was started again (its role: {role:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The master `node` replicates (`host:port`), if it is a replica.
fn replica_of(node: &str) -> Option<String> {
    let role: redis::Value =
        common::query_blocking(&format!("redis://{node}"), &redis::cmd("ROLE")).ok()?;
    let redis::Value::Array(items) = role else {
        return None;
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    if text(items.first()?)? != "slave" {
        return None;
    }
    let port = match items.get(2)? {
        redis::Value::Int(p) => p.to_string(),
        other => text(other)?,
    };
    Some(format!("{}:{port}", text(items.get(1)?)?))
}

/// The master (`host:port`) of the hash slot of `key`, as the first node
/// that answers says.
fn master_of(key: &str) -> Option<String> {
    NODES.iter().find_map(|node| {
        let mut keyslot = redis::cmd("CLUSTER");
        keyslot.arg("KEYSLOT").arg(key);
        let slot: i64 = common::query_blocking(&format!("redis://{node}"), &keyslot).ok()?;
        slot_table(node)?
            .into_iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .and_then(|(_, _, serving)| serving.into_iter().next())
    })
}

/// `CLUSTER NODES` on `node`, or why it could not be read.
fn cluster_nodes(node: &str) -> String {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    common::query_blocking::<String>(&format!("redis://{node}"), &cmd)
        .unwrap_or_else(|e| format!("(no answer: {e})"))
}

/// The first word of `ROLE` on `node`.
fn cluster_role(node: &str) -> Option<String> {
    let role: redis::Value =
        common::query_blocking(&format!("redis://{node}"), &redis::cmd("ROLE")).ok()?;
    match role {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

/// Races, kills a master, measures, heals; checks what a failover must
/// keep. `label` names the configuration in the printed figures.
async fn fail_over(
    label: &str,
    factory: &ClusterLeaseFactory,
    opts: &anarchon_redis::RedisOptions,
    restart_early: bool,
) -> (Race, usize) {
    refuse_a_cluster_elsewhere();
    common::log::capture("redis=debug,anarchon_redis=debug");
    until_whole().await;
    let mut stores = Vec::new();
    for _ in 0..RACERS {
        stores.push(Arc::new(RedisLeaseStore::connect(opts).await.unwrap()));
    }
    let watcher = RedisLeaseStore::connect(opts).await.unwrap();
    let (race, guard) = race(stores, &factory.prefix, restart_early).await;
    assert!(
        watcher.check_server().await.unwrap(),
        "the store sees that the masters changed"
    );
    let lost = lost_wins(&watcher, &race).await;
    let healed_after = heal(guard).await;

    let acknowledged: usize = race.wins.values().map(Vec::len).sum();
    let doubles: Vec<_> = race.wins.iter().filter(|(_, w)| w.len() > 1).collect();
    let lost_slots: BTreeSet<(usize, i64)> = lost.iter().map(|(run, _)| *run).collect();
    println!(
        "FAILOVER redis cluster ({label}): killed master {}; replica promoted (cluster ok on the \
         nodes left) {} ms after the kill; claims of every job answered again {} ms after the kill; longest stretch of one job without an answer: {} ms; \
         of a job on another master: {} ms; \
         unacknowledged claims (errors): {}; acknowledged wins: {acknowledged}; acknowledged wins \
         the new master does not have (lost by asynchronous replication): {} {:?}; slots won \
         twice: {}; node back and the cluster whole {healed_after} ms after the restart",
        race.killed,
        race.failed_over_after,
        race.answered_again_after,
        race.longest_gap(),
        race.longest_gap_elsewhere().map_or(0, |(_, gap)| gap),
        race.errors,
        lost.len(),
        lost.iter()
            .map(|((job, slot), win)| format!(
                "job-{job} slot {:+} ms from the kill, won by racer-{} {:+} ms from the kill",
                slot - race.killed_at,
                win.racer,
                win.at - race.killed_at
            ))
            .collect::<Vec<_>>(),
        doubles.len(),
    );
    // Exclusive, but for what the failover lost: a slot two racers were
    // told they won is one whose first win the new master does not have.
    for (run, wins) in &doubles {
        assert!(
            lost_slots.contains(run),
            "slot {run:?} was won twice although the store kept its first win: {wins:?}"
        );
    }
    // The claims went on after the failover, on every job.
    for job in 0..JOBS {
        assert!(
            race.wins
                .keys()
                .any(|(j, slot)| *j == job && *slot > race.killed_at + race.answered_again_after),
            "job-{job} was won again after the failover"
        );
    }
    (race, lost.len())
}

/// The lease strategy without `WAIT`: the failover may lose the last
/// acknowledged wins (printed, not asserted: it depends on timing); any
/// slot won twice is one of those.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_go_on_when_a_master_dies() {
    let factory = ClusterLeaseFactory::new().await;
    fail_over("no WAIT", &factory, &factory.opts, false).await;
}

/// With `wait_for_replicas(1, 100 ms)` every acknowledged win is on the
/// master's one replica, which the failover promotes: nothing
/// acknowledged is lost, and no slot is won twice. The new master has no
/// replica until the killed node is back, so until then its slots' claims
/// fail (`NotReplicated`): the node is started again as soon as the
/// replica took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_a_failover_loses_no_acknowledged_win() {
    let factory = ClusterLeaseFactory::new().await;
    let opts = factory
        .opts
        .clone()
        .wait_for_replicas(1, Duration::from_millis(100));
    let (race, lost) = fail_over("WAIT 1 replica, 100 ms", &factory, &opts, true).await;
    assert_eq!(lost, 0, "WAIT kept every acknowledged win");
    assert!(
        race.wins.values().all(|w| w.len() == 1),
        "no slot was won twice"
    );
}

/// `SCRIPT FLUSH` on every node of the cluster (what a restart does to
/// the script cache), and whether each node has the `script` strategy's
/// script.
fn flush_scripts() {
    for node in NODES {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("FLUSH");
        let flushed: redis::RedisResult<()> =
            common::query_blocking(&format!("redis://{node}"), &cmd);
        flushed.unwrap_or_else(|e| panic!("SCRIPT FLUSH on {node}: {e}"));
    }
}

fn has_script(node: &str, sha: &str) -> bool {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("EXISTS").arg(sha);
    let found: Vec<i64> = common::query_blocking(&format!("redis://{node}"), &cmd)
        .unwrap_or_else(|e| panic!("SCRIPT EXISTS on {node}: {e}"));
    found == [1]
}

/// A store loads its scripts on every node when it connects, replicas
/// too; after `SCRIPT FLUSH` on every node, claims of jobs on every
/// master still win (each node that answers NOSCRIPT gets the call again
/// as `EVAL`), and the masters have the script again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_on_every_node_and_reloaded_after_a_flush() {
    use anarchon_core::ClaimStore as _;
    refuse_a_cluster_elsewhere();
    let sha = redis::Script::new(include_str!("../lua/script_claim.lua"))
        .get_hash()
        .to_owned();
    let factory = common::ClusterScriptFactory::new().await;
    until_whole().await;
    flush_scripts();
    let store = factory.connect().await.unwrap();
    for node in NODES {
        assert!(
            has_script(node, &sha),
            "{node} has the script after connect"
        );
    }
    flush_scripts();
    let slot = now_ms();
    for job in 0..JOBS {
        let req = anarchon_testkit::fleet::slot_request(&format!("job-{job}"), slot, "a");
        let answer = store.claim(&req).await.unwrap();
        assert!(
            matches!(answer, ClaimOutcome::Won(_)),
            "job-{job}: {answer:?}"
        );
    }
    let url = common::cluster_url().await;
    for node in NODES {
        if common::is_master(&common::node_url(&url, node)) {
            assert!(has_script(node, &sha), "master {node} has the script again");
        }
    }
}
