//! `SqliteStore`: the lease flowchart in one `BEGIN IMMEDIATE` transaction.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::HandOvers;
use anarchon_core::decide::{self, ClaimDecision, LeaseRecord};
use anarchon_core::time::millis;
use anarchon_core::{
    Attempt, ClaimAnswers, ClaimOutcome, Fence, FinalState, InstanceId, JobName, LeaseClaim,
    LeaseStore, RecordState, Renewal, RunKey, RunOutcome, RunRecord, RunState, RunView, Slot,
    StoreError, Timestamp, Token,
};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteRow};
use sqlx::{FromRow, Row, SqliteConnection, SqlitePool};

use crate::BACKEND;
use crate::error::{Error, bad_value, code, primary_code, store_error};
use crate::options::SqliteOptions;
use crate::sql::Sql;

/// How long `open` waits between tries while another process holds the
/// lock it needs to switch a new file to WAL mode.
const WAL_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// A lease store in a SQLite file, shared by the processes of one host.
///
/// Open it with [`SqliteStore::open`] or [`SqliteStore::connect`]. Each
/// handle has its own connection pool; every process (or every simulated
/// instance in a test) opens its own.
///
/// # How it works
///
/// * Every claim is one `BEGIN IMMEDIATE` transaction: it takes SQLite's
///   single write lock first (waiting up to the busy timeout), then reads
///   the run and writes the answer, so no two claims can read the same "no
///   record". [`LeaseStore::claim_many`] makes all its claims in one
///   transaction.
/// * [`LeaseStore::peek`] is one plain `SELECT`, without a transaction: a
///   backup takes the write lock only when a lease has run out.
/// * Heartbeat, finish and release are one `UPDATE` each, matching the
///   token and `state = 'running'`: no match means
///   [`Renewal::Fenced`].
/// * The store's clock is SQLite's `'now'` on this host, in UTC
///   milliseconds, read inside each statement.
/// * Fence numbers come from a per-job counter row, incremented inside the
///   claim transaction; collection never deletes it.
/// * Tokens are stored as hyphenated lowercase UUID text.
///
/// # Cancel safety
///
/// Every method is cancel-safe in the sense of the store contract: a claim
/// whose future is dropped before `COMMIT` is rolled back; one dropped after
/// is recognised by its token when it is sent again.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Sql>,
    options: Arc<SqliteOptions>,
    /// Hand-overs heard: shared by every store of this process on the same
    /// file and prefix. SQLite cannot push a change to other processes;
    /// their backups learn of a hand-over at their next read.
    hand_overs: Arc<HandOvers>,
}

