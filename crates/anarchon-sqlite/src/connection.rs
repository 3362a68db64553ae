//! Opening a SQLite store: creating the file privately, switching it to
//! WAL mode, and creating or migrating the tables.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::error::{Error, code, is_busy, primary_code};
use crate::finishes::{FinishGroup, Finishes};
use crate::options::SqliteOptions;
use crate::sql::Sql;
use crate::store::{SqliteStore, board_for};

/// How long `open` waits between tries while another process holds the
/// lock it needs to switch a new file to WAL mode.
const WAL_RETRY_PAUSE: Duration = Duration::from_millis(20);

impl SqliteStore {
    /// Opens (creating if needed) the database file from a URL such as
    /// `sqlite://anarchon.db`; see [`SqliteOptions::from_url`].
    ///
    /// # Errors
    ///
    /// As [`SqliteOptions::from_url`] and [`Self::open`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::open(SqliteOptions::from_url(url)?).await
    }

    /// Opens the database file, switches it to WAL mode and creates or
    /// migrates the store's tables.
    ///
    /// Safe when several processes open the same new file at once: the
    /// migration runs inside `BEGIN IMMEDIATE` and re-reads the schema
    /// version under the lock.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidTablePrefix`] / [`Error::InvalidOption`] before
    ///   anything touches the file;
    /// * [`Error::MissingDirectory`] when the file's directory does not exist;
    /// * [`Error::NotADatabase`] for a file that is not SQLite;
    /// * [`Error::Locked`] when another connection holds the lock past the
    ///   busy timeout;
    /// * [`Error::WalUnavailable`], [`Error::SchemaTooNew`], or
    ///   [`Error::Sqlite`] for anything else.
    pub async fn open(options: SqliteOptions) -> Result<Self, Error> {
        options.validate()?;
        let sql = Sql::render(options.table_prefix())?;
        let path = options.path().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(Error::MissingDirectory {
                directory: dir.to_path_buf(),
                path,
            });
        }
        create_private(&path)?;
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .busy_timeout(options.busy_timeout());
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections())
            .acquire_timeout(
                options
                    .busy_timeout()
                    .saturating_mul(2)
                    .max(Duration::from_secs(5)),
            )
            .connect_with(connect)
            .await
            .map_err(|e| open_error(&options, "opening the file", e))?;
        let store = Self::assemble(pool, sql, options);
        store.use_wal().await?;
        store.migrate().await?;
        tracing::debug!(path = ?store.options.path(), prefix = store.options.table_prefix(), "SQLite store open");
        Ok(store)
    }

    /// Opens an existing database for reading only: nothing is created,
    /// migrated or switched to WAL mode, and no connection may write. For
    /// `history` and other inspection; claims through it fail.
    ///
    /// # Errors
    ///
    /// As [`Self::open`] for the options and the file, and
    /// [`Error::SchemaOutdated`] when the tables are missing or older than
    /// this crate's schema, [`Error::SchemaTooNew`] when newer.
    pub async fn open_read_only(options: SqliteOptions) -> Result<Self, Error> {
        options.validate()?;
        let sql = Sql::render(options.table_prefix())?;
        let path = options.path().to_path_buf();
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(options.busy_timeout());
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections())
            .connect_with(connect)
            .await
            .map_err(|e| open_error(&options, "opening the file for reading", e))?;
        let store = Self::assemble(pool, sql, options);
        let found = store.recorded_version().await?.unwrap_or(0);
        store.check_not_too_new(found)?;
        let latest = Sql::latest_version();
        if found < latest {
            return Err(Error::SchemaOutdated {
                path,
                prefix: store.options.table_prefix().to_owned(),
                found,
                latest,
            });
        }
        Ok(store)
    }

    /// Switches the file to write-ahead logging (a setting the file keeps).
    /// Changing the mode needs a lock that SQLite's busy handler does not
    /// wait for, so a few processes opening a new file at once take turns
    /// here, up to the busy timeout.
    async fn use_wal(&self) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            let answer = sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
                .fetch_one(&self.pool)
                .await;
            match answer {
                Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
                Ok(mode) => {
                    return Err(Error::WalUnavailable {
                        path: self.path().to_path_buf(),
                        mode,
                    });
                }
                Err(e) if is_busy(&e) && started.elapsed() < self.options.busy_timeout() => {
                    tokio::time::sleep(WAL_RETRY_PAUSE).await;
                }
                Err(e) => return Err(open_error(&self.options, "switching to WAL mode", e)),
            }
        }
    }

    /// The store on `pool`, with the statements and options it was opened
    /// with, and the hand-over board of its file and prefix.
    fn assemble(pool: SqlitePool, sql: Sql, options: SqliteOptions) -> Self {
        let (sql, options) = (Arc::new(sql), Arc::new(options));
        let finishes = Finishes::new(FinishGroup::new(pool.clone(), sql.clone(), options.clone()));
        Self {
            hand_overs: board_for(options.path(), options.table_prefix()),
            pool,
            sql,
            options,
            request_watch: Arc::default(),
            finishes,
        }
    }

    /// The schema version the file records, read without a lock: `None`
    /// when it has no schema-version table yet, 0 when the table is empty.
    async fn recorded_version(&self) -> Result<Option<i64>, Error> {
        let fail = |e| open_error(&self.options, "reading the schema version", e);
        let table = format!("{}_schema", self.options.table_prefix());
        let exists: i64 = sqlx::query_scalar(self.sql.schema_exists.clone())
            .bind(&table)
            .fetch_one(&self.pool)
            .await
            .map_err(fail)?;
        if exists == 0 {
            return Ok(None);
        }
        let found = sqlx::query_scalar::<_, i64>(self.sql.schema_version.clone())
            .fetch_optional(&self.pool)
            .await
            .map_err(fail)?;
        Ok(Some(found.unwrap_or(0)))
    }

    /// Creates or upgrades the tables: versioned migrations inside one
    /// `BEGIN IMMEDIATE` transaction, the version re-read under the lock.
    async fn migrate(&self) -> Result<(), Error> {
        let latest = Sql::latest_version();
        let fail = |doing: &'static str| move |e| open_error(&self.options, doing, e);
        // Fast path, without the write lock: already up to date.
        if let Some(found) = self.recorded_version().await? {
            if found == latest {
                return Ok(());
            }
            self.check_not_too_new(found)?;
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(fail("locking the database to migrate the schema"))?;
        sqlx::raw_sql(self.sql.schema_table.clone())
            .execute(&mut *tx)
            .await
            .map_err(fail("creating the schema-version table"))?;
        let found = sqlx::query_scalar::<_, i64>(self.sql.schema_version.clone())
            .fetch_optional(&mut *tx)
            .await
            .map_err(fail("reading the schema version"))?
            .unwrap_or(0);
        self.check_not_too_new(found)?;
        for (version, migration) in self.sql.migrations.iter().filter(|(v, _)| *v > found) {
            sqlx::raw_sql(migration.clone())
                .execute(&mut *tx)
                .await
                .map_err(fail("migrating the schema"))?;
            sqlx::query(self.sql.set_schema_version.clone())
                .bind(*version)
                .execute(&mut *tx)
                .await
                .map_err(fail("recording the schema version"))?;
            tracing::info!(path = ?self.path(), prefix = self.options.table_prefix(), version, "SQLite schema migrated");
        }
        tx.commit()
            .await
            .map_err(fail("committing the schema migration"))?;
        Ok(())
    }

    fn check_not_too_new(&self, found: i64) -> Result<(), Error> {
        let supported = Sql::latest_version();
        if found > supported {
            return Err(Error::SchemaTooNew {
                path: self.path().to_path_buf(),
                prefix: self.options.table_prefix().to_owned(),
                found,
                supported,
            });
        }
        Ok(())
    }
}

