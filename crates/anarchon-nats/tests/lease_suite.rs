//! The claim and lease suites against a real NATS server on the KV lease
//! store: every simulated instance has its own connection, every test its
//! own bucket.

mod common;

mod kv_claims {
    anarchon_testkit::claim_suite!(crate::common::NatsLeaseFactory::new().await);
}

mod kv_leases {
    anarchon_testkit::lease_suite!(crate::common::NatsLeaseFactory::new().await);
}
