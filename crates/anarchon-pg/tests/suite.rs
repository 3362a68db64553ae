//! The conformance suites against a real PostgreSQL: every test has its own
//! table, every simulated instance its own connection pool.

mod common;

mod claims {
    anarchon_testkit::claim_suite!(crate::common::PgFactory::new().await);
}

mod leases {
    anarchon_testkit::lease_suite!(crate::common::PgFactory::new().await);
}
