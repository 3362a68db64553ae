//! The backends under measurement, and how each counts its round trips.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anarchon_core::layer::{ClaimLayer, LeaseLayer};
use anarchon_core::{
    ClaimAnswers, ClaimOutcome, ClaimRequest, ClaimStore, FinalState, JobName, LeaseClaim,
    LeaseStore, MemoryStore, Renewal, RunKey, RunOutcome, RunRecord, RunView, StoreError, Token,
};

use anyhow::{Context, Result};
use async_trait::async_trait;
use futures::future::join_all;

use crate::RACE_JOB;
use crate::fleet::ServerLoad;

/// What a backend's figures are judged against, where backends differ.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Goals {
    /// A claim takes one round trip: the stores whose claim is one atomic
    /// step of the server (Redis `lease`, PostgreSQL).
    pub(crate) one_round_trip: bool,
    /// The round trips a lease store's batch of fresh claims may take,
    /// however many jobs it holds.
    pub(crate) batch_round_trips: u64,
    /// The claims a second eight racing instances must reach, where the
    /// backend has a target of its own (issue 19).
    pub(crate) claim_rate: Option<u32>,
    /// The lateness p99 (ms) within which 1,000 jobs a second must fire.
    pub(crate) lateness_p99_ms: f64,
    /// The fleet's server CPU per execution (ms), where the backend has
    /// a target (issue 19).
    pub(crate) fleet_server_cpu_ms: Option<f64>,
    /// The fleet's server commands per execution, where it has a target.
    pub(crate) fleet_commands: Option<f64>,
    /// The fleet must run every slot and never meet `database is locked`.
    pub(crate) fleet_misses_nothing: bool,
}

impl Default for Goals {
    fn default() -> Self {
        Self {
            one_round_trip: false,
            batch_round_trips: 1,
            claim_rate: None,
            lateness_p99_ms: 5.0,
            fleet_server_cpu_ms: None,
            fleet_commands: None,
            fleet_misses_nothing: false,
        }
    }
}

/// One backend to measure.
#[async_trait]
pub(crate) trait Target: Send + Sync {
    /// Its name in the table.
    fn name(&self) -> &'static str;
    /// What its figures are judged against.
    fn goals(&self) -> Goals {
        Goals::default()
    }
    /// A new handle: its own connection pool, like another instance.
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>>;
    /// Server-side commands per claim, where the store reports them
    /// separately from round trips (Redis `INFO commandstats`).
    async fn server_commands(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// Round trips served so far, counted by the store where it can count.
    async fn round_trips(&self) -> Result<u64>;
    /// Who counted the round trips.
    fn counted_by(&self) -> &'static str;
    /// The store's own speed: `ops` single-round-trip writes from
    /// `concurrency` connections; (what was measured, ops per second).
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        let _ = (concurrency, ops);
        Ok(None)
    }
    /// The store's own best at the work a claim of this backend must do,
    /// where that is more than the baseline's single write (Redis
    /// `script`: scan the job's claims, then append): `concurrency`
    /// connections race the same `slots` slots, each in slot order, with
    /// nothing of anarchon around the work; (what was measured, claims per
    /// second). It shows what the strategy itself allows beside the ratio.
    async fn same_work(&self, concurrency: usize, slots: usize) -> Result<Option<(String, f64)>> {
        let _ = (concurrency, slots);
        Ok(None)
    }
    /// Removes what the measurement left in the store.
    async fn cleanup(&self) {}
    /// Refuses, before it starts, a measurement that fires `jobs` jobs
    /// every second for `secs` seconds when what it would keep on the
    /// server is more than the server can hold without harm. Every store
    /// but RabbitMQ has room.
    fn check_room(&self, jobs: usize, secs: u64) -> Result<()> {
        let _ = (jobs, secs);
        Ok(())
    }
    /// This measurement's own place on the server (a key prefix, a table,
    /// a file), so that another process can open the same one with
    /// [`make_target`](crate::make_target).
    fn namespace(&self) -> String;
    /// Gives the measurement a place of its own where the server keeps its
    /// counters per place (PostgreSQL: a database of its own, so that
    /// `pg_stat_database` and the backends' CPU count the fleet alone).
    /// Called once, before [`Target::namespace`] is handed to other
    /// processes.
    async fn isolate(&mut self) -> Result<()> {
        Ok(())
    }
    /// A store as a process of a fleet opens it: the backend's default
    /// options (its default pool), in this measurement's namespace.
    async fn fleet_instance(&self) -> Result<Arc<dyn ClaimStore>> {
        self.instance().await
    }
    /// The server's counters now (commands, transactions, CPU), for the
    /// fleet's cost per execution; `None` for what it cannot tell.
    async fn server_load(&self) -> Result<ServerLoad> {
        Ok(ServerLoad::default())
    }
    /// The store calls of this handle's instances so far: made, failed,
    /// and failed because SQLite said `database is locked`.
    fn tally(&self) -> TallySnapshot {
        TallySnapshot::default()
    }
    /// Tells a fleet worker's handle that it is worker `worker` of
    /// `workers`. Only [`Floor`] uses it: a store shared by the workers
    /// needs no such word.
    fn fleet_share(&mut self, worker: usize, workers: usize) {
        let _ = (worker, workers);
    }
    /// Whether this is the fleet's floor, which has no store: its figures
    /// are the yardstick the stores' lateness is read against.
    fn is_floor(&self) -> bool {
        false
    }
}

/// Store calls counted on the client side: how many were made, how many
/// failed, and how many of those failed because SQLite's file was locked.
#[derive(Default)]
pub(crate) struct Tally {
    calls: AtomicU64,
    errors: AtomicU64,
    locked: AtomicU64,
}

/// A copy of a [`Tally`] at one moment.
#[derive(Clone, Copy, Default)]
pub(crate) struct TallySnapshot {
    /// Failed store calls (each counted where it failed, retried or not).
    pub(crate) errors: u64,
    /// Of those, the ones whose error chain says `database is locked`.
    pub(crate) locked: u64,
}

