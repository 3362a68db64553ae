// `catch_up` is a job option only lease stores can honour.
use std::time::Duration;

use anarchon_core::JobBuilder;
use anarchon_testkit::ClaimOnlyStore;

fn on_claim_only(job: JobBuilder<'_, ClaimOnlyStore>) {
    let _ = job.catch_up(Duration::from_secs(60));
}

fn main() {}
