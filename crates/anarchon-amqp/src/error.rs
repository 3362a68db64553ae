//! What can go wrong opening the store or talking to RabbitMQ.
//!
//! No message here ever holds a password: URLs are shown redacted, and
//! lapin's own URL errors (which repeat the whole URL) are never passed on.

use std::path::PathBuf;
use std::time::Duration;

use anarchon_core::StoreError;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

use crate::BACKEND;
use crate::options::{MAX_SLOT_TTL, MIN_SLOT_TTL};

/// An error opening an [`AmqpStore`](crate::AmqpStore) or from one of its
/// calls.
///
/// Calls through [`ClaimStore`](anarchon_core::ClaimStore) return the
/// core's [`StoreError`]; this type converts into one with `?`, keeping its
/// message and whether it is temporary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not an AMQP URL this store can use.
    #[error("invalid RabbitMQ URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The queue-name prefix is not usable in queue names.
    #[error(
        "invalid queue-name prefix {prefix:?}: {reason}; use up to {max} bytes of [A-Za-z0-9_-] segments joined by '.', not starting with \"amq\"",
        max = crate::names::MAX_PREFIX_LEN
    )]
    InvalidPrefix {
        /// The prefix as given (cut to 120 characters).
        prefix: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The slot TTL is too short to serve any job, or too long.
    #[error(
        "slot_ttl {slot_ttl:?} is out of range: it must be between {MIN_SLOT_TTL:?} and {MAX_SLOT_TTL:?}; it is how long RabbitMQ remembers a run, and each job needs it to exceed its max_late by the 10 s skew margin"
    )]
    SlotTtlOutOfRange {
        /// The slot TTL given.
        slot_ttl: Duration,
    },

    /// Another option is out of range.
    #[error("invalid RabbitMQ store option `{option}`: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What the range is.
        reason: String,
    },

    /// The URL or the options ask for TLS (an `amqps://` URL, or
    /// [`AmqpOptions::with_tls_ca_file`](crate::AmqpOptions::with_tls_ca_file)), but
    /// the crate was built without its `tls` feature.
    ///
    /// (Without the feature, the client would open an `amqps://` URL as
    /// plain TCP and send the password in the clear; the store refuses
    /// instead.)
    #[error(
        "{requested_by} asks for TLS, but anarchon-amqp was built without TLS support: enable the `tls` feature of anarchon-amqp (`amqp-tls` of anarchon)"
    )]
    TlsNotEnabled {
        /// What asked for TLS, e.g. `the URL scheme amqps://`.
        requested_by: String,
    },

    /// The certificate authority file given with
    /// [`AmqpOptions::with_tls_ca_file`](crate::AmqpOptions::with_tls_ca_file) cannot
    /// be read or holds no usable certificate.
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

    /// The TLS handshake with the broker failed: most often its certificate
    /// is not signed by an authority the store trusts, or does not name the
    /// URL's host, or the port does not speak TLS. Not temporary.
    #[error("the TLS handshake with RabbitMQ at {url} failed: {detail}")]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// What TLS reported, and what to check.
        detail: String,
        /// The client's error.
        #[source]
        source: Box<lapin::Error>,
    },

    /// The broker could not be reached at all.
    #[error("cannot reach RabbitMQ at {url}: {source}")]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// What the connection attempt said.
        #[source]
        source: lapin::Error,
    },

    /// The broker refused the user name or password.
    #[error(
        "RabbitMQ at {url} refused the login of user {user:?}: wrong user name or password (ACCESS_REFUSED)"
    )]
    LoginRefused {
        /// The URL, password redacted.
        url: String,
        /// The user name that was refused.
        user: String,
    },

    /// The vhost does not exist, or the user may not use it.
    #[error(
        "RabbitMQ at {url} did not let user {user:?} into vhost {vhost:?}: it does not exist or the user has no permissions on it ({message})"
    )]
    VhostNotAllowed {
        /// The URL, password redacted.
        url: String,
        /// The user.
        user: String,
        /// The vhost.
        vhost: String,
        /// The broker's message.
        message: String,
    },

    /// The user may not declare the store's queues or publish to them.
    #[error(
        "RabbitMQ refused access to {resource}: {message}; the user needs configure permission on queues named after the store's prefix (`^<prefix>\\.`) and write permission on the default exchange (`amq.default`)"
    )]
    AccessRefused {
        /// What was refused: a queue, or the default exchange.
        resource: String,
        /// The broker's message.
        message: String,
    },

    /// A queue of the store's name exists with other arguments.
    #[error(
        "the queue {queue:?} already exists with other arguments ({message}); another program, or an anarchon instance with another slot_ttl, declared it: give every instance the same slot_ttl, or use another prefix"
    )]
    QueueMismatch {
        /// The queue.
        queue: String,
        /// The broker's message, naming the argument that differs.
        message: String,
    },

    /// The broker did not answer in time.
    #[error("RabbitMQ at {url} did not answer within {after:?} while {doing}")]
    Timeout {
        /// The URL, password redacted.
        url: String,
        /// What the store was doing.
        doing: &'static str,
        /// The time limit.
        after: Duration,
    },

    /// Any other failure from the broker or the client.
    #[error("RabbitMQ at {url}: {doing} failed: {source}")]
    Amqp {
        /// The URL, password redacted.
        url: String,
        /// What the store was doing.
        doing: &'static str,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
}

/// How an error counts for the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The connection or the broker had a moment: the same request may
    /// succeed later.
    Unavailable,
    /// Configuration, permissions, names: retrying will not help.
    Invalid,
    /// Something we did not expect.
    Protocol,
}

impl Error {
    /// Whether sending the same request again later may succeed.
    pub fn is_temporary(&self) -> bool {
        self.class() == Class::Unavailable
    }