impl Tally {
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn snapshot(&self) -> TallySnapshot {
        TallySnapshot {
            errors: self.errors.load(Ordering::Relaxed),
            locked: self.locked.load(Ordering::Relaxed),
        }
    }

    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `result` if it is an error, and passes it on.
    fn note<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            self.errors.fetch_add(1, Ordering::Relaxed);
            if says_locked(e) {
                self.locked.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

/// Whether SQLite's "database is locked" (or "database table is locked")
/// appears anywhere in the error or its causes.
fn says_locked(e: &StoreError) -> bool {
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cause {
        if c.to_string().contains("is locked") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Counts calls on the client side, for stores that cannot count for us:
/// each call of these stores is one round trip (their own tests check it).
pub(crate) struct Counted {
    inner: Arc<dyn LeaseStore>,
    tally: Arc<Tally>,
}

/// The same for claim-only stores.
pub(crate) struct CountedClaims {
    inner: Arc<dyn ClaimStore>,
    tally: Arc<Tally>,
}

fn counted(inner: Arc<dyn ClaimStore>, tally: Arc<Tally>) -> Arc<dyn ClaimStore> {
    match inner.clone().as_lease_store() {
        Some(lease) => Arc::new(Counted {
            inner: lease,
            tally,
        }),
        None => Arc::new(CountedClaims { inner, tally }),
    }
}

#[async_trait]
impl ClaimLayer for CountedClaims {
    type Inner = dyn ClaimStore;

    fn inner(&self) -> &dyn ClaimStore {
        &*self.inner
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.tally.tick();
        self.tally.note(self.inner.claim(req).await)
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

impl Counted {
    fn tick(&self) {
        self.tally.tick();
    }

    fn note<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        self.tally.note(result)
    }
}

/// Every call that reaches the store is counted; waiting for hand-over
/// news is not a round trip, and `info` is local: those two forward.
#[async_trait]
impl LeaseLayer for Counted {
    type Inner = dyn LeaseStore;

    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.tick();
        self.note(self.inner.claim(req).await)
    }
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        self.tick();
        self.note(self.inner.claim_lease(req).await)
    }
    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        self.tick();
        self.note(self.inner.claim_many(reqs).await)
    }
    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.tick();
        self.note(self.inner.peek(run).await)
    }
    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.tick();
        self.note(self.inner.heartbeat(run, token, lease).await)
    }
    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        self.tick();
        self.note(self.inner.finish(run, token, outcome).await)
    }
    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.tick();
        self.note(self.inner.release(run, token).await)
    }
    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.tick();
        self.note(self.inner.give_back(run, token).await)
    }
    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.tick();
        self.note(self.inner.history(job, limit).await)
    }
    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.tick();
        self.note(self.inner.collect_garbage(keep).await)
    }
}

/// A server, a namespace of the measurement's own on it (a key prefix, a
/// stream prefix, a bucket), and the store calls counted there.
pub(crate) struct Spot {
    url: String,
    name: String,
    tally: Arc<Tally>,
}

impl Spot {
    /// A new namespace on the server at `url`, or the one named
    /// `namespace` (a fleet process joins its coordinator's).
    fn new(url: String, namespace: Option<&str>) -> Self {
        Self {
            url,
            name: namespace.map_or_else(
                || format!("bench{:08x}", Token::generate().as_u128() & 0xffff_ffff),
                str::to_owned,
            ),
            tally: Arc::default(),
        }
    }

    /// `store`, its calls counted here.
    fn count(&self, store: Arc<dyn ClaimStore>) -> Arc<dyn ClaimStore> {
        counted(store, self.tally.clone())
    }

    fn calls(&self) -> Result<u64> {
        Ok(self.tally.calls())
    }
}

/// `MemoryStore`: one store shared by every "instance"; it counts its own calls.
pub(crate) struct Memory {
    store: Arc<MemoryStore>,
}

impl Memory {
    pub(crate) fn new() -> Self {
        Self {
            store: Arc::new(MemoryStore::new()),
        }
    }
}

#[async_trait]
impl Target for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        Ok(self.store.clone())
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.store.operations())
    }
    fn counted_by(&self) -> &'static str {
        "the store (MemoryStore::operations)"
    }
    fn namespace(&self) -> String {
        String::new()
    }
}

/// SQLite on a temporary file; each instance a pool of its own.
pub(crate) struct Sqlite {
    /// The temporary directory this handle made and removes; `None` when
    /// it joined another handle's file (a fleet process).
    _dir: Option<tempfile::TempDir>,
    path: std::path::PathBuf,
    tally: Arc<Tally>,
}

impl Sqlite {
    /// A new file in a temporary directory, or the file at `namespace`.
    pub(crate) fn new(namespace: Option<&str>) -> Result<Self> {
        let (dir, path) = match namespace {
            Some(path) => (None, path.into()),
            None => {
                let dir = tempfile::tempdir()?;
                let path = dir.path().join("bench.db");
                (Some(dir), path)
            }
        };
        Ok(Self {
            _dir: dir,
            path,
            tally: Arc::default(),
        })
    }

    fn path(&self) -> std::path::PathBuf {
        self.path.clone()
    }
}

#[async_trait]
impl Target for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }
    /// A fleet on one file must lose no slot to its lock.
    fn goals(&self) -> Goals {
        Goals {
            fleet_misses_nothing: true,
            ..Goals::default()
        }
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let store = anarchon_sqlite::SqliteStore::open(
            anarchon_sqlite::SqliteOptions::new(self.path()).with_max_connections(1),
        )
        .await
        .context("opening the SQLite store")?;
        Ok(counted(Arc::new(store), self.tally.clone()))
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.tally.calls())
    }
    fn counted_by(&self) -> &'static str {
        "the client (one transaction per call)"
    }
    fn namespace(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }
    async fn fleet_instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let store =
            anarchon_sqlite::SqliteStore::open(anarchon_sqlite::SqliteOptions::new(self.path()))
                .await
                .context("opening the SQLite store")?;
        Ok(counted(Arc::new(store), self.tally.clone()))
    }
    fn tally(&self) -> TallySnapshot {
        self.tally.snapshot()
    }
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        let path = self.path.with_file_name("baseline.db");
        let mut pools = Vec::new();
        for _ in 0..concurrency {
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            pools.push(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await?,
            );
        }
        sqlx::query("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
            .execute(&pools[0])
            .await?;
        let per = ops / concurrency;
        let start = Instant::now();
        let runs = pools.iter().enumerate().map(|(c, pool)| async move {
            for i in 0..per {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query("INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v")
                    .bind((i % 1000) as i64)
                    .bind(c as i64)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Ok::<_, sqlx::Error>(())
        });
        for r in join_all(runs).await {
            r?;
        }
        let rate = (per * concurrency) as f64 / start.elapsed().as_secs_f64();
        Ok(Some((
            "BEGIN IMMEDIATE + one-row upsert + COMMIT".into(),
            rate,
        )))
    }
}

/// PostgreSQL in a table of its own. Every store call is one statement
/// (the crate's `statements` test checks what sqlx sends), counted here.
pub(crate) struct Postgres {
    url: String,
    table: anarchon_pg::TableName,
    stats: sqlx::PgPool,
    tally: Arc<Tally>,
    /// The database this handle created (see [`Target::isolate`]), and the
    /// URL it was created from, to drop it from there.
    own_database: Option<(String, String)>,
}

/// `url` with its database (the path) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (head, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let base = match head[authority_start..].find('/') {
        Some(i) => &head[..authority_start + i],
        None => head,
    };
    format!("{base}/{database}{query}")
}

