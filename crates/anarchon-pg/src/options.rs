//! Options: where the server is, which table, how many connections, how long to wait.

use std::fmt;
use std::time::Duration;

use anarchon_core::url::{Authority, Query, millis, percent_decode, positive_millis, redact};

use crate::error::Error;

/// The query parameters of a store URL that the PostgreSQL client (sqlx)
/// reads itself: [`PgOptions::from_url`] passes them on, as it does
/// `options[NAME]`.
pub const CLIENT_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
];

/// The query parameters [`PgOptions::from_url`] reads itself.
const STORE_PARAMETERS: &str =
    "table, pool_size, connect_timeout_ms, statement_timeout_ms, migrate, application_name";

/// The longest table name accepted, in bytes.
///
/// The store creates objects named `<table>_jobs`, `<table>_migrations`,
/// `<table>_claim`, `<table>_migrations_pkey`, … PostgreSQL cuts identifiers
/// at 63 bytes without an error, so two long names could silently end up
/// naming the same object. 40 leaves 23 bytes: enough for the longest suffix
/// (16) and for objects later versions may add.
pub const MAX_TABLE_NAME_LEN: usize = 40;

/// The suffixes of every object a store creates besides its table.
pub(crate) const SUFFIXES: &[&str] = &[
    "_pkey",
    "_state",
    "_live",
    "_jobs",
    "_jobs_pkey",
    "_migrations",
    "_migrations_pkey",
    "_claim",
];

/// A validated table name: `[a-z_][a-z0-9_]*`, at most [`MAX_TABLE_NAME_LEN`] bytes.
///
/// It is checked before any SQL is sent, and only then pasted into SQL text
/// (always double-quoted). Lower case only, so the name means the same table
/// quoted or not.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// The default table name, `anarchon`.
    pub const DEFAULT: &'static str = "anarchon";

    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTableName`] when the name is empty, longer than
    /// [`MAX_TABLE_NAME_LEN`], does not start with `a`–`z` or `_`, or
    /// contains anything but `a`–`z`, `0`–`9` and `_`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidTableName {
            name: name.chars().take(80).collect(),
            reason,
        };
        let Some(first) = name.chars().next() else {
            return Err(invalid("it is empty".into()));
        };
        if name.len() > MAX_TABLE_NAME_LEN {
            return Err(invalid(format!(
                "it is {} bytes long; the limit is {MAX_TABLE_NAME_LEN}, so that `<table>{}` stays within PostgreSQL's 63-byte identifiers",
                name.len(),
                longest_suffix()
            )));
        }
        if !(first.is_ascii_lowercase() || first == '_') {
            return Err(invalid(format!(
                "it starts with {first:?}; a table name starts with a-z or '_'"
            )));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            return Err(invalid(format!(
                "it contains {bad:?}; use only a-z, 0-9 and '_'"
            )));
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The names of every object a store on this table creates: the table,
    /// its constraints and indexes, the jobs and migrations tables and the
    /// claim function.
    pub fn objects(&self) -> Vec<String> {
        std::iter::once(self.0.clone())
            .chain(SUFFIXES.iter().map(|s| format!("{}{s}", self.0)))
            .collect()
    }
}

fn longest_suffix() -> &'static str {
    SUFFIXES
        .iter()
        .copied()
        .max_by_key(|s| s.len())
        .unwrap_or_default()
}

impl Default for TableName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({:?})", self.0)
    }
}

/// How to connect, and which table to use.
///
/// ```
/// use std::time::Duration;
/// use anarchon_pg::PgOptions;
///
/// # fn main() -> Result<(), anarchon_pg::Error> {
/// let options = PgOptions::new("postgres://app:secret@db.internal:5432/app")
///     .with_table("cron_runs")?
///     .with_pool_size(4)
///     .with_connect_timeout(Duration::from_secs(5))
///     .with_statement_timeout(Some(Duration::from_secs(10)));
/// // The password never shows in `Debug`.
/// assert!(!format!("{options:?}").contains("secret"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgOptions {
    pub(crate) url: String,
    pub(crate) table: TableName,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Option<Duration>,
    pub(crate) application_name: String,
    pub(crate) migrate: bool,
}

impl PgOptions {
    /// The default pool size per store.
    pub const DEFAULT_POOL_SIZE: u32 = 4;
    /// The default connect timeout.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default statement timeout.
    pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default `application_name` the store's connections report.
    pub const DEFAULT_APPLICATION_NAME: &'static str = "anarchon";

