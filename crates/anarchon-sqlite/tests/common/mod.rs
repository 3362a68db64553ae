//! What the SQLite tests share: a factory with a database file per test.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::Arc;

use anarchon_core::Clock;
use anarchon_sqlite::{SqliteOptions, SqliteStore};
use anarchon_testkit::StoreFactory;
use async_trait::async_trait;

/// A fresh database file in its own temporary directory; every
/// `instance()` opens its own pool on it, as separate processes would.
pub struct SqliteFactory {
    dir: tempfile::TempDir,
}

impl SqliteFactory {
    /// A factory with a new, empty directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    /// The test's database file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("anarchon.db")
    }

    /// A plain pool of one connection on the file, as another program
    /// would open it.
    pub async fn raw_pool(&self) -> sqlx::SqlitePool {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(self.path()))
            .await
            .expect("a plain pool on the test file")
    }

    /// Default options for the test's file, with a long busy timeout:
    /// the checks judge what the store answers, not how fast, and on a
    /// shared two-core machine running a whole test suite a writer can be
    /// kept off the CPU for seconds while it holds the lock.
    pub fn options(&self) -> SqliteOptions {
        SqliteOptions::new(self.path()).with_busy_timeout(std::time::Duration::from_secs(30))
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    type Store = SqliteStore;

    /// The store reads SQLite's `'now'` inside each statement; it computes
    /// nothing on the client side, so `clock` has nothing to reach.
    async fn instance_with_clock(&self, _clock: Arc<dyn Clock>) -> Arc<SqliteStore> {
        Arc::new(
            SqliteStore::open(self.options())
                .await
                .expect("open the test database"),
        )
    }
}
