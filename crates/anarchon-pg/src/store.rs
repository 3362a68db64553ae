//! `PgStore`: the lease store on PostgreSQL.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anarchon_core::time::millis;
use anarchon_core::{
    Attempt, ClaimAnswers, ClaimOutcome, Fence, FinalState, HandOvers, InstanceId, JobName,
    LeaseClaim, LeaseStore, Listener, Overlap, RecordState, Renewal, RunKey, RunOutcome, RunRecord,
    RunState, RunView, Slot, StoreError, Timestamp, Token, Win,
};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow, PgSslMode};
use sqlx::{Connection, FromRow, PgConnection, PgPool, Row};

use crate::error::{BACKEND, PgError, certainly_not_applied, connection_broken};
use crate::migrate::{SCHEMA_VERSION, drop_schema, migrate_to, schema_version};
use crate::options::{PgOptions, TableName, scrub, secrets_of};
use crate::sql::Statements;
use anarchon_core::url::redact;

/// A lease store on PostgreSQL.
///
/// Every claim — one run or a whole batch — is one call of the
/// `<table>_claim` function: one statement, one transaction, one round
/// trip. Inside it the job's row in `<table>_jobs` is locked first, so the
/// claims of one job take turns, and the decision is made on the server's
/// clock after the locks were granted. Heartbeat, finish, release, peek,
/// history and garbage collection are one statement each.
///
/// Each store owns a connection pool; open one store per process and share
/// it (`Arc<PgStore>`).
///
/// # Cancel safety
///
/// Every method sends one statement (sent again on another connection only
/// when the connection broke and repeating cannot change the answer). If a
/// future is dropped halfway, the statement either committed or did not;
/// sending the same request again (same token) gives the right answer.
pub struct PgStore {
    pool: PgPool,
    table: TableName,
    sql: Statements,
    statements: AtomicU64,
    resends: u32,
    /// Hand-overs heard: this handle's own, and (through `LISTEN`) those of
    /// every other store on the table.
    hand_overs: Arc<HandOvers>,
    _listener: Listener,
}

/// The channel every anarchon-pg store announces hand-overs on; the
/// payload is `table<TAB>job<TAB>slot`, so stores of other tables ignore
/// what is not theirs.
const HAND_OVER_CHANNEL: &str = "anarchon_hand_over";