impl Postgres {
    /// A table of its own, or the one named `namespace` (a fleet process):
    /// `table`, or `table@database` after [`Target::isolate`].
    pub(crate) async fn new(url: String, namespace: Option<&str>) -> Result<Self> {
        let (table, url) = match namespace {
            Some(ns) => match ns.split_once('@') {
                Some((table, database)) => (table.to_owned(), with_database(&url, database)),
                None => (ns.to_owned(), url),
            },
            None => (
                format!(
                    "anarchon_bench_{:012x}",
                    Token::generate().as_u128() & 0xffff_ffff_ffff
                ),
                url,
            ),
        };
        let table = anarchon_pg::TableName::new(&table)?;
        let stats = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .context("connecting to PostgreSQL")?;
        Ok(Self {
            url,
            table,
            stats,
            tally: Arc::default(),
            own_database: None,
        })
    }

    async fn drop_tables(&self) {
        if let Ok(store) = anarchon_pg::PgStore::connect_with(
            anarchon_pg::PgOptions::new(&self.url)
                .with_table_name(self.table.clone())
                .with_pool_size(1),
        )
        .await
        {
            let _ = store.drop_schema().await;
        }
        let _ = sqlx::query("DROP TABLE IF EXISTS anarchon_bench_baseline")
            .execute(&self.stats)
            .await;
    }
}

#[async_trait]
impl Target for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }
    fn goals(&self) -> Goals {
        Goals {
            one_round_trip: true,
            fleet_server_cpu_ms: Some(0.40),
            ..Goals::default()
        }
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let store = anarchon_pg::PgStore::connect_with(
            anarchon_pg::PgOptions::new(&self.url)
                .with_table_name(self.table.clone())
                .with_pool_size(1),
        )
        .await
        .context("opening the PostgreSQL store")?;
        Ok(counted(Arc::new(store), self.tally.clone()))
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.tally.calls())
    }
    fn namespace(&self) -> String {
        match &self.own_database {
            Some((database, _)) => format!("{}@{database}", self.table),
            None => self.table.to_string(),
        }
    }
    async fn isolate(&mut self) -> Result<()> {
        if self.own_database.is_some() {
            return Ok(());
        }
        // Made of the table's name: lower-case letters, digits and `_`.
        let database = self.table.as_str().replacen("bench", "fleet", 1);
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&self.stats)
            .await
            .with_context(|| format!("creating the database {database}"))?;
        let url = with_database(&self.url, &database);
        self.stats = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .context("connecting to the fleet's database")?;
        self.own_database = Some((database, std::mem::replace(&mut self.url, url)));
        Ok(())
    }
    async fn fleet_instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let store = anarchon_pg::PgStore::connect_with(
            anarchon_pg::PgOptions::new(&self.url).with_table_name(self.table.clone()),
        )
        .await
        .context("opening the PostgreSQL store")?;
        Ok(counted(Arc::new(store), self.tally.clone()))
    }
    async fn server_load(&self) -> Result<ServerLoad> {
        let transactions: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&self.stats)
        .await
        .context("reading pg_stat_database")?;
        // The server's own processes (WAL writer, checkpointer, ...) and
        // the backends of this database; not the backends of others.
        let database = self.own_database.as_ref().map(|(d, _)| format!(" {d} "));
        let ours = |title: &str| {
            let client =
                title.contains("127.0.0.1(") || title.contains("::1(") || title.contains("[local]");
            !client || database.as_ref().is_none_or(|d| title.contains(d.as_str()))
        };
        Ok(ServerLoad {
            transactions: Some(transactions.max(0) as u64),
            cpu: crate::fleet::process_cpu("postgres", ours),
            ..ServerLoad::default()
        })
    }
    fn tally(&self) -> TallySnapshot {
        self.tally.snapshot()
    }
    fn counted_by(&self) -> &'static str {
        "the client (one statement per call, as the crate's statements test checks against what sqlx sends)"
    }
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        sqlx::query("CREATE TABLE IF NOT EXISTS anarchon_bench_baseline (k int PRIMARY KEY, v int NOT NULL)")
            .execute(&self.stats)
            .await?;
        let mut pools = Vec::new();
        for _ in 0..concurrency {
            pools.push(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&self.url)
                    .await?,
            );
        }
        let per = ops / concurrency;
        let start = Instant::now();
        let runs = pools.iter().enumerate().map(|(c, pool)| async move {
            for i in 0..per {
                sqlx::query("INSERT INTO anarchon_bench_baseline (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v")
                    .bind((i % 1000) as i32)
                    .bind(c as i32)
                    .execute(pool)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        });
        for r in join_all(runs).await {
            r?;
        }
        let rate = (per * concurrency) as f64 / start.elapsed().as_secs_f64();
        Ok(Some(("one-row upsert".into(), rate)))
    }
    async fn cleanup(&self) {
        self.drop_tables().await;
        if let Some((database, url)) = &self.own_database {
            self.stats.close().await;
            if let Ok(admin) = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(url)
                .await
            {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {database} WITH (FORCE)"
                )))
                .execute(&admin)
                .await;
            }
        }
    }
}

/// Which Redis strategy.
#[derive(Clone, Copy)]
pub(crate) enum RedisStrategy {
    Lease,
    StreamId,
    Script,
}

/// Redis: round trips counted by the client, commands by the server.
pub(crate) struct Redis {
    spot: Spot,
    strategy: RedisStrategy,
}

impl Redis {
    /// A key prefix of its own, or the one named `namespace`.
    pub(crate) fn new(url: String, strategy: RedisStrategy, namespace: Option<&str>) -> Self {
        Self {
            spot: Spot::new(url, namespace),
            strategy,
        }
    }

    async fn admin(&self) -> Result<deadpool_redis::redis::aio::MultiplexedConnection> {
        let client = deadpool_redis::redis::Client::open(self.spot.url.as_str())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }
}

