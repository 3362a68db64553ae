//! Choosing a store from a URL, and opening it.
//!
//! Every scheme is read here without touching the store, so `anarchon
//! check` can validate a URL's form — and the crontab's options against the
//! kind of store it names — with no server running:
//!
//! | scheme | store | kind |
//! |---|---|---|
//! | `sqlite://` | SQLite file | lease |
//! | `postgres://`, `postgresql://` | PostgreSQL | lease |
//! | `redis://`, `rediss://` (TLS) | Redis / Valkey, `strategy=lease` (default) | lease |
//! | `redis://…?strategy=stream-id\|idmp\|script` | Redis / Valkey | claim-only |
//! | `amqp://`, `amqps://` (TLS) | RabbitMQ gate queues | claim-only |
//! | `nats://`, `tls://` or `nats+tls://` (TLS) | NATS JetStream de-duplication | claim-only |
//! | `nats-kv://`, `nats-kv+tls://` (TLS) | NATS JetStream key-value leases | lease |
//!
//! Every TLS scheme takes `tls_ca_file=<path>` to trust a private
//! certificate authority instead of the system's.
//!
//! Whatever the URL names, the daemon hands the opened store to the core as
//! an `Arc<dyn ClaimStore>`; the core decides from the store itself whether
//! lease-only options can be honoured.

use std::sync::Arc;
use std::time::Duration;

use anarchon::amqp::{AmqpOptions, AmqpStore};
use anarchon::nats::{ClaimOptions, NatsClaimStore, NatsLeaseOptions, NatsLeaseStore, NatsOptions};
use anarchon::pg::{PgOptions, PgStore, TableName};
use anarchon::redis::{
    EvictionCheck, RedisIdmpStore, RedisLeaseStore, RedisOptions, RedisScriptStore,
    RedisStreamIdStore,
};
use anarchon::sqlite::{SqliteOptions, SqliteStore};
use anarchon::{
    BackendInfo, ClaimOutcome, ClaimRequest, ClaimStore, LeaseStore, Memory, MemoryStore,
    StoreError,
};

use crate::error::Error;

/// The schemes this build opens, for messages.
pub(crate) const SCHEMES: &str = "sqlite://, postgres:// (or postgresql://), redis:// (or rediss://), amqp:// (or amqps://), nats:// (or tls://, nats+tls://: the claim store) and nats-kv:// (or nats-kv+tls://: the KV lease store)";

/// The backend names the Redis strategies report (`BackendInfo::name`).
const REDIS_LEASE: &str = "redis-lease";
const REDIS_STREAM_ID: &str = "redis-stream-id";
const REDIS_IDMP: &str = "redis-idmp";
const REDIS_SCRIPT: &str = "redis-script";

/// Query parameters of a PostgreSQL URL that sqlx reads itself; they are
/// passed on. (`options[NAME]` is passed on too.)
const SQLX_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
];

/// The query parameters anarchon reads from a PostgreSQL URL.
const PG_PARAMETERS: &str =
    "table, pool_size, connect_timeout_ms, statement_timeout_ms, migrate, application_name";

/// The query parameters anarchon reads from a Redis URL.
const REDIS_PARAMETERS: &str = "strategy, prefix, window_ms, duration_ms, timeout_ms, connect_timeout_ms, eviction, tls_ca_file";

/// How a Redis URL's store claims runs (its `strategy` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisStrategy {
    /// `lease` (the default): a lease store.
    Lease,
    /// `stream-id`: claim-only, remembers runs forever.
    StreamId,
    /// `idmp` (Redis 8.6+): claim-only, remembers runs for the duration.
    Idmp(Duration),
    /// `script`: claim-only, remembers runs for the window.
    Script(Duration),
}

impl RedisStrategy {
    /// The backend's name, as the store reports it.
    fn backend(self) -> &'static str {
        match self {
            RedisStrategy::Lease => REDIS_LEASE,
            RedisStrategy::StreamId => REDIS_STREAM_ID,
            RedisStrategy::Idmp(_) => REDIS_IDMP,
            RedisStrategy::Script(_) => REDIS_SCRIPT,
        }
    }

    /// The strategy as written in the URL.
    fn as_str(self) -> &'static str {
        match self {
            RedisStrategy::Lease => "lease",
            RedisStrategy::StreamId => "stream-id",
            RedisStrategy::Idmp(_) => "idmp",
            RedisStrategy::Script(_) => "script",
        }
    }

    /// How long the store remembers a run.
    fn memory(self) -> Memory {
        match self {
            RedisStrategy::Lease => Memory::UntilCollected,
            RedisStrategy::StreamId => Memory::Forever,
            RedisStrategy::Idmp(d) | RedisStrategy::Script(d) => Memory::Window(d),
        }
    }
}

/// A store named by a URL, not opened yet.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// `sqlite://path`.
    Sqlite(SqliteOptions),
    /// `postgres://…` / `postgresql://…`.
    Postgres {
        /// What the store gets (its URL stripped of anarchon's parameters).
        options: PgOptions,
        /// `host:port/database`, for messages.
        server: String,
    },
    /// `redis://…` / `rediss://…`.
    Redis {
        /// What the store gets (its URL stripped of anarchon's parameters).
        options: RedisOptions,
        /// Which store type.
        strategy: RedisStrategy,
        /// `host:port/db`, for messages.
        server: String,
    },
    /// `amqp://…` / `amqps://…`.
    Amqp(AmqpOptions),
    /// `nats://…`: the JetStream claim store.
    Nats {
        /// How to connect.
        connection: NatsOptions,
        /// The stream and its window.
        claims: ClaimOptions,
    },
    /// `nats-kv://…`: the JetStream KV lease store.
    NatsKv {
        /// How to connect (the URL with `nats://`).
        connection: NatsOptions,
        /// The bucket.
        leases: NatsLeaseOptions,
    },
}

