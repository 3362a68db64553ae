//! How to reach NATS: the URL, its credentials and time limits. Shared by
//! every store in this crate.

use std::fmt;
use std::time::Duration;

use crate::error::Error;

/// How long one store call may wait for the server unless told otherwise.
/// Kept below the scheduler's own 10 s limit per store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take unless told otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest name prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 100;

/// How to connect to a NATS server with JetStream.
///
/// The URL may carry credentials: `nats://user:password@host:4222`, or a
/// token as `nats://token@host:4222`. `Debug` and every error show the URL
/// with the password (or token) replaced by `***`.
///
/// ```
/// use std::time::Duration;
/// use anarchon_nats::NatsOptions;
///
/// let options = NatsOptions::new("nats://cron:s3cret@nats.internal:4222")
///     .timeout(Duration::from_secs(3));
/// assert!(!format!("{options:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NatsOptions {
    url: String,
    timeout: Duration,
    connect_timeout: Duration,
    connection_name: String,
}

/// Where a new stream or bucket keeps its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Storage {
    /// On disk: runs survive a server restart (the default).
    #[default]
    File,
    /// In memory: a server restart forgets every run.
    Memory,
}

impl Storage {
    /// Reads `file` or `memory`, as store URLs write it.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "file" => Some(Storage::File),
            "memory" => Some(Storage::Memory),
            _ => None,
        }
    }

    /// The JetStream storage type.
    pub(crate) fn stream_type(self) -> async_nats::jetstream::stream::StorageType {
        match self {
            Storage::File => async_nats::jetstream::stream::StorageType::File,
            Storage::Memory => async_nats::jetstream::stream::StorageType::Memory,
        }
    }
}

/// A URL taken apart: the address async-nats connects to (no credentials)
/// and the credentials.
pub(crate) struct ParsedUrl {
    pub(crate) address: String,
    pub(crate) credentials: Credentials,
}

/// Credentials from the URL's user info.
pub(crate) enum Credentials {
    None,
    Token(String),
    UserPassword(String, String),
}

impl NatsOptions {
    /// Options for the server at `url` (`nats://host:4222`, `tls://…`).
    /// Nothing is checked until a store connects.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connection_name: "anarchon".to_owned(),
        }
    }

    /// How long one store call waits for the server (default 5 s): a
    /// publish acknowledgement, a read, a stream lookup.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The client name the server shows in its monitoring (default
    /// `anarchon`).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The URL with its password or token replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// The time limit of one store call.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The time limit of connecting.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn get_connection_name(&self) -> &str {
        &self.connection_name
    }

    /// Checks the options without touching the server.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::InvalidOption`].
    pub fn validate(&self) -> Result<(), Error> {
        self.parse_url()?;
        for (option, value) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::InvalidOption {
                    option,
                    reason: "it must be longer than zero".into(),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn parse_url(&self) -> Result<ParsedUrl, Error> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: self.redacted_url(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = self
            .url
            .split_once("://")
            .ok_or_else(|| invalid("it must start with nats:// (or tls://)"))?;
        if !matches!(scheme, "nats" | "tls") {
            return Err(invalid("it must start with nats:// (or tls://)"));
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if !(tail.is_empty() || tail == "/") {
            return Err(invalid(
                "it must not have a path or query: nats://[user:password@]host[:port]",
            ));
        }
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        if host.is_empty() {
            return Err(invalid("it has no host"));
        }
        let credentials = match userinfo {
            None => Credentials::None,
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => Credentials::UserPassword(
                    percent_decode(user).ok_or_else(|| invalid("bad %-escape in the user"))?,
                    percent_decode(password)
                        .ok_or_else(|| invalid("bad %-escape in the password"))?,
                ),
                None => Credentials::Token(
                    percent_decode(userinfo).ok_or_else(|| invalid("bad %-escape in the token"))?,
                ),
            },
        };
        let address = format!("{scheme}://{host}");
        address
            .parse::<async_nats::ServerAddr>()
            .map_err(|_| invalid("the host or port is not valid"))?;
        Ok(ParsedUrl {
            address,
            credentials,
        })
    }
}

impl fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsOptions")
            .field("url", &self.redacted_url())
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("connection_name", &self.connection_name)
            .finish()
    }
}

