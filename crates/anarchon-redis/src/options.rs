//! Connection options and the key prefix.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{Clock, SystemClock};

use crate::error::RedisStoreError;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// The prefix of every key a store writes, validated: 1 to 64 characters of
/// `[A-Za-z0-9_.:-]`. The default is `cron`.
///
/// It becomes part of each job's hash tag, `{<prefix>:<job>}`, so braces,
/// spaces, glob characters and anything else that would change which keys
/// the tag covers are refused. Job names cannot contain `:`, so no two
/// (prefix, job) pairs share a tag.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Validates `prefix`.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::InvalidPrefix`] if it is empty, longer than
    /// [`MAX_PREFIX_LEN`] or contains a character outside `[A-Za-z0-9_.:-]`.
    pub fn new(prefix: &str) -> Result<Self, RedisStoreError> {
        let invalid = |reason: String| RedisStoreError::InvalidPrefix {
            prefix: prefix.chars().take(80).collect(),
            reason,
        };
        if prefix.is_empty() {
            return Err(invalid("it is empty".into()));
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(invalid(format!(
                "it is {} bytes long; the limit is {MAX_PREFIX_LEN}",
                prefix.len()
            )));
        }
        if let Some(bad) = prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
        {
            return Err(invalid(format!(
                "it contains {bad:?}; use only letters, digits, '_', '.', ':' and '-'"
            )));
        }
        Ok(Self(prefix.to_owned()))
    }

    /// The prefix as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self("cron".to_owned())
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// What a store does at start-up when Redis may evict keys
/// (`maxmemory-policy` other than `noeviction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionCheck {
    /// Log a warning and go on (the default). The finding is on
    /// [`ServerInfo::eviction`](crate::ServerInfo::eviction).
    #[default]
    Warn,
    /// Refuse to start unless the policy is `noeviction`. A server that does
    /// not let us read the policy (managed Redis) is still accepted, with a
    /// warning.
    Refuse,
}

/// How to reach Redis, and the options every strategy shares.
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) url: String,
    pub(crate) prefix: KeyPrefix,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) eviction: EvictionCheck,
    pub(crate) tls_ca_file: Option<PathBuf>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl RedisOptions {
    /// The default time allowed to open a connection.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default time allowed for an answer.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

    /// Options for the server at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://…` for TLS, which needs the crate's `tls` feature):
    /// prefix `cron`, 2 s to connect, 2 s for each answer, warn about
    /// eviction, the system's root certificates for TLS.
    ///
    /// The URL is read when a store connects: a URL that does not parse, or
    /// a TLS URL in a build without the `tls` feature, fails there.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: KeyPrefix::default(),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            eviction: EvictionCheck::Warn,
            tls_ca_file: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// The clock this process reads where a strategy computes something on
    /// the client side (default: the system clock). Only `idmp` does: it
    /// trims entries far older than its memory. No strategy decides who
    /// runs a slot with it; the lease strategy reads Redis's `TIME`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The key prefix (default `cron`).
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::InvalidPrefix`], see [`KeyPrefix::new`].
    pub fn prefix(mut self, prefix: &str) -> Result<Self, RedisStoreError> {
        self.prefix = KeyPrefix::new(prefix)?;
        Ok(self)
    }

    /// How long opening a connection may take before the call fails as
    /// unavailable.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one answer may take before the call fails as unavailable.
    /// Scripts run inside Redis, so this also bounds a claim's script.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// What to do when the server may evict keys.
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction = check;
        self
    }

    /// Trust the certificate authorities in the PEM file at `path` — and
    /// only those — for the server's certificate, instead of the system's
    /// root certificates: for a server whose certificate a private
    /// authority signed. Needs a `rediss://` URL and the crate's `tls`
    /// feature.
    ///
    /// The file is read each time a store connects (so it can be replaced
    /// between restarts); the server's certificate must still name the
    /// URL's host.
    ///
    /// # Errors
    ///
    /// None here. When a store connects:
    /// [`RedisStoreError::CaFile`] (naming the file) if it cannot be read or
    /// holds no usable certificate, [`RedisStoreError::InvalidUrl`] if the
    /// URL is not a TLS URL, [`RedisStoreError::TlsNotEnabled`] in a build
    /// without the `tls` feature.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The certificate authority file set with
    /// [`tls_ca_file`](Self::tls_ca_file), if any.
    pub fn tls_ca_path(&self) -> Option<&Path> {
        self.tls_ca_file.as_deref()
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("eviction", &self.eviction)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish_non_exhaustive()
    }
}

/// `url` with the password (user-info, or a `password`/`pass` query value) replaced by `***`.
pub fn redact(url: &str) -> String {
    anarchon_core::url::redact(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_validated() {
        for ok in ["cron", "a", "my-app:prod.v2_x", &"p".repeat(64)] {
            assert_eq!(KeyPrefix::new(ok).expect("valid").as_str(), ok);
        }
        for bad in [
            "",
            "a{b",
            "}",
            "a b",
            "a*",
            "a?",
            "[a]",
            "é",
            &"p".repeat(65),
        ] {
            let err = KeyPrefix::new(bad).expect_err(bad);
            assert!(
                matches!(err, RedisStoreError::InvalidPrefix { .. }),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(KeyPrefix::default().as_str(), "cron");
    }

    #[test]
    fn passwords_are_redacted() {
        for (url, want) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://user:s3cret@h", "redis://user:***@h"),
            ("redis://s3cret@h", "redis://***@h"),
            ("rediss://:s3cret@h:6380/0", "rediss://:***@h:6380/0"),
            ("rediss://s3cret@h", "rediss://***@h"),
            ("valkeys://user:s3cret@h", "valkeys://user:***@h"),
            (
                "redis+unix:///tmp/r.sock?pass=s3cret&db=1",
                "redis+unix:///tmp/r.sock?pass=***&db=1",
            ),
        ] {
            assert_eq!(redact(url), want);
        }
        let opts = RedisOptions::new("redis://user:s3cret@h:6379");
        let shown = format!("{opts:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("user:***@h:6379"), "{shown}");
        let opts = RedisOptions::new("rediss://user:s3cret@h:6380/1").tls_ca_file("/etc/ca.pem");
        let shown = format!("{opts:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("rediss://user:***@h:6380/1"), "{shown}");
        assert!(shown.contains("/etc/ca.pem"), "{shown}");
    }
}
