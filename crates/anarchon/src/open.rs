//! A store chosen by its URL: [`StoreUrl::parse`] reads a URL without
//! touching the store, [`open`] (or [`StoreUrl::open`]) connects.
//!
//! | scheme | store | kind | feature |
//! |---|---|---|---|
//! | `sqlite://` | SQLite file | lease | `sqlite` |
//! | `postgres://`, `postgresql://` | PostgreSQL | lease | `pg` |
//! | `redis://`, `rediss://` (TLS) | Redis / Valkey, `strategy=lease` (default) | lease | `redis`, `redis-tls` |
//! | `redis://…?strategy=stream-id\|idmp\|script` | Redis / Valkey | claim-only | `redis` |
//! | `amqp://`, `amqps://` (TLS) | RabbitMQ gate queues | claim-only | `amqp`, `amqp-tls` |
//! | `nats://`, `tls://`, `nats+tls://` (TLS) | NATS JetStream de-duplication | claim-only | `nats` |
//! | `nats-kv://`, `nats-kv+tls://` (TLS) | NATS JetStream KV leases | lease | `nats` |
//!
//! Each backend crate reads its own URLs (`SqliteOptions::from_url`,
//! `PgOptions::from_url`, `RedisOptions::from_url`, `AmqpOptions::from_url`,
//! `ClaimOptions::from_url`, `NatsLeaseOptions::from_kv_url`); this module
//! only picks the backend by scheme. Adding a backend means a `Backend`
//! variant here and its arms in this file, nothing in the programs that
//! call it.

use std::fmt;
use std::sync::Arc;

#[cfg(any(feature = "redis", feature = "amqp", feature = "nats"))]
use anarchon_core::Memory;
use anarchon_core::url::redact;
use anarchon_core::{BackendInfo, ClaimStore, JobName, LeaseStore};

use crate::open_error::OpenError;

/// Every scheme anarchon knows, whatever this build's features, for
/// messages.
const SCHEMES: &str = "sqlite://, postgres:// (or postgresql://), redis:// (or rediss://), amqp:// (or amqps://), nats:// (or tls://, nats+tls://: the claim store) and nats-kv:// (or nats-kv+tls://: the KV lease store); e.g. sqlite://anarchon.db, postgres://app@db/cron, redis://127.0.0.1:6379, amqp://guest:guest@127.0.0.1:5672/%2f, nats://127.0.0.1:4222";

/// Whether a store keeps a lease per run or only says who claimed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// A [`LeaseStore`]: backups, takeover, overlap, retries, catch-up and
    /// history all work.
    Lease,
    /// Only a [`ClaimStore`]: it tells which instance was first to claim a
    /// run, and the lease-only options are refused.
    ClaimOnly,
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreKind::Lease => "a lease store",
            StoreKind::ClaimOnly => "claim-only",
        })
    }
}

/// A store URL that has been read and checked, but not opened: what
/// `anarchon check` needs to validate a URL, and the crontab's options
/// against the kind of store it names, with no server running.
///
/// `Debug` and [`describe`](Self::describe) never show the password.
///
/// ```
/// # #[cfg(all(feature = "redis", feature = "amqp"))]
/// # fn main() -> Result<(), anarchon::OpenError> {
/// use anarchon::{StoreKind, StoreUrl};
///
/// let url = StoreUrl::parse("redis://:s3cret@redis.internal:6379?strategy=script&window_ms=600000")?;
/// assert_eq!(url.kind(), StoreKind::ClaimOnly);
/// assert_eq!(url.backend(), "redis-script");
/// assert!(!url.describe().contains("s3cret"));
///
/// // A misspelt parameter is refused, without the password.
/// let err = StoreUrl::parse("amqp://cron:s3cret@rabbit/%2f?slot_tll_ms=60000").unwrap_err();
/// assert!(err.to_string().contains("unknown parameter \"slot_tll_ms\""));
/// assert!(!err.to_string().contains("s3cret"));
/// # Ok(())
/// # }
/// # #[cfg(not(all(feature = "redis", feature = "amqp")))]
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct StoreUrl {
    backend: Backend,
}

