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

/// Each factory is a namespace of its own: a run won in one is free in
/// the next, and every instance of one factory sees the same store.
#[tokio::test(start_paused = true)]
async fn factories_are_fresh() {
    use anarchon_core::{ClaimOutcome, ClaimStore, RunKey, Token};
    use anarchon_testkit::StoreFactory;
    use anarchon_testkit::claim::{claim_request, future_slot, job};
    async fn check<F: StoreFactory>(first: F, second: F) {
        let run = RunKey::new(job("fresh"), future_slot(&first, 0));
        let claim = |who: &str| claim_request(run.clone(), Token::generate(), who);
        let a = first.instance().await;
        assert!(matches!(
            a.claim(&claim("a")).await.unwrap(),
            ClaimOutcome::Won(_)
        ));
        let b = first.instance().await;
        assert!(
            !matches!(b.claim(&claim("b")).await.unwrap(), ClaimOutcome::Won(_)),
            "instances of one factory share its store"
        );
        let c = second.instance().await;
        assert!(
            matches!(c.claim(&claim("c")).await.unwrap(), ClaimOutcome::Won(_)),
            "a new factory starts empty"
        );
    }
    check(MemoryFactory::new(), MemoryFactory::new()).await;
    check(ClaimOnlyFactory::new(), ClaimOnlyFactory::new()).await;
}
