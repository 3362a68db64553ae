//! The crate's one error type, and how Redis errors map onto it.

use std::path::PathBuf;
use std::time::Duration;

use anarchon_core::StoreError;
use deadpool_redis::redis::{ErrorKind, RedisError, ServerErrorKind};

/// Something went wrong building or using a Redis store.
///
/// Messages never contain the connection URL or a password. Store calls
/// return it as a [`StoreError`] (see [`Error::into_store_error`]);
/// constructors return it as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key prefix is empty, too long or has a character that is not
    /// plain in a Redis key (braces would break the hash tag).
    #[error("invalid key prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// The prefix as given (cut to 80 characters).
        prefix: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The connection URL does not parse. The URL itself is not repeated.
    #[error("invalid Redis URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },

    /// The URL or the options ask for TLS (a `rediss://` or `valkeys://`
    /// URL, or [`RedisOptions::with_tls_ca_file`](crate::RedisOptions::with_tls_ca_file)),
    /// but the crate was built without its `tls` feature.
    #[error(
        "{requested_by} asks for TLS, but anarchon-redis was built without TLS support: enable the `tls` feature of anarchon-redis"
    )]
    TlsNotEnabled {
        /// What asked for TLS, e.g. `the URL scheme rediss://`.
        requested_by: String,
    },

    /// The certificate authority file given with
    /// [`RedisOptions::with_tls_ca_file`](crate::RedisOptions::with_tls_ca_file)
    /// cannot be read or holds no usable certificate.
    #[error("cannot use the certificate authority file {}: {reason}", path.display())]
    CaFile {
        /// The file as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The error reading it, if reading failed.
        #[source]
        source: Option<std::io::Error>,
    },

    /// The TLS handshake with the server failed: most often the server's
    /// certificate is not signed by an authority the client trusts, or does
    /// not name the host of the URL. Not temporary.
    #[error("the TLS handshake with Redis failed while {during}: {detail}")]
    Tls {
        /// What the store was doing.
        during: &'static str,
        /// What TLS reported, and what to check.
        detail: String,
        /// The client's error.
        #[source]
        source: Option<RedisError>,
    },

    /// An option of a strategy is out of its range.
    #[error("the {option} of the `{strategy}` strategy is out of range: {reason}")]
    InvalidOption {
        /// The strategy, e.g. `script`.
        strategy: &'static str,
        /// The option, e.g. `window`.
        option: &'static str,
        /// The range and what was given.
        reason: String,
    },

    /// Two settings of [`RedisOptions`](crate::RedisOptions) do not go
    /// together, e.g. a `WAIT` timeout as long as the response timeout.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting, e.g. `wait_for_replicas`.
        setting: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A write step was applied, but fewer replicas than
    /// [`RedisOptions::wait_for_replicas`](crate::RedisOptions::wait_for_replicas)
    /// asks for acknowledged it within the timeout. Temporary: the step
    /// stands on the master (a claim is the caller's, a heartbeat renewed)
    /// but may be lost if that master fails before a replica has it; the
    /// same request sent again with the same token finds its own step and
    /// waits again.
    #[error(
        "Redis applied the step while {during}, but only {acknowledged} of the {wanted} replicas asked for acknowledged it within {timeout:?} (WAIT): it stands on the master and is lost if that master fails before a replica has it; the same request sent again (same token) finds it and waits again"
    )]
    NotReplicated {
        /// What the store was doing.
        during: &'static str,
        /// The replicas asked for.
        wanted: u32,
        /// The replicas that acknowledged in time. On a Redis Cluster the
        /// calls of one batch go out in one pipeline per hash slot, each
        /// with its own `WAIT`: this is the count of one pipeline that fell
        /// short, not necessarily the lowest.
        acknowledged: i64,
        /// How long Redis waited.
        timeout: Duration,
    },

    /// Redis could not be reached or did not answer in time. Temporary.
    #[error("Redis is unreachable while {during}: {cause}")]
    Unavailable {
        /// What the store was doing.
        during: &'static str,
        /// What happened, without the URL.
        cause: String,
        /// The client's error.
        #[source]
        source: Option<RedisError>,
    },

    /// Redis refused the credentials or an ACL rule denied a command or key.
    #[error(
        "Redis refused access while {during}: {detail} (check the user name, the password and the ACL rules for the key prefix)"
    )]
    AccessDenied {
        /// What the store was doing.
        during: &'static str,
        /// Redis's answer (it never contains the password).
        detail: String,
    },

    /// A key the store uses holds another type than the store expects.
    #[error(
        "a key of the store holds the wrong type while {during}: {detail}; another program writes under this key prefix, or the prefix was used by another strategy: choose another prefix or delete the key"
    )]
    WrongType {
        /// What the store was doing.
        during: &'static str,
        /// Redis's answer, naming the key when the store's scripts found it.
        detail: String,
    },

    /// The server lacks a feature the strategy needs.
    #[error(
        "the `{strategy}` strategy needs {needs}, but the server is {found}; use the `script` strategy instead (RedisScriptStore): the same claim as one Lua script, on any Redis 6.2+ or Valkey"
    )]
    ServerTooOld {
        /// The strategy.
        strategy: &'static str,
        /// What it needs, e.g. `Redis 8.6 or newer (XADD IDMP)`.
        needs: &'static str,
        /// What the server says it is, e.g. `Redis 7.0.15`.
        found: String,
    },

    /// The server may evict keys and the options say to refuse such a server.
    #[error(
        "Redis has maxmemory-policy {policy}: {why}; refused because the options ask for `noeviction` (set `maxmemory-policy noeviction`, or allow it with EvictionCheck::Warn)"
    )]
    EvictionPolicy {
        /// The server's policy.
        policy: String,
        /// What the policy can do to the store's keys.
        why: &'static str,
    },

    /// An `idmp` stream exists with a shorter IDMP duration or a smaller
    /// size than the options ask for.
    #[error(
        "the stream {key} remembers idempotency ids for {found_duration_s} s and {found_maxsize} per job, but the store was built for {want_duration_s} s and {want_maxsize}: it could forget a claim sooner than promised; align the options, or move the jobs to a new key prefix"
    )]
    IdmpConfig {
        /// The stream.
        key: String,
        /// Its IDMP-DURATION.
        found_duration_s: i64,
        /// Its IDMP-MAXSIZE.
        found_maxsize: i64,
        /// The duration asked for.
        want_duration_s: u64,
        /// The size asked for.
        want_maxsize: u64,
    },

    /// Redis answered with an error the store does not expect.
    #[error("Redis answered an error while {during}: {detail}")]
    Server {
        /// What the store was doing.
        during: &'static str,
        /// Redis's answer.
        detail: String,
        /// The client's error.
        #[source]
        source: Option<RedisError>,
    },

    /// Redis answered something that is not what the store's scripts return.
    #[error("unexpected answer from Redis while {during}: {detail}")]
    Protocol {
        /// What the store was doing.
        during: &'static str,
        /// What was wrong with the answer.
        detail: String,
    },
}