/// A store named by a URL, not opened yet: one variant per backend, each
/// holding what its own crate read from the URL.
#[derive(Debug, Clone)]
enum Backend {
    #[cfg(feature = "sqlite")]
    Sqlite(anarchon_sqlite::SqliteOptions),
    #[cfg(feature = "pg")]
    Postgres(anarchon_pg::PgOptions),
    #[cfg(feature = "redis")]
    Redis {
        options: anarchon_redis::RedisOptions,
        strategy: anarchon_redis::Strategy,
    },
    #[cfg(feature = "amqp")]
    Amqp(anarchon_amqp::AmqpOptions),
    #[cfg(feature = "nats")]
    Nats {
        connection: anarchon_nats::NatsOptions,
        claims: anarchon_nats::ClaimOptions,
    },
    #[cfg(feature = "nats")]
    NatsKv {
        connection: anarchon_nats::NatsOptions,
        leases: anarchon_nats::NatsLeaseOptions,
    },
}

/// An [`OpenError::InvalidUrl`] about `url` (redacted), with the
/// backend's `reason` stripped of anything that could be the password.
#[cfg(any(feature = "pg", feature = "redis", feature = "amqp", feature = "nats"))]
fn invalid(url: &str, reason: &str) -> OpenError {
    OpenError::InvalidUrl {
        url: redact(url),
        reason: anarchon_core::url::unreadable_reason(url, reason),
    }
}

/// An [`OpenError::FeatureDisabled`] for `url`.
#[allow(dead_code)] // Not called when every feature is on.
fn disabled(url: &str, feature: &'static str) -> OpenError {
    OpenError::FeatureDisabled {
        url: redact(url),
        feature,
    }
}

impl StoreUrl {
    /// Reads a store URL without touching the store: the scheme picks the
    /// backend, whose crate reads the rest — host, port, credentials and
    /// every query parameter, refusing unknown ones and values out of
    /// range.
    ///
    /// # Errors
    ///
    /// [`OpenError::UnknownScheme`] for a scheme anarchon does not know;
    /// [`OpenError::FeatureDisabled`] for a backend (or its TLS) this
    /// build was compiled without; [`OpenError::InvalidUrl`] for a URL of a
    /// known scheme that is malformed or has an unknown or out-of-range
    /// parameter ([`OpenError::Sqlite`] for a `sqlite://` URL). No error
    /// contains the URL's password.
    pub fn parse(url: &str) -> Result<Self, OpenError> {
        if let Some(reason) = anarchon_core::url::ambiguous_user_info(url) {
            return Err(OpenError::InvalidUrl {
                url: redact(url),
                reason,
            });
        }
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let backend = match scheme {
            "sqlite" => {
                #[cfg(feature = "sqlite")]
                {
                    Backend::Sqlite(anarchon_sqlite::SqliteOptions::from_url(url)?)
                }
                #[cfg(not(feature = "sqlite"))]
                {
                    return Err(disabled(url, "sqlite"));
                }
            }
            "postgres" | "postgresql" => {
                #[cfg(feature = "pg")]
                {
                    Backend::Postgres(anarchon_pg::PgOptions::from_url(url).map_err(
                        |e| match e {
                            anarchon_pg::Error::InvalidUrl { reason, .. } => invalid(url, &reason),
                            other => invalid(url, &other.to_string()),
                        },
                    )?)
                }
                #[cfg(not(feature = "pg"))]
                {
                    return Err(disabled(url, "pg"));
                }
            }
            "redis" | "rediss" => {
                #[cfg(not(feature = "redis-tls"))]
                if scheme == "rediss" {
                    return Err(disabled(url, "redis-tls"));
                }
                #[cfg(feature = "redis")]
                {
                    let (options, strategy) =
                        anarchon_redis::RedisOptions::from_url(url).map_err(|e| match e {
                            anarchon_redis::Error::InvalidUrl { reason } => invalid(url, &reason),
                            other => invalid(url, &other.to_string()),
                        })?;
                    Backend::Redis { options, strategy }
                }
                #[cfg(not(feature = "redis"))]
                {
                    return Err(disabled(url, "redis"));
                }
            }
            "amqp" | "amqps" => {
                #[cfg(not(feature = "amqp-tls"))]
                if scheme == "amqps" {
                    return Err(disabled(url, "amqp-tls"));
                }
                #[cfg(feature = "amqp")]
                {
                    Backend::Amqp(anarchon_amqp::AmqpOptions::from_url(url).map_err(
                        |e| match e {
                            anarchon_amqp::Error::InvalidUrl { reason, .. } => {
                                invalid(url, &reason)
                            }
                            other => invalid(url, &other.to_string()),
                        },
                    )?)
                }
                #[cfg(not(feature = "amqp"))]
                {
                    return Err(disabled(url, "amqp"));
                }
            }
            "nats" | "tls" | "nats+tls" | "nats-kv" | "nats-kv+tls" => {
                #[cfg(feature = "nats")]
                {
                    let nats_invalid = |e| match e {
                        anarchon_nats::Error::InvalidUrl { reason, .. } => invalid(url, &reason),
                        other => invalid(url, &other.to_string()),
                    };
                    if anarchon_nats::LEASE_SCHEMES.contains(&scheme) {
                        let (connection, leases) =
                            anarchon_nats::NatsLeaseOptions::from_kv_url(url)
                                .map_err(nats_invalid)?;
                        Backend::NatsKv { connection, leases }
                    } else {
                        let (connection, claims) =
                            anarchon_nats::ClaimOptions::from_url(url).map_err(nats_invalid)?;
                        Backend::Nats { connection, claims }
                    }
                }
                #[cfg(not(feature = "nats"))]
                {
                    return Err(disabled(url, "nats"));
                }
            }
            _ => {
                return Err(OpenError::UnknownScheme {
                    url: redact(url),
                    schemes: SCHEMES,
                });
            }
        };
        Ok(Self { backend })
    }

