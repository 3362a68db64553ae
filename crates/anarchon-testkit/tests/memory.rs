//! `MemoryStore` and the claim-only test store through the conformance suites.

#![allow(clippy::unwrap_used)]

use anarchon_testkit::{ClaimOnlyFactory, MemoryFactory};

mod memory_claims {
    anarchon_testkit::claim_suite!(
        anarchon_testkit::MemoryFactory::new(),
        tokio::test(start_paused = true)
    );
}

mod memory_leases {
    anarchon_testkit::lease_suite!(
        anarchon_testkit::MemoryFactory::new(),
        tokio::test(start_paused = true)
    );
}

mod claim_only {
    anarchon_testkit::claim_suite!(
        anarchon_testkit::ClaimOnlyFactory::new(),
        tokio::test(start_paused = true)
    );
}

#[tokio::test(start_paused = true)]
async fn dst_days_fire_each_local_slot_once() {
    anarchon_testkit::scheduler::dst_days_fire_each_local_slot_once(|clock| {
        std::sync::Arc::new(anarchon_core::MemoryStore::with_clock(clock))
    })
    .await;
}

#[test]
fn factories_are_fresh() {
    let _ = (MemoryFactory::new(), ClaimOnlyFactory::new());
}
