// `catch_up_limit` bounds catch-up, which only lease stores offer.
use anarchon_core::JobBuilder;
use anarchon_testkit::ClaimOnlyStore;

fn on_claim_only(job: JobBuilder<'_, ClaimOnlyStore>) {
    let _ = job.catch_up_limit(5);
}

fn main() {}