    /// The name the opened store reports as its backend
    /// ([`BackendInfo::name`]): `sqlite`, `postgres`, `redis-lease`,
    /// `redis-stream-id`, `redis-idmp`, `redis-script`, `rabbitmq`, `nats`
    /// or `nats-kv`.
    pub fn backend(&self) -> &'static str {
        match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => anarchon_sqlite::BACKEND,
            #[cfg(feature = "pg")]
            Backend::Postgres(_) => anarchon_pg::BACKEND,
            #[cfg(feature = "redis")]
            Backend::Redis { strategy, .. } => strategy.backend(),
            #[cfg(feature = "amqp")]
            Backend::Amqp(_) => anarchon_amqp::BACKEND,
            #[cfg(feature = "nats")]
            Backend::Nats { .. } => anarchon_nats::BACKEND,
            #[cfg(feature = "nats")]
            Backend::NatsKv { .. } => anarchon_nats::LEASE_BACKEND,
        }
    }

    /// Whether the store keeps leases, as the URL alone tells.
    pub fn kind(&self) -> StoreKind {
        let lease = match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => true,
            #[cfg(feature = "pg")]
            Backend::Postgres(_) => true,
            #[cfg(feature = "redis")]
            Backend::Redis { strategy, .. } => strategy.is_lease(),
            #[cfg(feature = "amqp")]
            Backend::Amqp(_) => false,
            #[cfg(feature = "nats")]
            Backend::Nats { .. } => false,
            #[cfg(feature = "nats")]
            Backend::NatsKv { .. } => true,
        };
        if lease {
            StoreKind::Lease
        } else {
            StoreKind::ClaimOnly
        }
    }

    /// Whether the store keeps leases: `kind() == StoreKind::Lease`.
    pub fn is_lease(&self) -> bool {
        self.kind() == StoreKind::Lease
    }

    /// The name and memory the opened store will report, without opening
    /// it: for a claim-only store, how long it remembers a run (its window,
    /// TTL or duration), which the scheduler checks each job's `max_late`
    /// against; for a lease store [`Memory::UntilCollected`](anarchon_core::Memory::UntilCollected).
    pub fn info(&self) -> BackendInfo {
        let memory = match self.backend {
            #[cfg(feature = "redis")]
            Backend::Redis { strategy, .. } => strategy.memory(),
            #[cfg(feature = "amqp")]
            Backend::Amqp(ref options) => Memory::Window(options.slot_ttl()),
            #[cfg(feature = "nats")]
            Backend::Nats { ref claims, .. } => Memory::Window(claims.duplicate_window()),
            #[allow(unreachable_patterns)] // Every backend is a lease store in some builds.
            _ => anarchon_core::Memory::UntilCollected,
        };
        BackendInfo {
            name: self.backend(),
            memory,
        }
    }

    /// Whether the opened store can list its jobs ([`Opened::jobs`]):
    /// every lease store keeps a job index; a claim-only store keeps none.
    pub fn lists_jobs(&self) -> bool {
        self.is_lease()
    }

    /// A short description for messages — the server or file, the names
    /// the store uses, its kind — never the password.
    pub fn describe(&self) -> String {
        let kind = self.kind();
        match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(ref options) => format!(
                "SQLite file {} (tables {}_*, {kind})",
                options.path().display(),
                options.table_prefix()
            ),
            #[cfg(feature = "pg")]
            Backend::Postgres(ref options) => format!(
                "PostgreSQL {} (table {}, pool of {}, {kind})",
                options.server(),
                options.table(),
                options.pool_size()
            ),
            #[cfg(feature = "redis")]
            Backend::Redis {
                ref options,
                strategy,
            } => {
                let kind = match strategy.memory() {
                    Memory::Forever => "claim-only, remembers runs forever".to_owned(),
                    Memory::Window(d) => format!(
                        "claim-only, remembers runs for {}",
                        humantime::format_duration(d)
                    ),
                    Memory::UntilCollected => kind.to_string(),
                };
                format!(
                    "Redis {} (strategy {}, key prefix {}, {kind})",
                    options.server(),
                    strategy.as_str(),
                    options.key_prefix()
                )
            }
            #[cfg(feature = "amqp")]
            Backend::Amqp(ref options) => format!(
                "RabbitMQ {} (queue prefix {}, slot TTL {}, {kind})",
                options.server(),
                options.prefix(),
                humantime::format_duration(options.slot_ttl())
            ),
            #[cfg(feature = "nats")]
            Backend::Nats {
                ref connection,
                ref claims,
            } => format!(
                "NATS JetStream {} (stream {}, subjects {}, duplicate window {}, {kind})",
                connection.server(),
                claims.stream_name(),
                claims.subject_filter(),
                humantime::format_duration(claims.duplicate_window())
            ),
            #[cfg(feature = "nats")]
            Backend::NatsKv {
                ref connection,
                ref leases,
            } => format!(
                "NATS JetStream KV {} (bucket {}, {kind})",
                connection.server(),
                leases.bucket()
            ),
        }
    }

    /// Opens the store: creates and migrates a SQLite file or a PostgreSQL
    /// table if needed, connects to a server and checks it.
    ///
    /// # Errors
    ///
    /// The backend's own error ([`OpenError::Sqlite`],
    /// [`OpenError::Postgres`], …), which never contains the password.
    pub async fn open(&self) -> Result<Opened, OpenError> {
        Ok(match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(ref options) => {
                let store = Arc::new(anarchon_sqlite::SqliteStore::open(options.clone()).await?);
                Opened::lease(store.clone(), Handle::Sqlite(store))
            }
            #[cfg(feature = "pg")]
            Backend::Postgres(ref options) => {
                let store = Arc::new(anarchon_pg::PgStore::connect_with(options.clone()).await?);
                Opened::lease(store.clone(), Handle::Postgres(store))
            }
            #[cfg(feature = "redis")]
            Backend::Redis {
                ref options,
                strategy,
            } => {
                use anarchon_redis::Strategy;
                match strategy {
                    Strategy::StreamId => Opened::claim_only(Arc::new(
                        anarchon_redis::RedisStreamIdStore::connect(options).await?,
                    )),
                    Strategy::Idmp(duration) => Opened::claim_only(Arc::new(
                        anarchon_redis::RedisIdmpStore::connect(options, duration).await?,
                    )),
                    Strategy::Script(window) => Opened::claim_only(Arc::new(
                        anarchon_redis::RedisScriptStore::connect(options, window).await?,
                    )),
                    Strategy::Lease => Opened::lease(
                        Arc::new(anarchon_redis::RedisLeaseStore::connect(options).await?),
                        Handle::None,
                    ),
                }
            }
            #[cfg(feature = "amqp")]
            Backend::Amqp(ref options) => Opened::claim_only(Arc::new(
                anarchon_amqp::AmqpStore::connect(options.clone()).await?,
            )),
            #[cfg(feature = "nats")]
            Backend::Nats {
                ref connection,
                ref claims,
            } => Opened::claim_only(Arc::new(
                anarchon_nats::NatsClaimStore::connect(connection, claims.clone()).await?,
            )),
            #[cfg(feature = "nats")]
            Backend::NatsKv {
                ref connection,
                ref leases,
            } => Opened::lease(
                Arc::new(anarchon_nats::NatsLeaseStore::connect(connection, leases.clone()).await?),
                Handle::None,
            ),
        })
    }

    /// Opens a lease store to read what it holds (its history), creating,
    /// migrating and writing nothing: a SQLite file is opened read-only, a
    /// PostgreSQL table is neither created nor migrated.
    ///
    /// # Errors
    ///
    /// [`OpenError::ClaimOnly`] for a claim-only store;
    /// [`OpenError::Missing`] for a SQLite file (or its tables) or a
    /// PostgreSQL table that does not exist; [`OpenError::SchemaOutdated`]
    /// for a PostgreSQL table of an older schema; the backend's errors.
    pub async fn open_existing(&self) -> Result<Opened, OpenError> {
        match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(ref options) => {
                if !options.path().exists() {
                    return Err(OpenError::Missing {
                        what: format!("no database at {:?}", options.path()),
                    });
                }
                match anarchon_sqlite::SqliteStore::open_read_only(options.clone()).await {
                    Ok(store) => {
                        let store = Arc::new(store);
                        Ok(Opened::lease(store.clone(), Handle::Sqlite(store)))
                    }
                    Err(anarchon_sqlite::Error::SchemaOutdated { found: 0, .. }) => {
                        Err(OpenError::Missing {
                            what: format!(
                                "no anarchon tables in {:?} (prefix {:?})",
                                options.path(),
                                options.table_prefix()
                            ),
                        })
                    }
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "pg")]
            Backend::Postgres(ref options) => {
                match anarchon_pg::PgStore::connect_with(options.clone().with_migrate(false)).await
                {
                    Ok(store) => {
                        let store = Arc::new(store);
                        Ok(Opened::lease(store.clone(), Handle::Postgres(store)))
                    }
                    Err(anarchon_pg::Error::SchemaOutdated {
                        table, found: 0, ..
                    }) => Err(OpenError::Missing {
                        what: format!("no anarchon table {table:?} in {}", options.server()),
                    }),
                    Err(anarchon_pg::Error::SchemaOutdated {
                        table,
                        found,
                        latest,
                    }) => Err(OpenError::SchemaOutdated {
                        table,
                        found,
                        latest,
                    }),
                    Err(e) => Err(e.into()),
                }
            }
            #[allow(unreachable_patterns)]
            _ if !self.is_lease() => Err(OpenError::ClaimOnly {
                backend: self.backend(),
            }),
            #[allow(unreachable_patterns)]
            _ => self.open().await,
        }
    }
}

