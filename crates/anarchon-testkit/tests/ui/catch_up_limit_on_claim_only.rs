// `catch_up_limit` bounds catch-up, which only lease stores offer.
use std::sync::Arc;

use anarchon_core::{Schedule, Scheduler};
use anarchon_testkit::ClaimOnlyStore;

fn main() {
    let mut builder = Scheduler::builder(Arc::new(ClaimOnlyStore::default()));
    let _ = builder
        .job("job", Schedule::cron("* * * * *").unwrap())
        .unwrap()
        .catch_up_limit(5);
}