/// An open store.
#[derive(Clone)]
pub(crate) enum Opened {
    /// A SQLite file.
    Sqlite(Arc<SqliteStore>),
    /// A PostgreSQL table.
    Postgres(Arc<PgStore>),
    /// A Redis lease store.
    RedisLease(Arc<RedisLeaseStore>),
    /// A NATS KV lease store.
    NatsLease(Arc<NatsLeaseStore>),
    /// A claim-only store (Redis `stream-id`, `idmp`, `script`, RabbitMQ,
    /// NATS).
    ClaimOnly(Arc<dyn ClaimStore>),
}

impl Backend {
    /// Reads a store URL without touching the store.
    ///
    /// # Errors
    ///
    /// [`Error::StoreUrl`] for a scheme this build does not know;
    /// [`Error::InvalidStoreUrl`] for a URL of a known scheme that is
    /// malformed or has an unknown or out-of-range parameter. Neither
    /// contains the URL's password.
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let invalid = |reason: String| Error::InvalidStoreUrl {
            url: redact(url),
            reason: anarchon::url::unreadable_reason(url, &reason),
        };
        if let Some(hint) = anarchon::url::ambiguous_user_info(url) {
            return Err(Error::InvalidStoreUrl {
                url: redact(url),
                reason: hint,
            });
        }
        match scheme {
            "sqlite" => Ok(Backend::Sqlite(SqliteOptions::from_url(url)?)),
            "postgres" | "postgresql" => parse_postgres(url).map_err(invalid),
            "redis" | "rediss" => parse_redis(url).map_err(invalid),
            "amqp" | "amqps" => {
                let options = AmqpOptions::from_url(url).map_err(|e| {
                    invalid(match e {
                        anarchon::amqp::Error::InvalidUrl { reason, .. } => reason,
                        other => other.to_string(),
                    })
                })?;
                Ok(Backend::Amqp(options))
            }
            "nats" | "tls" | "nats+tls" => {
                let (connection, claims) = ClaimOptions::from_url(url).map_err(|e| {
                    invalid(match e {
                        anarchon::nats::Error::InvalidUrl { reason, .. } => reason,
                        other => other.to_string(),
                    })
                })?;
                Ok(Backend::Nats { connection, claims })
            }
            "nats-kv" | "nats-kv+tls" => {
                let nats_url = url.replacen("nats-kv+tls://", "tls://", 1).replacen(
                    "nats-kv://",
                    "nats://",
                    1,
                );
                let (connection, leases) = NatsLeaseOptions::from_url(&nats_url).map_err(|e| {
                    invalid(match e {
                        anarchon::nats::Error::InvalidUrl { reason, .. } => reason,
                        other => other.to_string(),
                    })
                })?;
                Ok(Backend::NatsKv { connection, leases })
            }
            _ => Err(Error::StoreUrl {
                url: redact(url),
                reason: format!(
                    "this build of anarchon knows the schemes {SCHEMES} (e.g. sqlite://anarchon.db, postgres://app@db/cron, redis://127.0.0.1:6379, amqp://guest:guest@127.0.0.1:5672/%2f, nats://127.0.0.1:4222)"
                ),
            }),
        }
    }

    /// The name the store reports as its backend (`sqlite`, `postgres`,
    /// `redis-lease`, `redis-stream-id`, …, `rabbitmq`, `nats`): the name
    /// the core's errors use.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => anarchon::sqlite::BACKEND,
            Backend::Postgres { .. } => "postgres",
            Backend::Redis { strategy, .. } => strategy.backend(),
            Backend::Amqp(_) => anarchon::amqp::BACKEND,
            Backend::Nats { .. } => anarchon::nats::BACKEND,
            Backend::NatsKv { .. } => anarchon::nats::LEASE_BACKEND,
        }
    }

    /// Whether the store keeps leases (and so history), as the URL alone
    /// tells.
    pub(crate) fn is_lease(&self) -> bool {
        match self {
            Backend::Sqlite(_) | Backend::Postgres { .. } | Backend::NatsKv { .. } => true,
            Backend::Redis { strategy, .. } => *strategy == RedisStrategy::Lease,
            Backend::Amqp(_) | Backend::Nats { .. } => false,
        }
    }

    /// Opens the store: creates and migrates a SQLite file or a PostgreSQL
    /// table, connects to a server and checks it.
    ///
    /// # Errors
    ///
    /// The backend's own error, which never contains the password.
    pub(crate) async fn open(&self) -> Result<Opened, Error> {
        Ok(match self {
            Backend::Sqlite(options) => {
                Opened::Sqlite(Arc::new(SqliteStore::open(options.clone()).await?))
            }
            Backend::Postgres { options, .. } => {
                Opened::Postgres(Arc::new(PgStore::connect_with(options.clone()).await?))
            }
            Backend::Redis {
                options, strategy, ..
            } => match *strategy {
                RedisStrategy::Lease => {
                    Opened::RedisLease(Arc::new(RedisLeaseStore::connect(options).await?))
                }
                RedisStrategy::StreamId => {
                    Opened::ClaimOnly(Arc::new(RedisStreamIdStore::connect(options).await?))
                }
                RedisStrategy::Idmp(duration) => {
                    Opened::ClaimOnly(Arc::new(RedisIdmpStore::connect(options, duration).await?))
                }
                RedisStrategy::Script(window) => {
                    Opened::ClaimOnly(Arc::new(RedisScriptStore::connect(options, window).await?))
                }
            },
            Backend::Amqp(options) => {
                Opened::ClaimOnly(Arc::new(AmqpStore::connect(options.clone()).await?))
            }
            Backend::Nats { connection, claims } => Opened::ClaimOnly(Arc::new(
                NatsClaimStore::connect(connection, claims.clone()).await?,
            )),
            Backend::NatsKv { connection, leases } => Opened::NatsLease(Arc::new(
                NatsLeaseStore::connect(connection, leases.clone()).await?,
            )),
        })
    }

    /// Opens a lease store to read its history, creating nothing: a
    /// PostgreSQL table is not created or migrated.
    ///
    /// # Errors
    ///
    /// [`Error::NoHistory`] for a claim-only store; [`Error::NoDatabase`]
    /// for a SQLite file or a PostgreSQL table that does not exist; the
    /// backend's errors.
    pub(crate) async fn open_for_history(&self) -> Result<Opened, Error> {
        match self {
            Backend::Sqlite(options) if !options.get_path().exists() => Err(Error::NoDatabase {
                what: format!("no database at {:?}", options.get_path()),
            }),
            // Read only: `history` creates, migrates and writes nothing.
            Backend::Sqlite(options) => match SqliteStore::open_read_only(options.clone()).await {
                Ok(store) => Ok(Opened::Sqlite(Arc::new(store))),
                Err(anarchon::sqlite::Error::SchemaOutdated { found: 0, .. }) => {
                    Err(Error::NoDatabase {
                        what: format!(
                            "no anarchon tables in {:?} (prefix {:?})",
                            options.get_path(),
                            options.get_table_prefix()
                        ),
                    })
                }
                Err(e) => Err(e.into()),
            },
            Backend::Postgres { options, server } => {
                let opened = PgStore::connect_with(options.clone().migrate(false)).await;
                match opened {
                    Ok(store) => Ok(Opened::Postgres(Arc::new(store))),
                    Err(anarchon::pg::PgError::SchemaOutdated {
                        table, found: 0, ..
                    }) => Err(Error::NoDatabase {
                        what: format!("no anarchon table {table:?} in {server}"),
                    }),
                    Err(anarchon::pg::PgError::SchemaOutdated {
                        table,
                        found,
                        latest,
                    }) => Err(Error::SchemaOutdated {
                        table,
                        found,
                        latest,
                    }),
                    Err(e) => Err(e.into()),
                }
            }
            _ if !self.is_lease() => Err(Error::NoHistory {
                backend: self.name(),
            }),
            _ => self.open().await,
        }
    }

    /// A store of the same kind (lease or claim-only), name and memory that
    /// touches nothing, so the core can check the crontab's options against
    /// this backend before it is opened (and `anarchon check` without
    /// opening it).
    pub(crate) fn stand_in(&self) -> Arc<dyn ClaimStore> {
        let claim_only = |memory| -> Arc<dyn ClaimStore> {
            Arc::new(ClaimOnlyStandIn {
                info: BackendInfo {
                    name: self.name(),
                    memory,
                },
            })
        };
        match self {
            Backend::Sqlite(_) | Backend::Postgres { .. } | Backend::NatsKv { .. } => {
                Arc::new(MemoryStore::new())
            }
            Backend::Redis { strategy, .. } => match strategy {
                RedisStrategy::Lease => Arc::new(MemoryStore::new()),
                other => claim_only(other.memory()),
            },
            Backend::Amqp(options) => claim_only(Memory::Window(options.get_slot_ttl())),
            Backend::Nats { claims, .. } => {
                claim_only(Memory::Window(claims.get_duplicate_window()))
            }
        }
    }

    /// A short description for messages: never the password.
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Sqlite(options) => format!(
                "SQLite file {} (tables {}_*, a lease store)",
                options.get_path().display(),
                options.get_table_prefix()
            ),
            Backend::Postgres { options, server } => format!(
                "PostgreSQL {server} (table {}, pool of {}, a lease store)",
                options.get_table(),
                options.get_pool_size()
            ),
            Backend::Redis {
                options,
                strategy,
                server,
            } => {
                let kind = match strategy {
                    RedisStrategy::Lease => "a lease store".to_owned(),
                    RedisStrategy::StreamId => "claim-only, remembers runs forever".to_owned(),
                    RedisStrategy::Idmp(d) => format!(
                        "claim-only, remembers runs for {}",
                        humantime::format_duration(*d)
                    ),
                    RedisStrategy::Script(d) => format!(
                        "claim-only, remembers runs for {}",
                        humantime::format_duration(*d)
                    ),
                };
                format!(
                    "Redis {server} (strategy {}, key prefix {}, {kind})",
                    strategy.as_str(),
                    options.key_prefix()
                )
            }
            Backend::Amqp(options) => format!(
                "RabbitMQ {} (queue prefix {}, slot TTL {}, claim-only)",
                server_of(&options.redacted_url()),
                options.get_prefix(),
                humantime::format_duration(options.get_slot_ttl())
            ),
            Backend::Nats { connection, claims } => format!(
                "NATS JetStream {} (stream {}, subjects {}, duplicate window {}, claim-only)",
                server_of(&connection.redacted_url()),
                claims.stream_name(),
                claims.subject_filter(),
                humantime::format_duration(claims.get_duplicate_window())
            ),
            Backend::NatsKv { connection, leases } => format!(
                "NATS JetStream KV {} (bucket {}, a lease store)",
                server_of(&connection.redacted_url()),
                leases.get_bucket()
            ),
        }
    }
}

