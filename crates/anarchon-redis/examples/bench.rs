//! Claims per second with 8 racing instances, and commands per claim.
//!
//! ```text
//! cargo run --release -p anarchon-redis --example bench -- [lease|stream-id|script|lease-batch] [slots]
//! ```
//!
//! Eight stores (eight pools, as eight processes would have) claim the same
//! slots of one job, each in slot order, all at once; every slot must have
//! exactly one winner. Commands per claim come from the server's
//! `INFO commandstats` before and after, so run it on a quiet server
//! (the counts include anything else the server did meanwhile). The keys
//! are deleted afterwards. `ANARCHON_REDIS_URL` picks the server (default
//! `redis://127.0.0.1:6379`).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, LeaseClaim, LeaseStore, RunKey,
    Slot, Token,
};
use anarchon_redis::{RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore};
use deadpool_redis::redis::{self, AsyncCommands};

const RACERS: usize = 8;

async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let strategy = args.next().unwrap_or_else(|| "lease".into());
    let slots: i64 = args.next().map_or(2000, |s| s.parse().unwrap());
    let url =
        std::env::var("ANARCHON_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("bench{}", std::process::id());
    let opts = RedisOptions::new(url.clone()).with_prefix(&prefix).unwrap();
    let job = JobName::new("bench").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now - now % 1000 + 600_000;
    let requests = |i: usize| -> Vec<ClaimRequest> {
        (0..slots)
            .map(|s| ClaimRequest {
                run: RunKey::new(job.clone(), Slot::from_millis(base + s * 1000)),
                token: Token::generate(),
                instance: InstanceId::new(&format!("racer-{i}")).unwrap(),
                max_late: Duration::from_secs(60),
            })
            .collect()
    };

    let mut stores: Vec<Arc<dyn ClaimStore>> = Vec::new();
    let mut lease_stores: Vec<Arc<RedisLeaseStore>> = Vec::new();
    for _ in 0..RACERS {
        match strategy.as_str() {
            "lease" | "lease-batch" => {
                let s = Arc::new(RedisLeaseStore::connect(&opts).await.unwrap());
                lease_stores.push(s.clone());
                stores.push(s);
            }
            "stream-id" => stores.push(Arc::new(RedisStreamIdStore::connect(&opts).await.unwrap())),
            "script" => stores.push(Arc::new(
                RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
                    .await
                    .unwrap(),
            )),
            other => panic!("unknown strategy {other}: lease, lease-batch, stream-id, script"),
        }
    }
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let before = commandstats(&mut admin).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let reqs = requests(i);
            let store = stores[i].clone();
            let lease = lease_stores.get(i).cloned();
            let batch = strategy == "lease-batch";
            tokio::spawn(async move {
                let mut won = Vec::new();
                if batch {
                    // All slots of this instance in batches of 100, one round trip each.
                    let lease = lease.unwrap();
                    for chunk in reqs.chunks(100) {
                        let claims: Vec<LeaseClaim> =
                            chunk.iter().map(LeaseClaim::from_plain).collect();
                        let outcomes = lease.claim_many(&claims).await.unwrap().all().unwrap();
                        for (req, o) in chunk.iter().zip(outcomes) {
                            if matches!(o, ClaimOutcome::Won(_)) {
                                won.push(req.run.slot);
                            }
                        }
                    }
                } else {
                    for req in &reqs {
                        if matches!(store.claim(req).await.unwrap(), ClaimOutcome::Won(_)) {
                            won.push(req.run.slot);
                        }
                    }
                }
                won
            })
        })
        .collect();
    let mut winners: HashMap<Slot, usize> = HashMap::new();
    for task in tasks {
        for slot in task.await.unwrap() {
            *winners.entry(slot).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    let after = commandstats(&mut admin).await;
    let claims = slots as f64 * RACERS as f64;
    let doubles = winners.values().filter(|n| **n != 1).count();
    assert_eq!(winners.len() as i64, slots, "every slot has a winner");
    assert_eq!(doubles, 0, "no slot has two winners");
    println!(
        "{strategy}: {RACERS} instances, {slots} slots, {} claims in {elapsed:.2?}: {:.0} claims/s",
        claims as u64,
        claims / elapsed.as_secs_f64()
    );
    // What the instances send; everything else ran inside their scripts.
    let sent_by_clients: &[&str] = match strategy.as_str() {
        "stream-id" => &["xadd", "xrange"],
        _ => &["evalsha", "sadd", "script|load", "script"],
    };
    let (mut sent, mut inside) = (0u64, 0u64);
    for (name, calls) in &after {
        let delta = calls - before.get(name).copied().unwrap_or(0);
        // The second INFO call of this benchmark is not a claim.
        let delta = if name == "info" {
            delta.saturating_sub(1)
        } else {
            delta
        };
        if delta == 0 {
            continue;
        }
        let by_client = sent_by_clients.contains(&name.as_str());
        if by_client {
            sent += delta;
        } else {
            inside += delta;
        }
        println!(
            "  {name:<14} {:>8.3} per claim{}",
            delta as f64 / claims,
            if by_client { "" } else { "  (inside a script)" }
        );
    }
    println!(
        "  commands sent per claim:           {:.3}",
        sent as f64 / claims
    );
    println!(
        "  commands inside scripts per claim: {:.3}",
        inside as f64 / claims
    );

    let keys: Vec<String> = {
        let mut iter: redis::AsyncIter<'_, String> =
            admin.scan_match(format!("*{prefix}*")).await.unwrap();
        let mut keys = Vec::new();
        while let Some(key) = futures::StreamExt::next(&mut iter).await {
            keys.push(key.unwrap());
        }
        keys
    };
    if !keys.is_empty() {
        let _: () = admin.del(keys).await.unwrap();
    }
}
