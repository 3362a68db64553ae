//! Lease-only options do not compile against a claim-only store, and do
//! against a lease store.

#![allow(clippy::unwrap_used)]

#[test]
fn lease_only_options_need_a_lease_store() {
    let t = trybuild::TestCases::new();
    for option in [
        "lease",
        "heartbeat",
        "overlap",
        "max_attempts",
        "catch_up",
        "catch_up_limit",
        "catch_up_concurrency",
    ] {
        t.compile_fail(format!("tests/ui/{option}_on_claim_only.rs"));
    }
    t.pass("tests/ui/lease_options_on_lease_store.rs");
}
