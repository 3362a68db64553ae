//! Finishes that wait go together, as one statement (group commit).
//!
//! Why: the runs of one instant end within a millisecond or two of each
//! other (a fleet's every-second jobs, a backfill), and a finish sent alone
//! is a transaction of its own. On PostgreSQL the commit costs more of the
//! server's CPU than the row it writes: `pgbench` with this statement
//! measured 0.27–0.30 ms of backend CPU per lone finish and about a tenth
//! of that per finish in a statement of twenty-five (`docs/performance.md`).
//! So while one finish statement is
//! in flight, the finishes that arrive wait, and the next statement carries
//! all of them (up to [`MOST_PER_STATEMENT`]).
//!
//! Nothing waits for a timer: the first finish of a burst is sent at once,
//! alone, so a lone finish costs what it always did, and a finish waits for
//! the statement ahead of it (given up after [`STATEMENT_LIMIT`]) and for
//! those of the finishes queued before it, a thousand to a statement. Each
//! finish still gets its own answer, decided for its own run, token and end
//! by `sql/finish.sql`, and one the server refuses for good fails alone.
//!
//! A statement of many finishes locks several runs. A claim that ends
//! other runs of a job (`replace`) may lock two of them in the other order,
//! so the two can deadlock: PostgreSQL then aborts one of them after its
//! `deadlock_timeout` (a second by default) and it is sent again, since a
//! deadlock is a temporary failure. Single finishes could not take part
//! in one.
//!
//! The statement is sent by a task of its own, not by the caller: a caller
//! that stops waiting (a timeout, a cancelled run) cannot strand the others.
//! Its finish may still be recorded, as when a reply is lost; sent again
//! with the same token, it gets the same answer.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anarchon_core::{Renewal, RunKey, Token};
use sqlx::{PgPool, SqlStr};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::connection::{Resend, send};
use crate::error::Error;

/// The most finishes one statement carries; more wait for the next.
pub(crate) const MOST_PER_STATEMENT: usize = 1000;

/// How long a finish statement may go unanswered before its finishes are
/// answered `Unavailable` (their callers send them again): the limit the
/// scheduler puts on one store call.
const STATEMENT_LIMIT: Duration = Duration::from_secs(10);

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

/// The finishes of one store: those waiting, and whether a statement is
/// in flight.
pub(crate) struct Finishes {
    /// What `send!` needs: the store's pool, its statement count and how
    /// often a statement may be sent again on another connection.
    pool: PgPool,
    statements: Arc<AtomicU64>,
    resends: u32,
    sql: SqlStr,
    pending: Mutex<Pending>,
}

/// Finishes not yet sent, and whether a task is sending.
#[derive(Default)]
struct Pending {
    queue: Vec<Waiting>,
    sending: bool,
}

/// A finish and where its answer goes.
struct Waiting {
    finish: Finish,
    answer: oneshot::Sender<Result<Renewal, Error>>,
}