impl Opened {
    /// The store as the scheduler takes it.
    pub(crate) fn claim_store(&self) -> Arc<dyn ClaimStore> {
        match self {
            Opened::Sqlite(store) => store.clone(),
            Opened::Postgres(store) => store.clone(),
            Opened::RedisLease(store) => store.clone(),
            Opened::NatsLease(store) => store.clone(),
            Opened::ClaimOnly(store) => store.clone(),
        }
    }

    /// The store as a lease store, for its history; `None` for claim-only
    /// stores.
    pub(crate) fn lease_store(&self) -> Option<Arc<dyn LeaseStore>> {
        self.claim_store().as_lease_store()
    }

    /// Closes what needs closing (connection pools); the others close when
    /// dropped.
    pub(crate) async fn close(&self) {
        match self {
            Opened::Sqlite(store) => store.close().await,
            Opened::Postgres(store) => store.close().await,
            Opened::RedisLease(_) | Opened::NatsLease(_) | Opened::ClaimOnly(_) => {}
        }
    }
}

/// A claim-only store that touches nothing: reports the name and memory of
/// the store a URL names. It is only built on, never started.
#[derive(Debug)]
struct ClaimOnlyStandIn {
    info: BackendInfo,
}

#[anarchon::async_trait]
impl ClaimStore for ClaimOnlyStandIn {
    async fn claim(&self, _req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Err(StoreError::invalid(
            self.info.name,
            "a stand-in for checking options claims nothing",
        ))
    }