/// Listens for the table's hand-overs until aborted, connecting again
/// (after a pause) whenever the connection is lost.
async fn listen(pool: PgPool, table: TableName, board: Arc<HandOvers>) {
    loop {
        let heard = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(HAND_OVER_CHANNEL).await?;
            loop {
                let note = listener.recv().await?;
                let mut parts = note.payload().split('\t');
                let (Some(t), Some(job), Some(slot)) = (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                if t != table.as_str() {
                    continue;
                }
                if let (Ok(job), Ok(slot)) = (JobName::new(job), slot.parse::<i64>()) {
                    board.announce(&RunKey::new(job, Slot::from_millis(slot)));
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        if let Err(error) = heard.await {
            tracing::debug!(%error, "hand-over listener lost its connection; listening again shortly");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
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

/// Whether a statement that failed on a broken connection may be sent
/// again on another one.
#[derive(Clone, Copy)]
enum Resend {
    /// Repeating it cannot change its answer: claims carry their token, a
    /// heartbeat or release sets the lease again, a finish sent again by
    /// its token is answered as the first, reads read again.
    Always,
    /// Only when the server proved it did not apply it: a repeated give-back
    /// would be answered `Fenced` (the first cleared the token).
    IfNotApplied,
}

impl Resend {
    fn allows(self, error: &sqlx::Error) -> bool {
        match self {
            Resend::Always => true,
            Resend::IfNotApplied => certainly_not_applied(error),
        }
    }
}

/// Sends one statement on a pooled connection: `$query` is an expression
/// over `$conn: &mut PgConnection` that yields a future.
///
/// A connection that failed at the transport level is closed rather than
/// returned to the pool. After a server restart every idle connection is
/// dead, so the statement is sent again on another connection — at most
/// once per pooled connection, and only as [`Resend`] allows.
macro_rules! send {
    ($store:expr, $resend:expr, $action:expr, |$conn:ident| $query:expr) => {{
        let store: &PgStore = $store;
        let mut resent = 0u32;
        loop {
            let mut pooled = match store.pool.acquire().await {
                Ok(pooled) => pooled,
                Err(error) => break Err(PgError::from_sqlx($action, error)),
            };
            store.statements.fetch_add(1, Ordering::Relaxed);
            let result = {
                let $conn: &mut PgConnection = &mut *pooled;
                $query.await
            };
            match result {
                Ok(value) => break Ok(value),
                Err(error) => {
                    let broken = connection_broken(&error);
                    if broken {
                        pooled.close_on_drop();
                    }
                    if broken && resent < store.resends && $resend.allows(&error) {
                        resent += 1;
                        tracing::debug!(%error, resent, "connection lost; sending the statement again on another connection");
                        continue;
                    }
                    break Err(PgError::from_sqlx($action, error));
                }
            }
        }
    }};
}

impl PgStore {
    /// Connects to `url` with the default [`PgOptions`] (table `anarchon`)
    /// and migrates the schema.
    ///
    /// # Errors
    ///
    /// See [`PgStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, PgError> {
        Self::connect_with(PgOptions::new(url)).await
    }

    /// Connects with `options`: opens one connection (within the connect
    /// timeout) to create or migrate the schema, or with migrations off to
    /// check its version, then builds the pool, which opens connections as
    /// calls need them.
    ///
    /// # Errors
    ///
    /// * [`PgError::InvalidOption`] or [`PgError::InvalidUrl`] before
    ///   anything is sent (table names are checked when they are set).
    /// * [`PgError::Unavailable`] when the server does not answer within the
    ///   connect timeout or refuses connections.
    /// * [`PgError::Refused`] for wrong credentials, a missing database, or
    ///   a table name taken by something else; the message never contains
    ///   the password.
    /// * [`PgError::SchemaTooNew`] / [`PgError::SchemaOutdated`].
    pub async fn connect_with(options: PgOptions) -> Result<Self, PgError> {
        options.validate()?;
        let secrets = secrets_of(&options.url);
        let connect = connect_options(&options, &secrets)?;
        let server = describe_server(&connect);
        let action = format!("connecting to PostgreSQL at {server}");
        let opened = tokio::time::timeout(
            options.connect_timeout,
            PgConnection::connect_with(&connect),
        )
        .await;
        let mut conn = match opened {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                return Err(without_secrets(PgError::from_sqlx(action, error), &secrets));
            }
            Err(_) => {
                return Err(PgError::Unavailable {
                    action,
                    reason: format!(
                        "no answer within the connect timeout ({:?})",
                        options.connect_timeout
                    ),
                    source: None,
                });
            }
        };
        let prepared = prepare_schema(&mut conn, &options.table, options.migrate).await;
        // The schema connection is not kept: the pool opens its own.
        let _ = conn.close().await;
        prepared?;
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size)
            .min_connections(0)
            .acquire_timeout(options.connect_timeout)
            // A ping before each call would double the round trips; a dead
            // connection is found by the call itself and replaced.
            .test_before_acquire(false)
            .connect_lazy_with(connect);
        Ok(Self::assemble(pool, options.table))
    }

    /// A store on an existing pool (whose connections must reach the
    /// database the schema lives in), migrating the schema first when
    /// `migrate` is true.
    ///
    /// Consider `test_before_acquire(false)` on the pool: otherwise each
    /// call costs a ping round trip before its statement.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect_with`].
    pub async fn from_pool(pool: PgPool, table: TableName, migrate: bool) -> Result<Self, PgError> {
        let mut conn = pool.acquire().await.map_err(|e| {
            PgError::from_sqlx("taking a connection from the pool to prepare the schema", e)
        })?;
        prepare_schema(&mut conn, &table, migrate).await?;
        drop(conn);
        Ok(Self::assemble(pool, table))
    }

    fn assemble(pool: PgPool, table: TableName) -> Self {
        let resends = pool.options().get_max_connections();
        // One connection of its own for LISTEN, opened by the task.
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .connect_lazy_with((*pool.connect_options()).clone());
        let hand_overs = Arc::new(HandOvers::new());
        let listener = Listener::spawn(listen(listen_pool, table.clone(), hand_overs.clone()));
        Self {
            hand_overs,
            _listener: listener,
            sql: Statements::new(&table),
            pool,
            table,
            statements: AtomicU64::new(0),
            resends,
        }
    }

    /// Tells the backups of every store on the table (this one at once)
    /// that `run` was handed over: one `pg_notify`. Best effort: a backup
    /// that misses it reads the run when the lease would have ended.
    async fn announce_hand_over(&self, run: &RunKey) {
        self.hand_overs.announce(run);
        let payload = format!(
            "{}\t{}\t{}",
            self.table.as_str(),
            run.job,
            run.slot.as_millis()
        );
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
    /// sends one; a statement sent again after a broken connection counts
    /// again). For benchmarks and tests: statements per claim is 1.
    pub fn statements_sent(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// The schema version of the store's table.
    ///
    /// # Errors
    ///
    /// The server's error.
    pub async fn schema_version(&self) -> Result<u32, PgError> {
        let mut conn = self.pool.acquire().await.map_err(|e| {
            PgError::from_sqlx(
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
    pub async fn drop_schema(&self) -> Result<(), PgError> {
        let mut conn = self.pool.acquire().await.map_err(|e| {
            PgError::from_sqlx(format!("dropping the schema of table {}", self.table), e)
        })?;
        drop_schema(&mut conn, &self.table).await
    }

    /// Sends a batch of claims to the claim function. A row that cannot be
    /// read is that claim's error alone (the function has committed: the
    /// other answers, wins included, stand).
    async fn claim_batch(
        &self,
        reqs: &[LeaseClaim],
    ) -> Result<Vec<Result<ClaimOutcome, PgError>>, PgError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let n = reqs.len();
        let mut jobs = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut instances = Vec::with_capacity(n);
        let mut max_late = Vec::with_capacity(n);
        let mut leases = Vec::with_capacity(n);
        let mut skip = Vec::with_capacity(n);
        let mut max_attempts = Vec::with_capacity(n);
        for req in reqs {
            jobs.push(req.run().job.as_str().to_owned());
            slots.push(req.run().slot.as_millis());
            tokens.push(*req.claim.token.as_uuid());
            instances.push(req.claim.instance.as_str().to_owned());
            max_late.push(millis(req.claim.max_late));
            leases.push(millis(req.lease));
            skip.push(req.overlap == Overlap::Skip);
            max_attempts.push(i32::try_from(req.max_attempts.get()).unwrap_or(i32::MAX));
        }
        let action = || match reqs {
            [one] => format!("claiming {}", one.run()),
            many => format!("claiming {} runs", many.len()),
        };
        let rows: Vec<ClaimRow> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, ClaimRow>(self.sql.claim.clone())
                .bind(&jobs[..])
                .bind(&slots[..])
                .bind(&tokens[..])
                .bind(&instances[..])
                .bind(&max_late[..])
                .bind(&leases[..])
                .bind(&skip[..])
                .bind(&max_attempts[..])
                .fetch_all(conn)
        })?;
        let mut out: Vec<Option<Result<ClaimOutcome, PgError>>> = (0..n).map(|_| None).collect();
        for row in rows {
            let slot = usize::try_from(row.idx)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .filter(|i| *i < n)
                .ok_or_else(|| {
                    PgError::protocol(action(), format!("answer for claim {} of {n}", row.idx))
                })?;
            let outcome = row.outcome().map_err(|reason| {
                PgError::protocol(format!("claiming {}", reqs[slot].run()), reason)
            });
            if out[slot].replace(outcome).is_some() {
                return Err(PgError::protocol(
                    action(),
                    format!("two answers for claim {}", row.idx),
                ));
            }
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| PgError::protocol(action(), "some claims got no answer"))
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
    ) -> Result<Renewal, PgError> {
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

/// The connect options of `options`, with the store's session settings.
fn connect_options(options: &PgOptions, secrets: &[String]) -> Result<PgConnectOptions, PgError> {
    if let Some(reason) = anarchon_core::url::ambiguous_user_info(&options.url) {
        return Err(PgError::InvalidUrl {
            url: redact(&options.url),
            reason,
        });
    }
    let parsed = PgConnectOptions::from_str(&options.url).map_err(|e| PgError::InvalidUrl {
        url: redact(&options.url),
        reason: anarchon_core::url::unreadable_reason(
            &options.url,
            &scrub(&e.to_string(), secrets),
        ),
    })?;
    let mut connect = parsed.application_name(&options.application_name);
    if let Some(timeout) = options.statement_timeout {
        connect = connect.options([("statement_timeout", format!("{}ms", timeout.as_millis()))]);
    }
    secure_by_default(connect, &options.url)
}

/// Whether the server is on this machine: a Unix socket or a loopback host.
fn is_local(connect: &PgConnectOptions) -> bool {
    let host = connect.get_host();
    connect.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TLS mode a store connects with. Unless the URL (or `PGSSLMODE`)
/// says otherwise, a server that is not on this machine must prove who it
/// is (`verify-full`): sqlx's own default, `prefer`, checks no certificate
/// and falls back to plain text, so a man in the middle could read the
/// password. A mode that does not verify the server, written explicitly for
/// a remote host, is honoured with a warning.
fn secure_by_default(connect: PgConnectOptions, url: &str) -> Result<PgConnectOptions, PgError> {
    let explicit = url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.to_ascii_lowercase().starts_with("sslmode="))
    }) || std::env::var_os("PGSSLMODE").is_some();
    if is_local(&connect) {
        return Ok(connect);
    }
    if !explicit {
        if !cfg!(feature = "tls") {
            return Err(PgError::InvalidOption {
                option: "sslmode",
                reason: format!(
                    "{} is not on this machine, so the server must be verified (sslmode=verify-full, \
                     the default for remote hosts), but this build has no TLS: enable the feature \
                     `tls` of anarchon-pg (`pg-tls` of anarchon), or write sslmode=disable in the \
                     URL to send everything, the password included, in plain text",
                    connect.get_host()
                ),
            });
        }
        return Ok(connect.ssl_mode(PgSslMode::VerifyFull));
    }
    let weak = match connect.get_ssl_mode() {
        PgSslMode::Disable => Some("disable"),
        PgSslMode::Allow => Some("allow"),
        PgSslMode::Prefer => Some("prefer"),
        PgSslMode::Require => Some("require"),
        PgSslMode::VerifyCa | PgSslMode::VerifyFull => None,
    };
    if let Some(mode) = weak {
        tracing::warn!(
            host = connect.get_host(),
            sslmode = mode,
            "this TLS mode does not verify the PostgreSQL server: a man in the middle can read \
             the password and the runs; use sslmode=verify-full"
        );
    }
    Ok(connect)
}

/// `host:port/database as user`, for messages: never the password.
fn describe_server(connect: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{} as {}",
        connect.get_host(),
        connect.get_port(),
        connect.get_database().unwrap_or(connect.get_username()),
        connect.get_username()
    )
}

/// `error` with the URL's secrets scrubbed from its text, and without its
/// source if the source's text shows one.
fn without_secrets(error: PgError, secrets: &[String]) -> PgError {
    let leaks = |source: &Option<sqlx::Error>| {
        source.as_ref().is_some_and(|s| {
            let shown = format!("{s} {s:?}");
            secrets.iter().any(|secret| shown.contains(secret.as_str()))
        })
    };
    match error {
        PgError::Unavailable {
            action,
            reason,
            source,
        } => PgError::Unavailable {
            action: scrub(&action, secrets),
            reason: scrub(&reason, secrets),
            source: if leaks(&source) { None } else { source },
        },
        PgError::Refused {
            action,
            reason,
            source,
        } => PgError::Refused {
            action: scrub(&action, secrets),
            reason: scrub(&reason, secrets),
            source: if leaks(&source) { None } else { source },
        },
        PgError::Protocol {
            action,
            reason,
            source,
        } => PgError::Protocol {
            action: scrub(&action, secrets),
            reason: scrub(&reason, secrets),
            source: if leaks(&source) { None } else { source },
        },
        other => other,
    }
}

/// Migrates the schema, or checks its version when migrations are off.
async fn prepare_schema(
    conn: &mut PgConnection,
    table: &TableName,
    migrate: bool,
) -> Result<(), PgError> {
    if migrate {
        let done = migrate_to(conn, table, SCHEMA_VERSION).await?;
        if done.from != done.to {
            tracing::info!(%table, from = done.from, to = done.to, "schema migrated");
        }
        return Ok(());
    }
    let found = schema_version(conn, table).await?;
    match found.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(PgError::SchemaOutdated {
            table: table.to_string(),
            found,
            latest: SCHEMA_VERSION,
        }),
        std::cmp::Ordering::Greater => Err(PgError::SchemaTooNew {
            table: table.to_string(),
            found,
            latest: SCHEMA_VERSION,
        }),
    }
}

/// One answer of the claim function.
struct ClaimRow {
    idx: i32,
    outcome: String,
    attempt: Option<i32>,
    fence: Option<i64>,
    lease_until: Option<i64>,
    store_now: i64,
}

impl<'r> FromRow<'r, PgRow> for ClaimRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            idx: row.try_get("r_idx")?,
            outcome: row.try_get("r_outcome")?,
            attempt: row.try_get("r_attempt")?,
            fence: row.try_get("r_fence")?,
            lease_until: row.try_get("r_lease_until")?,
            store_now: row.try_get("r_store_now")?,
        })
    }
}

