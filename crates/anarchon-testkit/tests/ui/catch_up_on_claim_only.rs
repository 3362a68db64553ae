// `catch_up` is a job option only lease stores can honour.
use std::sync::Arc;
#[allow(unused_imports)]
use std::time::Duration;

use anarchon_core::{Schedule, Scheduler};
use anarchon_testkit::ClaimOnlyStore;

fn main() {
    let mut builder = Scheduler::builder(Arc::new(ClaimOnlyStore::default()));
    let _ = builder
        .job("job", Schedule::cron("* * * * *").unwrap())
        .unwrap()
        .catch_up(Duration::from_secs(60));
}
