//! The crate's one error type, and how sqlx errors map onto it.

use anarchon_core::{StoreError, StoreErrorKind};

/// The backend's name in errors, logs and [`anarchon_core::BackendInfo`].
pub const BACKEND: &str = "postgres";

/// Everything that can go wrong in `anarchon-pg`.
///
/// No variant ever holds a password: URLs are redacted before they are put
/// in a message, and errors from parsing a URL keep no source.
/// [`Error::kind`] says whether retrying can help; the conversion into
/// [`StoreError`] keeps that kind and this error as the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table name is not a plain identifier, or too long.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as given (cut to 80 characters).
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The connection URL does not parse.
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        /// What is wrong with it (password removed).
        reason: String,
    },

    /// An option is out of range.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// The accepted range.
        reason: String,
    },

    /// The server could not be reached, did not answer in time, dropped the
    /// connection, or asked to try again (serialization failure, deadlock,
    /// statement timeout, shutdown). Temporary: the same request may be sent
    /// again.
    #[error("{action}: {reason}")]
    Unavailable {
        /// What was being done.
        action: String,
        /// What went wrong.
        reason: String,
        /// The error from sqlx.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The server refused the request for a reason retrying will not fix:
    /// authentication, a missing database, table or function, permissions.
    #[error("{action}: {reason}")]
    Refused {
        /// What was being done.
        action: String,
        /// What went wrong.
        reason: String,
        /// The error from sqlx.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The server answered something this crate did not expect.
    #[error("{action}: {reason}")]
    Protocol {
        /// What was being done.
        action: String,
        /// What was unexpected.
        reason: String,
        /// The error from sqlx, when it came from there.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The schema was migrated by a newer version of this crate.
    #[error(
        "the schema of table {table:?} is at version {found}, newer than the latest this version of anarchon-pg knows ({latest}); run a newer anarchon-pg"
    )]
    SchemaTooNew {
        /// The table.
        table: String,
        /// The version found in the database.
        found: u32,
        /// The latest version this crate knows.
        latest: u32,
    },

    /// The schema is older than this crate needs and migrations are off.
    #[error(
        "the schema of table {table:?} is at version {found}, but this anarchon-pg needs version {latest} and migrations are turned off; open a store once with `PgOptions::with_migrate(true)` (the default; in a store URL, without `migrate=false`) to migrate it"
    )]
    SchemaOutdated {
        /// The table.
        table: String,
        /// The version found in the database (0: no schema).
        found: u32,
        /// The version this crate needs.
        latest: u32,
    },
}

impl Error {
    /// Which kind of failure this is, in the terms of [`StoreError`].
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            Error::Unavailable { .. } => StoreErrorKind::Unavailable,
            Error::Protocol { .. } => StoreErrorKind::Protocol,
            Error::InvalidTableName { .. }
            | Error::InvalidUrl { .. }
            | Error::InvalidOption { .. }
            | Error::Refused { .. }
            | Error::SchemaTooNew { .. }
            | Error::SchemaOutdated { .. } => StoreErrorKind::Invalid,
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn is_temporary(&self) -> bool {
        self.kind() == StoreErrorKind::Unavailable
    }

    /// Wraps a sqlx error from `action`, classified by [`classify`].
    pub(crate) fn from_sqlx(action: impl Into<String>, error: sqlx::Error) -> Self {
        let action = action.into();
        let reason = describe(&error);
        match classify(&error) {
            StoreErrorKind::Unavailable => Error::Unavailable {
                action,
                reason,
                source: Some(error),
            },
            StoreErrorKind::Protocol => Error::Protocol {
                action,
                reason,
                source: Some(error),
            },
            _ => Error::Refused {
                action,
                reason,
                source: Some(error),
            },
        }
    }

    /// This error again, for `action`: each of the calls that one failed
    /// statement carried gets its own, of the same kind and reason, so
    /// whether it may be retried is unchanged (the copies do not carry the
    /// underlying sqlx error).
    pub(crate) fn again(&self, action: String) -> Self {
        match self {
            Error::Unavailable { reason, .. } => Error::Unavailable {
                action,
                reason: reason.clone(),
                source: None,
            },
            Error::Protocol { reason, .. } => Error::Protocol {
                action,
                reason: reason.clone(),
                source: None,
            },
            Error::Refused { reason, .. } => Error::Refused {
                action,
                reason: reason.clone(),
                source: None,
            },
            other => Error::Refused {
                action,
                reason: other.to_string(),
                source: None,
            },
        }
    }

    /// An answer that does not fit the schema.
    pub(crate) fn protocol(action: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Protocol {
            action: action.into(),
            reason: reason.into(),
            source: None,
        }
    }
}

