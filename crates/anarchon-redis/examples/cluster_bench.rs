//! Claims per second and claim latency on a Redis Cluster, without and
//! with `WAIT` (one replica).
//!
//! ```text
//! cargo run --release -p anarchon-redis --example cluster_bench -- [lease|lease-batch|script|stream-id] [slots] [jobs]
//! ```
//!
//! Eight stores (eight cluster connections, as eight processes would have)
//! race for the same runs: `jobs` jobs (default 12, their keys spread over
//! the masters), `slots` slots each (default 300), each store in slot
//! order, all at once; every run must have exactly one winner. Each claim
//! call is timed (for `lease-batch`, one `claim_many` of all jobs of a
//! slot is one call). The race runs twice on fresh prefixes: without
//! `WAIT`, then with `wait_for_replicas(1, 100 ms)`. The figures are for
//! docs/backends/redis.md, never for a test's assertion.
//!
//! `ANARCHON_REDIS_CLUSTER_URL` picks the cluster (default: the test
//! cluster on 127.0.0.1:7000-7005); a URL without `cluster=true` (e.g.
//! `redis://127.0.0.1:6379`) runs the same race on one server, without
//! `WAIT`, for comparison. The keys are deleted afterwards.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, LeaseClaim, LeaseStore, RunKey,
    Slot, Token,
};
use anarchon_redis::{RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore};
use deadpool_redis::redis::{self, Commands as _};

const RACERS: usize = 8;
const DEFAULT_URL: &str = "redis://127.0.0.1:7000?cluster=true&seed=127.0.0.1:7001&seed=127.0.0.1:7002&seed=127.0.0.1:7003&seed=127.0.0.1:7004&seed=127.0.0.1:7005";

/// One racer's claim calls: how long each took, and the runs it won.
struct Raced {
    latencies: Vec<Duration>,
    won: Vec<RunKey>,
}

async fn race(
    strategy: &str,
    opts: &RedisOptions,
    slots: i64,
    jobs: usize,
) -> (f64, Vec<Duration>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now - now % 1000 + 600_000;
    let mut stores: Vec<Arc<dyn ClaimStore>> = Vec::new();
    let mut lease_stores: Vec<Arc<RedisLeaseStore>> = Vec::new();
    for _ in 0..RACERS {
        match strategy {
            "lease" | "lease-batch" => {
                let s = Arc::new(RedisLeaseStore::connect(opts).await.unwrap());
                lease_stores.push(s.clone());
                stores.push(s);
            }
            "stream-id" => stores.push(Arc::new(RedisStreamIdStore::connect(opts).await.unwrap())),
            "script" => stores.push(Arc::new(
                RedisScriptStore::connect(opts, RedisScriptStore::DEFAULT_WINDOW)
                    .await
                    .unwrap(),
            )),
            other => panic!("unknown strategy {other}: lease, lease-batch, stream-id, script"),
        }
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let store = stores[i].clone();
            let lease = lease_stores.get(i).cloned();
            let batch = strategy == "lease-batch";
            tokio::spawn(async move {
                let mut raced = Raced {
                    latencies: Vec::new(),
                    won: Vec::new(),
                };
                for s in 0..slots {
                    let reqs: Vec<ClaimRequest> = (0..jobs)
                        .map(|j| ClaimRequest {
                            run: RunKey::new(
                                JobName::new(&format!("job-{j}")).unwrap(),
                                Slot::from_millis(base + s * 1000),
                            ),
                            token: Token::generate(),
                            instance: InstanceId::new(&format!("racer-{i}")).unwrap(),
                            max_late: Duration::from_secs(60),
                        })
                        .collect();
                    if batch {
                        let claims: Vec<LeaseClaim> =
                            reqs.iter().map(LeaseClaim::from_plain).collect();
                        let at = Instant::now();
                        let outcomes = lease
                            .as_ref()
                            .unwrap()
                            .claim_many(&claims)
                            .await
                            .unwrap()
                            .all()
                            .unwrap();
                        raced.latencies.push(at.elapsed());
                        for (req, o) in reqs.iter().zip(outcomes) {
                            if matches!(o, ClaimOutcome::Won(_)) {
                                raced.won.push(req.run.clone());
                            }
                        }
                    } else {
                        for req in &reqs {
                            let at = Instant::now();
                            let outcome = store.claim(req).await.unwrap();
                            raced.latencies.push(at.elapsed());
                            if matches!(outcome, ClaimOutcome::Won(_)) {
                                raced.won.push(req.run.clone());
                            }
                        }
                    }
                }
                raced
            })
        })
        .collect();
    let mut winners: HashMap<RunKey, usize> = HashMap::new();
    let mut latencies = Vec::new();
    for task in tasks {
        let raced = task.await.unwrap();
        latencies.extend(raced.latencies);
        for run in raced.won {
            *winners.entry(run).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(
        winners.len(),
        slots as usize * jobs,
        "every run has a winner"
    );
    assert!(winners.values().all(|n| *n == 1), "no run has two winners");
    let claims = (slots as usize * jobs * RACERS) as f64;
    latencies.sort();
    (claims / elapsed.as_secs_f64(), latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Deletes the keys under `prefix` on every master the URL names.
fn clean(url: &str, prefix: &str) {
    let (_, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let mut nodes = vec![rest[..end].to_owned()];
    if let Some((_, query)) = rest.split_once('?') {
        nodes.extend(
            query
                .split('&')
                .filter_map(|p| p.strip_prefix("seed="))
                .map(str::to_owned),
        );
    }
    for node in nodes {
        let Ok(mut conn) =
            redis::Client::open(format!("redis://{node}")).and_then(|c| c.get_connection())
        else {
            continue;
        };
        let keys: Vec<String> = match conn.scan_match::<_, String>(format!("*{prefix}*")) {
            Ok(iter) => iter.filter_map(Result::ok).collect(),
            Err(_) => continue,
        };
        for key in keys {
            let _: redis::RedisResult<i64> = conn.del(&key);
        }
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let strategy = args.next().unwrap_or_else(|| "lease".into());
    let slots: i64 = args.next().map_or(300, |s| s.parse().unwrap());
    let jobs: usize = args.next().map_or(12, |s| s.parse().unwrap());
    let url = std::env::var("ANARCHON_REDIS_CLUSTER_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    let (base, _) = RedisOptions::from_url(&url).unwrap();
    println!(
        "{strategy} on {}: {RACERS} instances, {jobs} jobs x {slots} slots; latency per {}",
        if base.is_cluster() {
            "a Redis Cluster"
        } else {
            "one Redis server (no WAIT: no replicas)"
        },
        if strategy == "lease-batch" {
            "claim_many of all jobs of a slot"
        } else {
            "claim"
        }
    );
    let waits: &[(&str, Option<Duration>)] = if base.is_cluster() {
        &[
            ("no WAIT", None),
            ("WAIT 1 replica", Some(Duration::from_millis(100))),
        ]
    } else {
        &[("no WAIT", None)]
    };
    for &(label, wait) in waits {
        let prefix = format!("cbench{}{}", std::process::id(), wait.is_some() as u8);
        let mut opts = base.clone().with_prefix(&prefix).unwrap();
        if let Some(timeout) = wait {
            opts = opts.wait_for_replicas(1, timeout);
        }
        let (rate, latencies) = race(&strategy, &opts, slots, jobs).await;
        println!(
            "  {label:<15} {rate:>8.0} claims/s   p50 {:>7.2?}   p99 {:>7.2?}   max {:>7.2?}",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or_default(),
        );
        clean(&url, &prefix);
    }
}