/// Creates the database file, readable and writable by its owner only
/// (its records hold commands' stderr tails); SQLite gives its `-wal` and
/// `-shm` files the same mode. An existing file is kept as it is, with a
/// warning when others may write it; a symbolic link in the file's place
/// is never created through.
fn create_private(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                if std::fs::metadata(path).is_err() {
                    return Err(Error::CreateFile {
                        path: path.to_path_buf(),
                        source: std::io::Error::other(
                            "it is a symbolic link to nothing; the store does not create files through links",
                        ),
                    });
                }
                tracing::warn!(
                    ?path,
                    "the database path is a symbolic link: its target is used"
                );
            }
            if let Ok(meta) = std::fs::metadata(path) {
                for reason in distrust(&meta, nix::unistd::geteuid().as_raw()) {
                    tracing::warn!(?path, "{reason}");
                }
            }
            Ok(())
        }
        Err(source) => Err(Error::CreateFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Why a database file that this process (effective user `me`) did not
/// make may be in someone else's hands: it belongs to another user, or
/// others may write it. Whoever can write the file decides which runs
/// happen and can read every command's stderr tail.
fn distrust(meta: &std::fs::Metadata, me: u32) -> Vec<String> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let mut reasons = Vec::new();
    if meta.uid() != me {
        reasons.push(format!(
            "the database file belongs to user {} while this process runs as user {me}: that user decides which runs happen; chown it to this user",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        reasons.push(format!(
            "others may write the database file (mode {:o}), and so decide which runs happen: chmod go-w it",
            mode & 0o7777
        ));
    }
    reasons
}

/// An error while opening, with the file's name and the cases a user can fix.
fn open_error(options: &SqliteOptions, doing: &'static str, e: sqlx::Error) -> Error {
    let path = options.path().to_path_buf();
    match primary_code(&e) {
        Some(code::NOTADB) => Error::NotADatabase {
            path,
            message: match &e {
                sqlx::Error::Database(db) => db.message().to_owned(),
                other => other.to_string(),
            },
        },
        Some(code::BUSY | code::LOCKED) => Error::Locked {
            path,
            busy_timeout: options.busy_timeout(),
            doing,
        },
        _ if matches!(e, sqlx::Error::PoolTimedOut) => Error::Locked {
            path,
            busy_timeout: options.busy_timeout(),
            doing,
        },
        _ => Error::Sqlite {
            path,
            doing,
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file made by this process and kept to its owner raises nothing; the
    /// same file judged by another user, or opened to group writes, raises
    /// a warning that says what to do.
    #[test]
    fn a_database_in_other_hands_is_distrusted() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cron.db");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let me = meta.uid();
        assert_eq!(distrust(&meta, me), Vec::<String>::new());
        let other = distrust(&meta, me + 1);
        assert_eq!(other.len(), 1, "{other:?}");
        assert!(
            other[0].contains(&format!("belongs to user {me}")),
            "{other:?}"
        );
        assert!(other[0].contains("chown"), "{other:?}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).unwrap();
        let open = distrust(&std::fs::metadata(&path).unwrap(), me);
        assert_eq!(open.len(), 1, "{open:?}");
        assert!(
            open[0].contains("mode 620") && open[0].contains("chmod go-w"),
            "{open:?}"
        );
    }
}
