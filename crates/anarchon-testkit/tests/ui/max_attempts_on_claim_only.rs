// `max_attempts` is a job option only lease stores can honour.
use anarchon_core::JobBuilder;
use anarchon_testkit::ClaimOnlyStore;

fn on_claim_only(job: JobBuilder<'_, ClaimOnlyStore>) {
    let _ = job.max_attempts(2);
}

fn main() {}
