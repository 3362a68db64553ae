//! How to reach RabbitMQ and how to name and keep the gate queues.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lapin::uri::AMQPUri;

use crate::error::Error;
use crate::names;
use anarchon_core::url::{percent_decode, redact};

/// The queue-name prefix unless told otherwise: gate queues are named
/// `anarchon.<job>.slot.<slot>`.
pub const DEFAULT_PREFIX: &str = "anarchon";
/// How long a gate queue outlives its last claim unless told otherwise.
///
/// With the default `max_late` of 60 s a job needs at least 70 s; five
/// minutes leaves room for `max_late` up to 4 min 50 s.
pub const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(5 * 60);
/// The shortest slot TTL accepted.
///
/// The scheduler refuses a job whose `max_late` plus its 10 s skew margin is
/// longer than the slot TTL, so anything shorter than this could not serve
/// any useful job.
pub const MIN_SLOT_TTL: Duration = Duration::from_secs(20);
/// The longest slot TTL accepted (30 days). RabbitMQ keeps queue expiry in
/// an Erlang timer; we stay far below its limits.
pub const MAX_SLOT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long one claim may take in all (connecting, declaring, publishing,
/// waiting for the confirm) unless told otherwise. Kept below the
/// scheduler's own 10 s limit per store call, so the store answers first.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many channels one store opens at most unless told otherwise: the
/// number of claims it sends at the same time.
pub const DEFAULT_MAX_CHANNELS: usize = 16;

/// Query parameters of a store URL that lapin reads itself.
const LAPIN_PARAMETERS: [&str; 5] = [
    "frame_max",
    "channel_max",
    "heartbeat",
    "connection_timeout",
    "auth_mechanism",
];

/// How to open an [`AmqpStore`](crate::AmqpStore).
///
/// `Debug` never shows the password.
///
/// ```
/// use std::time::Duration;
/// use anarchon_amqp::AmqpOptions;
///
/// let options = AmqpOptions::new("amqp://cron:s3cret@rabbit.internal:5672/%2f")
///     .with_prefix("billing.cron")
///     .with_slot_ttl(Duration::from_secs(600));
/// assert!(!format!("{options:?}").contains("s3cret"));
///
/// let from_url = AmqpOptions::from_url(
///     "amqp://cron:s3cret@rabbit.internal/%2f?prefix=billing&slot_ttl_ms=600000",
/// )?;
/// assert_eq!(from_url.prefix(), "billing");
/// assert_eq!(from_url.slot_ttl(), Duration::from_secs(600));
/// # Ok::<(), anarchon_amqp::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpOptions {
    url: String,
    prefix: String,
    slot_ttl: Duration,
    timeout: Duration,
    max_channels: usize,
    connection_name: String,
    tls_ca_file: Option<PathBuf>,
}