    fn info(&self) -> BackendInfo {
        self.info
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

/// A URL taken apart at its query: the part before `?`, the `key=value`
/// pairs in order, and a `#fragment` (kept for the client).
struct Split<'a> {
    base: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
    fragment: Option<&'a str>,
}

impl<'a> Split<'a> {
    fn new(url: &'a str) -> Self {
        let (rest, fragment) = match url.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (url, None),
        };
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .collect();
        Self {
            base,
            pairs,
            fragment,
        }
    }

    /// The URL again with only the `kept` pairs.
    fn rebuild(&self, kept: &[(&str, &str)]) -> String {
        let mut url = self.base.to_owned();
        for (i, (key, value)) in kept.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(key);
            url.push('=');
            url.push_str(value);
        }
        if let Some(fragment) = self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }
}

/// A host and port read from a URL's authority.
struct Authority<'a> {
    host: &'a str,
    port: Option<u16>,
}

/// Reads `scheme://[userinfo@]host[:port]` up to the path; `host` may be a
/// bracketed IPv6 address. Never mentions the user info in its errors.
fn authority(base: &str) -> Result<(Authority<'_>, &str), String> {
    let rest = base
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or("it must start with scheme://")?;
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (_, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address is missing its closing ']'")?;
        let host = &host_port[..host_port.len() - after.len()];
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or("junk after the IPv6 address")?,
                ),
            ),
        }
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    let port = match port {
        None | Some("") => None,
        Some(port) => Some(
            port.parse::<u16>()
                .map_err(|_| format!("the port {port:?} is not a number from 0 to 65535"))?,
        ),
    };
    if host.contains(['?', '#', ' ']) {
        return Err(format!("the host {host:?} is not a host name"));
    }
    Ok((Authority { host, port }, path))
}

/// `host:port/path` of a redacted URL, for messages.
fn server_of(redacted: &str) -> String {
    let rest = redacted.split_once("://").map_or(redacted, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    rest.rsplit_once('@')
        .map_or(rest, |(_, host)| host)
        .to_owned()
}

/// A whole number of milliseconds, for parameter `key`.
fn millis(key: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("{key} must be a whole number of milliseconds, not {value:?}"))
}

/// A duration longer than zero, in milliseconds.
fn positive_millis(key: &str, value: &str) -> Result<Duration, String> {
    let d = millis(key, value)?;
    if d.is_zero() {
        return Err(format!("{key} must be longer than zero"));
    }
    Ok(d)
}

/// Reads a PostgreSQL URL: anarchon's parameters become [`PgOptions`] and
/// are taken out of the URL; sqlx's own parameters stay in it. (sqlx would
/// not refuse an unknown parameter — it logs a warning and ignores it — so
/// an unknown one is refused here, where a misspelt `tabel=` would
/// otherwise be silently ignored.)
fn parse_postgres(url: &str) -> Result<Backend, String> {
    let split = Split::new(url);
    let (auth, path) = authority(split.base)?;
    let mut kept = Vec::new();
    let mut table = None;
    let mut pool_size = None;
    let mut connect_timeout = None;
    let mut statement_timeout = None;
    let mut migrate = None;
    let mut application_name = None;
    let mut host_param = None;
    let mut database = path.trim_start_matches('/').to_owned();
    for &(key, value) in &split.pairs {
        match key {
            "table" => table = Some(TableName::new(value).map_err(|e| e.to_string())?),
            "pool_size" => {
                let n = value
                    .parse::<u32>()
                    .map_err(|_| format!("pool_size must be a whole number, not {value:?}"))?;
                if n == 0 {
                    return Err("pool_size must be at least 1".into());
                }
                pool_size = Some(n);
            }
            "connect_timeout_ms" => connect_timeout = Some(positive_millis(key, value)?),
            "statement_timeout_ms" => {
                let d = millis(key, value)?;
                statement_timeout = Some((!d.is_zero()).then_some(d));
            }
            "migrate" => {
                migrate = Some(match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(format!("migrate must be true or false, not {value:?}")),
                });
            }
            "application_name" => application_name = Some(value),
            k if SQLX_PARAMETERS.contains(&k) || k.starts_with("options[") => {
                match k {
                    "host" | "hostaddr" => host_param = Some(value),
                    "dbname" => value.clone_into(&mut database),
                    _ => {}
                }
                kept.push((key, value));
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?}; anarchon reads {PG_PARAMETERS}; the PostgreSQL client reads {}, options[NAME]",
                    SQLX_PARAMETERS.join(", ")
                ));
            }
        }
    }
    let host = match (auth.host, host_param) {
        ("", None) => return Err("it names no host (postgres://user@host:5432/database)".into()),
        (host, None) | ("", Some(host)) => host,
        (_, Some(host)) => host,
    };
    let mut options = PgOptions::new(split.rebuild(&kept));
    if let Some(table) = table {
        options = options.table_name(table);
    }
    if let Some(n) = pool_size {
        options = options.pool_size(n);
    }
    if let Some(d) = connect_timeout {
        options = options.connect_timeout(d);
    }
    if let Some(d) = statement_timeout {
        options = options.statement_timeout(d);
    }
    if let Some(migrate) = migrate {
        options = options.migrate(migrate);
    }
    if let Some(name) = application_name {
        options = options.application_name(name);
    }
    let port = auth.port.unwrap_or(5432);
    Ok(Backend::Postgres {
        options,
        server: format!("{host}:{port}/{database}"),
    })
}

