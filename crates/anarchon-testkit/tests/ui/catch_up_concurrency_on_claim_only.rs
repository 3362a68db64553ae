// `catch_up_concurrency` bounds catch-up, which only lease stores offer.
use std::sync::Arc;

use anarchon_core::Scheduler;
use anarchon_testkit::ClaimOnlyStore;

fn main() {
    let _ = Scheduler::builder(Arc::new(ClaimOnlyStore::default())).catch_up_concurrency(2);
}
