//! The [`LeaseStore`] impl: each call as reads and a compare-and-swap of
//! the job's document.

use anarchon_core::hand_over::announced;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anarchon_core::{
    ClaimAnswers, ClaimOutcome, FinalState, JobName, LeaseClaim, LeaseStore, Pause, PauseRequest,
    PauseScope, Pauses, RecordState, Renewal, RunKey, RunOutcome, RunRecord, RunRequest,
    RunRequests, RunState, RunView, Slot, StoreError, Timestamp, Token, TriggerRequest,
};
use async_trait::async_trait;
use futures::StreamExt;

use super::attempts::Failure;
use super::records::{JobDoc, Outside, RunDoc, Stamp};
use super::{Counters, LEASE_BACKEND, MAX_ROUNDS, NatsLeaseStore, PARALLEL};

impl NatsLeaseStore {
    /// Read-and-swap on the live run `run` held by `token`: `change` edits
    /// the document (the run is in `live`). `Fenced` when `token` does not
    /// hold the run.
    async fn change_live(
        &self,
        run: &RunKey,
        token: Token,
        change: impl Fn(&mut JobDoc, i64),
    ) -> Result<Renewal, StoreError> {
        let key = Self::job_key(&run.job);
        let slot = run.slot.as_millis();
        for _ in 0..MAX_ROUNDS {
            let read = self.read_job(&run.job).await?;
            self.round_trips(1);
            let held = read.doc.live.get(slot).map_err(|m| self.protocol(m))?;
            if !held.is_some_and(|l| l.held_by(token)) {
                return Ok(Renewal::Fenced);
            }
            let mut next = read.doc;
            change(&mut next, slot);
            let written = self.write(&key, next.encode(), Some(read.revision)).await?;
            self.round_trips(1);
            if written.is_some() {
                return Ok(Renewal::Renewed);
            }
            Counters::add(&self.counters.conflicts, 1);
        }
        Err(self.unavailable(format!(
            "the update of {run} lost {MAX_ROUNDS} compare-and-swap races in a row; try again"
        )))
    }
}

anarchon_core::claims_through_leases!(NatsLeaseStore, LEASE_BACKEND);

