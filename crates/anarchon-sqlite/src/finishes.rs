//! Finishes that wait go together, in one write transaction: SQLite's half
//! of the core's [`GroupCommit`].
//!
//! A SQLite file takes one write transaction at a time, and each one ends
//! in a commit that waits for the disk (an append to the write-ahead log,
//! synced: on a slow disk that is most of the cost). A
//! finish sent alone is such a transaction; a thousand runs ending in the
//! same second were a thousand of them, and with one instance running a
//! thousand jobs a second the finishes alone took the file's whole write
//! rate. So the finishes that arrive while one transaction is in flight go
//! in the next one, still one `UPDATE` each (`sql/finish.sql`), each
//! answered for its own run and token. How the group forms (nothing waits
//! for a timer; a task of its own sends) is the core's.
//!
//! A group that fails for a reason that may pass (a lock held past the
//! busy timeout, a full disk, an I/O error) fails each of its finishes as
//! temporary, and the scheduler sends them again. One that fails for good
//! (a finish the database refuses) is sent again one finish at a time, so
//! only that one fails, as it would have alone. A group holds the file's
//! write lock for its `UPDATE`s, one short statement each, and waits for
//! the lock no longer than a lone finish would (the busy timeout, at
//! `BEGIN IMMEDIATE`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anarchon_core::group_commit::{Group, GroupCommit};
use anarchon_core::time::millis;
use anarchon_core::{Renewal, RetryPlan, RunKey, StoreError, Token};
use async_trait::async_trait;
use sqlx::SqlitePool;
use sqlx::sqlite::SqliteArguments;

use crate::error::{Class, classify, described, doing_when, store_error_when};
use crate::options::SqliteOptions;
use crate::sql::Sql;

/// A store's finishes, grouped.
pub(crate) type Finishes = GroupCommit<FinishGroup>;

/// One run's end, as `sql/finish.sql` takes it.
pub(crate) struct Finish {
    pub(crate) run: RunKey,
    pub(crate) token: Token,
    /// The final state (`anarchon_core::FinalState::as_str`).
    pub(crate) state: &'static str,
    pub(crate) error: Option<String>,
    /// The retry its runner asks for, if any.
    pub(crate) retry: Option<RetryPlan>,
}

/// How a store's finishes are sent, and how many write transactions they
/// have taken.
pub(crate) struct FinishGroup {
    pool: SqlitePool,
    sql: Arc<Sql>,
    options: Arc<SqliteOptions>,
    pub(crate) transactions: AtomicU64,
}

type Update<'q> = sqlx::query::Query<'q, sqlx::Sqlite, SqliteArguments>;

impl FinishGroup {
    pub(crate) fn new(pool: SqlitePool, sql: Arc<Sql>, options: Arc<SqliteOptions>) -> Self {
        Self {
            pool,
            sql,
            options,
            transactions: AtomicU64::new(0),
        }
    }

    fn update(&self, finish: &Finish) -> Update<'static> {
        sqlx::query(self.sql.finish.clone())
            .bind(finish.run.job.as_str().to_owned())
            .bind(finish.run.slot.as_millis())
            .bind(finish.token.to_string())
            .bind(finish.state)
            .bind(finish.error.clone())
            .bind(finish.retry.map(|p| millis(p.after)))
            .bind(finish.retry.map(|p| p.before.as_millis()))
            .bind(anarchon_core::retry::NOT_RETRIED)
    }

    /// `finish` alone, in a transaction of its own (autocommit).
    async fn alone(&self, finish: &Finish) -> Result<Renewal, StoreError> {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let done = self.update(finish).execute(&self.pool).await;
        match done {
            Ok(done) => Ok(renewal(done.rows_affected())),
            Err(e) => Err(store_error_when(&self.options, &action_for(&finish.run), e)),
        }
    }

    /// The finishes of `group` in one write transaction: whether each
    /// changed its run, or the error that ended the transaction (nothing
    /// of it is recorded then).
    async fn together(&self, group: &[Finish]) -> Result<Vec<Renewal>, sqlx::Error> {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        let mut answers = Vec::with_capacity(group.len());
        let mut written = Ok(());
        for finish in group {
            match self.update(finish).execute(&mut *tx).await {
                Ok(done) => answers.push(renewal(done.rows_affected())),
                Err(e) => {
                    written = Err(e);
                    break;
                }
            }
        }
        let written = match written {
            Ok(()) => tx.commit().await,
            Err(e) => {
                drop(tx);
                Err(e)
            }
        };
        if written.is_err() {
            // SQLite ends the transaction itself on some failures (a full
            // disk, an I/O error); the rollback sqlx then sends fails, and
            // its connection would be left thinking it is still in one.
            // A connection of a failed group is not given back.
            conn.close_on_drop();
        }
        written.map(|()| answers)
    }

    /// Each finish of `group` alone, in order. After a temporary failure
    /// the rest are not sent (each would wait for the same store) and get
    /// a copy of that error.
    async fn each_alone(&self, group: &[Finish]) -> Vec<Result<Renewal, StoreError>> {
        let mut answers: Vec<Result<Renewal, StoreError>> = Vec::with_capacity(group.len());
        // The answer that stopped the rest: the first temporary failure.
        let mut stopped: Option<usize> = None;
        for finish in group {
            let answer = match stopped.and_then(|i| answers[i].as_ref().err()) {
                Some(error) => Err(error.copied(&format!(
                    "{}: not sent, the store failed an earlier finish",
                    action_for(&finish.run)
                ))),
                None => self.alone(finish).await,
            };
            if stopped.is_none() && answer.as_ref().is_err_and(StoreError::is_temporary) {
                stopped = Some(answers.len());
            }
            answers.push(answer);
        }
        answers
    }
}

#[async_trait]
impl Group for FinishGroup {
    type Call = Finish;
    type Answer = Result<Renewal, StoreError>;
    const MOST: usize = 1000;

    async fn send(&self, group: Vec<Finish>) -> Vec<Self::Answer> {
        if let [finish] = group.as_slice() {
            return vec![self.alone(finish).await];
        }
        match self.together(&group).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(e) if classify(&e) == Class::Unavailable => {
                let others = group.len() - 1;
                group
                    .iter()
                    .map(|f| {
                        let doing = format!(
                            "{} (written together with {others} other finishes)",
                            action_for(&f.run)
                        );
                        Err(described(&doing_when(&self.options, &doing, &e), &e))
                    })
                    .collect()
            }
            Err(e) => {
                tracing::debug!(error = %e, "a transaction of {} finishes failed; sending each alone", group.len());
                self.each_alone(&group).await
            }
        }
    }
}

/// One row changed: the token held the run (or had already ended it so).
fn renewal(rows: u64) -> Renewal {
    if rows == 1 {
        Renewal::Renewed
    } else {
        Renewal::Fenced
    }
}

pub(crate) fn action_for(run: &RunKey) -> String {
    format!("recording the end of {run}")
}