impl From<Error> for StoreError {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        let base = match error.kind() {
            StoreErrorKind::Unavailable => StoreError::unavailable(BACKEND, message),
            StoreErrorKind::Protocol => StoreError::protocol(BACKEND, message),
            _ => StoreError::invalid(BACKEND, message),
        };
        base.with_source(error)
    }
}

/// The SQLSTATE of a database error, if it is one.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Which kind of failure a sqlx error is.
///
/// Temporary: I/O, pool timeouts, a crashed worker, and the SQLSTATEs that
/// mean "try again" — connection exceptions (class 08), serialization
/// failure and deadlock (40001, 40P01), insufficient resources (class 53),
/// statement timeout and shutdowns (57014, 57P01–57P03, 57P05), a lock not
/// available (55P03), system errors (class 58) and a read-only server
/// (25006, e.g. a primary that was just demoted). Protocol: decoding and
/// malformed answers, and data exceptions (class 22). Everything else —
/// authentication, missing objects, permissions, configuration — is invalid.
pub(crate) fn classify(error: &sqlx::Error) -> StoreErrorKind {
    use sqlx::Error as E;
    match error {
        E::Io(_) | E::PoolTimedOut | E::WorkerCrashed => StoreErrorKind::Unavailable,
        E::Database(_) => {
            let code = sqlstate(error).unwrap_or_default();
            let class = code.get(..2).unwrap_or_default();
            match (class, code.as_str()) {
                ("08" | "53" | "58", _)
                | (_, "40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "57P05")
                | (_, "55P03" | "25006") => StoreErrorKind::Unavailable,
                ("22", _) => StoreErrorKind::Protocol,
                _ => StoreErrorKind::Invalid,
            }
        }
        E::Configuration(_) | E::InvalidArgument(_) | E::Tls(_) | E::PoolClosed => {
            StoreErrorKind::Invalid
        }
        _ => StoreErrorKind::Protocol,
    }
}

/// Whether the connection that returned `error` is unusable: it must not go
/// back to the pool.
pub(crate) fn connection_broken(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(_) => {
            let code = sqlstate(error).unwrap_or_default();
            code.starts_with("08") || matches!(code.as_str(), "57P01" | "57P02" | "57P03")
        }
        _ => false,
    }
}

/// Whether `error` proves the statement did not take effect: the server
/// ended the session (administrator command, crash, shutdown) before it
/// answered, which rolls back whatever the statement did.
pub(crate) fn certainly_not_applied(error: &sqlx::Error) -> bool {
    matches!(
        sqlstate(error).as_deref(),
        Some("57P01" | "57P02" | "57P03")
    )
}

/// A one-line description of a sqlx error for messages: the server's
/// message and SQLSTATE for database errors, with a hint for the common
/// configuration mistakes.
fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let hint = match code.as_str() {
                "28P01" | "28000" => {
                    "; check the user name and password of the URL (the password is never shown)"
                }
                "3D000" => "; create the database, or fix its name in the URL",
                "42P01" | "42883" => {
                    "; the schema is missing or incomplete: open the store with migrations on"
                }
                "42501" => "; the user lacks a privilege on the store's tables or function",
                "57014" => "; the statement timeout cut it short",
                _ => "",
            };
            format!("{} (SQLSTATE {code}){hint}", db.message())
        }
        sqlx::Error::PoolTimedOut => {
            "no connection within the connect timeout (server unreachable, or the pool is exhausted)"
                .to_owned()
        }
        sqlx::Error::PoolClosed => "the store's connection pool was closed".to_owned(),
        // Only connection-string errors can carry URL text; they are built
        // before any connection exists and are redacted by the caller, so
        // other errors are shown as sqlx words them.
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_store_error_kinds() {
        let io = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(classify(&io), StoreErrorKind::Unavailable);
        assert!(connection_broken(&io));
        assert!(!certainly_not_applied(&io));
        assert_eq!(
            classify(&sqlx::Error::PoolTimedOut),
            StoreErrorKind::Unavailable
        );
        assert_eq!(classify(&sqlx::Error::PoolClosed), StoreErrorKind::Invalid);
        assert_eq!(
            classify(&sqlx::Error::ColumnNotFound("x".into())),
            StoreErrorKind::Protocol
        );
        assert_eq!(
            classify(&sqlx::Error::Decode("bad".into())),
            StoreErrorKind::Protocol
        );
        let e = Error::from_sqlx("claim", sqlx::Error::PoolTimedOut);
        assert!(e.is_temporary());
        let store: StoreError = e.into();
        assert!(store.is_temporary());
        assert_eq!(store.backend(), BACKEND);
        let bad = Error::InvalidTableName {
            name: "x".into(),
            reason: "r".into(),
        };
        let store: StoreError = bad.into();
        assert_eq!(store.kind(), StoreErrorKind::Invalid);
    }
}
