// `heartbeat` is a scheduler option only lease stores can honour.
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::Scheduler;
use anarchon_testkit::ClaimOnlyStore;

fn main() {
    let _ = Scheduler::builder(Arc::new(ClaimOnlyStore::default())).heartbeat(Duration::from_secs(1));
}