#[async_trait]
impl Target for Redis {
    fn name(&self) -> &'static str {
        match self.strategy {
            RedisStrategy::Lease => "redis-lease",
            RedisStrategy::StreamId => "redis-stream-id",
            RedisStrategy::Script => "redis-script",
        }
    }
    /// `lease`: one round trip, and a fleet's cost on the server bounded
    /// (issue 19); the claim-only strategies are measured without targets.
    fn goals(&self) -> Goals {
        match self.strategy {
            RedisStrategy::Lease => Goals {
                one_round_trip: true,
                fleet_server_cpu_ms: Some(0.10),
                fleet_commands: Some(20.0),
                ..Goals::default()
            },
            RedisStrategy::StreamId | RedisStrategy::Script => Goals::default(),
        }
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let options =
            anarchon_redis::RedisOptions::new(&self.spot.url).with_prefix(&self.spot.name)?;
        let store: Arc<dyn ClaimStore> = match self.strategy {
            RedisStrategy::Lease => {
                Arc::new(anarchon_redis::RedisLeaseStore::connect(&options).await?)
            }
            RedisStrategy::StreamId => {
                Arc::new(anarchon_redis::RedisStreamIdStore::connect(&options).await?)
            }
            RedisStrategy::Script => Arc::new(
                anarchon_redis::RedisScriptStore::connect(&options, Duration::from_secs(600))
                    .await?,
            ),
        };
        Ok(self.spot.count(store))
    }
    async fn round_trips(&self) -> Result<u64> {
        self.spot.calls()
    }
    fn namespace(&self) -> String {
        self.spot.name.clone()
    }
    fn tally(&self) -> TallySnapshot {
        self.spot.tally.snapshot()
    }
    async fn server_load(&self) -> Result<ServerLoad> {
        let mut conn = self.admin().await?;
        let stats: String = deadpool_redis::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let cpu: String = deadpool_redis::redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await?;
        // Every command the server ran, those inside scripts included.
        let (mut commands, mut evalsha) = (0, 0);
        let mut by_command = std::collections::BTreeMap::new();
        for line in stats.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let calls: u64 = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            commands += calls;
            by_command.insert(name.to_owned(), calls);
            if name == "evalsha" {
                evalsha += calls;
            }
        }
        let field = |name: &str| {
            cpu.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        let seconds = match (field("used_cpu_sys"), field("used_cpu_user")) {
            (Some(sys), Some(user)) => Some(std::collections::BTreeMap::from([(0, sys + user)])),
            _ => None,
        };
        Ok(ServerLoad {
            commands: Some(commands),
            evalsha: Some(evalsha),
            by_command,
            cpu: seconds,
            ..ServerLoad::default()
        })
    }
    fn counted_by(&self) -> &'static str {
        "the client (one call = one round trip, pipelined); server commands from INFO commandstats"
    }
    async fn server_commands(&self) -> Result<Option<u64>> {
        let mut conn = self.admin().await?;
        let info: String = deadpool_redis::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        // The commands a client sends for a claim: EVALSHA (lease, script)
        // or XADD + XRANGE (stream-id); commands run inside scripts are not
        // round trips and are left out.
        let top_level = ["evalsha", "xadd", "xrange"];
        let total = info
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                if !top_level.contains(&name) {
                    return None;
                }
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        Ok(Some(total))
    }
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        let mut conns = Vec::new();
        for _ in 0..concurrency {
            conns.push(self.admin().await?);
        }
        let script = deadpool_redis::redis::Script::new(
            "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 60000)",
        );
        let per = ops / concurrency;
        let start = Instant::now();
        let runs = conns.into_iter().enumerate().map(|(c, mut conn)| {
            let script = script.clone();
            let prefix = self.spot.name.clone();
            async move {
                for i in 0..per {
                    let _: Option<String> = script
                        .key(format!("{prefix}:baseline:{}", i % 1000))
                        .arg(c)
                        .invoke_async(&mut conn)
                        .await?;
                }
                Ok::<_, deadpool_redis::redis::RedisError>(())
            }
        });
        for r in join_all(runs).await {
            r?;
        }
        let rate = (per * concurrency) as f64 / start.elapsed().as_secs_f64();
        Ok(Some(("EVALSHA of SET NX".into(), rate)))
    }
    async fn same_work(&self, concurrency: usize, slots: usize) -> Result<Option<(String, f64)>> {
        if !matches!(self.strategy, RedisStrategy::Script) {
            return Ok(None);
        }
        let mut conns = Vec::new();
        for _ in 0..concurrency {
            conns.push(self.admin().await?);
        }
        let script = deadpool_redis::redis::Script::new(SCRIPT_SAME_WORK);
        let key = format!("{}:same-work", self.spot.name);
        let start = Instant::now();
        let racers = conns.into_iter().enumerate().map(|(c, mut conn)| {
            let (script, key) = (script.clone(), key.clone());
            async move {
                let mut won = 0;
                for slot in 0..slots {
                    let token = format!("{c}-{slot}");
                    let holder: String = script
                        .key(&key)
                        .arg(slot)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await?;
                    won += usize::from(holder == token);
                }
                Ok::<_, deadpool_redis::redis::RedisError>(won)
            }
        });
        let mut won = 0;
        for r in join_all(racers).await {
            won += r?;
        }
        let rate = (slots * concurrency) as f64 / start.elapsed().as_secs_f64();
        anyhow::ensure!(
            won == slots,
            "the bare scan-and-append script won {won} of {slots} slots; each must have exactly one winner"
        );
        Ok(Some((
            "a bare script: scan the claims, then XADD".into(),
            rate,
        )))
    }
    async fn cleanup(&self) {
        if let Ok(mut conn) = self.admin().await {
            let pattern = format!("*{}*", self.spot.name);
            let keys: Vec<String> = deadpool_redis::redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            for chunk in keys.chunks(500) {
                let _: Result<u64, _> = deadpool_redis::redis::cmd("DEL")
                    .arg(chunk)
                    .query_async(&mut conn)
                    .await;
            }
        }
    }
}

/// The Redis `script` strategy's claim reduced to its scan and append
/// ([`Target::same_work`]).
const SCRIPT_SAME_WORK: &str = include_str!("../lua/script_same_work.lua");

/// The instances a target handed out, for stores that count their own
/// round trips: the measurement sums their counts. An instance the
/// measurement dropped no longer counts.
struct Handed<S>(std::sync::Mutex<Vec<std::sync::Weak<S>>>);

impl<S> Default for Handed<S> {
    fn default() -> Self {
        Self(std::sync::Mutex::default())
    }
}

impl<S> Handed<S> {
    /// Remembers `store`, and forgets the dropped ones.
    fn add(&self, store: &Arc<S>) {
        let mut stores = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stores.retain(|s| s.strong_count() > 0);
        stores.push(Arc::downgrade(store));
    }

    /// `count` summed over the instances still alive.
    fn sum(&self, count: impl Fn(&S) -> u64) -> u64 {
        let stores = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stores
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|s| count(&s))
            .sum()
    }
}

/// RabbitMQ: round trips counted by the store.
pub(crate) struct Amqp {
    spot: Spot,
    stores: Handed<anarchon_amqp::AmqpStore>,
}

/// How long the measured RabbitMQ stores remember a run (their slot TTL).
const AMQP_SLOT_TTL: Duration = Duration::from_secs(120);

impl Amqp {
    /// A queue prefix of its own, or the one named `namespace`.
    pub(crate) fn new(url: String, namespace: Option<&str>) -> Self {
        Self {
            spot: Spot::new(url, namespace),
            stores: Handed::default(),
        }
    }