/// The hand-over board of each (file, prefix) open in this process.
fn board_for(path: &Path, prefix: &str) -> Arc<HandOvers> {
    type Boards =
        std::collections::HashMap<(std::path::PathBuf, String), std::sync::Weak<HandOvers>>;
    static BOARDS: std::sync::Mutex<Option<Boards>> = std::sync::Mutex::new(None);
    let key = (
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        prefix.to_owned(),
    );
    let mut boards = BOARDS.lock().unwrap_or_else(|p| p.into_inner());
    let boards = boards.get_or_insert_with(Default::default);
    boards.retain(|_, board| board.strong_count() > 0);
    if let Some(board) = boards.get(&key).and_then(std::sync::Weak::upgrade) {
        return board;
    }
    let board = Arc::new(HandOvers::new());
    boards.insert(key, Arc::downgrade(&board));
    board
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.options.get_path())
            .field("table_prefix", &self.options.get_table_prefix())
            .finish_non_exhaustive()
    }
}

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
        let sql = Sql::render(options.get_table_prefix())?;
        let path = options.get_path().to_path_buf();
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
            .busy_timeout(options.get_busy_timeout());
        let pool = SqlitePoolOptions::new()
            .max_connections(options.get_max_connections())
            .acquire_timeout(
                options
                    .get_busy_timeout()
                    .saturating_mul(2)
                    .max(Duration::from_secs(5)),
            )
            .connect_with(connect)
            .await
            .map_err(|e| open_error(&options, "opening the file", e))?;
        let hand_overs = board_for(options.get_path(), options.get_table_prefix());
        let store = Self {
            pool,
            sql: Arc::new(sql),
            options: Arc::new(options),
            hand_overs,
        };
        store.use_wal().await?;
        store.migrate().await?;
        tracing::debug!(path = ?store.options.get_path(), prefix = store.options.get_table_prefix(), "SQLite store open");
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
        let sql = Sql::render(options.get_table_prefix())?;
        let path = options.get_path().to_path_buf();
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(options.get_busy_timeout());
        let pool = SqlitePoolOptions::new()
            .max_connections(options.get_max_connections())
            .connect_with(connect)
            .await
            .map_err(|e| open_error(&options, "opening the file for reading", e))?;
        let hand_overs = board_for(&path, options.get_table_prefix());
        let store = Self {
            pool,
            sql: Arc::new(sql),
            options: Arc::new(options),
            hand_overs,
        };
        let fail = |doing: &'static str| {
            let options = store.options.clone();
            move |e| open_error(&options, doing, e)
        };
        let table = format!("{}_schema", store.options.get_table_prefix());
        let exists: i64 = sqlx::query_scalar(store.sql.schema_exists.clone())
            .bind(&table)
            .fetch_one(&store.pool)
            .await
            .map_err(fail("reading the schema version"))?;
        let found = if exists > 0 {
            sqlx::query_scalar::<_, i64>(store.sql.schema_version.clone())
                .fetch_optional(&store.pool)
                .await
                .map_err(fail("reading the schema version"))?
                .unwrap_or(0)
        } else {
            0
        };
        store.check_not_too_new(found)?;
        let latest = Sql::latest_version();
        if found < latest {
            return Err(Error::SchemaOutdated {
                path,
                prefix: store.options.get_table_prefix().to_owned(),
                found,
                latest,
            });
        }
        Ok(store)
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.options.get_path()
    }

    /// The schema version of the store's tables.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be read.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(self.sql.schema_version.clone())
            .fetch_optional(&self.pool)
            .await
            .map(|v| v.unwrap_or(0))
            .map_err(|e| self.err("reading the schema version", e))
    }

    /// Closes the pool: waits for connections in use to come back, then
    /// closes them all. Later calls fail with a temporary error.
    pub async fn close(&self) {
        self.pool.close().await;
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
                Err(e) if is_busy(&e) && started.elapsed() < self.options.get_busy_timeout() => {
                    tokio::time::sleep(WAL_RETRY_PAUSE).await;
                }
                Err(e) => return Err(open_error(&self.options, "switching to WAL mode", e)),
            }
        }
    }

    /// Creates or upgrades the tables: versioned migrations inside one
    /// `BEGIN IMMEDIATE` transaction, the version re-read under the lock.
    async fn migrate(&self) -> Result<(), Error> {
        let latest = Sql::latest_version();
        let fail = |doing: &'static str| move |e| open_error(&self.options, doing, e);
        // Fast path, without the write lock: already up to date.
        let table = format!("{}_schema", self.options.get_table_prefix());
        let exists: i64 = sqlx::query_scalar(self.sql.schema_exists.clone())
            .bind(&table)
            .fetch_one(&self.pool)
            .await
            .map_err(fail("reading the schema version"))?;
        if exists > 0 {
            let found = sqlx::query_scalar::<_, i64>(self.sql.schema_version.clone())
                .fetch_optional(&self.pool)
                .await
                .map_err(fail("reading the schema version"))?
                .unwrap_or(0);
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
            tracing::info!(path = ?self.path(), prefix = self.options.get_table_prefix(), version, "SQLite schema migrated");
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
                prefix: self.options.get_table_prefix().to_owned(),
                found,
                supported,
            });
        }
        Ok(())
    }

    fn err(&self, doing: &str, e: sqlx::Error) -> StoreError {
        if is_busy(&e) {
            let doing = format!(
                "{doing}: the database stayed locked longer than the busy timeout ({:?})",
                self.options.get_busy_timeout()
            );
            return store_error(&doing, e);
        }
        store_error(doing, e)
    }

    /// One claim inside an open `BEGIN IMMEDIATE` transaction: the steps of
    /// the lease flowchart, as `MemoryStore` writes them. `batch_now` is the
    /// store's clock as the transaction's first read saw it: every claim of
    /// a batch decides on the same instant.
    async fn claim_in(
        &self,
        conn: &mut SqliteConnection,
        req: &LeaseClaim,
        batch_now: &mut Option<Timestamp>,
    ) -> Result<ClaimOutcome, StoreError> {
        let run = req.run();
        let job = run.job.as_str();
        let slot = run.slot.as_millis();
        sqlx::query(self.sql.note_window.clone())
            .bind(job)
            .bind(millis(req.claim.max_late))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err("recording the job's late window", e))?;
        let row: ClaimRow = sqlx::query_as(self.sql.read_run.clone())
            .bind(job)
            .bind(slot)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.err("reading the run", e))?;
        let now = *batch_now.get_or_insert(Timestamp::from_millis(row.now));
        let record = row.lease_record()?;
        let decision = match decide::claim(record.as_ref(), Some(now), None, req) {
            Ok(decision) => decision,
            Err(_) => {
                let live = self.another_run_is_live(conn, run, now).await?;
                decide::claim(record.as_ref(), Some(now), Some(live), req).map_err(|needs| {
                    StoreError::protocol(BACKEND, format!("the claim still needs {needs:?}"))
                })?
            }
        };
        let fence = if decision.needs_fence() {
            Some(self.next_fence(conn, &run.job).await?)
        } else {
            None
        };
        let lease_until = now.saturating_add(req.lease);
        match &decision {
            ClaimDecision::Answer(_) => {}
            ClaimDecision::RecordMissed => {
                self.write_run(conn, run, Written::ended(RecordState::Missed, now))
                    .await?;
            }
            ClaimDecision::RecordSkipped => {
                let skipped = RecordState::Finished(FinalState::Skipped);
                self.write_run(conn, run, Written::ended(skipped, now))
                    .await?;
            }
            ClaimDecision::Start => {
                let written = Written {
                    state: RecordState::Running,
                    attempt: Some(Attempt::FIRST),
                    token: Some(req.claim.token),
                    fence,
                    instance: Some(&req.claim.instance),
                    started_at: Some(now),
                    finished_at: None,
                    lease_until: Some(lease_until),
                };
                self.write_run(conn, run, written).await?;
            }
            ClaimDecision::TakeOver { attempt } => {
                let fence = fence.map(fence_value).transpose()?;
                let changed = sqlx::query(self.sql.take_over.clone())
                    .bind(job)
                    .bind(slot)
                    .bind(i64::from(attempt.get()))
                    .bind(req.claim.token.to_string())
                    .bind(fence)
                    .bind(req.claim.instance.as_str())
                    .bind(lease_until.as_millis())
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err("taking the run over", e))?
                    .rows_affected();
                expect_one_row("taking the run over", changed)?;
            }
            ClaimDecision::Interrupt => {
                let changed = sqlx::query(self.sql.interrupt.clone())
                    .bind(job)
                    .bind(slot)
                    .bind(now.as_millis())
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err("marking the run interrupted", e))?
                    .rows_affected();
                expect_one_row("marking the run interrupted", changed)?;
            }
        }
        Ok(decision.outcome(fence))
    }

    async fn savepoint(
        &self,
        conn: &mut SqliteConnection,
        statement: &'static str,
    ) -> Result<(), StoreError> {
        sqlx::raw_sql(statement)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err("setting a savepoint for one claim", e))?;
        Ok(())
    }

    async fn another_run_is_live(
        &self,
        conn: &mut SqliteConnection,
        run: &RunKey,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>(self.sql.live_run_exists.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(now.as_millis())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.err("checking for a live run of the job", e))
    }

    async fn next_fence(
        &self,
        conn: &mut SqliteConnection,
        job: &JobName,
    ) -> Result<Fence, StoreError> {
        let n: i64 = sqlx::query_scalar(self.sql.next_fence.clone())
            .bind(job.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.err("assigning a fence", e))?;
        parse_fence(n)
    }

    async fn write_run(
        &self,
        conn: &mut SqliteConnection,
        run: &RunKey,
        w: Written<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query(self.sql.write_run.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(w.state.as_str())
            .bind(w.attempt.map(|a| i64::from(a.get())))
            .bind(w.token.map(|t| t.to_string()))
            .bind(w.fence.map(fence_value).transpose()?)
            .bind(w.instance.map(InstanceId::as_str))
            .bind(w.started_at.map(Timestamp::as_millis))
            .bind(w.finished_at.map(Timestamp::as_millis))
            .bind(w.lease_until.map(Timestamp::as_millis))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err("writing the run", e))?;
        Ok(())
    }

    /// Runs `update` (heartbeat, finish, release): one statement that
    /// matches the token of a running run.
    async fn update_held(
        &self,
        doing: &str,
        query: sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Renewal, StoreError> {
        let changed = query
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(doing, e))?
            .rows_affected();
        Ok(if changed == 1 {
            Renewal::Renewed
        } else {
            Renewal::Fenced
        })
    }
}