impl ClaimRow {
    fn outcome(&self) -> Result<ClaimOutcome, String> {
        Ok(match self.outcome.as_str() {
            "won" => ClaimOutcome::Won(Win {
                attempt: attempt(self.attempt)?.ok_or("a win without an attempt")?,
                fence: Some(fence(self.fence)?.ok_or("a win without a fence")?),
            }),
            "running" => ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(
                    self.lease_until.ok_or("a live lease without an end")?,
                ),
                store_now: Timestamp::from_millis(self.store_now),
            },
            "late" => ClaimOutcome::Late,
            "overlap" => ClaimOutcome::Overlap,
            other => match RecordState::parse(other) {
                Some(RecordState::Finished(done)) => ClaimOutcome::Done(done),
                _ => return Err(format!("unknown claim outcome {other:?}")),
            },
        })
    }
}

/// One run as `peek` reads it.
struct PeekRow {
    store_now: i64,
    state: Option<String>,
    attempt: Option<i32>,
    lease_until: Option<i64>,
}

impl<'r> FromRow<'r, PgRow> for PeekRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            store_now: row.try_get("store_now")?,
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
    attempt: Option<i32>,
    fence: Option<i64>,
    instance: Option<String>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    lease_until: Option<i64>,
    error: Option<String>,
}

