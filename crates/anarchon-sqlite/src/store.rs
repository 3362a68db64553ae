//! `SqliteStore`: the lease flowchart in one `BEGIN IMMEDIATE` transaction.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::HandOvers;
use anarchon_core::stored::{self, PauseColumns, RunColumns};
use anarchon_core::time::millis;
use anarchon_core::{
    ClaimAnswers, ClaimOutcome, JobName, LeaseClaim, LeaseStore, Pause, PauseRequest, PauseScope,
    Pauses, Renewal, RunKey, RunOutcome, RunRecord, RunRequest, RunRequests, RunState, RunView,
    StoreError, Timestamp, Token, TriggerRequest,
};
use async_trait::async_trait;
use sqlx::SqlitePool;

use crate::BACKEND;
use crate::error::{bad_stored, bad_value, store_error_when};
use crate::finishes::{Finish, Finishes, action_for};
use crate::options::SqliteOptions;
use crate::rows::{PeekRow, parse_state};
use crate::sql::Sql;

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
///   [`Renewal::Fenced`]. Finishes that arrive while one is being written
///   go together in the next write transaction, each still its own
///   `UPDATE` with its own answer ([`SqliteStore::finish_transactions`]).
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
    pub(crate) pool: SqlitePool,
    pub(crate) sql: Arc<Sql>,
    pub(crate) options: Arc<SqliteOptions>,
    /// Hand-overs heard: shared by every store of this process on the same
    /// file and prefix. SQLite cannot push a change to other processes;
    /// their backups learn of a hand-over at their next read.
    pub(crate) hand_overs: Arc<HandOvers>,
    /// The watcher that announces other processes' requests, started by
    /// the first [`LeaseStore::announcements`].
    pub(crate) request_watch: Arc<std::sync::OnceLock<anarchon_core::Listener>>,
    /// Finishes: those that arrive together share one write transaction.
    pub(crate) finishes: Arc<Finishes>,
}

/// The hand-over board of each (file, prefix) open in this process.
pub(crate) fn board_for(path: &Path, prefix: &str) -> Arc<HandOvers> {
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
            .field("path", &self.options.path())
            .field("table_prefix", &self.options.table_prefix())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.options.path()
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

    /// How many write transactions this handle's finishes have tried
    /// (committed or not). Finishes that arrive while one
    /// transaction is in flight share the next, so under load this grows
    /// slower than the number of finishes.
    pub fn finish_transactions(&self) -> u64 {
        self.finishes
            .group()
            .transactions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn err(&self, doing: &str, e: sqlx::Error) -> StoreError {
        store_error_when(&self.options, doing, e)
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
                row.attempt
                    .map(stored::attempt)
                    .transpose()
                    .map_err(bad_stored)?,
                row.lease_until.map(Timestamp::from_millis),
                row.retry_at.map(Timestamp::from_millis),
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
        let retry = match &outcome {
            RunOutcome::Failed { retry, .. } => *retry,
            RunOutcome::Succeeded => None,
        };
        let (state, error) = outcome.into_record();
        let finish = Finish {
            run: run.clone(),
            token,
            state: state.as_str(),
            error,
            retry,
        };
        self.finishes
            .call(finish)
            .await
            .unwrap_or_else(|unanswered| Err(unanswered.store_error(BACKEND, &action_for(run))))
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

    fn hand_overs(&self) -> &HandOvers {
        &self.hand_overs
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let rows: Vec<RunColumns> = sqlx::query_as(self.sql.history.clone())
            .bind(job.as_str())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("reading the history", e))?;
        rows.into_iter()
            .map(|columns| stored::run_record(job, columns).map_err(bad_stored))
            .collect()
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        let deleted = sqlx::query(self.sql.collect_garbage.clone())
            .bind(millis(keep))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err("collecting old runs", e))?
            .rows_affected();
        self.collect_requests(keep).await?;
        Ok(deleted)
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err("starting the pause", e))?;
        let now: i64 = sqlx::query_scalar(self.sql.now.clone())
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| self.err("reading the clock", e))?;
        let pause = req
            .at(scope, Timestamp::from_millis(now))
            .map_err(|refused| refused.into_store_error(BACKEND))?;
        sqlx::query(self.sql.pause.clone())
            .bind(scope.key())
            .bind(pause.since.as_millis())
            .bind(pause.end.as_millis())
            .bind(pause.reason.as_deref())
            .bind(pause.by.as_deref())
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err("writing the pause", e))?;
        tx.commit()
            .await
            .map_err(|e| self.err("committing the pause", e))?;
        Ok(pause)
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        let removed = sqlx::query(self.sql.resume.clone())
            .bind(scope.key())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err("removing the pause", e))?
            .rows_affected();
        Ok(removed > 0)
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(self.sql.jobs.clone())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("listing the jobs", e))?;
        names
            .into_iter()
            .map(|n| JobName::new(&n).map_err(|_| bad_value("job name", &n)))
            .collect()
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        let now: i64 = sqlx::query_scalar(self.sql.now.clone())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("reading the clock", e))?;
        let rows: Vec<PauseColumns> = sqlx::query_as(self.sql.pauses.clone())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("reading the pauses", e))?;
        let pauses = rows
            .into_iter()
            .map(stored::pause)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad_stored)?;
        Ok(Pauses::holding(pauses, Timestamp::from_millis(now)))
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.write_request(req).await
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.read_requests().await
    }

    fn announcements(&self) -> tokio::sync::broadcast::Receiver<RunKey> {
        let news = self.hand_overs.subscribe();
        self.watch_requests();
        news
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::{ClaimRequest, InstanceId, MaxAttempts, Overlap, Slot};
    use sqlx::Row as _;
    use sqlx::SqlSafeStr as _;

    #[tokio::test]
    async fn the_overlap_check_reads_only_the_live_runs_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(
            SqliteOptions::new(dir.path().join("plan.db")).with_table_prefix("plan"),
        )
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
                rerun_paused: false,
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
            plan.iter().any(|d| d.starts_with("SEARCH plan_runs USING")
                && d.contains("INDEX plan_runs_retrying (job=? AND retry_at>?)")),
            "the overlap check must search the partial index of runs waiting for a retry: {plan:?}"
        );
        assert!(
            !plan.iter().any(|d| d.contains("SCAN plan_runs")),
            "the overlap check must not scan the runs: {plan:?}"
        );
        let explain = format!(
            "EXPLAIN QUERY PLAN {}",
            store.sql.waiting_slot_exists.as_str()
        );
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
        assert!(
            plan.iter()
                .any(|d| d.contains("INDEX plan_runs_waiting (job=? AND lease_until>?)"))
                && !plan.iter().any(|d| d.contains("SCAN plan_runs")),
            "the check for a waiting slot must search the partial index of waiting slots: {plan:?}"
        );
        for (statement, index) in [
            (&store.sql.replace_running, "INDEX plan_runs_live (job=?)"),
            (
                &store.sql.replace_retrying,
                "INDEX plan_runs_retrying (job=?",
            ),
        ] {
            let explain = format!("EXPLAIN QUERY PLAN {}", statement.as_str());
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
            assert!(
                plan.iter().any(|d| d.contains(index))
                    && !plan.iter().any(|d| d.contains("SCAN plan_runs")),
                "a replacing start must search {index}: {plan:?}"
            );
        }
    }

    fn chrono_free_now_ms() -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        i64::try_from(since.as_millis()).unwrap()
    }
}
