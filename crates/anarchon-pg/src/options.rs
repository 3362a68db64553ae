//! Options: where the server is, which table, how many connections, how long to wait.

use std::fmt;
use std::time::Duration;

use crate::error::PgError;

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
    /// [`PgError::InvalidTableName`] when the name is empty, longer than
    /// [`MAX_TABLE_NAME_LEN`], does not start with `a`–`z` or `_`, or
    /// contains anything but `a`–`z`, `0`–`9` and `_`.
    pub fn new(name: &str) -> Result<Self, PgError> {
        let invalid = |reason: String| PgError::InvalidTableName {
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
/// # fn main() -> Result<(), anarchon_pg::PgError> {
/// let options = PgOptions::new("postgres://app:secret@db.internal:5432/app")
///     .table("cron_runs")?
///     .pool_size(4)
///     .connect_timeout(Duration::from_secs(5))
///     .statement_timeout(Some(Duration::from_secs(10)));
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

    /// Uses table `name` (and `name_jobs`, `name_migrations`, `name_claim`).
    ///
    /// # Errors
    ///
    /// [`PgError::InvalidTableName`], see [`TableName::new`].
    pub fn table(self, name: &str) -> Result<Self, PgError> {
        Ok(self.table_name(TableName::new(name)?))
    }

    /// Uses an already validated table name.
    pub fn table_name(mut self, name: TableName) -> Self {
        self.table = name;
        self
    }

    /// The most connections the store's pool opens (at least 1). Each store
    /// call holds one connection for one round trip.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    /// How long to wait for a connection: to open one at start-up, and for a
    /// free or new one on each call. Past it the call fails as unavailable.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The server-side `statement_timeout` of the store's connections, sent
    /// as a start-up parameter; `None` leaves the server's setting. A claim
    /// cut short by it fails as unavailable and changes nothing.
    pub fn statement_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// The `application_name` the store's connections report (default
    /// `anarchon`), e.g. to find them in `pg_stat_activity`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Whether opening the store creates or migrates the schema (default
    /// `true`). With `false` the store only checks that the schema is at the
    /// version this crate needs, for deployments whose application role may
    /// not run DDL.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// The table.
    pub fn get_table(&self) -> &TableName {
        &self.table
    }

    /// The pool size.
    pub fn get_pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The statement timeout.
    pub fn get_statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// Checks the options that do not need the server.
    pub(crate) fn validate(&self) -> Result<(), PgError> {
        if self.pool_size == 0 {
            return Err(PgError::InvalidOption {
                option: "pool_size",
                reason: "must be at least 1".into(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(PgError::InvalidOption {
                option: "connect_timeout",
                reason: "must be longer than zero".into(),
            });
        }
        if let Some(t) = self.statement_timeout
            && t.as_millis() == 0
        {
            return Err(PgError::InvalidOption {
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

/// `url` with the password of its user part and any `password=` parameter
/// replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    anarchon_core::url::redact(url)
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
    let decoded: Vec<String> = secrets.iter().map(|s| percent_decode(s)).collect();
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

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
            assert!(matches!(err, PgError::InvalidTableName { .. }), "{bad}");
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
            redact_url("postgres://u:p%40ss@h:5432/db?sslmode=require"),
            "postgres://u:***@h:5432/db?sslmode=require"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("postgres://h/db?user=u&password=hunter2&x=1"),
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
        assert!(PgOptions::new(url).pool_size(0).validate().is_err());
        assert!(
            PgOptions::new(url)
                .connect_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::new(url)
                .statement_timeout(Some(Duration::from_micros(10)))
                .validate()
                .is_err()
        );
        assert!(PgOptions::new(url).table("Bad").is_err());
    }
}
