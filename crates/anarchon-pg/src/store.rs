//! `PgStore`: the lease store on PostgreSQL.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anarchon_core::hand_over::{announced, news_of, run_in_news};
use anarchon_core::stored::{self, RunColumns};
use anarchon_core::time::millis;
use anarchon_core::{
    ClaimAnswers, ClaimOutcome, HandOvers, JobName, LeaseClaim, LeaseStore, Listener, Pause,
    PauseRequest, PauseScope, Pauses, Renewal, RunKey, RunOutcome, RunRecord, RunRequest,
    RunRequests, RunState, RunView, StoreError, Timestamp, Token, TriggerRequest,
};
use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::connection::{Resend, send};
use crate::error::{BACKEND, Error};
use crate::finishes::{Finish, FinishGroup, Finishes};
use crate::migrate::{drop_schema, schema_version};
use crate::options::TableName;
use crate::rows::{PauseRow, PeekRow, reason};
use crate::sql::Statements;

/// A lease store on PostgreSQL.
///
/// Every claim — one run or a whole batch — is one call of the
/// `<table>_claim` function: one statement, one transaction, one round
/// trip. Inside it the job's row in `<table>_jobs` is locked first, so the
/// claims of one job take turns, and the decision is made on the server's
/// clock after the locks were granted. Heartbeat, release, peek, history
/// and garbage collection are one statement each. Finishes that arrive
/// while one is being recorded go together in the next statement (one
/// transaction for a burst of runs ending at once); each still gets its
/// own answer.
///
/// Each store owns a connection pool; open one store per process and share
/// it (`Arc<PgStore>`).
///
/// # Cancel safety
///
/// Every method sends one statement (sent again on another connection only
/// when the connection broke and repeating cannot change the answer). If a
/// future is dropped halfway, the statement either committed or did not;
/// sending the same request again (same token) gives the right answer. A
/// finish is sent by a task of the store's: a dropped future stops the
/// wait for its answer, not the statement.
pub struct PgStore {
    pub(crate) pool: PgPool,
    table: TableName,
    pub(crate) sql: Statements,
    pub(crate) statements: Arc<AtomicU64>,
    /// Finishes waiting for the statement that carries them.
    finishes: Arc<Finishes>,
    pub(crate) resends: u32,
    /// Hand-overs heard: this handle's own, and (through `LISTEN`) those of
    /// every other store on the table.
    hand_overs: Arc<HandOvers>,
    _listener: Listener,
}

/// The channel every anarchon-pg store announces hand-overs on; the
/// payload is `table<TAB>job slot` (`news_of`), so stores of other tables ignore
/// what is not theirs.
const HAND_OVER_CHANNEL: &str = "anarchon_hand_over";

/// How long opening a store waits for its `LISTEN` to hold.
const LISTEN_WAIT: Duration = Duration::from_secs(1);

/// Listens for the table's hand-overs on one connection until it is lost.
async fn listen(pool: PgPool, table: TableName, board: Arc<HandOvers>) -> Result<(), sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
    listener.listen(HAND_OVER_CHANNEL).await?;
    // Listening again after a loss: what was sent meanwhile is lost.
    board.reconnected();
    loop {
        let note = listener.recv().await?;
        // `table<TAB><news>`: the table's news only.
        let Some((t, news)) = note.payload().split_once('\t') else {
            continue;
        };
        if t == table.as_str()
            && let Some(run) = run_in_news(news)
        {
            board.announce(&run);
        }
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.options().get_max_connections())
            .field("statements", &self.statements_sent())
            .finish_non_exhaustive()
    }
}
impl PgStore {
    pub(crate) fn assemble(pool: PgPool, table: TableName) -> Self {
        let resends = pool.options().get_max_connections();
        // One connection of its own for LISTEN, opened by the task.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .connect_lazy_with((*pool.connect_options()).clone());
        let hand_overs = Arc::new(HandOvers::new());
        let listener = {
            let (table, board) = (table.clone(), hand_overs.clone());
            Listener::reconnecting("the hand-over listener", move || {
                listen(listen_pool.clone(), table.clone(), board.clone())
            })
        };
        let sql = Statements::new(&table);
        let statements = Arc::new(AtomicU64::new(0));
        let finishes = Finishes::new(FinishGroup::new(
            pool.clone(),
            statements.clone(),
            resends,
            sql.finish.clone(),
        ));
        Self {
            hand_overs,
            _listener: listener,
            sql,
            pool,
            table,
            statements,
            finishes,
            resends,
        }
    }