    pub(crate) fn class(&self) -> Class {
        match self {
            Error::Unreachable { .. } | Error::Timeout { .. } => Class::Unavailable,
            Error::Amqp { source, .. } => classify(source),
            Error::InvalidUrl { .. }
            | Error::InvalidPrefix { .. }
            | Error::SlotTtlOutOfRange { .. }
            | Error::InvalidOption { .. }
            | Error::TlsNotEnabled { .. }
            | Error::CaFile { .. }
            | Error::Tls { .. }
            | Error::LoginRefused { .. }
            | Error::VhostNotAllowed { .. }
            | Error::AccessRefused { .. }
            | Error::QueueMismatch { .. } => Class::Invalid,
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e.class() {
            Class::Unavailable => StoreError::unavailable(BACKEND, message),
            Class::Invalid => StoreError::invalid(BACKEND, message),
            Class::Protocol => StoreError::protocol(BACKEND, message),
        }
        .with_source(e)
    }
}

/// The AMQP error the broker sent, if this is one.
pub(crate) fn amqp_kind(e: &lapin::Error) -> Option<&AMQPErrorKind> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp.kind()),
        _ => None,
    }
}

/// The broker's text of an AMQP error, or the client's description.
pub(crate) fn broker_message(e: &lapin::Error) -> String {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
        _ => e.to_string(),
    }
}

/// Whether `e` means the connection itself is gone or unusable (as opposed
/// to one channel being closed by the broker).
pub(crate) fn breaks_connection(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => matches!(amqp.kind(), AMQPErrorKind::Hard(_)),
        lapin::ErrorKind::InvalidChannelState(..) => false,
        _ => true,
    }
}

/// What RabbitMQ says (NOT_FOUND, on a channel) of a durable queue whose
/// home node, or whose own process, is down: "home node 'rabbit@h' of
/// durable queue 'q' in vhost '/' is down or inaccessible".
const QUEUE_HOME_DOWN: &str = "is down or inaccessible";

/// Whether the broker refused `e`'s request because it lists the durable
/// queue but cannot reach the process behind it ("home node … is down or
/// inaccessible").
///
/// A RabbitMQ 3.x broker also answers this, for a moment, to a declaration
/// that races another connection's first declaration of the same queue: it
/// looks the queue up in its in-memory table and then in its table of
/// durable queues, outside a transaction, and between the two reads the
/// other declaration's commit can show in the second table only.
pub(crate) fn is_queue_home_down(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
                && amqp.get_message().as_str().contains(QUEUE_HOME_DOWN)
        }
        _ => false,
    }
}

pub(crate) fn classify(e: &lapin::Error) -> Class {
    use lapin::ErrorKind as K;
    match e.kind() {
        K::IOError(_)
        | K::InvalidChannel(_)
        | K::InvalidChannelState(..)
        | K::InvalidConnectionState(_)
        | K::MissingHeartbeatError
        | K::ChannelsLimitReached => Class::Unavailable,
        K::ProtocolError(amqp) => match amqp.kind() {
            // A durable queue whose process has gone while the broker
            // still lists it (seen on a broker deleting thousands of
            // expired gate queues, and for a moment while another
            // connection declares the queue for the first time): the broker
            // recovers it or drops it in a moment, so the same claim may go
            // through then. A claim refused so was not taken: its
            // declaration failed before any publish.
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) if is_queue_home_down(e) => {
                Class::Unavailable
            }
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::NOTFOUND
                | AMQPSoftError::RESOURCELOCKED
                | AMQPSoftError::PRECONDITIONFAILED
                | AMQPSoftError::CONTENTTOOLARGE,
            ) => Class::Invalid,
            AMQPErrorKind::Hard(
                AMQPHardError::CONNECTIONFORCED
                | AMQPHardError::RESOURCEERROR
                | AMQPHardError::INTERNALERROR,
            ) => Class::Unavailable,
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED | AMQPHardError::INVALIDPATH) => {
                Class::Invalid
            }
            _ => Class::Protocol,
        },
        K::AuthProviderError(_) | K::InvalidProtocolVersion(_) => Class::Invalid,
        _ => Class::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_keep_the_message_and_the_kind() {
        let e = Error::Timeout {
            url: "amqp://u:***@h/%2f".into(),
            doing: "publishing a claim",
            after: Duration::from_secs(5),
        };
        let store: StoreError = e.into();
        assert!(store.is_temporary());
        assert_eq!(store.backend(), BACKEND);
        assert!(store.message().contains("publishing a claim"));
        let store: StoreError = Error::QueueMismatch {
            queue: "cron.sync.slot.1".into(),
            message: "inequivalent arg 'x-expires'".into(),
        }
        .into();
        assert!(!store.is_temporary());
        assert!(store.message().contains("cron.sync.slot.1"));
    }

    fn refused(kind: AMQPSoftError, message: &str) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(lapin::protocol::AMQPError::new(
            AMQPErrorKind::Soft(kind),
            message.into(),
        ))
        .into()
    }

    #[test]
    fn a_queue_whose_home_is_down_is_a_moment_of_the_broker_and_a_missing_one_is_not() {
        let down = refused(
            AMQPSoftError::NOTFOUND,
            "NOT_FOUND - home node 'rabbit@localhost' of durable queue 'cron.sync.slot.1' in vhost '/' is down or inaccessible",
        );
        assert_eq!(classify(&down), Class::Unavailable);
        assert!(is_queue_home_down(&down));
        let missing = refused(
            AMQPSoftError::NOTFOUND,
            "NOT_FOUND - no queue 'cron.sync.slot.1' in vhost '/'",
        );
        assert_eq!(classify(&missing), Class::Invalid);
        assert!(!is_queue_home_down(&missing));
    }
}