impl<'r> FromRow<'r, PgRow> for HistoryRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
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

fn attempt(value: Option<i32>) -> Result<Option<Attempt>, String> {
    value
        .map(|n| {
            u32::try_from(n)
                .ok()
                .and_then(Attempt::new)
                .ok_or_else(|| format!("attempt {n} is not a positive number"))
        })
        .transpose()
}

fn fence(value: Option<i64>) -> Result<Option<Fence>, String> {
    value
        .map(|n| {
            u64::try_from(n)
                .map(Fence::new)
                .map_err(|_| format!("fence {n} is negative"))
        })
        .transpose()
}

fn record_state(text: &str) -> Result<RecordState, String> {
    RecordState::parse(text).ok_or_else(|| format!("unknown run state {text:?}"))
}

anarchon_core::claims_through_leases!(PgStore, BACKEND);

#[async_trait]
impl LeaseStore for PgStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let mut outcomes = self.claim_batch(std::slice::from_ref(req)).await?;
        Ok(outcomes
            .pop()
            .ok_or_else(|| PgError::protocol(format!("claiming {}", req.run()), "no answer"))??)
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
        let protocol = |reason: String| PgError::protocol(format!("reading {run}"), reason);
        let state = match row.state.as_deref() {
            None => RunState::Absent,
            Some(text) => RunState::of_record(
                record_state(text).map_err(protocol)?,
                attempt(row.attempt).map_err(protocol)?,
                row.lease_until.map(Timestamp::from_millis),
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
        let (state, error) = match outcome {
            RunOutcome::Succeeded => (FinalState::Succeeded, None),
            RunOutcome::Failed { error } => (FinalState::Failed, Some(error)),
        };
        Ok(self
            .update_held(
                "recording the end",
                &self.sql.finish,
                run,
                token,
                Resend::Always,
                |q| q.bind(state.as_str()).bind(error.clone()),
            )
            .await?)
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
        if answer == Renewal::Renewed {
            self.announce_hand_over(run).await;
        }
        Ok(answer)
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
        if answer == Renewal::Renewed {
            self.announce_hand_over(run).await;
        }
        Ok(answer)
    }

    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.hand_overs.wait(run, timeout).await
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let action = || format!("reading the history of {job}");
        let rows: Vec<HistoryRow> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, HistoryRow>(self.sql.history.clone())
                .bind(job.as_str())
                .bind(limit)
                .fetch_all(conn)
        })?;
        let record = |row: HistoryRow| -> Result<RunRecord, String> {
            Ok(RunRecord {
                run: RunKey::new(job.clone(), Slot::from_millis(row.slot)),
                state: record_state(&row.state)?,
                attempt: attempt(row.attempt)?,
                fence: fence(row.fence)?,
                instance: row
                    .instance
                    .map(|i| InstanceId::new(&i).map_err(|_| format!("invalid instance id {i:?}")))
                    .transpose()?,
                started_at: row.started_at.map(Timestamp::from_millis),
                finished_at: row.finished_at.map(Timestamp::from_millis),
                lease_until: row.lease_until.map(Timestamp::from_millis),
                error: row.error,
            })
        };
        rows.into_iter()
            .map(|row| record(row).map_err(|reason| PgError::protocol(action(), reason).into()))
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
}

