//! Conformance suites for anarchon backends, and what tests need around them.
//!
//! * [`claim_suite!`] and [`lease_suite!`] turn the checks in [`claim`],
//!   [`lease`] and [`scheduler`] into one `#[tokio::test]` each, given an
//!   expression that makes a fresh [`StoreFactory`] for every test.
//! * [`clock`]: a clock tokio's paused time drives, and skewed clocks.
//! * [`stores`]: a claim-only store, a fault-injecting wrapper, a resource
//!   that checks fences.
//! * [`proxy`]: a TCP proxy that injects latency, cuts, lost replies and
//!   blackholes between a store and a real server; [`fault_suite!`] runs
//!   the fault checks through it.
//! * With the `servers` feature (the project's own tests): `servers`,
//!   finding its Redis, PostgreSQL, RabbitMQ or NATS server; `restart`,
//!   restarting one; `tls`, a TLS terminator with its own certificate
//!   authority in front of a plain server, or that authority's certificate
//!   files for a server that speaks TLS itself.
//!
//! `docs/writing-a-backend.md` shows a third-party crate wiring the suites.
//!
//! ```text
//! // In a backend's tests/suite.rs:
//! anarchon_testkit::claim_suite!(MyFactory::new().await);
//! anarchon_testkit::lease_suite!(MyFactory::new().await);
//! ```
//!
//! The checks are public so third-party backends can run them. Their list
//! grows with each release; it is not covered by semver.

pub mod claim;
pub mod clock;
pub mod differential;
pub mod factory;
pub mod faults;
pub mod fleet;
pub mod history;
pub mod lease;
pub mod proxy;
#[cfg(feature = "servers")]
pub mod restart;
pub mod scheduler;
#[cfg(feature = "servers")]
pub mod servers;
pub mod stores;
#[cfg(feature = "servers")]
pub mod tls;

pub use crate::clock::{SkewedClock, TestClock};
pub use crate::factory::{
    ClaimOnlyFactory, MemoryFactory, ProxiedFactory, Proxyable, SLOW_LINK_LATENCY, StoreFactory,
    behind_a_slow_proxy,
};
pub use crate::proxy::FaultProxy;
pub use crate::stores::{ClaimOnlyStore, Faulty, FencedResource};
#[cfg(feature = "servers")]
pub use crate::tls::{CertificateFiles, Handshake, TlsTerminator, write_certificates};

/// A random lowercase name prefix for one test's keys, tables or streams,
/// so tests run in parallel against one server.
pub fn unique_prefix(stem: &str) -> String {
    let bits = anarchon_core::Token::generate().as_u128();
    format!("{stem}{:012x}", bits & 0xffff_ffff_ffff)
}
