//! How to open a store: the file, the table prefix, the busy timeout and
//! the pool size.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;

/// The table prefix unless told otherwise: tables `anarchon_runs`,
/// `anarchon_jobs` and `anarchon_schema`.
pub const DEFAULT_TABLE_PREFIX: &str = "anarchon";
/// How long a statement waits for another connection's write lock unless
/// told otherwise.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per store unless told otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;
/// The longest table prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 48;

/// How to open a [`SqliteStore`](crate::SqliteStore).
///
/// ```
/// use std::time::Duration;
/// use anarchon_sqlite::SqliteOptions;
///
/// let options = SqliteOptions::new("/var/lib/myapp/cron.db")
///     .with_table_prefix("cron")
///     .with_busy_timeout(Duration::from_secs(2))
///     .with_max_connections(2);
/// assert_eq!(options.table_prefix(), "cron");
///
/// let from_url = SqliteOptions::from_url("sqlite://data/cron.db?table_prefix=cron")?;
/// assert_eq!(from_url.path(), std::path::Path::new("data/cron.db"));
/// # Ok::<(), anarchon_sqlite::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    path: PathBuf,
    table_prefix: String,
    busy_timeout: Duration,
    max_connections: u32,
}

impl SqliteOptions {
    /// Options for the database file at `path` (created if missing; its
    /// directory must exist). A relative path is relative to the current
    /// directory.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            table_prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// Reads a URL: `sqlite://path/to/file.db` (relative to the current
    /// directory) or `sqlite:///absolute/path.db`, with optional query
    /// parameters `table_prefix`, `busy_timeout_ms` and `max_connections`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, an empty path, an
    /// in-memory database or an unknown parameter; the parameters' own
    /// errors as [`Self::validate`] reports them.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        // Errors show the URL without its parameters' values.
        let shown = match url.split_once('?') {
            Some((before, _)) => format!("{before}?..."),
            None => url.to_owned(),
        };
        let invalid = |reason: &str| Error::InvalidUrl {
            url: shown.clone(),
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| {
                invalid("it must start with sqlite://, e.g. sqlite://anarchon.db or sqlite:///var/lib/anarchon.db")
            })?;
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(invalid("it names no file"));
        }
        if path == ":memory:" || path.starts_with("file:") || path.contains("mode=memory") {
            return Err(invalid(
                "an in-memory database cannot be shared between processes; use a file, or anarchon's MemoryStore for one process",
            ));
        }
        let mut options = Self::new(path);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "table_prefix" => options = options.with_table_prefix(value),
                "busy_timeout_ms" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        invalid("busy_timeout_ms must be a whole number of milliseconds")
                    })?;
                    options = options.with_busy_timeout(Duration::from_millis(ms));
                }
                "max_connections" => {
                    let n: u32 = value
                        .parse()
                        .map_err(|_| invalid("max_connections must be a whole number"))?;
                    options = options.with_max_connections(n);
                }
                other => {
                    return Err(invalid(&format!(
                        "unknown parameter {other:?}; known: table_prefix, busy_timeout_ms, max_connections"
                    )));
                }
            }
        }
        options.validate()?;
        Ok(options)
    }

    /// The prefix of the store's table names (default `anarchon`): 1 to 48
    /// characters of `[A-Za-z0-9_]` starting with a letter or `_`. Several
    /// prefixes keep independent stores in one file.
    pub fn with_table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// How long a statement waits for another connection's write lock
    /// before it fails with a temporary error (default 5 s).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How many connections the store's pool opens at most (default 4).
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table prefix.
    pub fn table_prefix(&self) -> &str {
        &self.table_prefix
    }

    /// The busy timeout.
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The pool size.
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }

    /// Checks the options without touching the file.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTablePrefix`] or [`Error::InvalidOption`].
    pub fn validate(&self) -> Result<(), Error> {
        validate_prefix(&self.table_prefix)?;
        if self.max_connections == 0 {
            return Err(Error::InvalidOption {
                option: "max_connections",
                reason: "it must be at least 1".into(),
            });
        }
        if self.busy_timeout > Duration::from_secs(3600) {
            return Err(Error::InvalidOption {
                option: "busy_timeout",
                reason: "it must be at most one hour".into(),
            });
        }
        Ok(())
    }
}

impl fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("path", &self.path)
            .field("table_prefix", &self.table_prefix)
            .field("busy_timeout", &self.busy_timeout)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Checks that `prefix` is a plain identifier, safe to paste into SQL text.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidTablePrefix {
        prefix: prefix.chars().take(80).collect(),
        reason,
    };
    let Some(first) = prefix.chars().next() else {
        return Err(invalid("it is empty".into()));
    };
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(invalid(format!("it is {} bytes long", prefix.len())));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Err(invalid(format!("it contains {bad:?}")));
    }
    if first.is_ascii_digit() {
        return Err(invalid("it starts with a digit".into()));
    }
    if prefix.to_ascii_lowercase().starts_with("sqlite_") {
        return Err(invalid(
            "names starting with sqlite_ are reserved by SQLite".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_file_relative_or_absolute() {
        let o = SqliteOptions::from_url("sqlite://anarchon.db").unwrap();
        assert_eq!(o.path(), Path::new("anarchon.db"));
        assert_eq!(o.table_prefix(), DEFAULT_TABLE_PREFIX);
        let o = SqliteOptions::from_url("sqlite:///var/lib/a.db").unwrap();
        assert_eq!(o.path(), Path::new("/var/lib/a.db"));
        let o = SqliteOptions::from_url(
            "sqlite://d/a.db?table_prefix=cron&busy_timeout_ms=250&max_connections=2",
        )
        .unwrap();
        assert_eq!(o.path(), Path::new("d/a.db"));
        assert_eq!(o.table_prefix(), "cron");
        assert_eq!(o.busy_timeout(), Duration::from_millis(250));
        assert_eq!(o.max_connections(), 2);
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, says) in [
            ("postgres://h/db", "must start with sqlite://"),
            ("sqlite://", "names no file"),
            ("sqlite::memory:", "in-memory"),
            ("sqlite://a.db?colour=red", "unknown parameter \"colour\""),
            ("sqlite://a.db?busy_timeout_ms=soon", "busy_timeout_ms"),
        ] {
            let err = SqliteOptions::from_url(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
        let err = SqliteOptions::from_url("sqlite://a.db?password=hunter2")
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains("hunter2"),
            "parameter values are not echoed: {err}"
        );
        let err = SqliteOptions::from_url("sqlite://a.db?table_prefix=a;drop").unwrap_err();
        assert!(matches!(err, Error::InvalidTablePrefix { .. }), "{err}");
        let err = SqliteOptions::from_url("sqlite://a.db?max_connections=0").unwrap_err();
        assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    }

    #[test]
    fn prefixes_must_be_plain_identifiers() {
        for ok in ["anarchon", "_x", "Cron_2", &"p".repeat(MAX_PREFIX_LEN)] {
            validate_prefix(ok).unwrap();
        }
        for (bad, says) in [
            ("", "empty"),
            ("1abc", "starts with a digit"),
            ("a-b", "'-'"),
            ("a b", "' '"),
            ("a\"b", "'\"'"),
            ("x; DROP TABLE y", "';'"),
            ("é", "'é'"),
            ("sqlite_stat", "reserved"),
            (&"p".repeat(MAX_PREFIX_LEN + 1), "49 bytes"),
        ] {
            let err = validate_prefix(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
            assert!(err.contains("invalid table prefix"), "{err}");
        }
    }
}