    /// The open-files limit (soft) of the broker at the store's address
    /// when it runs on this machine, as (pid, limit); `None` when the
    /// address is not a loopback one or no broker process is found.
    fn local_broker_open_files(&self) -> Option<(u32, u64)> {
        let uri: lapin::uri::AMQPUri = self.spot.url.parse().ok()?;
        let host = uri
            .authority
            .host
            .trim_start_matches('[')
            .trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return None;
        }
        let pids = crate::fleet::process_cpu("beam.smp", |_| true)?;
        pids.keys().find_map(|&pid| {
            let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
            Some((pid, open_files_soft_limit(&limits)?))
        })
    }
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn open_files_soft_limit(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The RabbitMQ queues a measurement keeps alive when it fires `jobs` jobs
/// every second for `secs` seconds: a gate and a mark for every run, none
/// expiring before the slot TTL.
fn amqp_queues_kept(jobs: usize, secs: u64) -> u64 {
    jobs as u64 * secs.min(AMQP_SLOT_TTL.as_secs()) * 2
}

/// Whether a broker that may open `limit` files has room for `queues`
/// queues, and if not, why not and what to do.
///
/// The rule is one queue per file, no more: twice on this project's
/// machines a RabbitMQ 3.10 broker with the default 1,024 open files met
/// `emfile` while thousands of gates were being created (1,000 jobs a
/// second for 30 s on 2026-12-03; a fleet of 8 × 200 jobs for 20 s, 8,000
/// queues, on 2026-12-07). The queues that crashed then stayed in its table
/// of durable queues, without expiry, and the next restart hung recovering
/// them until its data directory was emptied. The racing-claims measurement
/// (4,000 queues, made at once and then idle) never did, and is not checked.
fn amqp_room(queues: u64, pid: u32, limit: u64) -> Result<()> {
    if queues <= limit {
        return Ok(());
    }
    anyhow::bail!(
        "refused: this measurement keeps about {queues} RabbitMQ queues alive (a gate and a mark per run), \
         and the broker on this machine (pid {pid}) may open only {limit} files; past that limit a RabbitMQ 3.x \
         broker crashes queues that it cannot recover when it restarts (docs/backends/brokers.md). \
         Raise the broker's open-files limit above {queues} (systemd LimitNOFILE, or `ulimit -n` before \
         rabbitmq-server), or measure fewer runs (a fleet: --fleet-jobs, --fleet-secs)"
    )
}

#[async_trait]
impl Target for Amqp {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }
    /// 5,000 claims a second (issue 19); a claim creates queues, so the
    /// lateness target is 50 ms rather than 5.
    fn goals(&self) -> Goals {
        Goals {
            claim_rate: Some(5_000),
            lateness_p99_ms: 50.0,
            ..Goals::default()
        }
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let options = anarchon_amqp::AmqpOptions::new(&self.spot.url)
            .with_prefix(&self.spot.name)
            .with_slot_ttl(AMQP_SLOT_TTL);
        let store = Arc::new(anarchon_amqp::AmqpStore::connect(options).await?);
        self.stores.add(&store);
        Ok(self.spot.count(store))
    }
    fn check_room(&self, jobs: usize, secs: u64) -> Result<()> {
        let queues = amqp_queues_kept(jobs, secs);
        match self.local_broker_open_files() {
            Some((pid, limit)) => amqp_room(queues, pid, limit),
            None => {
                eprintln!(
                    "  (the broker is not on this machine, so its open-files limit is not checked: \
                     it must exceed the {queues} queues this measurement keeps, see docs/backends/brokers.md)"
                );
                Ok(())
            }
        }
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.stores.sum(|s| s.stats().round_trips))
    }
    fn counted_by(&self) -> &'static str {
        "the store (AmqpStats::round_trips: a claim's gate declaration and publish, sent together, count once; then the winner's mark or a loser's probe for its own; a new channel 2)"
    }
    fn namespace(&self) -> String {
        self.spot.name.clone()
    }
    fn tally(&self) -> TallySnapshot {
        self.spot.tally.snapshot()
    }
    async fn server_load(&self) -> Result<ServerLoad> {
        Ok(ServerLoad {
            cpu: crate::fleet::process_cpu("beam.smp", |_| true),
            ..ServerLoad::default()
        })
    }
    /// The broker's own rate at a claim's work without anarchon: each of
    /// `concurrency` connections declares the gate queue of every run (the
    /// same arguments) and publishes one persistent message to it with a
    /// confirm, declaration and publish sent together; all connections race
    /// for the same runs, as the claims do. The winner's mark and the
    /// losers' probes for theirs are left out, so this is the ceiling a
    /// claim can approach.
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
        use lapin::types::{AMQPValue, FieldTable};
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("classic".into()),
        );
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(120_000));
        let mut channels = Vec::new();
        for _ in 0..concurrency {
            let connection =
                lapin::Connection::connect(&self.spot.url, lapin::ConnectionProperties::default())
                    .await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            channels.push((connection, channel));
        }
        let runs = ops / concurrency;
        let start = Instant::now();
        let racing = channels.iter().map(|(_, channel)| {
            let arguments = arguments.clone();
            let prefix = self.spot.name.clone();
            async move {
                for run in 0..runs {
                    let queue = format!("{prefix}.baseline.{run}");
                    let declaring = channel.queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..QueueDeclareOptions::default()
                        },
                        arguments.clone(),
                    );
                    let publishing = async {
                        channel
                            .basic_publish(
                                "".into(),
                                queue.as_str().into(),
                                BasicPublishOptions {
                                    mandatory: true,
                                    immediate: false,
                                },
                                b"baseline",
                                lapin::BasicProperties::default().with_delivery_mode(2),
                            )
                            .await?
                            .await
                    };
                    let (declared, published) = tokio::join!(declaring, publishing);
                    declared?;
                    published?;
                }
                Ok::<_, lapin::Error>(())
            }
        });
        for r in join_all(racing).await {
            r?;
        }
        let rate = (runs * concurrency) as f64 / start.elapsed().as_secs_f64();
        if let Some((_, channel)) = channels.first() {
            for run in 0..runs {
                let _ = channel
                    .queue_delete(
                        format!("{}.baseline.{run}", self.spot.name).as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await;
            }
        }
        Ok(Some(("declare + confirmed publish".into(), rate)))
    }
}

/// NATS JetStream de-duplication: round trips counted by the store.
pub(crate) struct Nats {
    spot: Spot,
    stores: Handed<anarchon_nats::NatsClaimStore>,
}

impl Nats {
    /// A stream prefix of its own, or the one named `namespace`.
    pub(crate) fn new(url: String, namespace: Option<&str>) -> Self {
        Self {
            spot: Spot::new(url, namespace),
            stores: Handed::default(),
        }
    }
}