impl Error {
    /// Whether sending the same request again may succeed.
    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::NotReplicated { .. }
        )
    }

    /// Whether the call timed out waiting for Redis (rather than being
    /// refused or answered with an error).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Error::Unavailable { source: Some(e), .. } if e.is_timeout())
    }

    /// This error as the answer of each of `calls` calls that failed
    /// together: the first gets it, the others a copy.
    pub(crate) fn for_each_of(self, calls: usize) -> Vec<Self> {
        let mut errors: Vec<Self> = (1..calls).map(|_| self.for_another_call()).collect();
        errors.insert(0, self);
        errors
    }

    /// The same error, for another call of the round trip that failed.
    fn for_another_call(&self) -> Self {
        match self {
            Error::Unavailable {
                during,
                cause,
                source,
            } => Error::Unavailable {
                during,
                cause: cause.clone(),
                source: source.clone(),
            },
            Error::NotReplicated {
                during,
                wanted,
                acknowledged,
                timeout,
            } => Error::NotReplicated {
                during,
                wanted: *wanted,
                acknowledged: *acknowledged,
                timeout: *timeout,
            },
            Error::Server {
                during,
                detail,
                source,
            } => Error::Server {
                during,
                detail: detail.clone(),
                source: source.clone(),
            },
            Error::AccessDenied { during, detail } => Error::AccessDenied {
                during,
                detail: detail.clone(),
            },
            Error::WrongType { during, detail } => Error::WrongType {
                during,
                detail: detail.clone(),
            },
            other => Error::Protocol {
                during: "sending a round trip",
                detail: other.to_string(),
            },
        }
    }

    /// This error as the core's [`StoreError`] for the strategy `backend`:
    /// unavailable (temporary), invalid (configuration, credentials, key
    /// types, server) or protocol.
    pub fn into_store_error(self, backend: &'static str) -> StoreError {
        let message = self.to_string();
        let error = match &self {
            Error::Unavailable { .. } | Error::NotReplicated { .. } => {
                StoreError::unavailable(backend, message)
            }
            Error::Server { .. } | Error::Protocol { .. } => StoreError::protocol(backend, message),
            _ => StoreError::invalid(backend, message),
        };
        error.with_source(self)
    }

    pub(crate) fn protocol(during: &'static str, detail: impl Into<String>) -> Self {
        Error::Protocol {
            during,
            detail: detail.into(),
        }
    }

    pub(crate) fn timeout(during: &'static str, after: Duration) -> Self {
        Error::Unavailable {
            during,
            cause: format!("no answer within {after:?}"),
            source: None,
        }
    }

    /// Sorts a client error into the store's kinds.
    pub(crate) fn from_redis(during: &'static str, err: RedisError) -> Self {
        let code = err.code().unwrap_or_default().to_owned();
        let detail = match err.detail() {
            Some(d) if !code.is_empty() => format!("{code} {d}"),
            Some(d) => d.to_owned(),
            None => err.to_string(),
        };
        #[cfg(feature = "tls")]
        if let Some(detail) = crate::tls::handshake_failure(&err) {
            return Error::Tls {
                during,
                detail,
                source: Some(err),
            };
        }
        let kind = err.kind();
        if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
        {
            return Error::Unavailable {
                during,
                cause: err.to_string(),
                source: Some(err),
            };
        }
        match (kind, code.as_str()) {
            (ErrorKind::AuthenticationFailed, _)
            | (ErrorKind::Server(ServerErrorKind::NoPerm), _)
            | (_, "WRONGPASS" | "NOAUTH" | "NOPERM") => Error::AccessDenied { during, detail },
            (_, "WRONGTYPE") => Error::WrongType { during, detail },
            (
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask,
                ),
                _,
            )
            | (
                _,
                "BUSY" | "OOM" | "LOADING" | "MASTERDOWN" | "READONLY" | "MOVED" | "ASK"
                | "CLUSTERDOWN" | "TRYAGAIN",
            ) => Error::Unavailable {
                during,
                cause: detail,
                source: Some(err),
            },
            _ => Error::Server {
                during,
                detail,
                source: Some(err),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::StoreErrorKind;

    #[test]
    fn kinds_map_onto_store_errors() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = Error::from_redis("claiming", refused);
        assert!(e.is_temporary(), "{e}");
        assert_eq!(
            e.into_store_error("redis-lease").kind(),
            StoreErrorKind::Unavailable
        );

        let too_old = Error::ServerTooOld {
            strategy: "idmp",
            needs: "Redis 8.6 or newer (XADD IDMP)",
            found: "Redis 7.0.15".into(),
        };
        assert!(too_old.to_string().contains("`script` strategy"));
        assert_eq!(
            too_old.into_store_error("redis-idmp").kind(),
            StoreErrorKind::Invalid
        );
        assert_eq!(
            Error::protocol("reading", "odd")
                .into_store_error("redis-lease")
                .kind(),
            StoreErrorKind::Protocol
        );
    }
}
