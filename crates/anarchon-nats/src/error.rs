//! What can go wrong opening a NATS store or talking to the server.
//!
//! No message here ever holds a password or token: URLs are shown redacted.

use std::path::PathBuf;
use std::time::Duration;

use anarchon_core::{BoxError, StoreError};

use crate::claim::{MAX_DUPLICATE_WINDOW, MIN_DUPLICATE_WINDOW};

/// An error opening a store of this crate, or from one of its calls.
///
/// Calls through [`ClaimStore`](anarchon_core::ClaimStore) return the
/// core's [`StoreError`]; this type converts into one with `?`, keeping its
/// message and whether it is temporary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not a NATS URL this crate can use.
    #[error("invalid NATS URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password or token redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The subject prefix is not usable in subjects.
    #[error(
        "invalid subject prefix {prefix:?}: {reason}; use up to {max} bytes of [A-Za-z0-9_-] segments joined by '.'",
        max = crate::options::MAX_PREFIX_LEN
    )]
    InvalidPrefix {
        /// The prefix as given (cut to 120 characters).
        prefix: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The stream name is not usable.
    #[error("invalid stream name {stream:?}: {reason}; use 1 to 128 characters of [A-Za-z0-9_-]")]
    InvalidStreamName {
        /// The name as given (cut to 140 characters).
        stream: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The duplicate window is too short to serve any job, or too long.
    #[error(
        "duplicate_window {window:?} is out of range: it must be between {MIN_DUPLICATE_WINDOW:?} and {MAX_DUPLICATE_WINDOW:?}; it is how long NATS remembers a run, and each job needs it to exceed its max_late by the 10 s skew margin"
    )]
    DuplicateWindowOutOfRange {
        /// The window given.
        window: Duration,
    },

    /// The KV bucket name is not usable.
    #[error(
        "invalid KV bucket name {bucket:?}: {reason}; use 1 to {max} characters of [A-Za-z0-9_-]",
        max = crate::lease::MAX_BUCKET_NAME_LEN
    )]
    InvalidBucketName {
        /// The name as given (cut to 140 characters).
        bucket: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A KV bucket of the store's name exists and does not fit.
    #[error(
        "the JetStream KV bucket {bucket:?} already exists but {reason}; another program or a differently configured anarchon made it: fix or delete that bucket, or give this store another bucket name"
    )]
    BucketMismatch {
        /// The bucket.
        bucket: String,
        /// What does not fit.
        reason: String,
    },

    /// Another option is out of range.
    #[error("invalid NATS store option `{option}`: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What the range is.
        reason: String,
    },

    /// The server could not be reached.
    #[error("cannot reach NATS at {url}: {source}")]
    Unreachable {
        /// The URL, redacted.
        url: String,
        /// What the client said.
        #[source]
        source: BoxError,
    },

    /// The server refused the credentials.
    #[error(
        "NATS at {url} refused the credentials (authorization violation): check the user name and password, or the token, in the URL"
    )]
    AuthorizationViolation {
        /// The URL, redacted.
        url: String,
    },

    /// The server (or this account) has no JetStream.
    #[error(
        "NATS at {url} has no JetStream for this account: start nats-server with JetStream on (`-js`, or `jetstream {{}}` in its configuration) and give the account JetStream limits"
    )]
    NoJetStream {
        /// The URL, redacted.
        url: String,
    },

    /// A stream of the store's name exists and does not fit.
    #[error(
        "the JetStream stream {stream:?} already exists but {reason}; another program or a differently configured anarchon made it: fix or delete that stream, or give this store another prefix or stream name"
    )]
    StreamMismatch {
        /// The stream.
        stream: String,
        /// What does not fit.
        reason: String,
    },

    /// Another stream already takes the store's subjects.
    #[error(
        "cannot create the JetStream stream {stream:?} for subjects {subject:?}: another stream already takes these subjects ({message}); use another prefix"
    )]
    SubjectsOverlap {
        /// The stream the store wanted.
        stream: String,
        /// Its subject filter.
        subject: String,
        /// The server's message.
        message: String,
    },

    /// The TLS handshake with the server failed: its certificate is not
    /// trusted, or it does not speak TLS where TLS was asked for.
    #[error("TLS with NATS at {url} failed: {reason}")]
    Tls {
        /// The URL, redacted.
        url: String,
        /// What failed, and what to check.
        reason: String,
        /// What the client said.
        #[source]
        source: BoxError,
    },

    /// The certificate authority file given with
    /// [`NatsOptions::with_tls_ca_file`](crate::NatsOptions::with_tls_ca_file)
    /// cannot be used.
    #[error("cannot use the TLS certificate authority file {}: {reason}", path.display())]
    TlsCaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The I/O error, when the file could not be read.
        #[source]
        source: Option<std::io::Error>,
    },

    /// The server did not answer in time.
    #[error("NATS at {url} did not answer within {after:?} while {doing}")]
    Timeout {
        /// The URL, redacted.
        url: String,
        /// What the store was doing.
        doing: &'static str,
        /// The time limit.
        after: Duration,
    },

    /// Any other failure from the server or the client.
    #[error("NATS at {url}: {doing} failed: {source}")]
    Nats {
        /// The URL, redacted.
        url: String,
        /// What the store was doing.
        doing: &'static str,
        /// Whether trying again may help (a connection problem).
        temporary: bool,
        /// The client's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether trying again later may succeed.
    pub fn is_temporary(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Timeout { .. } => true,
            Error::Nats { temporary, .. } => *temporary,
            _ => false,
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        if e.is_temporary() {
            StoreError::unavailable(crate::BACKEND, message).with_source(e)
        } else {
            StoreError::invalid(crate::BACKEND, message).with_source(e)
        }
    }
}