/// A record as the claim writes it.
struct Written<'a> {
    state: RecordState,
    attempt: Option<Attempt>,
    token: Option<Token>,
    fence: Option<Fence>,
    instance: Option<&'a InstanceId>,
    started_at: Option<Timestamp>,
    finished_at: Option<Timestamp>,
    lease_until: Option<Timestamp>,
}

impl Written<'_> {
    /// A slot nobody ran (missed, skipped), ended at `now`.
    fn ended(state: RecordState, now: Timestamp) -> Self {
        Self {
            state,
            attempt: None,
            token: None,
            fence: None,
            instance: None,
            started_at: None,
            finished_at: Some(now),
            lease_until: None,
        }
    }
}

/// The clock and the run, read at the start of a claim.
struct ClaimRow {
    now: i64,
    state: Option<String>,
    attempt: Option<i64>,
    token: Option<String>,
    fence: Option<i64>,
    lease_until: Option<i64>,
}

impl ClaimRow {
    /// The run's record as the core's decisions read it; `None` when the
    /// run has no record.
    fn lease_record(&self) -> Result<Option<LeaseRecord>, StoreError> {
        let Some(state) = parse_state(self.state.as_deref())? else {
            return Ok(None);
        };
        Ok(Some(LeaseRecord {
            state,
            attempt: self.attempt.map(parse_attempt).transpose()?,
            holder: self
                .token
                .as_deref()
                .map(|t| Token::parse(t).ok_or_else(|| bad_value("token", t)))
                .transpose()?,
            fence: self.fence.map(parse_fence).transpose()?,
            lease_until: self.lease_until.map(Timestamp::from_millis),
        }))
    }
}