#[async_trait]
impl LeaseStore for NatsLeaseStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let mut answers = self.claim_batch(std::slice::from_ref(req)).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(self.protocol("a claim got no answer")))
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        Ok(ClaimAnswers::new(self.claim_batch(reqs).await?))
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        let (tick, read) = tokio::join!(self.tick(), self.read_job(&run.job));
        self.round_trips(1);
        let (sequence, read) = (tick?, read?);
        let slot = run.slot.as_millis();
        let in_doc = read.doc.live.contains(slot) || read.doc.ended.contains_key(&slot);
        let (now, outside) = if in_doc {
            (self.clock_after(sequence).await?, None)
        } else {
            let (now, outside) = tokio::join!(self.clock_after(sequence), self.outside(run));
            (now?, Some(outside?))
        };
        self.round_trips(1);
        let now = read.written_at.map_or(now, |w| w.max(now));
        let live = read.doc.live.get(slot).map_err(|m| self.protocol(m))?;
        let state = if let Some(live) = live {
            let attempt = anarchon_core::Attempt::new(live.attempt)
                .ok_or_else(|| self.protocol("a live run has attempt 0"))?;
            match &live.failed {
                Some(failure) => RunState::RetryPending {
                    attempt,
                    retry_at: Timestamp::from_millis(failure.retry_at.at_or(now)),
                },
                None => RunState::Running {
                    attempt,
                    lease_until: Timestamp::from_millis(live.lease_until.at_or(now)),
                },
            }
        } else if let Some(ended) = read.doc.ended.get(&slot) {
            match ended.record_state().map_err(|m| self.protocol(m))? {
                RecordState::Finished(state) => RunState::Finished(state),
                RecordState::Missed => RunState::Missed,
                RecordState::Waiting => RunState::Waiting {
                    until: Timestamp::from_millis(ended.lease_until.map_or(now, |u| u.at_or(now))),
                },
                other => {
                    return Err(self.protocol(format!(
                        "an ended run in the document of {} has the state {}",
                        run.job,
                        other.as_str()
                    )));
                }
            }
        } else {
            match outside {
                Some(Outside::Missed) => RunState::Missed,
                Some(Outside::Ended(state)) => RunState::Finished(state),
                _ => RunState::Absent,
            }
        };
        Ok(RunView {
            store_now: Timestamp::from_millis(now),
            state,
        })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.change_live(run, token, |doc, slot| {
            if let Ok(Some(live)) = doc.live.get_mut(slot) {
                live.lease_until = Stamp::after_write(lease);
            }
        })
        .await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        let plan = match &outcome {
            RunOutcome::Failed { retry, .. } => *retry,
            RunOutcome::Succeeded => None,
        };
        // A retry is due after the failure on the server's clock; read
        // it only when one is asked for. The due time counts from this
        // read, which comes before the write that records the failure.
        let retry_at = match plan {
            Some(plan) => {
                let sequence = self.tick().await?;
                let now = self.clock_after(sequence).await?;
                self.round_trips(2);
                Some(plan.due(Timestamp::from_millis(now)))
            }
            None => None,
        };
        let (state, mut error) = outcome.into_record();
        if let (Some(None), Some(error)) = (retry_at, error.as_mut()) {
            error.push_str(anarchon_core::retry::NOT_RETRIED);
        }
        let changed = self
            .change_live(run, token, |doc, slot| match retry_at.flatten() {
                Some(due) => {
                    if let Ok(Some(live)) = doc.live.get_mut(slot) {
                        live.failed = Some(Failure {
                            finished: Stamp::NOW,
                            error: error.clone().unwrap_or_default(),
                            retry_at: Stamp::At(due.as_millis()),
                        });
                    }
                }
                None => {
                    if let Ok(Some(live)) = doc.live.remove(slot) {
                        doc.ended
                            .insert(slot, RunDoc::from_live(&live, state, error.clone()));
                    }
                }
            })
            .await?;
        if changed == Renewal::Renewed {
            return Ok(changed);
        }
        // The same finish sent again by the token that finished the run:
        // it was recorded (its answer was lost), and gets the same answer.
        let slot = run.slot.as_millis();
        let read = self.read_job(&run.job).await?;
        if let Some(live) = read.doc.live.get(slot).map_err(|m| self.protocol(m))? {
            let retrying = live.failed.is_some() && Token::parse(&live.token) == Some(token);
            return Ok(if retrying && state == FinalState::Failed {
                Renewal::Renewed
            } else {
                Renewal::Fenced
            });
        }
        let ended = match read.doc.ended.get(&slot) {
            Some(record) => Some(record.clone()),
            None => self.read_run(run).await?,
        };
        Ok(if ended.is_some_and(|r| r.finished_by(token, state)) {
            Renewal::Renewed
        } else {
            Renewal::Fenced
        })
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .change_live(run, token, |doc, slot| {
                if let Ok(Some(live)) = doc.live.get_mut(slot) {
                    // Alive means `lease end >= now`: 1 ms before the write's
                    // own timestamp has run out for every later reader.
                    live.lease_until = Stamp::Written { w: -1 };
                }
            })
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .change_live(run, token, |doc, slot| {
                if let Ok(Some(live)) = doc.live.get_mut(slot) {
                    live.lease_until = Stamp::Written { w: -1 };
                    live.token.clear();
                }
            })
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    fn hand_overs(&self) -> &anarchon_core::HandOvers {
        &self.hand_overs
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The document first, then the keys: a run that moves from one to
        // the other meanwhile is written to its key before it leaves the
        // document, so it is found in one of them.
        let read = self.read_job(job).await?;
        let keys = self.list(&format!("run.{job}.*")).await?;
        self.round_trips(2);
        enum Source<'a> {
            Live,
            Ended(&'a RunDoc),
            Key,
        }
        let key_prefix = format!("run.{job}.");
        // By instant ([`Slot`]'s order): a manual run's key is negative.
        let mut all: BTreeMap<Slot, Source<'_>> = BTreeMap::new();
        for key in &keys {
            match key
                .strip_prefix(&key_prefix)
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(slot) => {
                    all.insert(Slot::from_millis(slot), Source::Key);
                }
                None => {
                    tracing::debug!(bucket = %self.bucket, %key, "not a run key; ignored");
                }
            }
        }
        for (slot, record) in &read.doc.ended {
            all.insert(Slot::from_millis(*slot), Source::Ended(record));
        }
        for slot in read.doc.live.slots() {
            all.insert(Slot::from_millis(slot), Source::Live);
        }
        let newest: Vec<(Slot, Source<'_>)> = all.into_iter().rev().take(limit).collect();
        let to_fetch: Vec<RunKey> = newest
            .iter()
            .filter(|(_, source)| matches!(source, Source::Key))
            .map(|(slot, _)| RunKey::new(job.clone(), *slot))
            .collect();
        let fetching = !to_fetch.is_empty();
        let fetched: Vec<(RunKey, Result<Option<RunDoc>, StoreError>)> =
            futures::stream::iter(to_fetch.into_iter().map(|run| async move {
                let record = self.read_run(&run).await;
                (run, record)
            }))
            .buffered(PARALLEL)
            .collect()
            .await;
        if fetching {
            self.round_trips(1);
        }
        let mut fetched: HashMap<Slot, Result<Option<RunDoc>, StoreError>> = fetched
            .into_iter()
            .map(|(run, record)| (run.slot, record))
            .collect();
        let mut out = Vec::with_capacity(newest.len());
        for (slot, source) in &newest {
            let run = RunKey::new(job.clone(), *slot);
            let record = match source {
                Source::Live => match read.doc.live.get(slot.as_millis()) {
                    Ok(Some(live)) => live.to_record(run),
                    Ok(None) => continue,
                    Err(m) => Err(m),
                },
                Source::Ended(record) => record.to_record(run),
                Source::Key => match fetched.remove(slot).transpose()?.flatten() {
                    Some(record) => record.to_record(run),
                    // Collected meanwhile.
                    None => continue,
                },
            };
            out.push(record.map_err(|m| self.protocol(m))?);
        }
        Ok(out)
    }
    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.collect_garbage_now(keep).await
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        self.pause_now(scope, req).await
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        self.resume_now(scope).await
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        self.indexed_jobs().await
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.pauses_now().await
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.write_request(req).await
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.read_requests().await
    }
}
