//! The claim suite against a real NATS server: 8 instances with 8
//! connections.

mod common;

anarchon_testkit::claim_suite!(crate::common::NatsFactory::new().await);
