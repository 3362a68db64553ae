//! The two ways things go wrong: configuration and the store.
//!
//! They answer different questions, so they are two types. A [`ConfigError`]
//! is found while building a schedule, a job or a scheduler, before anything
//! runs, and the fix is in the caller's configuration. A [`StoreError`] comes
//! back from a store at run time, and [`StoreError::is_temporary`] tells the
//! scheduler whether to retry the same request with the same token.

use std::time::Duration;

/// A boxed error, the `source` of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Something in the configuration of a schedule, job or scheduler is wrong.
///
/// Every variant names the thing and says how to fix it. These are returned
/// while building, never at fire time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A job name is not 1–64 characters of `[A-Za-z0-9_-]`.
    #[error("invalid job name {name:?}: {reason}")]
    InvalidJobName {
        /// The name as given (cut to 80 characters).
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Two jobs of one scheduler have the same name.
    #[error("job {name:?} is defined twice; job names must be unique within a scheduler")]
    DuplicateJob {
        /// The repeated name.
        name: String,
    },

    /// A cron expression does not parse or never fires.
    #[error("invalid cron expression {expr:?}: {}{reason}", field.map(|f| format!("the {f} field is wrong: ")).unwrap_or_default())]
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// The field at fault, when it can be told (`minute`, `hour`, …).
        field: Option<&'static str>,
        /// What is wrong.
        reason: String,
    },

    /// A time zone is not a known IANA name.
    #[error("unknown time zone {zone:?}: use an IANA name such as \"Europe/Athens\" or \"UTC\"")]
    UnknownTimeZone {
        /// The zone as given.
        zone: String,
    },

    /// A duration that must be positive is zero.
    #[error("{option} must be longer than zero")]
    ZeroDuration {
        /// The option, e.g. `lease` or `interval`.
        option: &'static str,
    },

    /// A duration is out of the range the option accepts.
    #[error("{option} is out of range: {reason}")]
    OutOfRange {
        /// The option.
        option: &'static str,
        /// What the range is.
        reason: String,
    },

    /// The heartbeat is not shorter than the lease.
    #[error(
        "heartbeat ({heartbeat:?}) must be shorter than lease ({lease:?}), or the lease runs out between two heartbeats; a third of the lease is a good heartbeat"
    )]
    HeartbeatNotShorterThanLease {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },

    /// The heartbeat and the stop grace leave no lease to renew in.
    #[error(
        "heartbeat ({heartbeat:?}) plus stop_grace ({stop_grace:?}) must be shorter than lease ({lease:?}): a runner gives its run up stop_grace before the lease could end, and must have a heartbeat to renew before that; lengthen the lease or shorten the other two"
    )]
    StopGraceTooLong {
        /// How long a cancelled handler may take to stop.
        stop_grace: Duration,
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },

    /// `max_attempts` is zero.
    #[error("max_attempts must be at least 1 (1 means no takeover)")]
    ZeroMaxAttempts,

    /// An instance id is empty, too long or has spaces or control characters.
    #[error("invalid instance id {id:?}: use 1 to 128 printable ASCII characters without spaces")]
    InvalidInstanceId {
        /// The id as given.
        id: String,
    },

    /// An option that only a lease store can honour was set on a claim-only store.
    #[error(
        "the `{backend}` store is claim-only and cannot honour `{option}`: it can only tell who was first, not keep a lease; use a lease store (one that implements `LeaseStore`) or remove the option"
    )]
    UnsupportedOption {
        /// The option, e.g. `overlap`.
        option: &'static str,
        /// The backend's name.
        backend: &'static str,
    },

    /// A claim-only store forgets runs sooner than a late instance could ask about them.
    #[error(
        "the `{backend}` store remembers a run for {memory:?}, but job {job:?} accepts claims up to {max_late:?} late (+{margin:?} for clock skew): a late instance could win the run a second time; lengthen the store's memory or shorten max_late"
    )]
    MemoryTooShort {
        /// The backend's name.
        backend: &'static str,
        /// The job.
        job: String,
        /// How long the store remembers a run.
        memory: Duration,
        /// The job's late window.
        max_late: Duration,
        /// The skew margin added to it.
        margin: Duration,
    },
}

/// Which kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or did not answer in time. Temporary:
    /// the same request, with the same token, may be sent again.
    Unavailable,
    /// The configuration or schema is wrong (bad credentials, a missing
    /// table, a key of the wrong type). Retrying will not help.
    Invalid,
    /// The store answered something we did not expect.
    Protocol,
}

/// An error from a store operation.
///
/// Backends build these with [`StoreError::unavailable`], [`StoreError::invalid`]
/// and [`StoreError::protocol`]. Messages must never contain a password.
#[derive(Debug, thiserror::Error)]
#[error("{backend}: {}: {message}", match kind {
    StoreErrorKind::Unavailable => "store unavailable",
    StoreErrorKind::Invalid => "invalid store configuration",
    StoreErrorKind::Protocol => "unexpected answer from store",
})]
pub struct StoreError {
    kind: StoreErrorKind,
    backend: &'static str,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl StoreError {
    fn new(kind: StoreErrorKind, backend: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// The store could not be reached or did not answer: retry with the same token.
    pub fn unavailable(backend: &'static str, message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unavailable, backend, message)
    }

    /// The configuration or schema is wrong; retrying will not help.
    pub fn invalid(backend: &'static str, message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Invalid, backend, message)
    }

    /// The store answered something unexpected.
    pub fn protocol(backend: &'static str, message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Protocol, backend, message)
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// A copy of this error for another of the calls it failed together
    /// (a group of calls sent as one): the same kind and backend, the
    /// message after `doing` (which names that call), and no source (a
    /// source cannot be copied).
    pub fn copied(&self, doing: &str) -> Self {
        Self::new(
            self.kind,
            self.backend,
            format!("{doing}: {}", self.message),
        )
    }

    /// Which kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The backend that failed.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The message, without the backend and kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether sending the same request again may succeed.
    pub fn is_temporary(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_say_what_and_whether_to_retry() {
        let e = StoreError::unavailable("memory", "connection refused");
        assert!(e.is_temporary());
        assert_eq!(
            e.to_string(),
            "memory: store unavailable: connection refused"
        );
        assert!(!StoreError::invalid("pg", "no such table").is_temporary());
    }

    #[test]
    fn a_copied_error_keeps_its_kind_and_names_its_own_call() {
        let e = StoreError::unavailable("pg", "connection reset").with_source(std::fmt::Error);
        let copy = e.copied("recording the end of a@1");
        assert_eq!(copy.kind(), StoreErrorKind::Unavailable);
        assert_eq!(copy.backend(), "pg");
        assert_eq!(copy.message(), "recording the end of a@1: connection reset");
        assert!(std::error::Error::source(&copy).is_none());
        let copy = StoreError::invalid("pg", "bad").copied("x");
        assert!(!copy.is_temporary() && copy.kind() == StoreErrorKind::Invalid);
    }

    #[test]
    fn cron_error_names_the_field() {
        let e = ConfigError::InvalidCron {
            expr: "61 * * * *".into(),
            field: Some("minute"),
            reason: "61 is out of range 0-59".into(),
        };
        assert_eq!(
            e.to_string(),
            "invalid cron expression \"61 * * * *\": the minute field is wrong: 61 is out of range 0-59"
        );
    }
}
