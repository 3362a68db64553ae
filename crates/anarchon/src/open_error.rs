//! The one error of opening a store from its URL.

/// Why a store could not be chosen from its URL, or opened.
///
/// No message shows a URL's password, a NATS token or the value of a
/// parameter whose name speaks of a secret: URLs are redacted with
/// [`url::redact`](crate::url::redact) before they are put in one, and the
/// backends' errors keep passwords out of theirs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme names no backend anarchon knows.
    #[error("unsupported store URL {url}: anarchon knows the schemes {schemes}")]
    UnknownScheme {
        /// The URL, redacted.
        url: String,
        /// The schemes there are, for the message.
        schemes: &'static str,
    },

    /// The URL names a backend, or a TLS variant of one, whose cargo
    /// feature this build of the `anarchon` crate does not have.
    #[error(
        "the store URL {url} needs the `{feature}` feature of the anarchon crate, which this build does not have: enable it in Cargo.toml (features = [\"{feature}\"])"
    )]
    FeatureDisabled {
        /// The URL, redacted.
        url: String,
        /// The feature, e.g. `redis` or `redis-tls`.
        feature: &'static str,
    },

    /// The URL names a known backend but is malformed, or one of its
    /// parameters is unknown or out of range.
    #[error("invalid store URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, redacted.
        url: String,
        /// What is wrong, without the password.
        reason: String,
    },

    /// [`StoreUrl::open_existing`](crate::StoreUrl::open_existing) on a
    /// claim-only store, which keeps no runs to read.
    #[error(
        "the `{backend}` store is claim-only: it keeps no record of runs, only which instance claimed each one first"
    )]
    ClaimOnly {
        /// The backend, e.g. `rabbitmq`.
        backend: &'static str,
    },

    /// [`StoreUrl::open_existing`](crate::StoreUrl::open_existing) found
    /// no store to read: a SQLite file or its tables, or a PostgreSQL
    /// table, that nothing has created yet.
    #[error("{what}")]
    Missing {
        /// What is missing, e.g. `no database at "cron.db"`.
        what: String,
    },

    /// [`StoreUrl::open_existing`](crate::StoreUrl::open_existing) found a
    /// PostgreSQL table of an older schema, which it may not migrate.
    #[error(
        "the table {table:?} is at schema version {found}, but this version of anarchon reads version {latest}; opening the store for writing migrates it"
    )]
    SchemaOutdated {
        /// The table.
        table: String,
        /// The version found.
        found: u32,
        /// The version this build reads.
        latest: u32,
    },

    /// The SQLite store: a URL it refuses, or a file it cannot open.
    #[cfg(feature = "sqlite")]
    #[error(transparent)]
    Sqlite(#[from] anarchon_sqlite::Error),

    /// The PostgreSQL store could not be opened.
    #[cfg(feature = "pg")]
    #[error(transparent)]
    Postgres(#[from] anarchon_pg::Error),

    /// The Redis store could not be opened.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] anarchon_redis::Error),

    /// The RabbitMQ store could not be opened.
    #[cfg(feature = "amqp")]
    #[error(transparent)]
    Amqp(#[from] anarchon_amqp::Error),

    /// A NATS store could not be opened.
    #[cfg(feature = "nats")]
    #[error(transparent)]
    Nats(#[from] anarchon_nats::Error),

    /// A store call made while opening or reading failed.
    #[error(transparent)]
    Store(#[from] anarchon_core::StoreError),
}

impl OpenError {
    /// Whether trying again later may succeed: a server that did not
    /// answer, a locked file. Everything about the URL itself, and
    /// credentials or a database the server refuses, is not temporary.
    pub fn is_temporary(&self) -> bool {
        match self {
            OpenError::UnknownScheme { .. }
            | OpenError::FeatureDisabled { .. }
            | OpenError::InvalidUrl { .. }
            | OpenError::ClaimOnly { .. }
            | OpenError::Missing { .. }
            | OpenError::SchemaOutdated { .. } => false,
            #[cfg(feature = "sqlite")]
            OpenError::Sqlite(e) => e.is_temporary(),
            #[cfg(feature = "pg")]
            OpenError::Postgres(e) => e.is_temporary(),
            #[cfg(feature = "redis")]
            OpenError::Redis(e) => e.is_temporary(),
            #[cfg(feature = "amqp")]
            OpenError::Amqp(e) => e.is_temporary(),
            #[cfg(feature = "nats")]
            OpenError::Nats(e) => e.is_temporary(),
            OpenError::Store(e) => e.is_temporary(),
        }
    }

    /// Whether the URL itself is at fault — an unknown scheme, a feature
    /// this build lacks, a malformed URL or parameter — as
    /// [`StoreUrl::parse`](crate::StoreUrl::parse) finds without
    /// connecting.
    pub fn is_url(&self) -> bool {
        match self {
            OpenError::UnknownScheme { .. }
            | OpenError::FeatureDisabled { .. }
            | OpenError::InvalidUrl { .. } => true,
            // The SQLite crate's own words for a URL it refuses.
            #[cfg(feature = "sqlite")]
            OpenError::Sqlite(
                anarchon_sqlite::Error::InvalidUrl { .. }
                | anarchon_sqlite::Error::InvalidOption { .. },
            ) => true,
            _ => false,
        }
    }
}
