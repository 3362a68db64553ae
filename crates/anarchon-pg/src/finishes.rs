//! Finishes that wait go together, as one statement: PostgreSQL's half of
//! the core's [`GroupCommit`].
//!
//! On PostgreSQL a lone finish's commit costs more of the server's CPU
//! than the row it writes: `pgbench` with this statement measured
//! 0.27–0.30 ms of backend CPU per lone finish and about a tenth of that
//! per finish in a statement of twenty-five (`docs/performance.md`). So the
//! finishes that arrive while one statement is in flight go in the next
//! one (up to [`FinishGroup::MOST`]), and `sql/finish.sql` decides each
//! for its own run, token and end; one the server refuses for good fails
//! alone. How the group forms (nothing waits for a timer; a task of its
//! own sends) is the core's.
//!
//! A statement of many finishes locks several runs. A claim that ends
//! other runs of a job (`replace`) may lock two of them in the other order,
//! so the two can deadlock: PostgreSQL then aborts one of them after its
//! `deadlock_timeout` (a second by default) and it is sent again, since a
//! deadlock is a temporary failure. Single finishes could not take part
//! in one.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anarchon_core::group_commit::{Group, GroupCommit};
use anarchon_core::{Renewal, RunKey, Token};
use async_trait::async_trait;
use sqlx::{PgPool, SqlStr};
use uuid::Uuid;

use crate::connection::{Resend, send};
use crate::error::Error;

/// How long a finish statement may go unanswered before its finishes are
/// answered `Unavailable` (their callers send them again): the limit the
/// scheduler puts on one store call.
const STATEMENT_LIMIT: Duration = Duration::from_secs(10);

/// A store's finishes, grouped.
pub(crate) type Finishes = GroupCommit<FinishGroup>;

/// One run's end, as `sql/finish.sql` takes it.
pub(crate) struct Finish {
    pub(crate) run: RunKey,
    pub(crate) token: Token,
    /// The final state (`anarchon_core::FinalState::as_str`).
    pub(crate) state: &'static str,
    pub(crate) error: Option<String>,
    /// For a failure whose runner asks for a retry: the wait (ms) and the
    /// job's next slot (ms), before which the retry must be due.
    pub(crate) retry: Option<(i64, i64)>,
}

/// How a store's finishes are sent: what `send!` needs (the store's pool,
/// its statement count and how often a statement may be sent again on
/// another connection) and the `finish` statement.
pub(crate) struct FinishGroup {
    pool: PgPool,
    statements: Arc<AtomicU64>,
    resends: u32,
    sql: SqlStr,
}

impl FinishGroup {
    /// Finishes sent with `sql` (the store's `finish` statement).
    pub(crate) fn new(pool: PgPool, statements: Arc<AtomicU64>, resends: u32, sql: SqlStr) -> Self {
        Self {
            pool,
            statements,
            resends,
            sql,
        }
    }

    /// Sends `batch` as one statement: the runs it recorded, or why not.
    /// A statement with no answer within [`STATEMENT_LIMIT`] is given up
    /// (dropped with its connection, as the scheduler's own limit on a
    /// store call drops a call), so one stuck statement holds up the
    /// finishes behind it no longer than that limit would have held up a
    /// lone finish.
    async fn record(&self, batch: &[Finish], action: &str) -> Result<HashSet<Recorded>, Error> {
        let (mut jobs, mut slots, mut tokens, mut states) = (vec![], vec![], vec![], vec![]);
        let (mut errors, mut waits, mut next_slots) = (vec![], vec![], vec![]);
        for finish in batch {
            jobs.push(finish.run.job.as_str());
            slots.push(finish.run.slot.as_millis());
            tokens.push(*finish.token.as_uuid());
            states.push(finish.state);
            errors.push(finish.error.as_deref());
            waits.push(finish.retry.map(|(wait, _)| wait));
            next_slots.push(finish.retry.map(|(_, next)| next));
        }
        let sent = tokio::time::timeout(STATEMENT_LIMIT, async {
            send!(self, Resend::Always, action.to_owned(), |conn| {
                sqlx::query_as::<_, Recorded>(self.sql.clone())
                    .bind(&jobs)
                    .bind(&slots)
                    .bind(&tokens)
                    .bind(&states)
                    .bind(&errors)
                    .bind(&waits)
                    .bind(&next_slots)
                    .bind(anarchon_core::retry::NOT_RETRIED)
                    .fetch_all(conn)
            })
        })
        .await;
        match sent {
            Ok(rows) => Ok(rows?.into_iter().collect()),
            Err(_) => Err(Error::Unavailable {
                action: action.to_owned(),
                reason: format!("no answer within {STATEMENT_LIMIT:?}"),
                source: None,
            }),
        }
    }
}

