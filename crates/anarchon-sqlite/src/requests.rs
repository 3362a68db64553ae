//! Manual-run requests in SQLite, and how other processes hear of them.
//!
//! A request is one row, written in a `BEGIN IMMEDIATE` transaction that
//! first looks for the same (job, id), so the same id twice is one
//! request. SQLite cannot push a change to other processes; a store whose
//! announcements someone listens to watches the file instead: one
//! connection of its own asks `PRAGMA data_version` a few times a second
//! (a read of a counter in shared memory, no disk I/O) and, when another
//! connection committed something, reads the recent requests and announces
//! the ones it has not announced yet.

use std::collections::BTreeSet;
use std::time::Duration;

use anarchon_core::scheduler::MANUAL_RUN_WINDOW;
use anarchon_core::stored;
use anarchon_core::time::millis;
use anarchon_core::{
    HandOvers, JobName, RequestId, RunRequest, RunRequests, StoreError, Timestamp, TriggerRequest,
};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, SqliteConnection};
use std::sync::Arc;

use crate::error::{bad_stored, bad_value};
use crate::sql::Sql;
use crate::store::SqliteStore;

/// How often the watcher asks whether another connection wrote.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// One request's columns: job, id, requested_at, requested_by,
/// range_from, range_to.
type RequestColumns = (
    String,
    String,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// A stored request as find_request.sql reads it: requested_at,
/// requested_by, range_from, range_to.
type Found = (i64, Option<String>, Option<i64>, Option<i64>);

fn request(columns: RequestColumns) -> Result<RunRequest, StoreError> {
    let (job, id, requested_at, by, from, to) = columns;
    Ok(RunRequest {
        job: JobName::new(&job).map_err(|_| bad_value("job name", &job))?,
        id: RequestId::new(&id).map_err(|_| bad_value("request id", &id))?,
        requested_at: Timestamp::from_millis(requested_at),
        by,
        backfill: stored::backfill(from, to).map_err(bad_stored)?,
    })
}

impl SqliteStore {
    pub(crate) async fn write_request(
        &self,
        req: &TriggerRequest,
    ) -> Result<RunRequest, StoreError> {
        let (job, id) = (req.job(), req.id());
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err("starting the request", e))?;
        let found: Option<Found> = sqlx::query_as(self.sql.find_request.clone())
            .bind(job.as_str())
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.err("reading the request", e))?;
        let (requested_at, by, backfill, new) = match found {
            Some((at, stored_by, from, to)) => (
                at,
                stored_by,
                stored::backfill(from, to).map_err(bad_stored)?,
                false,
            ),
            None => {
                let at: i64 = sqlx::query_scalar(self.sql.write_request.clone())
                    .bind(job.as_str())
                    .bind(id.as_str())
                    .bind(req.by())
                    .bind(req.range().map(|r| r.from().as_millis()))
                    .bind(req.range().map(|r| r.to().as_millis()))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| self.err("writing the request", e))?;
                (at, req.by().map(str::to_owned), req.range(), true)
            }
        };
        tx.commit()
            .await
            .map_err(|e| self.err("committing the request", e))?;
        let request = req.answer(Timestamp::from_millis(requested_at), by, backfill);
        if new {
            self.hand_overs.announce(&request.news());
        }
        Ok(request)
    }

    pub(crate) async fn read_requests(&self) -> Result<RunRequests, StoreError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| self.err("starting to read the requests", e))?;
        let now: i64 = sqlx::query_scalar(self.sql.now.clone())
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| self.err("reading the clock", e))?;
        let rows: Vec<RequestColumns> = sqlx::query_as(self.sql.requests.clone())
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err("reading the requests", e))?;
        tx.commit()
            .await
            .map_err(|e| self.err("ending the read", e))?;
        Ok(RunRequests {
            store_now: Timestamp::from_millis(now),
            requests: rows.into_iter().map(request).collect::<Result<_, _>>()?,
        })
    }

    pub(crate) async fn collect_requests(&self, keep: Duration) -> Result<(), StoreError> {
        sqlx::query(self.sql.collect_requests.clone())
            .bind(millis(keep))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err("collecting old requests", e))?;
        Ok(())
    }

    /// Starts watching the file for requests written by other processes,
    /// once per store handle.
    pub(crate) fn watch_requests(&self) {
        self.request_watch.get_or_init(|| {
            let connect = SqliteConnectOptions::new()
                .filename(self.options.path())
                .read_only(true)
                .busy_timeout(self.options.busy_timeout());
            let (sql, board) = (self.sql.clone(), self.hand_overs.clone());
            let announced = Arc::default();
            anarchon_core::Listener::reconnecting("the request watcher", move || {
                watch(
                    connect.clone(),
                    sql.clone(),
                    board.clone(),
                    Arc::clone(&announced),
                )
            })
        });
    }
}

/// Watches on one connection, until it fails, for requests another
/// connection wrote, and announces the recent ones.
async fn watch(
    connect: SqliteConnectOptions,
    sql: Arc<Sql>,
    board: Arc<HandOvers>,
    announced: Arc<std::sync::Mutex<BTreeSet<(JobName, RequestId)>>>,
) -> Result<(), sqlx::Error> {
    let mut conn = connect.connect().await?;
    let mut version: Option<i64> = None;
    loop {
        let now: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut conn)
            .await?;
        if version != Some(now) {
            version = Some(now);
            let recent =
                announce_recent(&mut conn, &sql, &board, &announced_copy(&announced)).await?;
            *announced.lock().unwrap_or_else(|p| p.into_inner()) = recent;
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

fn announced_copy(
    announced: &std::sync::Mutex<BTreeSet<(JobName, RequestId)>>,
) -> BTreeSet<(JobName, RequestId)> {
    announced.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Announces the recent requests not in `announced`; returns the recent
/// ones (only those can be new at the next look).
async fn announce_recent(
    conn: &mut SqliteConnection,
    sql: &Sql,
    board: &HandOvers,
    announced: &BTreeSet<(JobName, RequestId)>,
) -> Result<BTreeSet<(JobName, RequestId)>, sqlx::Error> {
    let now: i64 = sqlx::query_scalar(sql.now.clone())
        .fetch_one(&mut *conn)
        .await?;
    let since = now - millis(MANUAL_RUN_WINDOW);
    let rows: Vec<RequestColumns> = sqlx::query_as(sql.requests_since.clone())
        .bind(since)
        .fetch_all(&mut *conn)
        .await?;
    let mut recent = BTreeSet::new();
    for columns in rows {
        let Ok(req) = request(columns) else { continue };
        let key = (req.job.clone(), req.id.clone());
        if !announced.contains(&key) {
            board.announce(&req.news());
        }
        recent.insert(key);
    }
    Ok(recent)
}