impl<'r> FromRow<'r, SqliteRow> for ClaimRow {
    fn from_row(row: &'r SqliteRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            now: row.try_get("now")?,
            state: row.try_get("state")?,
            attempt: row.try_get("attempt")?,
            token: row.try_get("token")?,
            fence: row.try_get("fence")?,
            lease_until: row.try_get("lease_until")?,
        })
    }
}

/// What `peek` reads.
struct PeekRow {
    now: i64,
    state: Option<String>,
    attempt: Option<i64>,
    lease_until: Option<i64>,
}

impl<'r> FromRow<'r, SqliteRow> for PeekRow {
    fn from_row(row: &'r SqliteRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            now: row.try_get("now")?,
            state: row.try_get("state")?,
            attempt: row.try_get("attempt")?,
            lease_until: row.try_get("lease_until")?,
        })
    }
}

/// One run of a job's history.
struct HistoryRow {
    slot: i64,
    state: String,
    attempt: Option<i64>,
    fence: Option<i64>,
    instance: Option<String>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    lease_until: Option<i64>,
    error: Option<String>,
}

impl<'r> FromRow<'r, SqliteRow> for HistoryRow {
    fn from_row(row: &'r SqliteRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            slot: row.try_get("slot")?,
            state: row.try_get("state")?,
            attempt: row.try_get("attempt")?,
            fence: row.try_get("fence")?,
            instance: row.try_get("instance")?,
            started_at: row.try_get("started_at")?,
            finished_at: row.try_get("finished_at")?,
            lease_until: row.try_get("lease_until")?,
            error: row.try_get("error")?,
        })
    }
}