    /// Options for the server at `url` (`postgres://user:password@host:port/database?sslmode=…`),
    /// with the defaults: table `anarchon`, 4 connections, a 5 s connect
    /// timeout, a 30 s statement timeout, migrations on.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            table: TableName::default(),
            pool_size: Self::DEFAULT_POOL_SIZE,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            statement_timeout: Some(Self::DEFAULT_STATEMENT_TIMEOUT),
            application_name: Self::DEFAULT_APPLICATION_NAME.to_owned(),
            migrate: true,
        }
    }

    /// Reads a store URL: a PostgreSQL URL (`postgres://` or
    /// `postgresql://`) whose query may also carry the store's own
    /// parameters `table`, `pool_size`, `connect_timeout_ms`,
    /// `statement_timeout_ms` (`0` keeps the server's setting), `migrate`
    /// (`true` or `false`) and `application_name`. They are taken out of
    /// the URL; the client's own parameters ([`CLIENT_PARAMETERS`], and
    /// `options[NAME]`) stay in it. Nothing connects.
    ///
    /// The client would ignore an unknown parameter with a warning; here it
    /// is refused, so a misspelt `tabel=` does not go unnoticed.
    ///
    /// ```
    /// use anarchon_pg::PgOptions;
    ///
    /// let options = PgOptions::from_url(
    ///     "postgres://app:s3cret@db.internal/app?table=cron_runs&pool_size=8&sslmode=require",
    /// )?;
    /// assert_eq!(options.table().as_str(), "cron_runs");
    /// assert_eq!(options.pool_size(), 8);
    /// assert_eq!(options.redacted_url(), "postgres://app:***@db.internal/app?sslmode=require");
    /// assert_eq!(options.server(), "db.internal:5432/app");
    /// # Ok::<(), anarchon_pg::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (the URL redacted) for another scheme, a
    /// URL that names no host, a bad port, an unknown parameter or a value
    /// out of range; no message shows the password.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact(url),
            reason: anarchon_core::url::unreadable_reason(url, &reason),
        };
        if let Some(hint) = anarchon_core::url::ambiguous_user_info(url) {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: hint,
            });
        }
        let scheme = url.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("postgres" | "postgresql")) {
            return Err(invalid(
                "it must start with postgres:// (or postgresql://), e.g. postgres://app@db.internal:5432/app".into(),
            ));
        }
        let query = Query::split(url);
        let auth = Authority::of(query.base).map_err(invalid)?;
        let mut kept = Vec::new();
        let mut options = Self::new(String::new());
        let mut host_param = false;
        for &(key, value) in &query.pairs {
            match key {
                "table" => {
                    options.table = TableName::new(value).map_err(|e| invalid(e.to_string()))?;
                }
                "pool_size" => {
                    let n = value.parse::<u32>().map_err(|_| {
                        invalid(format!("pool_size must be a whole number, not {value:?}"))
                    })?;
                    if n == 0 {
                        return Err(invalid("pool_size must be at least 1".into()));
                    }
                    options.pool_size = n;
                }
                "connect_timeout_ms" => {
                    options.connect_timeout = positive_millis(key, value).map_err(invalid)?;
                }
                "statement_timeout_ms" => {
                    let d = millis(key, value).map_err(invalid)?;
                    options.statement_timeout = (!d.is_zero()).then_some(d);
                }
                "migrate" => {
                    options.migrate = match value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(invalid(format!(
                                "migrate must be true or false, not {value:?}"
                            )));
                        }
                    };
                }
                "application_name" => value.clone_into(&mut options.application_name),
                k if CLIENT_PARAMETERS.contains(&k) || k.starts_with("options[") => {
                    host_param |= matches!(k, "host" | "hostaddr");
                    kept.push((key, value));
                }
                other => {
                    return Err(invalid(format!(
                        "unknown parameter {other:?}; anarchon reads {STORE_PARAMETERS}; the PostgreSQL client reads {}, options[NAME]",
                        CLIENT_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        if auth.host.is_empty() && !host_param {
            return Err(invalid(
                "it names no host (postgres://user@host:5432/database)".into(),
            ));
        }
        options.url = query.rebuild(&kept);
        Ok(options)
    }

    /// Uses table `name` (and `name_jobs`, `name_migrations`, `name_claim`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTableName`], see [`TableName::new`].
    pub fn with_table(self, name: &str) -> Result<Self, Error> {
        Ok(self.with_table_name(TableName::new(name)?))
    }

    /// Uses an already validated table name.
    pub fn with_table_name(mut self, name: TableName) -> Self {
        self.table = name;
        self
    }

    /// The most connections the store's pool opens (at least 1). Each store
    /// call holds one connection for one round trip.
    pub fn with_pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// How long to wait for a connection: to open one at start-up, and for a
    /// free or new one on each call. Past it the call fails as unavailable.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The server-side `statement_timeout` of the store's connections, sent
    /// as a start-up parameter; `None` leaves the server's setting. A claim
    /// cut short by it fails as unavailable and changes nothing.
    pub fn with_statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// The `application_name` the store's connections report (default
    /// `anarchon`), e.g. to find them in `pg_stat_activity`.
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Whether opening the store creates or migrates the schema (default
    /// `true`). With `false` the store only checks that the schema is at the
    /// version this crate needs, for deployments whose application role may
    /// not run DDL.
    pub fn with_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// `host:port/database` as the URL names them (a `host` or `hostaddr`
    /// parameter, e.g. a Unix socket directory, before the URL's host; port
    /// 5432 unless the URL has one), for messages. Never the password.
    pub fn server(&self) -> String {
        // Read from the redacted URL: a password that breaks the URL's
        // structure cannot then be taken for a host or a port.
        let redacted = redact(&self.url);
        let query = Query::split(&redacted);
        let Ok(auth) = Authority::of(query.base) else {
            return query.base.to_owned();
        };
        let mut host = auth.host;
        let mut database = auth.path.trim_start_matches('/');
        for &(key, value) in &query.pairs {
            match key {
                "host" | "hostaddr" => host = value,
                "dbname" => database = value,
                _ => {}
            }
        }
        format!("{host}:{}/{database}", auth.port.unwrap_or(5432))
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The pool size.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The statement timeout.
    pub fn statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// Checks the options that do not need the server.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.pool_size == 0 {
            return Err(Error::InvalidOption {
                option: "pool_size",
                reason: "must be at least 1".into(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::InvalidOption {
                option: "connect_timeout",
                reason: "must be longer than zero".into(),
            });
        }
        if let Some(t) = self.statement_timeout
            && t.as_millis() == 0
        {
            return Err(Error::InvalidOption {
                option: "statement_timeout",
                reason: "must be at least 1 ms (use None to keep the server's setting)".into(),
            });
        }
        Ok(())
    }
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &self.redacted_url())
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("application_name", &self.application_name)
            .field("migrate", &self.migrate)
            .finish()
    }
}

/// The secrets `url` carries, as written and percent-decoded, to scrub from
/// messages built from errors about it.
pub(crate) fn secrets_of(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Some((_, rest)) = url.split_once("://") {
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if let Some((userinfo, _)) = rest[..end].rsplit_once('@')
            && let Some((_, password)) = userinfo.split_once(':')
        {
            secrets.push(password.to_owned());
        }
    }
    let lower = url.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = lower[from..].find("password=") {
        let start = from + pos + "password=".len();
        let end = url[start..]
            .find(['&', ' ', '#'])
            .map_or(url.len(), |e| start + e);
        secrets.push(url[start..end].to_owned());
        from = end;
    }
    let decoded: Vec<String> = secrets.iter().filter_map(|s| percent_decode(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// `text` with every secret replaced by `***`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for good in [
            "anarchon",
            "_x",
            "cron_runs_2",
            &"a".repeat(MAX_TABLE_NAME_LEN),
        ] {
            assert!(TableName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Anarchon",
            "9lives",
            "runs-table",
            "runs table",
            "runs\"; DROP TABLE x; --",
            "rüns",
            "public.runs",
            &"a".repeat(MAX_TABLE_NAME_LEN + 1),
        ] {
            let err = TableName::new(bad).expect_err(bad);
            assert!(matches!(err, Error::InvalidTableName { .. }), "{bad}");
        }
    }

    #[test]
    fn every_derived_name_fits_in_63_bytes() {
        let longest = TableName::new(&"a".repeat(MAX_TABLE_NAME_LEN)).unwrap();
        for name in longest.objects() {
            assert!(name.len() <= 63, "{name} is {} bytes", name.len());
        }
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("postgres://u:p%40ss@h:5432/db?sslmode=require"),
            "postgres://u:***@h:5432/db?sslmode=require"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://h/db?user=u&password=hunter2&x=1"),
            "postgres://h/db?user=u&password=***&x=1"
        );
        let secrets = secrets_of("postgres://u:p%40ss@h/db?password=two");
        assert!(secrets.contains(&"p%40ss".to_owned()));
        assert!(secrets.contains(&"p@ss".to_owned()));
        assert!(secrets.contains(&"two".to_owned()));
        assert_eq!(scrub("x p@ss y two", &secrets), "x *** y ***");
    }

    #[test]
    fn options_never_show_the_password() {
        let options =
            PgOptions::new("postgres://app:Sentinel-Pw-7@db:5432/app?password=Sentinel-Pw-8");
        let shown = format!("{options:?}");
        assert!(!shown.contains("Sentinel"), "{shown}");
        assert!(shown.contains("app:***@db"), "{shown}");
    }

    #[test]
    fn options_are_checked() {
        let url = "postgres://h/db";
        assert!(PgOptions::new(url).validate().is_ok());
        assert!(PgOptions::new(url).with_pool_size(0).validate().is_err());
        assert!(
            PgOptions::new(url)
                .with_connect_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::new(url)
                .with_statement_timeout(Some(Duration::from_micros(10)))
                .validate()
                .is_err()
        );
        assert!(PgOptions::new(url).with_table("Bad").is_err());
    }
    #[test]
    fn store_urls_keep_the_clients_parameters_and_strip_ours() {
        for scheme in ["postgres", "postgresql"] {
            let options = PgOptions::from_url(&format!(
                "{scheme}://app:s3cret@db.internal:6543/cron?table=cron_runs&pool_size=8&sslmode=require&connect_timeout_ms=1500&statement_timeout_ms=0&migrate=false&application_name=web"
            ))
            .unwrap();
            assert_eq!(options.table().as_str(), "cron_runs");
            assert_eq!(options.pool_size(), 8);
            assert_eq!(options.connect_timeout(), Duration::from_millis(1500));
            assert_eq!(options.statement_timeout(), None);
            assert!(!options.migrate);
            assert_eq!(options.application_name, "web");
            assert_eq!(
                options.redacted_url(),
                format!("{scheme}://app:***@db.internal:6543/cron?sslmode=require")
            );
            assert_eq!(options.server(), "db.internal:6543/cron");
            assert!(!format!("{options:?}").contains("s3cret"));
        }
        let plain = PgOptions::from_url("postgres://postgres@127.0.0.1/test").unwrap();
        assert_eq!(plain.table().as_str(), "anarchon");
        assert_eq!(plain.redacted_url(), "postgres://postgres@127.0.0.1/test");
        assert_eq!(plain.server(), "127.0.0.1:5432/test");
        assert_eq!(
            plain.statement_timeout(),
            Some(PgOptions::DEFAULT_STATEMENT_TIMEOUT)
        );
        // A Unix socket named by the client's `host` parameter.
        let socket = PgOptions::from_url("postgres://app@/cron?host=/run/postgresql").unwrap();
        assert_eq!(socket.server(), "/run/postgresql:5432/cron");
        let named =
            PgOptions::from_url("postgres://h/x?dbname=cron&options[search_path]=a").unwrap();
        assert_eq!(named.server(), "h:5432/cron");
    }

    #[test]
    fn bad_store_urls_say_what_is_wrong() {
        for (url, says) in [
            (
                "postgres://app:s3cret@db/cron?tabel=x",
                "unknown parameter \"tabel\"",
            ),
            (
                "postgres://app:s3cret@db/cron?table=Runs",
                "invalid table name",
            ),
            (
                "postgres://app:s3cret@db/cron?pool_size=0",
                "pool_size must be at least 1",
            ),
            (
                "postgres://app:s3cret@db/cron?pool_size=many",
                "pool_size must be a whole number",
            ),
            (
                "postgres://app:s3cret@db/cron?migrate=yes",
                "migrate must be true or false",
            ),
            ("postgres://app:s3cret@db:port/cron", "the port \"port\""),
            ("postgres://app:s3cret@/cron", "names no host"),
            (
                "postgres://app:s3cret@db/cron?connect_timeout_ms=0",
                "longer than zero",
            ),
            (
                "postgres://app:s3cret@db/cron?statement_timeout_ms=soon",
                "whole number of milliseconds",
            ),
            ("mysql://app:s3cret@db/cron", "postgres://"),
            ("postgres://app:s3/cret@db/cron", "%2F"),
        ] {
            let err = PgOptions::from_url(url).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {text}");
            assert!(!err.is_temporary(), "{text}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(
                !text.contains("s3cret") && !text.contains("cret@"),
                "{text}"
            );
            assert!(text.contains("app:***@"), "{text}");
        }
    }
}