/// `url` with the password (or a token) in its user info replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    // Without a scheme, the whole text up to the path is the authority.
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}{user}:***@{host}{tail}"),
            None => format!("{scheme}***@{host}{tail}"),
        },
        None => url.to_owned(),
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Checks a name prefix: segments of `[A-Za-z0-9_-]` joined by `.`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidPrefix {
        prefix: prefix.chars().take(120).collect(),
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
    for segment in prefix.split('.') {
        if segment.is_empty() {
            return Err(invalid(
                "it has an empty segment (a leading, trailing or doubled '.')".into(),
            ));
        }
        if let Some(bad) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(invalid(format!(
                "it contains {bad:?} (NATS gives '*', '>' and spaces special meanings)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_out_of_the_url_and_never_show() {
        let options = NatsOptions::new("nats://app:hunter%402@h:4222");
        assert!(!format!("{options:?}").contains("hunter"));
        let parsed = options.parse_url().expect("valid");
        assert_eq!(parsed.address, "nats://h:4222");
        match parsed.credentials {
            Credentials::UserPassword(user, password) => {
                assert_eq!(user, "app");
                assert_eq!(password, "hunter@2");
            }
            _ => panic!("expected a user and password"),
        }
        let token = NatsOptions::new("nats://s3cr3t-token@h:4222");
        assert_eq!(token.redacted_url(), "nats://***@h:4222");
        assert!(matches!(
            token.parse_url().expect("valid").credentials,
            Credentials::Token(t) if t == "s3cr3t-token"
        ));
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for bad in [
            "http://app:hunter2@h:4222",
            "nats://app:hunter2@h:4222/path",
            "nats://app:hunter2@:4222",
            "nats://app:hunter2@h:notaport",
            "app:hunter2@h:4222",
        ] {
            let err = NatsOptions::new(bad).validate().expect_err(bad).to_string();
            assert!(!err.contains("hunter2"), "{err}");
        }
        assert!(
            NatsOptions::new("nats://h")
                .timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn prefixes_are_subject_tokens() {
        for ok in ["anarchon", "a.b-c_d"] {
            validate_prefix(ok).expect(ok);
        }
        for bad in [
            "",
            "a.",
            ".a",
            "a..b",
            "a*",
            "a>",
            "a b",
            "é",
            &"p".repeat(101),
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }
}

/// One `key=value` parameter of a store URL's query.
pub(crate) struct UrlParam<'a> {
    pub(crate) key: &'a str,
    pub(crate) value: &'a str,
    url: &'a str,
}

impl UrlParam<'_> {
    /// An [`Error::InvalidUrl`] about this URL (its password redacted).
    pub(crate) fn invalid(&self, reason: String) -> Error {
        Error::InvalidUrl {
            url: redact(self.url),
            reason,
        }
    }

    /// The value as a whole number.
    pub(crate) fn number(&self) -> Result<u64, Error> {
        self.value
            .parse::<u64>()
            .map_err(|_| self.invalid(format!("{} must be a whole number", self.key)))
    }
}

/// The settings every JetStream store reads from its URL besides its own.
#[derive(Default)]
pub(crate) struct StreamParams {
    pub(crate) storage: Option<Storage>,
    pub(crate) replicas: Option<usize>,
}

/// Reads a `nats://…?…` store URL: the connection from the part before `?`,
/// the parameters both stores share (`timeout_ms`, `storage`, `replicas`)
/// here, and every other parameter through `own`, which says whether it
/// knew it. An unknown parameter is refused, listing `known`.
pub(crate) fn read_url(
    url: &str,
    known: &str,
    mut own: impl FnMut(&UrlParam<'_>) -> Result<bool, Error>,
) -> Result<(NatsOptions, StreamParams), Error> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut connection = NatsOptions::new(base);
    let mut shared = StreamParams::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let param = UrlParam { key, value, url };
        match key {
            "timeout_ms" => connection = connection.timeout(Duration::from_millis(param.number()?)),
            "replicas" => {
                shared.replicas = Some(
                    usize::try_from(param.number()?)
                        .map_err(|_| param.invalid("replicas is too large".into()))?,
                );
            }
            "storage" => {
                shared.storage = Some(
                    Storage::parse(value)
                        .ok_or_else(|| param.invalid("storage must be file or memory".into()))?,
                );
            }
            _ if own(&param)? => {}
            other => {
                return Err(param.invalid(format!("unknown parameter {other:?}; use {known}")));
            }
        }
    }
    Ok((connection, shared))
}
