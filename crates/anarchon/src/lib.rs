//! Leaderless distributed cron for Rust.
//!
//! Every instance of a service runs the same schedule; for each run — a job
//! and a slot — exactly one instance wins an atomic claim in a shared store.
//! On lease stores a backup takes over a run whose runner died, overlapping
//! runs can be skipped, and missed runs caught up.
//!
//! This crate re-exports [`anarchon_core`] and, behind one feature each, the
//! backends. See the repository's `README.md` and `docs/` for the guides.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use anarchon::{MemoryStore, Overlap, Schedule, Scheduler};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new());
//! let mut builder = Scheduler::builder(store)
//!     .lease(Duration::from_secs(30))
//!     .heartbeat(Duration::from_secs(10));
//! builder
//!     .job("nightly-report", Schedule::cron_in("0 3 * * *", "Europe/Athens")?)?
//!     .overlap(Overlap::Skip)
//!     .max_attempts(2)
//!     .run(|ctx| async move {
//!         println!("{} for {} (fence {:?})", ctx.job(), ctx.slot(), ctx.fence());
//!         Ok::<_, std::io::Error>(())
//!     })?;
//! let scheduler = builder.start()?;
//! // ... serve until asked to stop ...
//! scheduler.shutdown().await;
//! # Ok(())
//! # }
//! ```

#[doc(inline)]
pub use anarchon_core::*;

/// The SQLite lease backend.
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use anarchon_sqlite as sqlite;

/// The PostgreSQL lease backend.
#[cfg(feature = "pg")]
#[doc(inline)]
pub use anarchon_pg as pg;

/// The Redis / Valkey backend.
#[cfg(feature = "redis")]
#[doc(inline)]
pub use anarchon_redis as redis;

/// The RabbitMQ claim-only backend.
#[cfg(feature = "amqp")]
#[doc(inline)]
pub use anarchon_amqp as amqp;

/// The NATS backends.
#[cfg(feature = "nats")]
#[doc(inline)]
pub use anarchon_nats as nats;
