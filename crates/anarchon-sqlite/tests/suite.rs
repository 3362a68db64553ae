//! The conformance suites against SQLite: each test has its own database
//! file, each simulated instance its own connection pool on it.

mod common;

mod claims {
    anarchon_testkit::claim_suite!(crate::common::SqliteFactory::new());
}

mod leases {
    anarchon_testkit::lease_suite!(crate::common::SqliteFactory::new());
}
