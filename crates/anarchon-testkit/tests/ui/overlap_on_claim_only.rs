// `overlap` is a job option only lease stores can honour.
use anarchon_core::{JobBuilder, Overlap};
use anarchon_testkit::ClaimOnlyStore;

fn on_claim_only(job: JobBuilder<'_, ClaimOnlyStore>) {
    let _ = job.overlap(Overlap::Skip);
}

fn main() {}