impl AmqpOptions {
    /// Options for the broker at `url`
    /// (`amqp://user:password@host:port/vhost`; the vhost `/` is written
    /// `%2f`). Nothing is checked until the store connects.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            slot_ttl: DEFAULT_SLOT_TTL,
            timeout: DEFAULT_TIMEOUT,
            max_channels: DEFAULT_MAX_CHANNELS,
            connection_name: "anarchon".to_owned(),
            tls_ca_file: None,
        }
    }

    /// Reads a store URL: an AMQP URL whose query may also carry `prefix`,
    /// `slot_ttl_ms`, `timeout_ms` and `tls_ca_file` (a path, `%`-escaped
    /// where needed; see [`Self::with_tls_ca_file`]); lapin's own parameters
    /// `heartbeat`, `frame_max`, `channel_max`, `connection_timeout` and
    /// `auth_mechanism` pass through.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for an unknown parameter or a value that is not
    /// a number; the options' own errors as [`Self::validate`] reports them.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact(url),
            reason: anarchon_core::url::unreadable_reason(url, &reason),
        };
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let mut kept = Vec::new();
        let mut options = Self::new(base);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let millis = || {
                value
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| invalid(format!("{key} must be a whole number of milliseconds")))
            };
            match key {
                "prefix" => options.prefix = value.to_owned(),
                "slot_ttl_ms" => options.slot_ttl = millis()?,
                "timeout_ms" => options.timeout = millis()?,
                "tls_ca_file" => {
                    let path = percent_decode(value)
                        .ok_or_else(|| invalid("tls_ca_file has an invalid %-escape".into()))?;
                    options.tls_ca_file = Some(PathBuf::from(path));
                }
                k if LAPIN_PARAMETERS.contains(&k) => kept.push(pair),
                other => {
                    return Err(invalid(format!(
                        "unknown parameter {other:?}; anarchon reads prefix, slot_ttl_ms, timeout_ms and tls_ca_file, lapin reads {}",
                        LAPIN_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        options.url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        options.validate()?;
        Ok(options)
    }

    /// The queue-name prefix (default `anarchon`): one or more segments of
    /// `[A-Za-z0-9_-]` joined by `.`, at most [`names::MAX_PREFIX_LEN`]
    /// bytes, not `amq` or `amq.…` (RabbitMQ reserves those names).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a gate queue lives after the last claim that touched it
    /// (its `x-expires`, default 5 min): how long the store remembers a run.
    /// Between [`MIN_SLOT_TTL`] and [`MAX_SLOT_TTL`].
    ///
    /// Every instance of a fleet must use the same value: a gate queue
    /// declared with another TTL is refused by RabbitMQ.
    pub fn with_slot_ttl(mut self, slot_ttl: Duration) -> Self {
        self.slot_ttl = slot_ttl;
        self
    }

    /// How long one claim may take in all (default 5 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many claims the store sends at the same time, one channel each
    /// (default 16).
    pub fn with_max_channels(mut self, max_channels: usize) -> Self {
        self.max_channels = max_channels;
        self
    }

    /// The connection name RabbitMQ shows in its management UI (default
    /// `anarchon`).
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Trust the certificate authorities in the PEM file at `path` for the
    /// broker's certificate, in addition to the system's root certificates:
    /// for a broker whose certificate a private authority signed. Needs an
    /// `amqps://` URL and the crate's `tls` feature.
    ///
    /// The file is read when the options are checked and when the store
    /// connects (the store keeps its certificates for later reconnects).
    /// The broker's certificate must still name the URL's host.
    ///
    /// Errors are reported by [`Self::validate`] and
    /// [`AmqpStore::connect`](crate::AmqpStore::connect):
    /// [`Error::CaFile`] (naming the file) if it cannot be read or holds no
    /// usable certificate, [`Error::InvalidOption`] with an `amqp://` URL,
    /// [`Error::TlsNotEnabled`] in a build without the `tls` feature.
    pub fn with_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// `host:port/vhost` as the URL writes them, for messages: the URL
    /// without its scheme, user info and query. Never the password.
    pub fn server(&self) -> String {
        server_of(&redact(&self.url))
    }

    /// The queue-name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The slot TTL.
    pub fn slot_ttl(&self) -> Duration {
        self.slot_ttl
    }

    /// The time limit of one claim.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The most channels the store opens.
    pub fn max_channels(&self) -> usize {
        self.max_channels
    }

    /// The certificate authority file set with
    /// [`with_tls_ca_file`](Self::with_tls_ca_file), if any.
    pub fn tls_ca_file(&self) -> Option<&Path> {
        self.tls_ca_file.as_deref()
    }

    /// Whether the URL asks for TLS (`amqps://`).
    pub fn uses_tls(&self) -> bool {
        self.url
            .split_once("://")
            .is_some_and(|(scheme, _)| scheme == "amqps")
    }

    /// Checks every option without touching the broker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`], [`Error::InvalidPrefix`],
    /// [`Error::SlotTtlOutOfRange`], [`Error::InvalidOption`];
    /// [`Error::TlsNotEnabled`] for an `amqps://` URL or a CA file in a
    /// build without the `tls` feature; [`Error::CaFile`] for a CA file
    /// that cannot be read or holds no usable certificate.
    pub fn validate(&self) -> Result<(), Error> {
        self.parse_url()?;
        names::validate_prefix(&self.prefix)?;
        if self.slot_ttl < MIN_SLOT_TTL || self.slot_ttl > MAX_SLOT_TTL {
            return Err(Error::SlotTtlOutOfRange {
                slot_ttl: self.slot_ttl,
            });
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidOption {
                option: "timeout",
                reason: "it must be longer than zero".into(),
            });
        }
        if self.max_channels == 0 || self.max_channels > 1024 {
            return Err(Error::InvalidOption {
                option: "max_channels",
                reason: "it must be between 1 and 1024".into(),
            });
        }
        self.tls_certificates()?;
        Ok(())
    }

    /// The PEM text of the extra certificate authorities to trust, if a
    /// file is set; checks that TLS is asked for consistently and that this
    /// build can do it.
    pub(crate) fn tls_certificates(&self) -> Result<Option<String>, Error> {
        #[cfg(not(feature = "tls"))]
        {
            if self.uses_tls() {
                return Err(Error::TlsNotEnabled {
                    requested_by: format!("the URL {}", self.redacted_url()),
                });
            }
            if self.tls_ca_file.is_some() {
                return Err(Error::TlsNotEnabled {
                    requested_by: "the option tls_ca_file".to_owned(),
                });
            }
            Ok(None)
        }
        #[cfg(feature = "tls")]
        {
            let Some(path) = &self.tls_ca_file else {
                return Ok(None);
            };
            if !self.uses_tls() {
                return Err(Error::InvalidOption {
                    option: "tls_ca_file",
                    reason: format!(
                        "a certificate authority file is set, but {} does not use TLS: use amqps://",
                        self.redacted_url()
                    ),
                });
            }
            crate::tls::read_ca_file(path).map(Some)
        }
    }

    /// The URL as lapin reads it.
    pub(crate) fn parse_url(&self) -> Result<AMQPUri, Error> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: self.redacted_url(),
            reason: anarchon_core::url::unreadable_reason(&self.url, reason),
        };
        if let Some(hint) = anarchon_core::url::ambiguous_user_info(&self.url) {
            return Err(invalid(&hint));
        }
        let scheme = self.url.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("amqp" | "amqps")) {
            return Err(invalid(
                "it must start with amqp:// (or amqps://), e.g. amqp://guest:guest@127.0.0.1:5672/%2f",
            ));
        }
        if authority(&self.url).contains('[') {
            // lapin's URL reader turns an IPv6 literal into "localhost".
            return Err(invalid(
                "IPv6 address literals are not supported; use a host name",
            ));
        }
        // lapin's own parse error repeats the whole URL, password included:
        // never show it.
        self.url.parse::<AMQPUri>().map_err(|_| {
            invalid("it is not a valid AMQP URL (amqp://user:password@host:port/vhost)")
        })
    }

    pub(crate) fn connection_name_value(&self) -> &str {
        &self.connection_name
    }
}