/// Reads a Redis URL: `strategy` and anarchon's other parameters become
/// [`RedisOptions`] and the store type, and are taken out of the URL;
/// `protocol`, which the Redis client reads, stays in it.
fn parse_redis(url: &str) -> Result<Backend, String> {
    let split = Split::new(url);
    let (auth, path) = authority(split.base)?;
    if auth.host.is_empty() {
        return Err("it names no host (redis://[user:password@]host:6379[/db])".into());
    }
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!("the database {db:?} is not a number"));
    }
    let mut kept = Vec::new();
    let mut strategy = "lease";
    let mut window = None;
    let mut duration = None;
    let mut connect_timeout = None;
    let mut response_timeout = None;
    let mut eviction = None;
    let mut prefix = None;
    let mut ca_file = None;
    for &(key, value) in &split.pairs {
        match key {
            "strategy" => strategy = value,
            "tls_ca_file" => ca_file = Some(percent_decoded(key, value)?),
            "prefix" => prefix = Some(value),
            "window_ms" => window = Some(millis(key, value)?),
            "duration_ms" => duration = Some(millis(key, value)?),
            "timeout_ms" => response_timeout = Some(positive_millis(key, value)?),
            "connect_timeout_ms" => connect_timeout = Some(positive_millis(key, value)?),
            "eviction" => {
                eviction = Some(match value {
                    "warn" => EvictionCheck::Warn,
                    "refuse" => EvictionCheck::Refuse,
                    _ => return Err(format!("eviction must be warn or refuse, not {value:?}")),
                });
            }
            "protocol" => kept.push((key, value)),
            other => {
                return Err(format!(
                    "unknown parameter {other:?}; anarchon reads {REDIS_PARAMETERS}; the Redis client reads protocol"
                ));
            }
        }
    }
    let strategy = match strategy {
        "lease" => RedisStrategy::Lease,
        "stream-id" => RedisStrategy::StreamId,
        "idmp" => {
            let d = duration.unwrap_or(RedisIdmpStore::DEFAULT_DURATION);
            if d.subsec_nanos() != 0 {
                return Err(format!(
                    "duration_ms must be whole seconds (Redis keeps IDMP ids for whole seconds), not {}",
                    d.as_millis()
                ));
            }
            if d < anarchon::redis::MIN_MEMORY || d > RedisIdmpStore::MAX_DURATION {
                return Err(format!(
                    "duration_ms must be from {} to {}",
                    anarchon::redis::MIN_MEMORY.as_millis(),
                    RedisIdmpStore::MAX_DURATION.as_millis()
                ));
            }
            RedisStrategy::Idmp(d)
        }
        "script" => {
            let w = window.unwrap_or(RedisScriptStore::DEFAULT_WINDOW);
            if w < anarchon::redis::MIN_MEMORY {
                return Err(format!(
                    "window_ms must be at least {}",
                    anarchon::redis::MIN_MEMORY.as_millis()
                ));
            }
            RedisStrategy::Script(w)
        }
        other => {
            return Err(format!(
                "unknown strategy {other:?}; use lease (the default), stream-id, idmp or script"
            ));
        }
    };
    if window.is_some() && !matches!(strategy, RedisStrategy::Script(_)) {
        return Err("window_ms applies to strategy=script only".into());
    }
    if duration.is_some() && !matches!(strategy, RedisStrategy::Idmp(_)) {
        return Err("duration_ms applies to strategy=idmp only".into());
    }
    let client_url = split.rebuild(&kept);
    check_with_redis_client(&client_url)?;
    let mut options = RedisOptions::new(client_url);
    if let Some(d) = connect_timeout {
        options = options.connect_timeout(d);
    }
    if let Some(d) = response_timeout {
        options = options.response_timeout(d);
    }
    if let Some(check) = eviction {
        options = options.eviction_check(check);
    }
    if let Some(prefix) = prefix {
        options = options.prefix(prefix).map_err(|e| e.to_string())?;
    }
    if let Some(path) = ca_file {
        if !split.base.starts_with("rediss://") && !split.base.starts_with("valkeys://") {
            return Err("tls_ca_file needs a rediss:// URL (TLS)".into());
        }
        options = options.tls_ca_file(path);
    }
    let port = auth.port.unwrap_or(6379);
    let db = if db.is_empty() { "0" } else { db };
    Ok(Backend::Redis {
        options,
        strategy,
        server: format!("{}:{port}/{db}", auth.host),
    })
}

/// Reads `url` with the Redis client's own parser, which connects to
/// nothing: what it refuses (a TLS URL in a build without TLS, a bad
/// database number, an unknown `protocol`) is refused before the daemon
/// starts. Its message is dropped if it shows any of the URL's user info.
/// A query value with its `%XX` escapes decoded (a file path may hold
/// characters a URL must escape).
fn percent_decoded(key: &str, value: &str) -> Result<String, String> {
    anarchon::url::percent_decode(value)
        .ok_or_else(|| format!("{key} has a broken %-escape or is not UTF-8 once decoded"))
}

fn check_with_redis_client(url: &str) -> Result<(), String> {
    use deadpool_redis::redis::IntoConnectionInfo as _;
    let Err(e) = url.into_connection_info() else {
        return Ok(());
    };
    let message = e.to_string();
    let userinfo = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .map(|(userinfo, _)| userinfo);
    let leaks = userinfo.is_some_and(|u| {
        u.split(':')
            .any(|part| !part.is_empty() && message.contains(part))
    });
    Err(if leaks {
        "the Redis client cannot read it".to_owned()
    } else {
        format!("the Redis client cannot read it: {message}")
    })
}