#[async_trait]
impl Target for Nats {
    fn name(&self) -> &'static str {
        "nats"
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let connection = anarchon_nats::NatsOptions::new(&self.spot.url);
        let claims = anarchon_nats::ClaimOptions::new()
            .with_prefix(&self.spot.name)
            .with_duplicate_window(Duration::from_secs(120));
        let store = Arc::new(anarchon_nats::NatsClaimStore::connect(&connection, claims).await?);
        self.stores.add(&store);
        Ok(self.spot.count(store))
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.stores.sum(|s| s.stats().round_trips))
    }
    fn counted_by(&self) -> &'static str {
        "the store (ClaimStats::round_trips: a claim's publish and its acknowledgement count once; a loser also reads the stored claim back: 2)"
    }
    fn namespace(&self) -> String {
        self.spot.name.clone()
    }
    fn tally(&self) -> TallySnapshot {
        self.spot.tally.snapshot()
    }
    async fn server_load(&self) -> Result<ServerLoad> {
        Ok(nats_server_load(&self.spot.url))
    }
    async fn cleanup(&self) {
        let stream = anarchon_nats::ClaimOptions::new()
            .with_prefix(&self.spot.name)
            .stream_name();
        if let Ok(client) = async_nats::connect(&self.spot.url).await {
            let _ = async_nats::jetstream::new(client)
                .delete_stream(&stream)
                .await;
        }
    }
}

/// NATS JetStream KV lease store: round trips counted by the store
/// itself ([`anarchon_nats::LeaseStats`]), since one of its calls is
/// several waits for the server (a claim writes the clock while it reads
/// the job's document, reads the clock, then swaps the document).
pub(crate) struct NatsKv {
    spot: Spot,
    /// Every instance handed out, to sum their own counts.
    stores: Handed<anarchon_nats::NatsLeaseStore>,
}

impl NatsKv {
    /// A bucket of its own, or the one named `namespace`.
    pub(crate) fn new(url: String, namespace: Option<&str>) -> Self {
        Self {
            spot: Spot::new(url, namespace),
            stores: Handed::default(),
        }
    }

    /// Makes the bucket `<namespace>_<suffix>` the way the lease store
    /// makes its own (a stream config the older servers accept), and opens
    /// `racers` connections of their own to the server; (bucket, one
    /// JetStream context per racer). If a connection fails the bucket is
    /// removed again.
    async fn bucket_beside(
        &self,
        suffix: &str,
        racers: usize,
    ) -> Result<(String, Vec<async_nats::jetstream::Context>)> {
        let bucket = format!("{}_{suffix}", self.spot.name);
        let connection = anarchon_nats::NatsOptions::new(&self.spot.url);
        let leases = anarchon_nats::NatsLeaseOptions::new().with_bucket(&bucket);
        drop(anarchon_nats::NatsLeaseStore::connect(&connection, leases).await?);
        let mut contexts = Vec::with_capacity(racers);
        for _ in 0..racers {
            match async_nats::connect(&self.spot.url).await {
                Ok(client) => contexts.push(async_nats::jetstream::new(client)),
                Err(e) => {
                    self.drop_bucket(&bucket).await;
                    return Err(e.into());
                }
            }
        }
        Ok((bucket, contexts))
    }

    /// Removes the bucket `bucket` (one [`Self::bucket_beside`] made, or
    /// the measurement's own), whatever the measurement's outcome.
    async fn drop_bucket(&self, bucket: &str) {
        if let Ok(client) = async_nats::connect(&self.spot.url).await {
            let _ = async_nats::jetstream::new(client)
                .delete_stream(format!("KV_{bucket}"))
                .await;
        }
    }

    /// The race of [`Target::same_work`] on `bucket`: every racer claims
    /// `slots` slots of one document with `entry`-byte entries; (slots
    /// won in all, time taken).
    async fn race_one_document(
        &self,
        bucket: &str,
        racers: &[async_nats::jetstream::Context],
        slots: usize,
        entry: usize,
    ) -> Result<(usize, Duration)> {
        let stream_name = format!("KV_{bucket}");
        let subject = format!("$KV.{bucket}.job.same-work");
        let mut streams = Vec::with_capacity(racers.len());
        for js in racers {
            streams.push(js.get_stream(&stream_name).await?);
        }
        let start = Instant::now();
        let racing = racers.iter().zip(&streams).enumerate().map(|(r, (js, stream))| {
            let subject = subject.clone();
            async move {
                let mut won = 0;
                for slot in 0..slots {
                    let tag = format!("|{slot:08}:");
                    loop {
                        let (mut doc, revision) =
                            match stream.direct_get_last_for_subject(&subject).await {
                                Ok(m) => (m.payload.to_vec(), m.sequence),
                                Err(e)
                                    if e.kind()
                                        == async_nats::jetstream::stream::DirectGetErrorKind::NotFound =>
                                {
                                    (Vec::new(), 0)
                                }
                                Err(e) => return Err(anyhow::Error::new(e)),
                            };
                        let t = tag.as_bytes();
                        if doc.windows(t.len()).any(|w| w[0] == b'|' && w == t) {
                            break;
                        }
                        doc.extend_from_slice(t);
                        doc.extend(std::iter::repeat_n(
                            b'a' + (r % 26) as u8,
                            entry.saturating_sub(t.len()),
                        ));
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert(
                            "Nats-Expected-Last-Subject-Sequence",
                            revision.to_string().as_str(),
                        );
                        let swapped = async {
                            js.publish_with_headers(subject.clone(), headers, doc.into())
                                .await?
                                .await
                        }
                        .await;
                        match swapped {
                            Ok(_) => {
                                won += 1;
                                break;
                            }
                            Err(e) if anarchon_nats::is_wrong_last_sequence(&e) => {}
                            Err(e) => return Err(anyhow::Error::new(e)),
                        }
                    }
                }
                Ok(won)
            }
        });
        let mut won = 0;
        for r in join_all(racing).await {
            won += r?;
        }
        Ok((won, start.elapsed()))
    }
}