impl fmt::Debug for AmqpOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpOptions")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("slot_ttl", &self.slot_ttl)
            .field("timeout", &self.timeout)
            .field("max_channels", &self.max_channels)
            .field("connection_name", &self.connection_name)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

/// The part of a redacted `url` after the scheme and the user info, up to
/// the query: `host:port/path`.
pub(crate) fn server_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    // Up to the last `@`, as `redact` reads it: a password may hold `/`.
    rest.rsplit_once('@')
        .map_or(rest, |(_, host)| host)
        .to_owned()
}

/// The part of a URL between `://` and the path.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_errors_never_show_the_password() {
        let options = AmqpOptions::new("amqp://app:hunter2@h:5672/%2f");
        let shown = format!("{options:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("amqp://app:***@h:5672/%2f"), "{shown}");
        for bad in [
            "amqp://app:hunter2@h:99999/%2f",
            "http://app:hunter2@h/",
            "amqp://app:hunter2@h/%2f?bogus=1",
            "amqp://app:hunter2@[::1]/%2f",
            "app:hunter2@h:5672/%2f",
        ] {
            let err = AmqpOptions::from_url(bad).expect_err(bad).to_string();
            assert!(!err.contains("hunter2"), "{err}");
            assert!(err.contains("app:***@"), "{err}");
        }
    }

    #[test]
    fn from_url_reads_our_parameters_and_passes_lapins_on() {
        let options = AmqpOptions::from_url(
            "amqp://u:p@h/%2f?heartbeat=10&prefix=a.b&slot_ttl_ms=90000&timeout_ms=2000",
        )
        .expect("valid");
        assert_eq!(options.prefix(), "a.b");
        assert_eq!(options.slot_ttl(), Duration::from_secs(90));
        assert_eq!(options.timeout(), Duration::from_secs(2));
        let uri = options.parse_url().expect("lapin reads it");
        assert_eq!(uri.query.heartbeat, Some(10));
        assert_eq!(uri.vhost, "/");
        assert!(AmqpOptions::from_url("amqp://h/%2f?slot_ttl_ms=soon").is_err());
    }

    #[test]
    fn slot_ttl_has_a_floor_and_a_ceiling() {
        let at = |ttl| {
            AmqpOptions::new("amqp://h/%2f")
                .with_slot_ttl(ttl)
                .validate()
        };
        assert!(at(MIN_SLOT_TTL).is_ok());
        assert!(at(MAX_SLOT_TTL).is_ok());
        for bad in [
            Duration::ZERO,
            MIN_SLOT_TTL - Duration::from_millis(1),
            MAX_SLOT_TTL + Duration::from_millis(1),
        ] {
            let err = at(bad).expect_err("out of range");
            assert!(matches!(err, Error::SlotTtlOutOfRange { .. }), "{err}");
            assert!(err.to_string().contains("20s"), "{err}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_needs_the_tls_feature() {
        // lapin without a TLS backend would open amqps:// as plain TCP.
        for options in [
            AmqpOptions::new("amqps://app:hunter2@h/%2f"),
            AmqpOptions::new("amqp://app:hunter2@h/%2f").with_tls_ca_file("/etc/ca.pem"),
        ] {
            let err = options.validate().expect_err("no TLS in this build");
            assert!(matches!(err, Error::TlsNotEnabled { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains("`tls` feature"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(!err.is_temporary());
        }
        let err = AmqpOptions::from_url("amqps://app:hunter2@h/%2f").expect_err("refused");
        assert!(err.to_string().contains("amqps://app:***@h/%2f"), "{err}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_urls_are_accepted_and_a_ca_file_needs_one() {
        AmqpOptions::new("amqps://app:hunter2@h/%2f")
            .validate()
            .expect("amqps:// with the tls feature");
        let err = AmqpOptions::new("amqp://app:hunter2@h/%2f")
            .with_tls_ca_file("/etc/ca.pem")
            .validate()
            .expect_err("a CA file without TLS");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    option: "tls_ca_file",
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("amqps://"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn from_url_reads_the_ca_file_path() {
        let path = std::env::temp_dir().join("anarchon amqp missing ca.pem");
        let url = format!(
            "amqps://u:p@h/%2f?tls_ca_file={}",
            path.display().to_string().replace(' ', "%20")
        );
        let err = AmqpOptions::from_url(&url).expect_err("missing file, or no TLS");
        if cfg!(feature = "tls") {
            assert!(matches!(err, Error::CaFile { .. }), "{err:?}");
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        } else {
            assert!(matches!(err, Error::TlsNotEnabled { .. }), "{err:?}");
        }
        assert!(AmqpOptions::from_url("amqps://u:p@h/%2f?tls_ca_file=%zz").is_err());
        let shown = format!(
            "{:?}",
            AmqpOptions::new("amqps://h/%2f").with_tls_ca_file("/etc/ca.pem")
        );
        assert!(shown.contains("/etc/ca.pem"), "{shown}");
    }

    #[test]
    fn other_options_are_checked() {
        let base = || AmqpOptions::new("amqp://h/%2f");
        assert!(base().with_timeout(Duration::ZERO).validate().is_err());
        assert!(base().with_max_channels(0).validate().is_err());
        assert!(base().with_prefix("amq.x").validate().is_err());
        assert!(base().validate().is_ok());
    }

    #[test]
    fn the_server_is_named_without_the_user_info() {
        let options = AmqpOptions::new("amqp://u:pa@ss@rabbit:5672/%2f?heartbeat=10");
        assert_eq!(options.server(), "rabbit:5672/%2f");
        assert_eq!(AmqpOptions::new("amqp://u:pa?ss@h/%2f").server(), "h/%2f");
        assert_eq!(AmqpOptions::new("amqps://h").server(), "h");
    }
}