#[async_trait]
impl Group for FinishGroup {
    type Call = Finish;
    type Answer = Result<Renewal, Error>;
    const MOST: usize = 1000;

    /// Sends `batch` as one statement and answers each of its finishes.
    /// When the server refuses the statement for good (not a temporary
    /// failure), one finish's data may be the cause (say, an error text
    /// with a NUL byte, which PostgreSQL text cannot hold): each finish is
    /// then sent again alone, so only that one fails, as it would have
    /// alone.
    async fn send(&self, batch: Vec<Finish>) -> Vec<Self::Answer> {
        if let [finish] = batch.as_slice() {
            // Alone, a finish keeps the whole error, its source too.
            return vec![
                self.record(&batch, &action_for(&finish.run))
                    .await
                    .map(|recorded| answer(finish, &recorded)),
            ];
        }
        let action = format!(
            "recording the end of {} runs ({} first)",
            batch.len(),
            batch[0].run
        );
        match self.record(&batch, &action).await {
            Ok(recorded) => batch.iter().map(|f| Ok(answer(f, &recorded))).collect(),
            Err(error) if !error.is_temporary() => {
                tracing::debug!(%error, "a statement of {} finishes was refused; sending each alone", batch.len());
                let mut answers: Vec<Self::Answer> = Vec::with_capacity(batch.len());
                // After a temporary failure the rest are not sent (each
                // would wait for the same server) and get a copy of it.
                let mut stopped: Option<Error> = None;
                for finish in &batch {
                    let action = action_for(&finish.run);
                    if let Some(error) = &stopped {
                        answers.push(Err(error.again(action)));
                        continue;
                    }
                    let alone = std::slice::from_ref(finish);
                    match self.record(alone, &action).await {
                        Ok(recorded) => answers.push(Ok(answer(finish, &recorded))),
                        Err(error) => {
                            if error.is_temporary() {
                                stopped = Some(error.again(action));
                            }
                            answers.push(Err(error));
                        }
                    }
                }
                answers
            }
            Err(error) => batch
                .iter()
                .map(|f| Err(error.again(action_for(&f.run))))
                .collect(),
        }
    }
}

/// A run the statement recorded: job, slot, token and the state it ended
/// in (`RETURNING`).
type Recorded = (String, i64, Uuid, String);

/// `Renewed` if the statement recorded the run of `finish`, for its
/// token, in its state; else `Fenced`. (The same run twice in one
/// statement with two different ends is recorded with one of them: the
/// other is fenced, as it would be sent after it.)
fn answer(finish: &Finish, recorded: &HashSet<Recorded>) -> Renewal {
    let key = (
        finish.run.job.as_str().to_owned(),
        finish.run.slot.as_millis(),
        *finish.token.as_uuid(),
        finish.state.to_owned(),
    );
    if recorded.contains(&key) {
        Renewal::Renewed
    } else {
        Renewal::Fenced
    }
}

fn action_for(run: &RunKey) -> String {
    format!("recording the end of {run}")
}
