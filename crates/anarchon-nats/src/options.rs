//! How to reach NATS: the URL, its credentials and time limits. Shared by
//! every store in this crate.

use anarchon_core::name::check_dotted;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;
use anarchon_core::url::{percent_decode, redact};

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
/// # TLS
///
/// A `tls://` URL (or `nats+tls://`), [`with_require_tls`](Self::with_require_tls),
/// [`with_tls_ca_file`](Self::with_tls_ca_file) or [`with_tls_first`](Self::with_tls_first)
/// makes the connection use TLS, and refuses to connect without it. The
/// server's certificate is checked against the system's root certificates,
/// or, with `tls_ca_file`, against the authorities in that file only.
/// Nothing turns the check off. A server that asks for TLS in its greeting
/// gets it with a `nats://` URL too.
///
/// ```
/// use std::time::Duration;
/// use anarchon_nats::NatsOptions;
///
/// let options = NatsOptions::new("nats://cron:s3cret@nats.internal:4222")
///     .with_timeout(Duration::from_secs(3));
/// assert!(!format!("{options:?}").contains("s3cret"));
///
/// let private = NatsOptions::new("tls://nats.internal:4222")
///     .with_tls_ca_file("/etc/anarchon/nats-ca.pem");
/// assert!(private.uses_tls());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NatsOptions {
    url: String,
    timeout: Duration,
    connect_timeout: Duration,
    connection_name: String,
    require_tls: bool,
    tls_first: bool,
    tls_ca_file: Option<PathBuf>,
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
    /// Options for the server at `url` (`nats://host:4222`, or
    /// `tls://host:4222` for TLS). Nothing is checked until a store
    /// connects.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connection_name: "anarchon".to_owned(),
            require_tls: false,
            tls_first: false,
            tls_ca_file: None,
        }
    }

    /// Connects with TLS, or not at all, whatever the URL's scheme
    /// (default: only for `tls://` URLs, or when the server asks for it).
    pub fn with_require_tls(mut self, require: bool) -> Self {
        self.require_tls = require;
        self
    }

    /// Trusts the certificate authorities in the PEM file at `path`, and
    /// only those, for the server's certificate: for a server whose
    /// certificate a private authority signed. Implies TLS.
    ///
    /// The file is read when a store connects; a file that cannot be read
    /// or holds no usable certificate fails the connect with
    /// [`Error::TlsCaFile`], naming it.
    pub fn with_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// Starts TLS before the server's greeting, for a server configured
    /// with `handshake_first` (default off: the server greets in plain
    /// text and TLS starts after). Implies TLS.
    pub fn with_tls_first(mut self, first: bool) -> Self {
        self.tls_first = first;
        self
    }

    /// Whether connections use TLS: a `tls://` URL, or any of
    /// [`with_require_tls`](Self::with_require_tls), [`with_tls_ca_file`](Self::with_tls_ca_file)
    /// or [`with_tls_first`](Self::with_tls_first).
    pub fn uses_tls(&self) -> bool {
        self.require_tls
            || self.tls_first
            || self.tls_ca_file.is_some()
            || self
                .url
                .split_once("://")
                .is_some_and(|(scheme, _)| TLS_SCHEMES.contains(&scheme))
    }

    /// The certificate authority file, if one was given.
    pub fn tls_ca_file(&self) -> Option<&Path> {
        self.tls_ca_file.as_deref()
    }

    /// Whether TLS starts before the server's greeting.
    pub fn tls_first(&self) -> bool {
        self.tls_first
    }

    /// How long one store call waits for the server (default 5 s): a
    /// publish acknowledgement, a read, a stream lookup.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The client name the server shows in its monitoring (default
    /// `anarchon`).
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The URL with its password or token replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// `host:port` as the URL writes them, for messages: the URL without
    /// its scheme, user info and query. Never the password or token.
    pub fn server(&self) -> String {
        crate::options::server_of(&redact(&self.url))
    }

    /// The time limit of one store call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The time limit of connecting.
    pub fn connect_timeout(&self) -> Duration {
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
        if self
            .tls_ca_file
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(Error::InvalidOption {
                option: "tls_ca_file",
                reason: "the path is empty".into(),
            });
        }
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
            reason: anarchon_core::url::unreadable_reason(&self.url, reason),
        };
        if let Some(hint) = anarchon_core::url::ambiguous_user_info(&self.url) {
            return Err(invalid(&hint));
        }
        let (scheme, rest) = self
            .url
            .split_once("://")
            .ok_or_else(|| invalid("it must start with nats:// (or tls:// for TLS)"))?;
        // async-nats knows `tls`; `nats+tls` is the same.
        let scheme = match scheme {
            "nats" => "nats",
            "tls" | "nats+tls" => "tls",
            _ => return Err(invalid("it must start with nats:// (or tls:// for TLS)")),
        };
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
            .field("require_tls", &self.require_tls)
            .field("tls_first", &self.tls_first)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

