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

use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::{
    ClaimRequest, InstanceId, JobName, LeaseClaim, LeaseStore, MaxAttempts, Overlap, RunKey, Slot,
    Token,
};
use anarchon_pg::{PgOptions, PgStore, TableName};

const INSTANCES: usize = 8;
const JOBS: usize = 50;
const SLOTS: i64 = 20;
const BATCH_JOBS: usize = 100;

fn claim(job: &JobName, slot: Slot, instance: &InstanceId) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(job.clone(), slot),
            token: Token::generate(),
            instance: instance.clone(),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(30),
        overlap: Overlap::Skip,
        max_attempts: MaxAttempts::DEFAULT,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    let jobs: Vec<JobName> = (0..JOBS)
        .map(|i| JobName::new(&format!("job-{i}")))
        .collect::<Result<_, _>>()?;
    let sent_before: u64 = stores.iter().map(|s| s.statements_sent()).sum();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let (store, jobs) = (store.clone(), jobs.clone());
        let me = InstanceId::new(&format!("bench-{i}"))?;
        tasks.push(tokio::spawn(async move {
            for s in 0..SLOTS {
                let slot = Slot::from_millis(base + s * 1000);
                for job in &jobs {
                    store.claim_lease(&claim(job, slot, &me)).await?;
                }
            }
            Ok::<_, anarchon_core::StoreError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = started.elapsed();
    let claims = (INSTANCES * JOBS) as f64 * SLOTS as f64;
    let sent: u64 = stores.iter().map(|s| s.statements_sent()).sum::<u64>() - sent_before;
    println!(
        "single claims: {INSTANCES} instances x {} runs = {claims} claims in {took:.2?}: {:.0} claims/s, {:.2} statements per claim",
        JOBS as i64 * SLOTS,
        claims / took.as_secs_f64(),
        sent as f64 / claims
    );

    // Batches: every instance claims BATCH_JOBS jobs due at one slot per call.
    let batch_jobs: Vec<JobName> = (0..BATCH_JOBS)
        .map(|i| JobName::new(&format!("batch-{i}")))
        .collect::<Result<_, _>>()?;
    let sent_before: u64 = stores.iter().map(|s| s.statements_sent()).sum();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let (store, jobs) = (store.clone(), batch_jobs.clone());
        let me = InstanceId::new(&format!("bench-{i}"))?;
        tasks.push(tokio::spawn(async move {
            for s in 0..SLOTS {
                let slot = Slot::from_millis(base + s * 1000);
                let batch: Vec<LeaseClaim> = jobs.iter().map(|j| claim(j, slot, &me)).collect();
                store.claim_many(&batch).await?.all()?;
            }
            Ok::<_, anarchon_core::StoreError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = started.elapsed();
    let claims = (INSTANCES * BATCH_JOBS) as f64 * SLOTS as f64;
    let sent: u64 = stores.iter().map(|s| s.statements_sent()).sum::<u64>() - sent_before;
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