#[async_trait]
impl Target for NatsKv {
    fn name(&self) -> &'static str {
        "nats-kv"
    }
    /// 3,000 claims a second (issue 19). A batch learns the server's
    /// time by a write of its own while it reads the documents, reads
    /// that time back with the pauses, then swaps the documents: three
    /// waits by design, the same for one job or a thousand.
    fn goals(&self) -> Goals {
        Goals {
            batch_round_trips: 3,
            claim_rate: Some(3_000),
            ..Goals::default()
        }
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        let connection = anarchon_nats::NatsOptions::new(&self.spot.url);
        let leases = anarchon_nats::NatsLeaseOptions::new().with_bucket(&self.spot.name);
        let store = Arc::new(anarchon_nats::NatsLeaseStore::connect(&connection, leases).await?);
        self.stores.add(&store);
        Ok(self.spot.count(store))
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(self.stores.sum(|s| s.stats().round_trips))
    }
    fn counted_by(&self) -> &'static str {
        "the store (LeaseStats::round_trips: requests sent together count once; a claim that starts a run is 3, one that finds a live lease 2)"
    }
    /// The server's own rate at the heart of a claim without anarchon:
    /// `concurrency` connections race to create the same key of a KV
    /// bucket for every run; one create per key succeeds. A claim also
    /// reads the server's clock and the job's record, so this is the
    /// ceiling a claim can approach.
    async fn baseline(&self, concurrency: usize, ops: usize) -> Result<Option<(String, f64)>> {
        let (bucket, racers) = self.bucket_beside("baseline", concurrency).await?;
        let runs = ops / concurrency;
        let raced = async {
            let mut stores = Vec::new();
            for js in &racers {
                stores.push(js.get_key_value(&bucket).await?);
            }
            let start = Instant::now();
            let racing = stores.iter().map(|kv| async move {
                let mut won = 0;
                for run in 0..runs {
                    // Losing the race is the expected answer for all but one.
                    if kv
                        .create(format!("run{run}"), "claimed".into())
                        .await
                        .is_ok()
                    {
                        won += 1;
                    }
                }
                won
            });
            let won: usize = join_all(racing).await.into_iter().sum();
            anyhow::Ok((won, start.elapsed()))
        }
        .await;
        self.drop_bucket(&bucket).await;
        let (won, took) = raced?;
        if won != runs {
            anyhow::bail!(
                "the KV baseline created {won} of {runs} keys: the server refused some creates for another reason than the race"
            );
        }
        let rate = (runs * concurrency) as f64 / took.as_secs_f64();
        Ok(Some(("KV create".into(), rate)))
    }
    /// The server's own rate at the work of the lease store's layout: a
    /// job's claims decide on one document that holds every live run, so
    /// `concurrency` connections race the same `slots` slots of one key,
    /// each reading the document (direct get), losing if the slot is in
    /// it, else appending an entry as long as one live run of the race's
    /// own document and swapping on the revision read, reading again
    /// after a lost swap. No clock write, no pause reads, no JSON: the
    /// ceiling of this layout, whatever the client does.
    async fn same_work(&self, concurrency: usize, slots: usize) -> Result<Option<(String, f64)>> {
        let client = async_nats::connect(&self.spot.url).await?;
        let race = async_nats::jetstream::new(client)
            .get_stream(format!("KV_{}", self.spot.name))
            .await?;
        let document = race
            .direct_get_last_for_subject(format!("$KV.{}.job.{RACE_JOB}", self.spot.name))
            .await
            .context("reading the racing job's document")?;
        let entry = (document.payload.len() / slots.max(1)).max(16);
        let (bucket, racers) = self.bucket_beside("same_work", concurrency).await?;
        let raced = self.race_one_document(&bucket, &racers, slots, entry).await;
        self.drop_bucket(&bucket).await;
        let (won, took) = raced?;
        anyhow::ensure!(
            won == slots,
            "the bare document race won {won} of {slots} slots; each must have exactly one winner"
        );
        let rate = (slots * concurrency) as f64 / took.as_secs_f64();
        Ok(Some((
            format!("read, append a {entry}-byte entry, swap one document"),
            rate,
        )))
    }
    fn namespace(&self) -> String {
        self.spot.name.clone()
    }
    fn tally(&self) -> TallySnapshot {
        self.spot.tally.snapshot()
    }
    async fn server_load(&self) -> Result<ServerLoad> {
        Ok(nats_server_load(&self.spot.url))
    }
    async fn cleanup(&self) {
        self.drop_bucket(&self.spot.name).await;
    }
}

/// The CPU of the local `nats-server` that serves `url`: the one whose
/// command line names the URL's port (other NATS servers, such as a test
/// cluster, may run beside it).
fn nats_server_load(url: &str) -> ServerLoad {
    let port = url
        .rsplit(':')
        .next()
        .map(|p| p.trim_end_matches('/'))
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .unwrap_or("4222");
    ServerLoad {
        cpu: crate::fleet::process_cpu("nats-server", |command| {
            command.split_whitespace().any(|word| word == port)
        }),
        ..ServerLoad::default()
    }
}

/// The fleet's floor: K processes with the same M jobs and no store at
/// all, so that the fleet's lateness has a figure beside it for what the
/// machine and the scheduler cost by themselves.
///
/// Each worker decides its claims in its own memory, at once: a run whose
/// job and slot hash to the worker's own index (of K) goes to a
/// [`MemoryStore`] of its own, which it wins; every other run is answered
/// done. So each run starts in exactly one process, as in a real fleet,
/// and each winner heartbeats and finishes into its memory, but no claim
/// waits for a round trip or for a server. What is left of the lateness
/// is the workers' timers, their claim batches, the handler starts and
/// the appends, on a machine shared by K processes.
///
/// The losers' answer differs from a real store's (which mostly says the
/// run is going, so the loser watches it as a backup until its lease
/// ends): a backup waits for a lease end seconds away, so it does not
/// touch the slot's lateness.
pub(crate) struct Floor {
    share: Share,
}

impl Floor {
    pub(crate) fn new() -> Self {
        Self {
            share: Share { index: 0, of: 1 },
        }
    }
}

/// Which runs a floor worker owns: those whose job and slot hash to its
/// index of `of`.
#[derive(Clone, Copy)]
struct Share {
    index: u64,
    of: u64,
}

impl Share {
    /// Whether this worker runs `run`. FNV-1a over the job's name and the
    /// slot: every worker computes the same owner for a run, and exactly
    /// one index matches.
    fn owns(self, run: &RunKey) -> bool {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let slot = run.slot.as_millis().to_le_bytes();
        for byte in run.job.as_str().bytes().chain(slot) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash % self.of == self.index
    }
}

/// A floor worker's store: its own runs in a [`MemoryStore`], every other
/// run done at once.
struct FloorStore {
    inner: MemoryStore,
    share: Share,
}

impl FloorStore {
    /// The answer to a claim of a run another worker owns.
    const OTHERS: ClaimOutcome = ClaimOutcome::Done(FinalState::Succeeded);
}

#[async_trait]
impl LeaseLayer for FloorStore {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if !self.share.owns(&req.run) {
            return Ok(Self::OTHERS);
        }
        self.inner.claim(req).await
    }

    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        if !self.share.owns(&req.claim.run) {
            return Ok(Self::OTHERS);
        }
        self.inner.claim_lease(req).await
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        // One pass decides ownership; the answers go back by index.
        let mut answers: Vec<Option<Result<ClaimOutcome, StoreError>>> = reqs
            .iter()
            .map(|req| (!self.share.owns(&req.claim.run)).then_some(Ok(Self::OTHERS)))
            .collect();
        let owned: Vec<LeaseClaim> = reqs
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(req, _)| req.clone())
            .collect();
        let mut won = self.inner.claim_many(&owned).await?.into_iter();
        for answer in answers.iter_mut().filter(|a| a.is_none()) {
            *answer = won.next();
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::protocol(
                        "floor",
                        "the memory store answered too few claims",
                    ))
                })
            })
            .collect())
    }
}