/// The schemes that ask for TLS.
const TLS_SCHEMES: [&str; 2] = ["tls", "nats+tls"];

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

/// Checks a name prefix: segments of `[A-Za-z0-9_-]` joined by `.`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    check_dotted(prefix, MAX_PREFIX_LEN).map_err(|problem| Error::InvalidPrefix {
        prefix: prefix.chars().take(120).collect(),
        reason: problem.with_hint(" (NATS gives '*', '>' and spaces special meanings)"),
    })
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
                .with_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn tls_comes_from_the_scheme_or_the_options() {
        assert!(!NatsOptions::new("nats://h:4222").uses_tls());
        for tls in [
            NatsOptions::new("tls://h:4222"),
            NatsOptions::new("nats+tls://h:4222"),
            NatsOptions::new("nats://h:4222").with_require_tls(true),
            NatsOptions::new("nats://h:4222").with_tls_first(true),
            NatsOptions::new("nats://h:4222").with_tls_ca_file("/ca.pem"),
        ] {
            assert!(tls.uses_tls(), "{tls:?}");
        }
        let parsed = NatsOptions::new("nats+tls://u:pw@h:4222")
            .parse_url()
            .expect("valid");
        assert_eq!(parsed.address, "tls://h:4222");
        assert!(
            NatsOptions::new("nats://h")
                .with_tls_ca_file("")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn secrets_in_the_query_never_show() {
        assert_eq!(
            redact("tls://u:pw@h:4222?prefix=p&password=hunter2&tls_ca_file=/ca.pem&Token=t0k"),
            "tls://u:***@h:4222?prefix=p&password=***&tls_ca_file=/ca.pem&Token=***"
        );
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
        assert_eq!(redact("nats://u:pa/ss@h:4222"), "nats://u:***@h:4222");
        assert_eq!(redact("nats://t0k/en@h:4222/"), "nats://***@h:4222/");
        let err = read_url("nats://h:4222?password=hunter2", "nothing", |_| Ok(false))
            .err()
            .expect("unknown parameter")
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("password"), "{err}");
    }

    #[test]
    fn store_urls_carry_tls() {
        let (connection, _) = read_url(
            "nats://h:4222?tls=true&tls_first=true&tls_ca_file=/etc/my%20ca.pem",
            "",
            |_| Ok(false),
        )
        .expect("valid");
        assert!(connection.uses_tls());
        assert!(connection.tls_first());
        assert_eq!(connection.tls_ca_file(), Some(Path::new("/etc/my ca.pem")));
        for bad in [
            "nats://u:hunter2@h:4222?tls=yes",
            "nats://u:hunter2@h:4222?tls_first=1",
            "nats://u:hunter2@h:4222?tls_ca_file=%zz",
        ] {
            let err = read_url(bad, "", |_| Ok(false))
                .err()
                .expect(bad)
                .to_string();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn the_server_is_named_without_the_credentials() {
        assert_eq!(NatsOptions::new("nats://t0k/en@h:4222").server(), "h:4222");
        assert_eq!(NatsOptions::new("tls://u:pw@h:4222/").server(), "h:4222/");
        assert_eq!(NatsOptions::new("nats://h").server(), "h");
        assert_eq!(NatsOptions::new("nats://u:pa?ss@h:4222").server(), "h:4222");
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
            reason: anarchon_core::url::unreadable_reason(self.url, &reason),
        }
    }

    /// The value as a whole number.
    pub(crate) fn number(&self) -> Result<u64, Error> {
        self.value
            .parse::<u64>()
            .map_err(|_| self.invalid(format!("{} must be a whole number", self.key)))
    }

    /// The value as `true` or `false`.
    pub(crate) fn flag(&self) -> Result<bool, Error> {
        match self.value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.invalid(format!("{} must be true or false", self.key))),
        }
    }

    /// The value with its %-escapes decoded.
    pub(crate) fn decoded(&self) -> Result<String, Error> {
        percent_decode(self.value)
            .ok_or_else(|| self.invalid(format!("{} has a bad %-escape", self.key)))
    }
}