impl Finishes {
    /// Finishes sent with `sql` (the store's `finish` statement).
    pub(crate) fn new(pool: PgPool, statements: Arc<AtomicU64>, resends: u32, sql: SqlStr) -> Self {
        Self {
            pool,
            statements,
            resends,
            sql,
            pending: Mutex::new(Pending::default()),
        }
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `finish`, in the next statement: `Renewed` if its token
    /// still held the run (or had finished it so already), else `Fenced`.
    pub(crate) async fn send(self: &Arc<Self>, finish: Finish) -> Result<Renewal, Error> {
        let action = action_for(&finish.run);
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut pending = self.pending();
            pending.queue.push(Waiting { finish, answer });
            !std::mem::replace(&mut pending.sending, true)
        };
        if start {
            tokio::spawn(Sender::new(self.clone()).run());
        }
        answered.await.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                action,
                reason: "the task sending it ended before it answered (a panic, or the \
                         runtime shutting down)"
                    .to_owned(),
                source: None,
            })
        })
    }

    /// Sends `batch` as one statement and answers each of its finishes.
    /// When the server refuses the statement for good (not a temporary
    /// failure), one finish's data may be the cause (say, an error text
    /// with a NUL byte, which PostgreSQL text cannot hold): each finish is
    /// then sent again alone, so only that one fails, as it would have
    /// alone.
    async fn send_batch(&self, batch: Vec<Waiting>) {
        let action = match batch.len() {
            1 => action_for(&batch[0].finish.run),
            n => format!(
                "recording the end of {n} runs ({} first)",
                batch[0].finish.run
            ),
        };
        match self.record(&batch, &action).await {
            Ok(recorded) => answer(batch, &recorded),
            Err(error) if batch.len() > 1 && !error.is_temporary() => {
                tracing::debug!(%error, "a statement of {} finishes was refused; sending each alone", batch.len());
                for waiting in batch {
                    let action = action_for(&waiting.finish.run);
                    let alone = std::slice::from_ref(&waiting);
                    match self.record(alone, &action).await {
                        Ok(recorded) => answer(vec![waiting], &recorded),
                        Err(error) => {
                            let _ = waiting.answer.send(Err(error));
                        }
                    }
                }
            }
            Err(error) => {
                for Waiting { finish, answer } in batch {
                    let _ = answer.send(Err(error.again(action_for(&finish.run))));
                }
            }
        }
    }

    /// Sends the finishes of `batch` as one statement: the runs it
    /// recorded, or why not. A statement with no answer within
    /// [`STATEMENT_LIMIT`] is given up (dropped with its connection, as
    /// the scheduler's own limit on a store call drops a call), so one
    /// stuck statement holds up the finishes behind it no longer than
    /// that limit would have held up a lone finish.
    async fn record(&self, batch: &[Waiting], action: &str) -> Result<HashSet<Recorded>, Error> {
        let (mut jobs, mut slots, mut tokens, mut states) = (vec![], vec![], vec![], vec![]);
        let (mut errors, mut waits, mut next_slots) = (vec![], vec![], vec![]);
        for Waiting { finish, .. } in batch {
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

/// A run the statement recorded: job, slot, token and the state it ended
/// in (`RETURNING`).
type Recorded = (String, i64, Uuid, String);

/// Answers each finish of `batch`: `Renewed` if the statement recorded its
/// run, for its token, in its state; else `Fenced`. (The same run twice in
/// one statement with two different ends is recorded with one of them: the
/// other is fenced, as it would be sent after it.)
fn answer(batch: Vec<Waiting>, recorded: &HashSet<Recorded>) {
    for Waiting { finish, answer } in batch {
        let key = (
            finish.run.job.as_str().to_owned(),
            finish.run.slot.as_millis(),
            *finish.token.as_uuid(),
            finish.state.to_owned(),
        );
        let renewal = if recorded.contains(&key) {
            Renewal::Renewed
        } else {
            Renewal::Fenced
        };
        // A caller that stopped waiting needs no answer.
        let _ = answer.send(Ok(renewal));
    }
}

fn action_for(run: &RunKey) -> String {
    format!("recording the end of {run}")
}

/// The task that sends what waits until nothing does. Should it end any
/// other way (a panic, the runtime dropping it), the finishes still waiting
/// are answered with an error (their callers send them again) and the next
/// finish starts a new task.
struct Sender {
    finishes: Arc<Finishes>,
    done: bool,
}

impl Sender {
    fn new(finishes: Arc<Finishes>) -> Self {
        Self {
            finishes,
            done: false,
        }
    }

    async fn run(mut self) {
        loop {
            let batch: Vec<Waiting> = {
                let mut pending = self.finishes.pending();
                if pending.queue.is_empty() {
                    pending.sending = false;
                    self.done = true;
                    return;
                }
                let n = pending.queue.len().min(MOST_PER_STATEMENT);
                pending.queue.drain(..n).collect()
            };
            self.finishes.send_batch(batch).await;
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if !self.done {
            let mut pending = self.finishes.pending();
            pending.sending = false;
            // Dropping the answers' senders tells each caller.
            pending.queue.clear();
        }
    }
}