#[async_trait]
impl Target for Floor {
    fn name(&self) -> &'static str {
        "floor"
    }
    fn is_floor(&self) -> bool {
        true
    }
    async fn instance(&self) -> Result<Arc<dyn ClaimStore>> {
        Ok(Arc::new(FloorStore {
            inner: MemoryStore::new(),
            share: self.share,
        }))
    }
    async fn round_trips(&self) -> Result<u64> {
        Ok(0)
    }
    fn counted_by(&self) -> &'static str {
        "nobody: the floor has no store"
    }
    fn namespace(&self) -> String {
        String::new()
    }
    fn fleet_share(&mut self, worker: usize, workers: usize) {
        self.share = Share {
            index: worker as u64,
            of: workers.max(1) as u64,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::{InstanceId, Slot};

    /// The goals that differ from the default are each backend's own:
    /// one round trip where a claim is one atomic step, NATS KV's three
    /// for a batch, the claim rates and fleet costs of issue 19, RabbitMQ's
    /// 50 ms. (PostgreSQL's target connects when it is made, so its goals,
    /// one round trip and 0.40 ms of server CPU, are not checked here.)
    #[test]
    fn each_backend_is_held_to_its_own_goals() {
        let nowhere = |scheme: &str| format!("{scheme}://127.0.0.1:1");
        let redis = |strategy| Redis::new(nowhere("redis"), strategy, None).goals();
        assert_eq!(Memory::new().goals(), Goals::default());
        assert!(!Goals::default().one_round_trip);
        let lease = redis(RedisStrategy::Lease);
        assert!(lease.one_round_trip);
        assert_eq!(
            (lease.fleet_server_cpu_ms, lease.fleet_commands),
            (Some(0.10), Some(20.0))
        );
        let sqlite = Sqlite::new(None).expect("a SQLite target").goals();
        assert!(sqlite.fleet_misses_nothing && !sqlite.one_round_trip);
        assert_eq!(redis(RedisStrategy::StreamId), Goals::default());
        assert_eq!(redis(RedisStrategy::Script), Goals::default());
        let amqp = Amqp::new(nowhere("amqp"), None).goals();
        assert_eq!((amqp.claim_rate, amqp.lateness_p99_ms), (Some(5_000), 50.0));
        assert_eq!(Nats::new(nowhere("nats"), None).goals(), Goals::default());
        let kv = NatsKv::new(nowhere("nats"), None).goals();
        assert_eq!((kv.batch_round_trips, kv.claim_rate), (3, Some(3_000)));
        assert_eq!(kv.lateness_p99_ms, 5.0);
    }

    #[test]
    fn replaces_the_database_of_a_url() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "f"),
            "postgres://postgres@127.0.0.1:5432/f"
        );
        assert_eq!(
            with_database("postgres://u:p@h/test?sslmode=disable", "f"),
            "postgres://u:p@h/f?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h:5432", "f"),
            "postgres://h:5432/f"
        );
    }

    #[test]
    fn reads_the_soft_open_files_limit_of_a_process() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 20000                files     \n\
                      Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(open_files_soft_limit(limits), Some(1024));
        assert_eq!(
            open_files_soft_limit("Max cpu time unlimited unlimited seconds"),
            None
        );
    }

    #[test]
    fn a_broker_without_a_file_per_queue_is_refused_and_told_how_to_fix_it() {
        // The fleet that broke this machine's broker: 8 × 200 jobs for 20 s.
        let fleet = amqp_queues_kept(200, 20);
        assert_eq!(fleet, 8_000);
        let refusal = amqp_room(fleet, 4242, 1024).unwrap_err().to_string();
        for needed in [
            "8000 RabbitMQ queues",
            "pid 4242",
            "only 1024 files",
            "LimitNOFILE",
        ] {
            assert!(
                refusal.contains(needed),
                "{needed:?} missing from: {refusal}"
            );
        }
        assert!(amqp_room(fleet, 4242, 20_000).is_ok());
        // Runs older than the slot TTL have expired: a long run keeps no more.
        assert_eq!(amqp_queues_kept(1000, 3600), amqp_queues_kept(1000, 120));
    }

    /// The run of `fleet-{job}` at the whole second `second` s from now
    /// (a claim of it is not late).
    fn run(job: usize, second: i64) -> RunKey {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        RunKey::new(
            JobName::new(&format!("fleet-{job}")).unwrap(),
            Slot::from_millis((now + second) * 1000),
        )
    }

    #[test]
    fn every_run_has_exactly_one_floor_worker() {
        for of in 1..=8u64 {
            let mut per_worker = vec![0; of as usize];
            for job in 0..50 {
                for second in 0..20 {
                    let run = run(job, second);
                    let owners: Vec<u64> = (0..of)
                        .filter(|&index| Share { index, of }.owns(&run))
                        .collect();
                    assert_eq!(owners.len(), 1, "{of} workers, job {job}, second {second}");
                    per_worker[owners[0] as usize] += 1;
                }
            }
            // 1,000 runs: every worker gets a share, none all of them.
            assert!(
                per_worker.iter().all(|&n| n > 1000 / of / 2),
                "{of} workers: {per_worker:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_floor_worker_wins_its_own_runs_and_hears_the_others_done() {
        let claims: Vec<LeaseClaim> = (0..40)
            .map(|job| {
                LeaseClaim::from_plain(&ClaimRequest {
                    run: run(job, 0),
                    token: Token::generate(),
                    instance: InstanceId::generate(),
                    max_late: Duration::from_secs(5),
                })
            })
            .collect();
        let mut won = vec![0; claims.len()];
        for worker in 0..3 {
            let mut floor = Floor::new();
            floor.fleet_share(worker, 3);
            let store = floor.instance().await.unwrap().as_lease_store().unwrap();
            let answers: Vec<_> = store
                .claim_many(&claims)
                .await
                .unwrap()
                .into_iter()
                .collect();
            assert_eq!(answers.len(), claims.len());
            for (i, answer) in answers.into_iter().enumerate() {
                match answer.unwrap() {
                    ClaimOutcome::Won(_) => won[i] += 1,
                    ClaimOutcome::Done(FinalState::Succeeded) => {}
                    other => panic!("claim {i}: {other:?}"),
                }
            }
        }
        assert!(won.iter().all(|&n| n == 1), "wins per run: {won:?}");
    }
}