/// The settings every JetStream store reads from its URL besides its own.
#[derive(Default)]
pub(crate) struct StreamParams {
    pub(crate) storage: Option<Storage>,
    pub(crate) replicas: Option<usize>,
}

/// The parameters [`read_url`] reads for every store, as its list of known
/// parameters ends.
const SHARED_PARAMS: &str = "storage, replicas, timeout_ms, tls, tls_ca_file or tls_first";

/// A store's own options, as a store URL sets them: each store makes one
/// stream (or bucket) whose storage and replicas the URL may give.
pub(crate) trait StreamOptions {
    /// Where the new stream keeps its messages, and how many replicas it has.
    fn stream_shape(&mut self) -> (&mut Storage, &mut usize);

    /// Checks the options without touching the server.
    fn check(&self) -> Result<(), Error>;
}

/// Reads a store URL into the connection and `options`: the shared
/// parameters as [`read_url`] does, `storage` and `replicas` into
/// `options`, and the store's own parameters (`own_params`, listed in
/// errors) through `own`. Both results are checked before they are handed
/// back.
pub(crate) fn read_store_url<T: StreamOptions>(
    url: &str,
    own_params: &str,
    mut options: T,
    mut own: impl FnMut(&mut T, &UrlParam<'_>) -> Result<bool, Error>,
) -> Result<(NatsOptions, T), Error> {
    let known = format!("{own_params}, {SHARED_PARAMS}");
    let (connection, shared) = read_url(url, &known, |param| own(&mut options, param))?;
    let (storage, replicas) = options.stream_shape();
    *storage = shared.storage.unwrap_or(*storage);
    *replicas = shared.replicas.unwrap_or(*replicas);
    connection.validate()?;
    options.check()?;
    Ok((connection, options))
}

/// Checks a new stream's replicas: JetStream allows 1 to 5.
pub(crate) fn validate_replicas(replicas: usize) -> Result<(), Error> {
    if !(1..=5).contains(&replicas) {
        return Err(Error::InvalidOption {
            option: "replicas",
            reason: "it must be between 1 and 5".into(),
        });
    }
    Ok(())
}

/// Reads a `nats://…?…` store URL: the connection from the part before `?`,
/// the parameters both stores share (`timeout_ms`, `storage`, `replicas`,
/// and TLS: `tls`, `tls_ca_file`, `tls_first`) here, and every other
/// parameter through `own`, which says whether it knew it. An unknown
/// parameter is refused, listing `known`. No error shows a password or
/// token.
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
            "timeout_ms" => {
                connection = connection.with_timeout(Duration::from_millis(param.number()?))
            }
            "tls" => connection = connection.with_require_tls(param.flag()?),
            "tls_first" => connection = connection.with_tls_first(param.flag()?),
            "tls_ca_file" => connection = connection.with_tls_ca_file(param.decoded()?),
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