/// An open store, of either kind.
#[derive(Clone)]
pub enum Store {
    /// A lease store.
    Lease(Arc<dyn LeaseStore>),
    /// A claim-only store.
    ClaimOnly(Arc<dyn ClaimStore>),
}

impl Store {
    /// The store as the scheduler takes it, whatever its kind.
    pub fn claim_store(&self) -> Arc<dyn ClaimStore> {
        match self {
            Store::Lease(store) => store.clone(),
            Store::ClaimOnly(store) => store.clone(),
        }
    }

    /// The store as a lease store; `None` for a claim-only store.
    pub fn lease_store(&self) -> Option<Arc<dyn LeaseStore>> {
        match self {
            Store::Lease(store) => Some(store.clone()),
            Store::ClaimOnly(_) => None,
        }
    }

    /// Which kind of store it is.
    pub fn kind(&self) -> StoreKind {
        match self {
            Store::Lease(_) => StoreKind::Lease,
            Store::ClaimOnly(_) => StoreKind::ClaimOnly,
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let info = self.claim_store().info();
        f.debug_struct("Store")
            .field("kind", &self.kind())
            .field("backend", &info.name)
            .finish()
    }
}

/// What only some backends can do besides their store traits.
#[derive(Clone)]
enum Handle {
    None,
    #[cfg(feature = "sqlite")]
    Sqlite(Arc<anarchon_sqlite::SqliteStore>),
    #[cfg(feature = "pg")]
    Postgres(Arc<anarchon_pg::PgStore>),
}

/// A store opened from its URL ([`open`], [`StoreUrl::open`]): the store,
/// its kind, and how to close it.
#[derive(Clone)]
pub struct Opened {
    store: Store,
    handle: Handle,
}

impl Opened {
    #[allow(dead_code)] // Not called in a build without lease backends.
    fn lease(store: Arc<dyn LeaseStore>, handle: Handle) -> Self {
        Self {
            store: Store::Lease(store),
            handle,
        }
    }

