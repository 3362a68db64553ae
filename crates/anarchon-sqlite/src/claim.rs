//! The claim path: one claim inside the `BEGIN IMMEDIATE` transaction of
//! [`LeaseStore::claim_many`](anarchon_core::LeaseStore::claim_many),
//! decided by [`anarchon_core::decide::claim`].

use anarchon_core::decide::{self, ClaimDecision, Facts, Needs};
use anarchon_core::stored;
use anarchon_core::time::millis;
use anarchon_core::{
    Attempt, ClaimOutcome, Fence, FinalState, InstanceId, JobName, LeaseClaim, RecordState, RunKey,
    StoreError, Timestamp, Token,
};
use sqlx::SqliteConnection;

use crate::BACKEND;
use crate::error::bad_stored;
use crate::rows::{ClaimRow, fence_value};
use crate::store::SqliteStore;

impl SqliteStore {
    /// One claim inside an open `BEGIN IMMEDIATE` transaction: the steps of
    /// the lease flowchart, as `MemoryStore` writes them. `batch_now` is the
    /// store's clock as the transaction's first read saw it: every claim of
    /// a batch decides on the same instant.
    pub(crate) async fn claim_in(
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
        let mut facts = Facts::at(now, row.paused());
        // Each round reads one more fact the decision asked for.
        let decision = loop {
            match decide::claim(record.as_ref(), facts, req) {
                Ok(decision) => break decision,
                Err(Needs::OverlapCheck) if facts.another_run_live.is_none() => {
                    let live = self.another_run_is_live(conn, run, now).await?;
                    facts.another_run_live = Some(live);
                }
                Err(Needs::WaitingCheck) if facts.another_waiting.is_none() => {
                    let waiting = self.another_slot_waits(conn, run, now).await?;
                    facts.another_waiting = Some(waiting);
                }
                Err(needs) => {
                    return Err(StoreError::protocol(
                        BACKEND,
                        format!("the claim still needs {needs:?}"),
                    ));
                }
            }
        };
        let fence = if decision.needs_fence() {
            Some(self.next_fence(conn, &run.job).await?)
        } else {
            None
        };
        let lease_until = now.saturating_add(req.lease);
        let past = row.past_after(decision.ends_attempt(record.as_ref()))?;
        match &decision {
            ClaimDecision::Answer(_) | ClaimDecision::Resent { .. } => {}
            ClaimDecision::RecordMissed => {
                self.write_run(conn, run, Written::ended(RecordState::Missed, now))
                    .await?;
            }
            ClaimDecision::RecordSkipped => {
                let skipped = RecordState::Finished(FinalState::Skipped);
                self.write_run(conn, run, Written::ended(skipped, now))
                    .await?;
            }
            ClaimDecision::RecordPaused => {
                let paused = RecordState::Finished(FinalState::Paused);
                self.write_run(conn, run, Written::ended(paused, now))
                    .await?;
            }
            ClaimDecision::RecordWaiting { until, .. } => {
                let waiting = Written {
                    finished_at: None,
                    lease_until: Some(*until),
                    ..Written::ended(RecordState::Waiting, now)
                };
                self.write_run(conn, run, waiting).await?;
            }
            ClaimDecision::Start | ClaimDecision::StartReplacing => {
                if decision == ClaimDecision::StartReplacing {
                    for statement in [&self.sql.replace_running, &self.sql.replace_retrying] {
                        sqlx::query(statement.clone())
                            .bind(job)
                            .bind(slot)
                            .bind(now.as_millis())
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| self.err("replacing the job's runs still going", e))?;
                    }
                }
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
            ClaimDecision::TakeOver { attempt } | ClaimDecision::Retry { attempt } => {
                let fence = fence.map(fence_value).transpose()?;
                let changed = sqlx::query(self.sql.run_again.clone())
                    .bind(job)
                    .bind(slot)
                    .bind(i64::from(attempt.get()))
                    .bind(req.claim.token.to_string())
                    .bind(fence)
                    .bind(req.claim.instance.as_str())
                    .bind(lease_until.as_millis())
                    .bind((!past.is_empty()).then(|| past.encode()))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err("running the run again", e))?
                    .rows_affected();
                expect_one_row("running the run again", changed)?;
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
        Ok(decision.outcome(fence, &past))
    }

    pub(crate) async fn savepoint(
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

    async fn another_slot_waits(
        &self,
        conn: &mut SqliteConnection,
        run: &RunKey,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar::<_, bool>(self.sql.waiting_slot_exists.clone())
            .bind(run.job.as_str())
            .bind(run.slot.as_millis())
            .bind(now.as_millis())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.err("checking for a waiting slot of the job", e))
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
        stored::fence(n).map_err(bad_stored)
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
