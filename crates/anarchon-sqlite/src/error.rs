//! What can go wrong opening a SQLite store, and how store calls report
//! SQLite's failures.

use std::path::PathBuf;
use std::time::Duration;

use anarchon_core::StoreError;
use anarchon_core::stored::BadValue;

use crate::BACKEND;

/// An error opening a [`SqliteStore`](crate::SqliteStore) or reading its
/// options.
///
/// Calls on an open store ([`ClaimStore`](anarchon_core::ClaimStore),
/// [`LeaseStore`](anarchon_core::LeaseStore)) return the core's
/// [`StoreError`] instead; this type converts into one with `?`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table prefix is not a plain SQL identifier.
    #[error(
        "invalid table prefix {prefix:?}: {reason}; use 1 to {max} characters of [A-Za-z0-9_], starting with a letter or '_'",
        max = crate::options::MAX_PREFIX_LEN
    )]
    InvalidTablePrefix {
        /// The prefix as given (cut to 80 characters).
        prefix: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A store URL that this backend does not understand.
    #[error("invalid SQLite store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given, without the values of its parameters.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An option is out of range.
    #[error("invalid SQLite store option `{option}`: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What the range is.
        reason: String,
    },

    /// The directory that should hold the database file does not exist.
    #[error(
        "cannot open the SQLite database {path:?}: its directory {directory:?} does not exist; create it first (the store creates the file, not its directory)"
    )]
    MissingDirectory {
        /// The database file.
        path: PathBuf,
        /// Its missing directory.
        directory: PathBuf,
    },

    /// The file exists but is not a SQLite database.
    #[error(
        "{path:?} is not a SQLite database (SQLite says: {message}); point the store at a new or existing SQLite file"
    )]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// SQLite's message.
        message: String,
    },

    /// Another connection held the database's write lock for longer than
    /// the busy timeout.
    #[error(
        "the SQLite database {path:?} stayed locked by another connection for longer than the busy timeout ({busy_timeout:?}) while {doing}"
    )]
    Locked {
        /// The database file.
        path: PathBuf,
        /// The busy timeout that ran out.
        busy_timeout: Duration,
        /// What the store was doing.
        doing: &'static str,
    },

    /// The database could not be switched to write-ahead logging.
    #[error(
        "could not switch the SQLite database {path:?} to WAL mode (it stays in {mode:?} mode); WAL needs a local filesystem with shared memory (not NFS or SMB)"
    )]
    WalUnavailable {
        /// The database file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        mode: String,
    },

    /// The tables were made by a newer version of this crate.
    #[error(
        "the tables with prefix {prefix:?} in {path:?} have schema version {found}, but this anarchon-sqlite knows versions up to {supported}; upgrade anarchon, or use another prefix or file"
    )]
    SchemaTooNew {
        /// The database file.
        path: PathBuf,
        /// The table prefix.
        prefix: String,
        /// The version found.
        found: i64,
        /// The newest version this crate knows.
        supported: i64,
    },

    /// The tables were made by an older release and a read-only store
    /// cannot migrate them.
    #[error(
        "SQLite database {path:?} (prefix {prefix:?}) has schema version {found}, older than {latest}: open it once for writing (`anarchon run`, or SqliteStore::open) to migrate it"
    )]
    SchemaOutdated {
        /// The database file.
        path: PathBuf,
        /// The table prefix.
        prefix: String,
        /// The version found (0: no tables).
        found: i64,
        /// The version this crate needs.
        latest: i64,
    },

    /// The database file could not be created.
    #[error("cannot create the database file {path:?}: {source}")]
    CreateFile {
        /// The database file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },

    /// Any other failure from SQLite or the connection pool.
    #[error("SQLite database {path:?}: {doing} failed: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What the store was doing.
        doing: &'static str,
        /// The underlying error.
        #[source]
        source: sqlx::Error,
    },
}

