// The same options compile against a lease store.
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{MemoryStore, Overlap, Schedule, Scheduler};

fn main() {
    let mut builder = Scheduler::builder(Arc::new(MemoryStore::new()))
        .lease(Duration::from_secs(30))
        .heartbeat(Duration::from_secs(10))
        .catch_up_concurrency(2);
    let _ = builder
        .job("job", Schedule::cron("* * * * *").unwrap())
        .unwrap()
        .overlap(Overlap::Skip)
        .max_attempts(2)
        .catch_up(Duration::from_secs(60))
        .catch_up_limit(5);
}