#[cfg(test)]
mod tls_default_tests {
    use super::*;

    fn mode(url: &str) -> Result<PgSslMode, PgError> {
        let options = PgOptions::new(url);
        connect_options(&options, &[]).map(|c| c.get_ssl_mode())
    }

    #[test]
    fn a_remote_host_is_verified_unless_the_url_says_otherwise() {
        // (PGSSLMODE is not set where the tests run.)
        assert!(std::env::var_os("PGSSLMODE").is_none());
        let remote = mode("postgres://app:secret@db.example.com:5432/cron");
        if cfg!(feature = "tls") {
            assert!(matches!(remote, Ok(PgSslMode::VerifyFull)), "{remote:?}");
        } else {
            let err = remote.expect_err("no TLS in this build");
            assert!(err.to_string().contains("sslmode=disable"), "{err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        for written in ["require", "prefer", "disable", "verify-ca"] {
            let url = format!("postgres://app@db.example.com/cron?sslmode={written}");
            let got = mode(&url).expect("an explicit mode is honoured");
            assert_eq!(
                format!("{got:?}").to_ascii_lowercase().replace('-', ""),
                written.replace('-', ""),
                "{url}"
            );
        }
    }

    #[test]
    fn a_server_on_this_machine_keeps_the_drivers_default() {
        for url in [
            "postgres://app@127.0.0.1/cron",
            "postgres://app@localhost:5433/cron",
            "postgres://app@[::1]/cron",
            "postgres://app@%2Fvar%2Frun%2Fpostgresql/cron",
        ] {
            assert!(
                matches!(mode(url), Ok(PgSslMode::Prefer)),
                "{url}: {:?}",
                mode(url)
            );
        }
    }
}