impl HistoryRow {
    fn into_record(self, job: &JobName) -> Result<RunRecord, StoreError> {
        let state =
            RecordState::parse(&self.state).ok_or_else(|| bad_value("run state", &self.state))?;
        let instance = self
            .instance
            .map(|i| InstanceId::new(&i).map_err(|_| bad_value("instance id", &i)))
            .transpose()?;
        Ok(RunRecord {
            run: RunKey::new(job.clone(), Slot::from_millis(self.slot)),
            state,
            attempt: self.attempt.map(parse_attempt).transpose()?,
            fence: self.fence.map(parse_fence).transpose()?,
            instance,
            started_at: self.started_at.map(Timestamp::from_millis),
            finished_at: self.finished_at.map(Timestamp::from_millis),
            lease_until: self.lease_until.map(Timestamp::from_millis),
            error: self.error,
        })
    }
}

fn parse_state(text: Option<&str>) -> Result<Option<RecordState>, StoreError> {
    text.map(|s| RecordState::parse(s).ok_or_else(|| bad_value("run state", s)))
        .transpose()
}

fn parse_attempt(n: i64) -> Result<Attempt, StoreError> {
    u32::try_from(n)
        .ok()
        .and_then(Attempt::new)
        .ok_or_else(|| bad_value("attempt", n))
}

fn parse_fence(n: i64) -> Result<Fence, StoreError> {
    u64::try_from(n)
        .map(Fence::new)
        .map_err(|_| bad_value("fence", n))
}

fn fence_value(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| bad_value("fence", fence.get()))
}

fn expect_one_row(doing: &str, changed: u64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::protocol(
            BACKEND,
            format!("{doing} changed {changed} rows inside the claim transaction; expected 1"),
        ))
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(code::BUSY | code::LOCKED))
}

/// An error while opening, with the file's name and the cases a user can fix.
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

fn open_error(options: &SqliteOptions, doing: &'static str, e: sqlx::Error) -> Error {
    let path = options.get_path().to_path_buf();
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
            busy_timeout: options.get_busy_timeout(),
            doing,
        },
        _ if matches!(e, sqlx::Error::PoolTimedOut) => Error::Locked {
            path,
            busy_timeout: options.get_busy_timeout(),
            doing,
        },
        _ => Error::Sqlite {
            path,
            doing,
            source: e,
        },
    }
}

anarchon_core::claims_through_leases!(SqliteStore, BACKEND);

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        self.claim_many(std::slice::from_ref(req))
            .await?
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(StoreError::protocol(BACKEND, "a claim produced no outcome")))
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        if reqs.is_empty() {
            return Ok(ClaimAnswers::default());
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err("starting the claim transaction", e))?;
        let mut answers = Vec::with_capacity(reqs.len());
        let mut now = None;
        for req in reqs {
            // Each claim under its own savepoint: a claim that fails on
            // its own (a record it cannot read) is undone alone, and the
            // batch goes on. A temporary error (a lock) fails the batch.
            self.savepoint(&mut tx, "SAVEPOINT claim").await?;
            match self.claim_in(&mut tx, req, &mut now).await {
                Ok(outcome) => {
                    self.savepoint(&mut tx, "RELEASE claim").await?;
                    answers.push(Ok(outcome));
                }
                Err(error) if error.is_temporary() => return Err(error),
                Err(error) => {
                    self.savepoint(&mut tx, "ROLLBACK TO claim").await?;
                    self.savepoint(&mut tx, "RELEASE claim").await?;
                    answers.push(Err(error));
                }
            }
        }
        tx.commit()
            .await
            .map_err(|e| self.err("committing the claim", e))?;
        Ok(ClaimAnswers::new(answers))
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        let row: PeekRow = sqlx::query_as(self.sql.peek.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("reading the run", e))?;
        let now = Timestamp::from_millis(row.now);
        let state = match parse_state(row.state.as_deref())? {
            None => RunState::Absent,
            Some(state) => RunState::of_record(
                state,
                row.attempt.map(parse_attempt).transpose()?,
                row.lease_until.map(Timestamp::from_millis),
                now,
            ),
        };
        Ok(RunView {
            store_now: now,
            state,
        })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        let query = sqlx::query(self.sql.heartbeat.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(token.to_string())
            .bind(millis(lease));
        self.update_held("renewing the lease", query).await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        let (state, error) = match outcome {
            RunOutcome::Succeeded => (FinalState::Succeeded, None),
            RunOutcome::Failed { error } => (FinalState::Failed, Some(error)),
        };
        let query = sqlx::query(self.sql.finish.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(token.to_string())
            .bind(state.as_str())
            .bind(error);
        self.update_held("recording the outcome", query).await
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let query = sqlx::query(self.sql.release.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(token.to_string());
        let answer = self.update_held("releasing the lease", query).await?;
        if answer == Renewal::Renewed {
            self.hand_overs.announce(run);
        }
        Ok(answer)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let query = sqlx::query(self.sql.give_back.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(token.to_string());
        let answer = self.update_held("giving the run back", query).await?;
        if answer == Renewal::Renewed {
            self.hand_overs.announce(run);
        }
        Ok(answer)
    }

    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.hand_overs.wait(run, timeout).await
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let rows: Vec<HistoryRow> = sqlx::query_as(self.sql.history.clone())
            .bind(job.as_str())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("reading the history", e))?;
        rows.into_iter().map(|r| r.into_record(job)).collect()
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        let deleted = sqlx::query(self.sql.collect_garbage.clone())
            .bind(millis(keep))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err("collecting old runs", e))?
            .rows_affected();
        Ok(deleted)
    }
}