impl Error {
    /// Whether trying again later may succeed (the database was locked).
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Locked { .. } => true,
            Error::Sqlite { source, .. } => classify(source) == Class::Unavailable,
            _ => false,
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        if e.is_temporary() {
            StoreError::unavailable(BACKEND, message).with_source(e)
        } else {
            StoreError::invalid(BACKEND, message).with_source(e)
        }
    }
}

/// SQLite's primary result codes we tell apart
/// (<https://www.sqlite.org/rescode.html>).
pub(crate) mod code {
    pub(crate) const BUSY: i64 = 5;
    pub(crate) const LOCKED: i64 = 6;
    pub(crate) const NOMEM: i64 = 7;
    pub(crate) const READONLY: i64 = 8;
    pub(crate) const IOERR: i64 = 10;
    pub(crate) const CORRUPT: i64 = 11;
    pub(crate) const FULL: i64 = 13;
    pub(crate) const CANTOPEN: i64 = 14;
    pub(crate) const PROTOCOL: i64 = 15;
    pub(crate) const NOTADB: i64 = 26;
}

/// How a sqlx error counts for the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Locked, busy, pool exhausted, I/O: the same request may succeed later.
    Unavailable,
    /// Schema or configuration: retrying will not help.
    Invalid,
    /// Something we did not expect back.
    Protocol,
}

/// SQLite's primary result code of a database error.
pub(crate) fn primary_code(e: &sqlx::Error) -> Option<i64> {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .map(|c| c & 0xff),
        _ => None,
    }
}

pub(crate) fn classify(e: &sqlx::Error) -> Class {
    match e {
        sqlx::Error::Database(_) => match primary_code(e) {
            Some(
                code::BUSY
                | code::LOCKED
                | code::NOMEM
                | code::IOERR
                | code::FULL
                | code::CANTOPEN
                | code::PROTOCOL,
            ) => Class::Unavailable,
            Some(code::READONLY | code::CORRUPT | code::NOTADB) => Class::Invalid,
            // Constraint failures, "no such table", SQL errors: the schema
            // is not what this crate wrote.
            _ => Class::Invalid,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Class::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => Class::Invalid,
        _ => Class::Protocol,
    }
}

/// Turns a sqlx error from a store call into a [`StoreError`].
pub(crate) fn store_error(doing: &str, e: sqlx::Error) -> StoreError {
    described(doing, &e).with_source(e)
}

/// [`store_error`] without the underlying error as its source: for each of
/// the calls that one error failed together.
pub(crate) fn described(doing: &str, e: &sqlx::Error) -> StoreError {
    let message = format!("{doing}: {e}");
    match classify(e) {
        Class::Unavailable => StoreError::unavailable(BACKEND, message),
        Class::Invalid => StoreError::invalid(BACKEND, message),
        Class::Protocol => StoreError::protocol(BACKEND, message),
    }
}

/// What a store opened with `options` was doing when `e` came: a lock
/// held past the busy timeout says so, with the timeout.
pub(crate) fn doing_when(options: &crate::SqliteOptions, doing: &str, e: &sqlx::Error) -> String {
    if is_busy(e) {
        format!(
            "{doing}: the database stayed locked longer than the busy timeout ({:?})",
            options.busy_timeout()
        )
    } else {
        doing.to_owned()
    }
}

/// [`store_error`] for a store opened with `options` ([`doing_when`]).
pub(crate) fn store_error_when(
    options: &crate::SqliteOptions,
    doing: &str,
    e: sqlx::Error,
) -> StoreError {
    store_error(&doing_when(options, doing, &e), e)
}

/// A value read back from the database that this crate never writes.
pub(crate) fn bad_value(what: &'static str, value: impl std::fmt::Debug) -> StoreError {
    bad_stored(BadValue::new(what, value))
}

/// A stored value the core's types cannot hold.
pub(crate) fn bad_stored(e: BadValue) -> StoreError {
    StoreError::protocol(BACKEND, e.to_string())
}

/// Whether SQLite answered "busy" or "locked": another connection held the
/// lock past the busy timeout.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(code::BUSY | code::LOCKED))
}
