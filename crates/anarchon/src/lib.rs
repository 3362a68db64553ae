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
//! ## A store from a URL
//!
//! [`open`] picks the backend by the URL's scheme and opens it with the
//! URL's parameters — the same URL forms, parameters and checks as the
//! `anarchon` daemon's `--store` (its guide, `docs/cli.md`, lists them).
//! A URL whose backend was left out of the build's features gets an error
//! that names the feature. The result says which kind of store it is:
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let default = format!("sqlite://{}", dir.path().join("cron.db").display());
//! use anarchon::{Schedule, Scheduler, Store};
//!
//! // e.g. CRON_STORE=postgres://app@db.internal/app?table=cron_runs
//! let url = std::env::var("CRON_STORE").unwrap_or(default);
//! let opened = anarchon::open(&url).await?;
//! let mut builder = Scheduler::builder(opened.claim_store());
//! builder
//!     .job("nightly-report", Schedule::cron_in("0 3 * * *", "Europe/Athens")?)?
//!     .run(|ctx| async move {
//!         println!("{} for {}", ctx.job(), ctx.slot());
//!         Ok::<_, std::io::Error>(())
//!     })?;
//! match opened.store() {
//!     Store::Lease(_) => println!("a lease store: backups take over a run whose runner died"),
//!     Store::ClaimOnly(_) => println!("claim-only: one winner per run, nothing more"),
//! }
//! let scheduler = builder.start()?;
//! // ... serve until asked to stop ...
//! scheduler.shutdown().await;
//! opened.close().await;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! [`StoreUrl::parse`] reads and checks a URL without connecting, and
//! tells the store's kind and name — enough to check a configuration's
//! options against the store before anything starts.
//!
//! ## A scheduler
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

// A build without any backend still compiles; its `match`es over the
// backends have no arms.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "pg",
        feature = "redis",
        feature = "amqp",
        feature = "nats"
    )),
    allow(unreachable_code, unused_variables)
)]
mod open;
mod open_error;

#[doc(inline)]
pub use anarchon_core::*;

pub use crate::open::{Opened, Store, StoreKind, StoreUrl, open};
pub use crate::open_error::OpenError;

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