    /// The store once its `LISTEN` holds (or a second has passed), so it
    /// hears every hand-over and request from then on.
    pub(crate) async fn listening(self) -> Self {
        if !self.hand_overs.listening(LISTEN_WAIT).await {
            tracing::debug!(table = %self.table, "the hand-over listener is not connected yet; news before it is missed");
        }
        self
    }

    /// Tells the backups of every store on the table (this one at once)
    /// that `run` was handed over: one `pg_notify`. Best effort: a backup
    /// that misses it reads the run when the lease would have ended.
    pub(crate) async fn announce_hand_over(&self, run: &RunKey) {
        self.hand_overs.announce(run);
        let payload = format!("{}\t{}", self.table.as_str(), news_of(run));
        let sent = sqlx::query(include_str!("../sql/announce_hand_over.sql"))
            .bind(HAND_OVER_CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await;
        if let Err(error) = sent {
            tracing::debug!(%error, %run, "could not announce a hand-over; backups learn of it at their next read");
        }
    }

    /// The store's connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The store's table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// How many statements this store has sent to the server (each call
    /// sends one, except that finishes arriving together share one; a
    /// statement sent again after a broken connection counts again). For
    /// benchmarks and tests: statements per claim is 1.
    pub fn statements_sent(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// The schema version of the store's table.
    ///
    /// # Errors
    ///
    /// The server's error.
    pub async fn schema_version(&self) -> Result<u32, Error> {
        let mut conn = self.pool.acquire().await.map_err(|e| {
            Error::from_sqlx(
                format!("reading the schema version of table {}", self.table),
                e,
            )
        })?;
        schema_version(&mut conn, &self.table).await
    }

    /// Closes the pool: waits for calls in flight, then closes every
    /// connection. Later calls fail.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Drops every object of the store's table; see [`migrate::drop_schema`](crate::migrate::drop_schema).
    ///
    /// # Errors
    ///
    /// The server's error.
    pub async fn drop_schema(&self) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await.map_err(|e| {
            Error::from_sqlx(format!("dropping the schema of table {}", self.table), e)
        })?;
        drop_schema(&mut conn, &self.table).await
    }
    async fn update_held(
        &self,
        what: &str,
        sql: &sqlx::SqlStr,
        run: &RunKey,
        token: Token,
        resend: Resend,
        bind: impl Fn(
            sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Renewal, Error> {
        let done = send!(self, resend, format!("{what} of {run}"), |conn| {
            bind(
                sqlx::query(sql.clone())
                    .bind(run.job.as_str())
                    .bind(run.slot.as_millis())
                    .bind(*token.as_uuid()),
            )
            .execute(conn)
        })?;
        Ok(match done.rows_affected() {
            0 => Renewal::Fenced,
            _ => Renewal::Renewed,
        })
    }
}
anarchon_core::claims_through_leases!(PgStore, BACKEND);

#[async_trait]
impl LeaseStore for PgStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let mut outcomes = self.claim_batch(std::slice::from_ref(req)).await?;
        Ok(outcomes
            .pop()
            .ok_or_else(|| Error::protocol(format!("claiming {}", req.run()), "no answer"))??)
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        Ok(self
            .claim_batch(reqs)
            .await?
            .into_iter()
            .map(|answer| answer.map_err(StoreError::from))
            .collect())
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        let row: PeekRow = send!(self, Resend::Always, format!("reading {run}"), |conn| {
            sqlx::query_as::<_, PeekRow>(self.sql.peek.clone())
                .bind(run.job.as_str())
                .bind(run.slot.as_millis())
                .fetch_one(conn)
        })?;
        let store_now = Timestamp::from_millis(row.store_now);
        let protocol = |e| Error::protocol(format!("reading {run}"), reason(e));
        let state = match row.state.as_deref() {
            None => RunState::Absent,
            Some(text) => RunState::of_record(
                stored::state(text).map_err(protocol)?,
                row.attempt
                    .map(|n| stored::attempt(n.into()))
                    .transpose()
                    .map_err(protocol)?,
                row.lease_until.map(Timestamp::from_millis),
                row.retry_at.map(Timestamp::from_millis),
                store_now,
            ),
        };
        Ok(RunView { store_now, state })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        let lease = millis(lease);
        Ok(self
            .update_held(
                "renewing the lease",
                &self.sql.heartbeat,
                run,
                token,
                Resend::Always,
                |q| q.bind(lease),
            )
            .await?)
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        // A retry the runner asks for: the store turns the wait into a due
        // time on its own clock, or finds it not before the next slot.
        let plan = match &outcome {
            RunOutcome::Failed {
                retry: Some(plan), ..
            } => Some(*plan),
            _ => None,
        };
        let (state, error) = outcome.into_record();
        let error = error.map(storable);
        let answer = self
            .finishes
            .call(Finish {
                run: run.clone(),
                token,
                state: state.as_str(),
                error,
                retry: plan.map(|p| (millis(p.after), p.before.as_millis())),
            })
            .await
            .unwrap_or_else(|unanswered| {
                Err(Error::Unavailable {
                    action: format!("recording the end of {run}"),
                    reason: unanswered.to_string(),
                    source: None,
                })
            });
        Ok(answer?)
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .update_held(
                "releasing the lease",
                &self.sql.release,
                run,
                token,
                Resend::Always,
                |q| q,
            )
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .update_held(
                "giving the run back",
                &self.sql.give_back,
                run,
                token,
                Resend::IfNotApplied,
                |q| q,
            )
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    fn hand_overs(&self) -> &HandOvers {
        &self.hand_overs
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        // `LIMIT 0` reads nothing.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let action = || format!("reading the history of {job}");
        let rows: Vec<RunColumns> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, RunColumns>(self.sql.history.clone())
                .bind(job.as_str())
                .bind(limit)
                .fetch_all(conn)
        })?;
        rows.into_iter()
            .map(|columns| {
                stored::run_record(job, columns)
                    .map_err(|e| Error::protocol(action(), reason(e)).into())
            })
            .collect()
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        let keep = millis(keep);
        let done = send!(
            self,
            Resend::Always,
            format!("collecting old runs of table {}", self.table),
            |conn| {
                sqlx::query(self.sql.collect_garbage.clone())
                    .bind(keep)
                    .execute(conn)
            }
        )?;
        Ok(done.rows_affected())
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        let action = || format!("pausing {scope} in table {}", self.table);
        let now: i64 = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_scalar(self.sql.now.clone()).fetch_one(conn)
        })?;
        let pause = req
            .at(scope, Timestamp::from_millis(now))
            .map_err(|refused| refused.into_store_error(BACKEND))?;
        // Writing the same pause again changes nothing.
        send!(self, Resend::Always, action(), |conn| {
            sqlx::query(self.sql.pause.clone())
                .bind(scope.key())
                .bind(pause.since.as_millis())
                .bind(pause.end.as_millis())
                .bind(pause.reason.as_deref())
                .bind(pause.by.as_deref())
                .execute(conn)
        })?;
        Ok(pause)
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        // Sent again after a lost reply, the delete finds nothing: the
        // answer would say no pause was there.
        let done = send!(
            self,
            Resend::IfNotApplied,
            format!("resuming {scope} in table {}", self.table),
            |conn| {
                sqlx::query(self.sql.resume.clone())
                    .bind(scope.key())
                    .execute(conn)
            }
        )?;
        Ok(done.rows_affected() > 0)
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        let action = || format!("listing the jobs of table {}", self.table);
        let names: Vec<String> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_scalar(self.sql.jobs.clone()).fetch_all(conn)
        })?;
        names
            .into_iter()
            .map(|n| {
                JobName::new(&n).map_err(|_| {
                    StoreError::from(Error::protocol(action(), format!("invalid job name {n:?}")))
                })
            })
            .collect()
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        let action = || format!("reading the pauses of table {}", self.table);
        let rows: Vec<PauseRow> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, PauseRow>(self.sql.pauses.clone()).fetch_all(conn)
        })?;
        let now = rows.first().map_or(0, |row| row.store_now);
        let pauses = rows
            .into_iter()
            .filter_map(|row| row.into_pause().transpose())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| StoreError::from(Error::protocol(action(), reason)))?;
        Ok(Pauses::holding(pauses, Timestamp::from_millis(now)))
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.write_request(req).await
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.read_requests().await
    }
}

/// A handler's error text as PostgreSQL can store it: `text` cannot hold
/// a NUL character, and a finish the server refuses for one would leave
/// the run `running` until a backup takes it over and runs the handler
/// again. Each NUL reads `\0` instead.
fn storable(error: String) -> String {
    if error.contains('\0') {
        error.replace('\0', "\\0")
    } else {
        error
    }
}
