//! A quick throughput figure: 8 instances, each with its own pool of one
//! connection, claim the same runs at the same time, as a fleet does.
//!
//! ```text
//! cargo run --release -p anarchon-pg --example throughput
//! ```
//!
//! Uses `ANARCHON_PG_URL` or `postgres://postgres@127.0.0.1:5432/test`, in a
//! table of its own that it drops at the end. Prints claims per second and
//! statements per claim, for single claims and for batches.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::{JobName, LeaseClaim, LeaseStore, Overlap, RunKey, Slot, Token};
use anarchon_pg::{PgOptions, PgStore, TableName};
use anarchon_testkit::lease::lease_claim;

const INSTANCES: usize = 8;
const JOBS: usize = 50;
const SLOTS: i64 = 20;
const BATCH_JOBS: usize = 100;

/// `instance`'s claim of `job` at `slot`: a 30 s lease, a minute late at
/// most, skipping while another run of the job is live.
fn claim(job: &JobName, slot: Slot, instance: &str) -> LeaseClaim {
    let mut claim = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), instance);
    claim.overlap = Overlap::Skip;
    claim
}

/// `n` job names `{prefix}-0`, `{prefix}-1`, ...
fn jobs(prefix: &str, n: usize) -> Result<Vec<JobName>, Box<dyn Error>> {
    Ok((0..n)
        .map(|i| JobName::new(&format!("{prefix}-{i}")))
        .collect::<Result<_, _>>()?)
}

/// Every instance claims every run of `jobs` at `SLOTS` slots from `base`,
/// all instances at once: one call per run, or with `batched` one
/// `claim_many` per slot. How long that took, and the statements it sent.
async fn claim_all(
    stores: &[Arc<PgStore>],
    jobs: &[JobName],
    base: i64,
    batched: bool,
) -> Result<(Duration, u64), Box<dyn Error>> {
    let sent_before: u64 = stores.iter().map(|s| s.statements_sent()).sum();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let (store, jobs) = (store.clone(), jobs.to_vec());
        let me = format!("bench-{i}");
        tasks.push(tokio::spawn(async move {
            for s in 0..SLOTS {
                let slot = Slot::from_millis(base + s * 1000);
                if batched {
                    let batch: Vec<LeaseClaim> = jobs.iter().map(|j| claim(j, slot, &me)).collect();
                    store.claim_many(&batch).await?.all()?;
                } else {
                    for job in &jobs {
                        store.claim_lease(&claim(job, slot, &me)).await?;
                    }
                }
            }
            Ok::<_, anarchon_core::StoreError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = started.elapsed();
    let sent: u64 = stores.iter().map(|s| s.statements_sent()).sum::<u64>() - sent_before;
    Ok((took, sent))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let url = std::env::var("ANARCHON_PG_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let table = TableName::new(&format!(
        "anarchon_bench_{:012x}",
        Token::generate().as_u128() & 0xffff_ffff_ffff
    ))?;
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(Arc::new(
            PgStore::connect_with(
                PgOptions::new(&url)
                    .with_table_name(table.clone())
                    .with_pool_size(1),
            )
            .await?,
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let base = now - now.rem_euclid(1000) + 600_000;

    // Single claims: every instance claims every run, one call per run.
    let (took, sent) = claim_all(&stores, &jobs("job", JOBS)?, base, false).await?;
    let claims = (INSTANCES * JOBS) as f64 * SLOTS as f64;
    println!(
        "single claims: {INSTANCES} instances x {} runs = {claims} claims in {took:.2?}: {:.0} claims/s, {:.2} statements per claim",
        JOBS as i64 * SLOTS,
        claims / took.as_secs_f64(),
        sent as f64 / claims
    );

    // Batches: every instance claims BATCH_JOBS jobs due at one slot per call.
    let (took, sent) = claim_all(&stores, &jobs("batch", BATCH_JOBS)?, base, true).await?;
    let claims = (INSTANCES * BATCH_JOBS) as f64 * SLOTS as f64;
    println!(
        "batched claims ({BATCH_JOBS} per call): {claims} claims in {took:.2?}: {:.0} claims/s, {:.3} statements per claim",
        claims / took.as_secs_f64(),
        sent as f64 / claims
    );

    stores[0].drop_schema().await?;
    for store in &stores {
        store.close().await;
    }
    Ok(())
}