/// The URL with any secret replaced by `***`: the password of the user
/// info (`scheme://user:***@host`), the whole user info where the client
/// reads a lone one as a secret (a NATS token, a Redis password), and the
/// value of any query parameter whose name contains `pass` or `token`.
pub(crate) fn redact(url: &str) -> String {
    anarchon::url::redact(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        for (url, want) in [
            (
                "postgres://app:s3cret@db:5432/cron",
                "postgres://app:***@db:5432/cron",
            ),
            ("redis://:pw@h:6379", "redis://:***@h:6379"),
            ("redis://pw@h:6379", "redis://***@h:6379"),
            ("nats://tok3n@h:4222", "nats://***@h:4222"),
            ("nats-kv://tok3n@h:4222", "nats-kv://***@h:4222"),
            ("tls://tok3n@h:4222", "tls://***@h:4222"),
            ("nats-kv+tls://tok3n@h:4222", "nats-kv+tls://***@h:4222"),
            ("amqp://guest@h/%2f?x=1", "amqp://guest@h/%2f?x=1"),
            (
                "postgres://h/db?user=u&password=hunter2&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            (
                "rediss://u:pw@h:6380/0?strategy=lease#insecure",
                "rediss://u:***@h:6380/0?strategy=lease#insecure",
            ),
            ("sqlite://anarchon.db", "sqlite://anarchon.db"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn unknown_schemes_are_refused_without_the_password() {
        let err = Backend::parse("mysql://app:s3cret@db/cron").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::StoreUrl { .. }), "{text}");
        assert!(err.is_configuration());
        assert!(text.contains("mysql://app:***@db/cron"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        for scheme in [
            "sqlite://",
            "postgres://",
            "redis://",
            "rediss://",
            "amqp://",
            "amqps://",
            "nats://",
        ] {
            assert!(text.contains(scheme), "lists {scheme}: {text}");
        }
        assert!(Backend::parse("anarchon.db").is_err());
    }

    #[test]
    fn sqlite_urls_are_read_without_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("never.db");
        let backend = Backend::parse(&format!("sqlite://{}", path.display())).unwrap();
        assert!(backend.describe().contains("never.db"));
        assert!(backend.is_lease());
        assert_eq!(backend.name(), "sqlite");
        assert!(backend.stand_in().as_lease_store().is_some());
        assert!(!path.exists(), "parsing a URL must not create the file");
    }

    #[test]
    fn postgres_urls_keep_the_clients_parameters_and_strip_ours() {
        for scheme in ["postgres", "postgresql"] {
            let backend = Backend::parse(&format!(
                "{scheme}://app:s3cret@db.internal:6543/cron?table=cron_runs&pool_size=8&sslmode=require&connect_timeout_ms=1500&statement_timeout_ms=0&migrate=false&application_name=web"
            ))
            .unwrap();
            let Backend::Postgres { options, server } = &backend else {
                panic!("{backend:?}")
            };
            assert_eq!(options.get_table().as_str(), "cron_runs");
            assert_eq!(options.get_pool_size(), 8);
            assert_eq!(options.get_connect_timeout(), Duration::from_millis(1500));
            assert_eq!(options.get_statement_timeout(), None);
            assert_eq!(
                options.redacted_url(),
                format!("{scheme}://app:***@db.internal:6543/cron?sslmode=require")
            );
            assert_eq!(server, "db.internal:6543/cron");
            assert!(backend.is_lease());
            assert_eq!(backend.name(), "postgres");
            assert!(backend.stand_in().as_lease_store().is_some());
            let described = backend.describe();
            assert!(described.contains("table cron_runs"), "{described}");
            assert!(!described.contains("s3cret"), "{described}");
            assert!(!format!("{backend:?}").contains("s3cret"));
        }
        let plain = Backend::parse("postgres://postgres@127.0.0.1/test").unwrap();
        let Backend::Postgres { options, server } = &plain else {
            panic!()
        };
        assert_eq!(options.get_table().as_str(), "anarchon");
        assert_eq!(options.redacted_url(), "postgres://postgres@127.0.0.1/test");
        assert_eq!(server, "127.0.0.1:5432/test");
        // A Unix socket named by the client's `host` parameter.
        let socket = Backend::parse("postgres://app@/cron?host=/run/postgresql").unwrap();
        assert!(socket.describe().contains("/run/postgresql:5432/cron"));
    }

    #[test]
    fn bad_postgres_urls_say_what_is_wrong() {
        for (url, says) in [
            (
                "postgres://app:s3cret@db/cron?tabel=x",
                "unknown parameter \"tabel\"",
            ),
            (
                "postgres://app:s3cret@db/cron?table=Runs",
                "invalid table name",
            ),
            (
                "postgres://app:s3cret@db/cron?pool_size=0",
                "pool_size must be at least 1",
            ),
            (
                "postgres://app:s3cret@db/cron?pool_size=many",
                "pool_size must be a whole number",
            ),
            (
                "postgres://app:s3cret@db/cron?migrate=yes",
                "migrate must be true or false",
            ),
            ("postgres://app:s3cret@db:port/cron", "the port \"port\""),
            ("postgres://app:s3cret@/cron", "names no host"),
            (
                "postgres://app:s3cret@db/cron?connect_timeout_ms=0",
                "longer than zero",
            ),
        ] {
            let err = Backend::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, Error::InvalidStoreUrl { .. }),
                "{url}: {text}"
            );
            assert!(err.is_configuration(), "{text}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("app:***@"), "{text}");
        }
    }

    #[test]
    fn redis_urls_choose_a_strategy() {
        let lease = Backend::parse("redis://:s3cret@127.0.0.1:6379/2?prefix=team.a").unwrap();
        assert!(lease.is_lease());
        assert_eq!(lease.name(), "redis-lease");
        assert!(lease.stand_in().as_lease_store().is_some());
        let described = lease.describe();
        assert!(described.contains("127.0.0.1:6379/2"), "{described}");
        assert!(described.contains("key prefix team.a"), "{described}");
        assert!(!described.contains("s3cret") && !format!("{lease:?}").contains("s3cret"));
        let Backend::Redis { options, .. } = &lease else {
            panic!()
        };
        assert!(
            !format!("{options:?}").contains("prefix=team.a"),
            "stripped"
        );

        for (url, name, memory) in [
            (
                "redis://h?strategy=stream-id",
                "redis-stream-id",
                Memory::Forever,
            ),
            (
                "redis://h?strategy=script&window_ms=120000",
                "redis-script",
                Memory::Window(Duration::from_secs(120)),
            ),
            (
                "redis://h?strategy=script",
                "redis-script",
                Memory::Window(RedisScriptStore::DEFAULT_WINDOW),
            ),
            (
                "redis://h?strategy=idmp&duration_ms=3600000&protocol=resp2",
                "redis-idmp",
                Memory::Window(Duration::from_secs(3600)),
            ),
        ] {
            let backend = Backend::parse(url).unwrap();
            assert!(!backend.is_lease(), "{url}");
            assert_eq!(backend.name(), name);
            let stand_in = backend.stand_in();
            assert_eq!(stand_in.info().name, name);
            assert_eq!(stand_in.info().memory, memory);
            assert!(stand_in.as_lease_store().is_none());
            assert!(backend.describe().contains("claim-only"));
        }
    }

    #[test]
    fn tls_urls_carry_a_private_authority() {
        let redis = Backend::parse(
            "rediss://:s3cret@h:6380/0?strategy=script&tls_ca_file=/etc/ca%20files/team.pem",
        )
        .unwrap();
        assert_eq!(redis.name(), "redis-script");
        let Backend::Redis { options, .. } = &redis else {
            panic!()
        };
        assert_eq!(
            options.tls_ca_path(),
            Some(std::path::Path::new("/etc/ca files/team.pem"))
        );
        assert!(!format!("{redis:?}").contains("s3cret"));

        // The RabbitMQ store reads its authority file as the URL is read,
        // so a wrong path shows up in `anarchon check`.
        let err = Backend::parse("amqps://u:s3cret@h/%2f?tls_ca_file=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");

        for url in [
            "tls://tok3n@h:4222",
            "nats+tls://tok3n@h:4222",
            "nats://tok3n@h:4222?tls_ca_file=/etc/ca.pem",
        ] {
            let backend = Backend::parse(url).unwrap();
            assert_eq!(backend.name(), "nats", "{url}");
            let Backend::Nats { connection, .. } = &backend else {
                panic!()
            };
            assert!(connection.uses_tls(), "{url}");
        }
        let kv = Backend::parse("nats-kv+tls://tok3n@h:4222?tls_ca_file=/etc/ca.pem").unwrap();
        assert!(kv.is_lease());
        let Backend::NatsKv { connection, .. } = &kv else {
            panic!()
        };
        assert!(connection.uses_tls());
        assert_eq!(
            connection.get_tls_ca_file(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert!(!format!("{kv:?}").contains("tok3n"));
    }

    #[test]
    fn bad_redis_urls_say_what_is_wrong() {
        for (url, says) in [
            (
                "redis://:s3cret@h?strategy=leases",
                "unknown strategy \"leases\"",
            ),
            (
                "redis://:s3cret@h?strategie=lease",
                "unknown parameter \"strategie\"",
            ),
            (
                "redis://:s3cret@h?window_ms=60000",
                "window_ms applies to strategy=script",
            ),
            (
                "redis://:s3cret@h?strategy=script&duration_ms=60000",
                "duration_ms applies to strategy=idmp",
            ),
            (
                "redis://:s3cret@h?strategy=script&window_ms=5",
                "window_ms must be at least",
            ),
            (
                "redis://:s3cret@h?strategy=idmp&duration_ms=1500",
                "whole seconds",
            ),
            ("redis://:s3cret@h?prefix=a%20b", "invalid key prefix"),
            ("redis://:s3cret@h/zero", "database \"zero\""),
            ("redis://:s3cret@:6379", "names no host"),
            ("redis://:s3cret@h?timeout_ms=0", "longer than zero"),
            (
                "redis://:s3cret@h?eviction=maybe",
                "eviction must be warn or refuse",
            ),
            (
                "redis://:s3cret@h?protocol=resp9",
                "Invalid protocol version",
            ),
            (
                "redis://:s3cret@h?tls_ca_file=/ca.pem",
                "needs a rediss:// URL",
            ),
            ("rediss://:s3cret@h?tls_ca_file=%zz", "broken %-escape"),
        ] {
            let err = Backend::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(err.is_configuration(), "{text}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    /// `url` with `params` added to its query.
    fn with_params(url: &str, params: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{params}")
    }

    /// What `check` and the pre-start validation assume about a URL's store
    /// — its name, whether it is a lease store, how long it remembers a
    /// run — is what the store opened from that URL on the real server
    /// reports.
    #[tokio::test]
    async fn stand_ins_match_the_stores_they_stand_for() {
        use anarchon_testkit::servers::{Service, require, unique_prefix};
        let prefix = unique_prefix("clistandin");
        let dir = tempfile::tempdir().unwrap();
        let pg = require(Service::Postgres).await;
        let redis = require(Service::Redis).await;
        let amqp = require(Service::Amqp).await;
        let nats = require(Service::Nats).await;
        let urls = [
            format!("sqlite://{}", dir.path().join("cron.db").display()),
            with_params(&pg, &format!("table={prefix}")),
            with_params(&redis, &format!("prefix={prefix}")),
            with_params(&redis, &format!("prefix={prefix}&strategy=stream-id")),
            with_params(
                &redis,
                &format!("prefix={prefix}&strategy=script&window_ms=90000"),
            ),
            with_params(&amqp, &format!("prefix={prefix}&slot_ttl_ms=90000")),
            with_params(
                &nats,
                &format!("prefix={prefix}&duplicate_window_ms=90000&storage=memory"),
            ),
        ];
        let mut seen = Vec::new();
        for url in &urls {
            let backend = Backend::parse(url).unwrap();
            let opened = backend.open().await;
            // Clean up before asserting, so a failure leaves nothing behind.
            if let Ok(Opened::Postgres(store)) = &opened {
                store.drop_schema().await.unwrap();
            }
            if matches!(backend, Backend::Nats { .. }) && opened.is_ok() {
                let client = async_nats::connect(nats.as_str()).await.unwrap();
                async_nats::jetstream::new(client)
                    .delete_stream(format!("{prefix}-claims"))
                    .await
                    .unwrap();
            }
            let opened = opened.unwrap_or_else(|e| panic!("{}: {e}", redact(url)));
            let store = opened.claim_store();
            let stand_in = backend.stand_in();
            let (real, assumed) = (store.info(), stand_in.info());
            assert_eq!(real.name, backend.name(), "{url}");
            let is_lease = store.clone().as_lease_store().is_some();
            assert_eq!(is_lease, backend.is_lease(), "{url}");
            assert_eq!(stand_in.as_lease_store().is_some(), is_lease, "{url}");
            assert_eq!(opened.lease_store().is_some(), is_lease, "{url}");
            if !is_lease {
                assert_eq!(assumed.name, real.name, "{url}");
                assert_eq!(assumed.memory, real.memory, "{url}");
            }
            opened.close().await;
            seen.push(real.name);
        }
        assert_eq!(
            seen,
            [
                "sqlite",
                "postgres",
                "redis-lease",
                "redis-stream-id",
                "redis-script",
                "rabbitmq",
                "nats"
            ]
        );
    }

    #[test]
    fn broker_urls_are_claim_only() {
        let amqp = Backend::parse(
            "amqp://guest:s3cret@127.0.0.1:5672/%2f?prefix=billing&slot_ttl_ms=90000",
        )
        .unwrap();
        assert_eq!(amqp.name(), "rabbitmq");
        assert!(!amqp.is_lease());
        let stand_in = amqp.stand_in();
        assert_eq!(stand_in.info().name, "rabbitmq");
        assert_eq!(
            stand_in.info().memory,
            Memory::Window(Duration::from_secs(90))
        );
        assert!(stand_in.as_lease_store().is_none());
        let described = amqp.describe();
        assert!(described.contains("queue prefix billing"), "{described}");
        assert!(!described.contains("s3cret"), "{described}");

        let nats =
            Backend::parse("nats://tok3n@127.0.0.1:4222?prefix=billing&duplicate_window_ms=600000")
                .unwrap();
        assert_eq!(nats.name(), "nats");
        assert!(!nats.is_lease());
        assert_eq!(
            nats.stand_in().info().memory,
            Memory::Window(Duration::from_secs(600))
        );
        let described = nats.describe();
        assert!(described.contains("stream billing-claims"), "{described}");
        assert!(!described.contains("tok3n"), "{described}");

        for (url, says) in [
            ("amqp://u:s3cret@h/%2f?bogus=1", "unknown parameter"),
            ("amqp://u:s3cret@h/%2f?slot_ttl_ms=1000", "slot_ttl"),
            ("amqps://u:s3cret@h/%2f?prefix=amq.x", "prefix"),
            ("nats://u:s3cret@h?bogus=1", "unknown parameter"),
            (
                "nats://u:s3cret@h?duplicate_window_ms=1000",
                "duplicate_window",
            ),
            ("nats://u:s3cret@h:notaport", "not valid"),
        ] {
            let err = Backend::parse(url).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, Error::InvalidStoreUrl { .. }),
                "{url}: {text}"
            );
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    /// A password of five-to-eight-character pieces joined by characters
    /// that break URL structure (and others), so any piece a parser quotes
    /// is long enough to be found in its message.
    fn awkward_password(seed: &mut u64) -> String {
        const JOINERS: &[char] = &['/', '?', '#', '@', ':', '%', '&', '=', '[', ']', ' ', '"'];
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let pieces = 2 + next() % 3;
        let mut password = String::new();
        for i in 0..pieces {
            if i > 0 {
                password.push(JOINERS[(next() % JOINERS.len() as u64) as usize]);
            }
            let len = 5 + next() % 4;
            for _ in 0..len {
                // Printable ASCII without the joiners, and some beyond ASCII.
                let c = match next() % 70 {
                    n @ 0..=25 => char::from(b'a' + n as u8),
                    n @ 26..=51 => char::from(b'A' + (n - 26) as u8),
                    n @ 52..=61 => char::from(b'0' + (n - 52) as u8),
                    62 => 'é',
                    63 => 'ß',
                    64 => '東',
                    65 => '!',
                    66 => '*',
                    67 => '+',
                    68 => '~',
                    _ => '$',
                };
                password.push(c);
            }
        }
        password
    }

    /// The pieces of `password` a parser could quote.
    fn pieces(password: &str) -> Vec<&str> {
        password
            .split(['/', '?', '#', '@', ':', '%', '&', '=', '[', ']', ' ', '"'])
            .filter(|p| p.chars().count() >= 5)
            .collect()
    }

    /// For random passwords, whatever reading (and, for PostgreSQL,
    /// opening) a store URL answers — an error, or the options' `Debug`
    /// and description — never shows the password or a piece of it, and
    /// neither does any log line written meanwhile.
    #[tokio::test]
    async fn no_url_reader_shows_a_password() {
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let logs = Lines::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);

        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..150 {
            let password = awkward_password(&mut seed);
            let secret = pieces(&password);
            let shows =
                |text: &str| text.contains(&password) || secret.iter().any(|p| text.contains(p));
            // Alone in the user info, what precedes a `:` is a user name by
            // the URL's grammar: only what follows it is the secret.
            let lone = password
                .split_once(':')
                .map_or(password.as_str(), |(_, p)| p);
            let lone_secret = pieces(lone);
            let shows_lone =
                |text: &str| text.contains(lone) || lone_secret.iter().any(|p| text.contains(p));
            for (url, alone) in [
                (format!("postgres://app:{password}@127.0.0.1:9/cron"), false),
                (format!("redis://app:{password}@127.0.0.1:9"), false),
                (format!("rediss://{password}@127.0.0.1:9"), true),
                (format!("amqp://app:{password}@127.0.0.1:9/%2f"), false),
                (format!("nats://app:{password}@127.0.0.1:9?prefix=p"), false),
                (format!("nats-kv://{password}@127.0.0.1:9"), true),
            ] {
                let leaks = |text: &str| if alone { shows_lone(text) } else { shows(text) };
                let said = match Backend::parse(&url) {
                    Ok(backend) => format!("{} {:?}", backend.describe(), backend.name()),
                    Err(e) => format!("{e} {e:?}"),
                };
                assert!(!leaks(&said), "{url:?} -> {said}");
                assert!(!leaks(&redact(&url)), "{url:?} -> {}", redact(&url));
            }
            let opened = anarchon::pg::PgStore::connect_with(
                anarchon::pg::PgOptions::new(format!("postgres://app:{password}@127.0.0.1:9/cron"))
                    .connect_timeout(std::time::Duration::from_millis(300)),
            )
            .await;
            if let Err(e) = opened {
                let said = format!("{e} {e:?}");
                assert!(!shows(&said), "postgres open -> {said}");
            }
            let written = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
            assert!(!shows(&written), "a log line shows the password: {written}");
        }
    }
}
