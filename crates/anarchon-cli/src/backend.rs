//! Choosing a store from a URL, and opening it.

use std::sync::Arc;

use anarchon::sqlite::{SqliteOptions, SqliteStore};
use anarchon::{ClaimStore, MemoryStore};

use crate::error::Error;

/// A store named by a URL, not opened yet.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// `sqlite://path`.
    Sqlite(SqliteOptions),
}

/// An open store.
#[derive(Debug, Clone)]
pub(crate) enum Opened {
    /// A SQLite file.
    Sqlite(Arc<SqliteStore>),
}

impl Backend {
    /// Reads a store URL without touching the store.
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        match scheme {
            "sqlite" => Ok(Backend::Sqlite(SqliteOptions::from_url(url)?)),
            _ => Err(Error::StoreUrl {
                url: redact(url),
                reason: "this build of anarchon knows the scheme sqlite:// (e.g. sqlite://anarchon.db or sqlite:///var/lib/anarchon/cron.db)".into(),
            }),
        }
    }

    /// Opens the store (creating and migrating a SQLite file).
    pub(crate) async fn open(&self) -> Result<Opened, Error> {
        match self {
            Backend::Sqlite(options) => Ok(Opened::Sqlite(Arc::new(
                SqliteStore::open(options.clone()).await?,
            ))),
        }
    }

    /// A store of the same kind (lease or claim-only) that touches nothing,
    /// so `anarchon check` can ask the core whether the crontab's options
    /// suit this backend without opening it.
    pub(crate) fn stand_in(&self) -> Arc<dyn ClaimStore> {
        match self {
            Backend::Sqlite(_) => Arc::new(MemoryStore::new()),
        }
    }

    /// A short description for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Sqlite(options) => format!(
                "SQLite file {} (tables {}_*, a lease store)",
                options.get_path().display(),
                options.get_table_prefix()
            ),
        }
    }
}

impl Opened {
    /// The store as the scheduler takes it.
    pub(crate) fn claim_store(&self) -> Arc<dyn ClaimStore> {
        match self {
            Opened::Sqlite(store) => store.clone(),
        }
    }
}

/// The URL with any password replaced by `***`: `scheme://user:***@host/…`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/cron"),
            "postgres://app:***@db:5432/cron"
        );
        assert_eq!(redact("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact("amqp://guest@h/%2f?x=1"), "amqp://guest@h/%2f?x=1");
        assert_eq!(redact("sqlite://anarchon.db"), "sqlite://anarchon.db");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn unknown_schemes_are_refused_without_the_password() {
        let err = Backend::parse("postgres://app:s3cret@db/cron").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("postgres://app:***@db/cron"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("sqlite://"), "{text}");
        assert!(Backend::parse("anarchon.db").is_err());
    }

    #[test]
    fn sqlite_urls_are_read_without_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("never.db");
        let backend = Backend::parse(&format!("sqlite://{}", path.display())).unwrap();
        assert!(backend.describe().contains("never.db"));
        assert!(backend.stand_in().as_lease_store().is_some());
        assert!(!path.exists(), "parsing a URL must not create the file");
    }
}
