//! Manual-run requests in PostgreSQL: one statement writes or finds one
//! (sql/request_run.sql), and the store's hand-over channel (`NOTIFY`)
//! carries the news of the new run to every listening store.

use anarchon_core::stored;
use anarchon_core::{
    JobName, RequestId, RunRequest, RunRequests, StoreError, Timestamp, TriggerRequest,
};

use crate::connection::{Resend, send};
use crate::error::Error;
use crate::store::PgStore;

/// How often a request is sent again when a racing request of the job took
/// its stamp, or committed its id after this statement's snapshot.
const TRIES: u32 = 8;

/// The answer of sql/request_run.sql: the stamp, the author, the range,
/// whether the statement wrote it.
type Written = (i64, Option<String>, Option<i64>, Option<i64>, bool);

/// One row of sql/requests.sql: the clock, then a request's columns.
type Listed = (
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

impl PgStore {
    pub(crate) async fn write_request(
        &self,
        req: &TriggerRequest,
    ) -> Result<RunRequest, StoreError> {
        let (job, id) = (req.job(), req.id());
        let action = || format!("requesting a manual run of {job} in table {}", self.table());
        for _ in 0..TRIES {
            let written: Option<Vec<Written>> = send!(self, Resend::Always, action(), |conn| {
                async {
                    let sent = sqlx::query_as::<_, Written>(self.sql.request_run.clone())
                        .bind(job.as_str())
                        .bind(id.as_str())
                        .bind(req.by())
                        .bind(req.range().map(|r| r.from().as_millis()))
                        .bind(req.range().map(|r| r.to().as_millis()))
                        .fetch_all(conn)
                        .await;
                    match sent {
                        // Another request of the job took the stamp.
                        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                            Ok(None)
                        }
                        other => other.map(Some),
                    }
                }
            })?;
            let Some((requested_at, by, from, to, new)) =
                written.and_then(|rows| rows.into_iter().next())
            else {
                continue;
            };
            let backfill =
                stored::backfill(from, to).map_err(|e| Error::protocol(action(), e.to_string()))?;
            let request = req.answer(Timestamp::from_millis(requested_at), by, backfill);
            if new {
                self.announce_hand_over(&request.news()).await;
            }
            return Ok(request);
        }
        Err(Error::protocol(
            action(),
            format!("other requests of the job kept racing this one {TRIES} times"),
        )
        .into())
    }

    pub(crate) async fn read_requests(&self) -> Result<RunRequests, StoreError> {
        let action = || format!("reading the requests of table {}", self.table());
        let rows: Vec<Listed> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, Listed>(self.sql.requests.clone()).fetch_all(conn)
        })?;
        let now = rows.first().map_or(0, |row| row.0);
        let mut requests = Vec::new();
        for (_, job, id, at, by, from, to) in rows {
            let (Some(job), Some(id), Some(at)) = (job, id, at) else {
                continue;
            };
            let bad = |what: &str, value: &str| {
                StoreError::from(Error::protocol(
                    action(),
                    format!("invalid {what} {value:?} in the requests table"),
                ))
            };
            requests.push(RunRequest {
                job: JobName::new(&job).map_err(|_| bad("job name", &job))?,
                id: RequestId::new(&id).map_err(|_| bad("request id", &id))?,
                requested_at: Timestamp::from_millis(at),
                by,
                backfill: stored::backfill(from, to)
                    .map_err(|e| Error::protocol(action(), e.to_string()))?,
            });
        }
        Ok(RunRequests {
            store_now: Timestamp::from_millis(now),
            requests,
        })
    }
}
