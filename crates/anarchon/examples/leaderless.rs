//! Three schedulers in one process share a `MemoryStore`, as three instances
//! of a service would share a database. A job fires every second; for each
//! slot exactly one instance wins and runs it.
//!
//! `cargo run -p anarchon --example leaderless`

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon::{InstanceId, MemoryStore, Schedule, Scheduler, Slot};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::new());
    let winners: Arc<Mutex<BTreeMap<Slot, Vec<String>>>> = Arc::default();
    let mut schedulers = Vec::new();
    for name in ["instance-a", "instance-b", "instance-c"] {
        let mut builder = Scheduler::builder(store.clone())
            .instance_id(InstanceId::new(name)?)
            .lease(Duration::from_secs(5))
            .heartbeat(Duration::from_secs(1));
        let winners = winners.clone();
        builder
            .job("tick", Schedule::every(Duration::from_secs(1))?)?
            .run(move |ctx| {
                let winners = winners.clone();
                async move {
                    println!(
                        "slot {}  won by {}  (attempt {}, fence {})",
                        ctx.slot(),
                        ctx.instance(),
                        ctx.attempt(),
                        ctx.fence().map_or(0, |f| f.get())
                    );
                    winners
                        .lock()
                        .expect("not poisoned")
                        .entry(ctx.slot())
                        .or_default()
                        .push(ctx.instance().to_string());
                    Ok::<_, std::io::Error>(())
                }
            })?;
        schedulers.push(builder.start()?);
    }

    tokio::time::sleep(Duration::from_millis(5500)).await;
    for scheduler in schedulers {
        scheduler.shutdown().await;
    }

    let winners = winners.lock().expect("not poisoned");
    let doubled: Vec<_> = winners.iter().filter(|(_, w)| w.len() > 1).collect();
    println!("{} slots, {} won twice", winners.len(), doubled.len());
    if winners.is_empty() || !doubled.is_empty() {
        return Err(format!("expected one winner per slot, got {winners:?}").into());
    }
    println!("no slot was won twice");
    Ok(())
}