impl SqliteStore {
    /// The jobs that have records, in name order: what `anarchon history`
    /// lists when no job is named.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the database cannot be read, or holds a job name
    /// this crate would not have written.
    pub async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(self.sql.jobs.clone())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("listing the jobs", e))?;
        names
            .into_iter()
            .map(|n| JobName::new(&n).map_err(|_| bad_value("job name", &n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::{ClaimRequest, MaxAttempts, Overlap};
    use sqlx::SqlSafeStr as _;

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

    #[tokio::test]
    async fn the_overlap_check_reads_only_the_live_runs_index() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(SqliteOptions::new(dir.path().join("plan.db")).table_prefix("plan"))
                .await
                .unwrap();
        // A job with a finished history and one live run.
        let job = JobName::new("busy-job").unwrap();
        let now = chrono_free_now_ms();
        for i in 0..50 {
            let run = RunKey::new(job.clone(), Slot::from_millis(now - 50_000 + i * 1000));
            let token = Token::generate();
            let claim = LeaseClaim {
                claim: ClaimRequest {
                    run: run.clone(),
                    token,
                    instance: InstanceId::new("plan").unwrap(),
                    max_late: Duration::from_secs(3600),
                },
                lease: Duration::from_secs(30),
                overlap: Overlap::Allow,
                max_attempts: MaxAttempts::DEFAULT,
            };
            assert!(matches!(
                store.claim_lease(&claim).await.unwrap(),
                ClaimOutcome::Won(_)
            ));
            if i < 49 {
                store
                    .finish(&run, token, RunOutcome::Succeeded)
                    .await
                    .unwrap();
            }
        }
        let explain = format!("EXPLAIN QUERY PLAN {}", store.sql.live_run_exists.as_str());
        let rows = sqlx::query(sqlx::AssertSqlSafe(explain).into_sql_str())
            .bind(job.as_str())
            .bind(now)
            .bind(now)
            .fetch_all(&store.pool)
            .await
            .unwrap();
        let plan: Vec<String> = rows
            .iter()
            .map(|r| r.try_get::<String, _>("detail").unwrap())
            .collect();
        println!("overlap check plan:\n  {}", plan.join("\n  "));
        assert!(
            plan.iter().any(|d| d.starts_with("SEARCH plan_runs USING")
                && d.contains("INDEX plan_runs_live (job=? AND lease_until>?)")),
            "the overlap check must search the partial index of live runs: {plan:?}"
        );
        assert!(
            !plan.iter().any(|d| d.contains("SCAN plan_runs")),
            "the overlap check must not scan the runs: {plan:?}"
        );
    }

    fn chrono_free_now_ms() -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        i64::try_from(since.as_millis()).unwrap()
    }
}