    #[allow(dead_code)] // Not called in a build without claim-only backends.
    fn claim_only(store: Arc<dyn ClaimStore>) -> Self {
        Self {
            store: Store::ClaimOnly(store),
            handle: Handle::None,
        }
    }

    /// The store and its kind.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store and its kind, without the handle that
    /// [`close`](Self::close)s it: connection pools then close when the
    /// last reference is dropped.
    pub fn into_store(self) -> Store {
        self.store
    }

    /// The store as the scheduler takes it, whatever its kind.
    pub fn claim_store(&self) -> Arc<dyn ClaimStore> {
        self.store.claim_store()
    }

    /// The store as a lease store; `None` for a claim-only store.
    pub fn lease_store(&self) -> Option<Arc<dyn LeaseStore>> {
        self.store.lease_store()
    }

    /// Which kind of store it is.
    pub fn kind(&self) -> StoreKind {
        self.store.kind()
    }

    /// The jobs of a lease store's job index
    /// ([`LeaseStore::jobs`](anarchon_core::LeaseStore::jobs)); `None` for a
    /// claim-only store.
    ///
    /// # Errors
    ///
    /// The store's error reading them.
    pub async fn jobs(&self) -> Result<Option<Vec<JobName>>, OpenError> {
        match self.lease_store() {
            Some(store) => Ok(Some(store.jobs().await?)),
            None => Ok(None),
        }
    }

    /// Closes what needs closing (the connection pools of SQLite and
    /// PostgreSQL) and waits for it; the other stores close when dropped.
    pub async fn close(&self) {
        match &self.handle {
            #[cfg(feature = "sqlite")]
            Handle::Sqlite(store) => store.close().await,
            #[cfg(feature = "pg")]
            Handle::Postgres(store) => store.close().await,
            Handle::None => {}
        }
    }
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Opens the store `url` names: [`StoreUrl::parse`], then
/// [`StoreUrl::open`]. The same checks as the `anarchon` daemon's, on the
/// URL forms and parameters its guide documents.
///
/// # Errors
///
/// As [`StoreUrl::parse`] and [`StoreUrl::open`]. No error contains the
/// URL's password.
pub async fn open(url: &str) -> Result<Opened, OpenError> {
    StoreUrl::parse(url)?.open().await
}

#[cfg(test)]
mod tests;
