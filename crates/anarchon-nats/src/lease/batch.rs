//! Batching: the claims of a batch settled job by job, each job's claims
//! with one compare-and-swap of its document.

use std::collections::HashMap;

use anarchon_core::time::millis;
use anarchon_core::{
    ClaimOutcome, JobName, LeaseClaim, Paused, RunKey, StoreError, StoreErrorKind,
};
use futures::future::join_all;
use tokio::sync::OnceCell;

use super::clock::ServerClock;
use super::kv::JobRead;
use super::pauses::AllPause;
use super::records::{Decided, Effect, Missing, Outside, RunDoc, decide, needs_time};
use super::{Counters, LEASE_BACKEND, MAX_ROUNDS, NatsLeaseStore};

impl NatsLeaseStore {
    /// Claims a batch: one round trip to read every job's document (and
    /// write the clock), one to read the clock, the pauses and any run
    /// keys, one to write; more only for jobs whose write lost a race, and
    /// one for a paused job's slots the document never held.
    /// Settles a batch job by job. A job whose claims fail (its document
    /// unreadable, its swaps lost) answers each of its claims with that
    /// error; the other jobs' answers, wins included, stand.
    pub(super) async fn claim_batch(
        &self,
        reqs: &[LeaseClaim],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut groups: Vec<(&JobName, Vec<(usize, &LeaseClaim)>)> = Vec::new();
        let mut index: HashMap<&JobName, usize> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            let job = &req.run().job;
            let g = *index.entry(job).or_insert_with(|| {
                groups.push((job, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((i, req));
        }
        let (tick, reads) = tokio::join!(
            self.tick(),
            join_all(groups.iter().map(|(job, _)| self.read_job(job)))
        );
        let clock = ServerClock {
            store: self,
            tick: tick.map_err(|e| e.to_string()),
            now: OnceCell::new(),
        };
        let all_pause = AllPause::new();
        let settled =
            join_all(groups.iter().zip(reads).map(|((job, claims), read)| {
                self.claim_job(job, claims, read, &clock, &all_pause)
            }))
            .await;
        let mut out: Vec<Option<Result<ClaimOutcome, StoreError>>> =
            (0..reqs.len()).map(|_| None).collect();
        let mut depth = 0;
        for ((job, claims), result) in groups.iter().zip(settled) {
            match result {
                Ok((answers, d)) => {
                    depth = depth.max(d);
                    for (i, outcome) in answers {
                        out[i] = Some(Ok(outcome));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, job = %job, "the job's claims failed; the batch's other jobs go on");
                    for (i, _) in claims {
                        out[*i] = Some(Err(same_error(&e)));
                    }
                }
            }
        }
        self.round_trips(1 + depth);
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(self.protocol("a claim of the batch got no answer"))))
            .collect())
    }

    /// Settles the claims of one job, starting from `first`, the read of
    /// its document. Returns the answers and how many round trips it
    /// waited after that read.
    ///
    /// The pauses are read (at most once per call) in the round trip that
    /// reads the server's time, when a claim's slot is not in the document
    /// and so may start: before the swap, not in it (see the type's docs).
    async fn claim_job(
        &self,
        job: &JobName,
        claims: &[(usize, &LeaseClaim)],
        first: Result<JobRead, StoreError>,
        clock: &ServerClock<'_>,
        all_pause: &AllPause,
    ) -> Result<(Vec<(usize, ClaimOutcome)>, u64), StoreError> {
        let key = Self::job_key(job);
        let mut read = first?;
        let mut depth = 0;
        let mut paused: Option<Paused> = None;
        for round in 0..MAX_ROUNDS {
            if round > 0 {
                read = self.read_job(job).await?;
                depth += 1;
            }
            let doc = &read.doc;
            let in_doc = |slot: i64| doc.live.contains(slot) || doc.ended.contains_key(&slot);
            // Run keys matter only for slots the document once had.
            let mut to_read: Vec<&RunKey> = Vec::new();
            for (_, claim) in claims {
                let slot = claim.run().slot.as_millis();
                if !in_doc(slot)
                    && doc.high.is_some_and(|high| slot <= high)
                    && !to_read.contains(&claim.run())
                {
                    to_read.push(claim.run());
                }
            }
            let timed = claims.iter().any(|(_, c)| needs_time(doc, None, c));
            // Only a slot the document does not hold may start, and only a
            // claim that may start asks about pauses.
            let wants_pauses = paused.is_none()
                && timed
                && claims
                    .iter()
                    .any(|(_, c)| !in_doc(c.run().slot.as_millis()));
            // Ended runs move to their run keys before the swap that drops
            // them from the document, in the round trip that reads the
            // clock. Only a call that may start a run does it: in a fleet,
            // the instances that find their slot already claimed would
            // otherwise each write the same records again. A takeover that
            // swaps without moving them leaves them in the document (only
            // what was moved is dropped) for the next start to move.
            let moves = claims
                .iter()
                .any(|(_, c)| doc.may_start(c.run().slot.as_millis()));
            let flush: Vec<(i64, &RunDoc)> = if timed && moves {
                doc.movable().collect()
            } else {
                Vec::new()
            };
            let mut outside: HashMap<i64, Outside> = HashMap::new();
            let mut flushed = Vec::new();
            let mut now = None;
            // The clock is read once per call; a later round reuses it.
            let asks = (timed && clock.now.get().is_none()) || !flush.is_empty() || wants_pauses;
            if timed || !to_read.is_empty() {
                let time = async {
                    if timed {
                        clock.now().await.map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let pauses = async {
                    if wants_pauses {
                        self.paused(job, all_pause).await.map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let (runs, puts, time, pauses) = tokio::join!(
                    join_all(to_read.iter().map(|run| self.outside(run))),
                    join_all(
                        flush
                            .iter()
                            .map(|(slot, rec)| self.put_run(job, *slot, rec))
                    ),
                    time,
                    pauses,
                );
                if asks || !to_read.is_empty() {
                    depth += 1;
                }
                for (run, found) in to_read.iter().zip(runs) {
                    outside.insert(run.slot.as_millis(), found?);
                }
                for ((slot, rec), put) in flush.iter().zip(puts) {
                    match put {
                        Ok(()) => flushed.push((*slot, *rec)),
                        Err(error) => {
                            tracing::debug!(%error, job = %job, slot, "could not move an ended run to its key yet");
                        }
                    }
                }
                if let Some(found) = pauses? {
                    paused = Some(found);
                }
                // Both are server times from before this decision.
                now = time?.map(|t| read.written_at.map_or(t, |w| w.max(t)));
            }
            // Decide every claim on this revision. A fact the reads above
            // did not bring (the pauses, or the run key of a slot a pause
            // holds) is read, and the claims are decided again on the same
            // revision; each such fact is read once.
            let mut settled = None;
            for _ in 0..3 {
                let mut next = read.doc.clone();
                let mut answers = Vec::with_capacity(claims.len());
                let mut write_job = false;
                // Each with the index of its answer.
                let mut missed: Vec<(usize, &RunKey)> = Vec::new();
                let mut wants_pauses = false;
                let mut unread: Vec<&RunKey> = Vec::new();
                for (i, claim) in claims {
                    let slot = claim.run().slot.as_millis();
                    let found = outside.get(&slot).copied().unwrap_or(Outside::NoneOrMissed);
                    match decide(&mut next, found, now, paused, claim)
                        .map_err(|m| self.protocol(format!("{key}: {m}")))?
                    {
                        Decided::Answer(outcome, effect) => {
                            match effect {
                                Effect::Job => write_job = true,
                                Effect::CreateMissed => missed.push((answers.len(), claim.run())),
                                Effect::None => {}
                            }
                            answers.push((*i, outcome));
                        }
                        Decided::Needs(Missing::Time) => {
                            return Err(self
                                .protocol("a claim needed the server's time, which was not read"));
                        }
                        Decided::Needs(Missing::Pauses) => wants_pauses = true,
                        Decided::Needs(Missing::RunKey) => {
                            if !unread.contains(&claim.run()) {
                                unread.push(claim.run());
                            }
                        }
                    }
                }
                if !wants_pauses && unread.is_empty() {
                    settled = Some((next, answers, write_job, missed));
                    break;
                }
                let pauses = async {
                    if wants_pauses {
                        self.paused(job, all_pause).await.map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let (pauses, runs) =
                    tokio::join!(pauses, join_all(unread.iter().map(|run| self.outside(run))));
                depth += 1;
                if let Some(found) = pauses? {
                    paused = Some(found);
                }
                for (run, found) in unread.iter().zip(runs) {
                    outside.insert(run.slot.as_millis(), found?);
                }
            }
            let Some((mut next, mut answers, write_job, missed)) = settled else {
                return Err(self.protocol(format!(
                    "{key}: the claims still lacked a fact after reading the pauses and run keys"
                )));
            };
            // The job's window must cover every claim's `max_late`, also
            // that of a claim that changes nothing else (it found its slot
            // running or ended): otherwise another service's collection
            // with a shorter `keep` takes runs a catch-up claim asked about,
            // and the next catch-up runs them again. So a claim with a
            // longer window than the stored one writes the document, if
            // there is one: a job without a document has no run that
            // started or ended (a `missed` record, which it may have, is
            // no different from none to any claim).
            let longest = claims.iter().map(|(_, c)| millis(c.claim.max_late)).max();
            let widens = read.revision != 0 && longest > next.window;
            if write_job || widens {
                // Only what was moved: a record a claim of this round wrote
                // over it (a backfill's slot skipped, say) stays.
                for (slot, moved) in &flushed {
                    if next.ended.get(slot) == Some(*moved) {
                        next.ended.remove(slot);
                    }
                }
                next.window = next.window.max(longest);
                let written = self.write(&key, next.encode(), Some(read.revision)).await?;
                depth += 1;
                if written.is_none() {
                    Counters::add(&self.counters.conflicts, 1);
                    continue;
                }
            }
            if !missed.is_empty() {
                let created = join_all(missed.iter().map(|(_, run)| self.create_missed(run))).await;
                depth += 1;
                for ((answer, _), result) in missed.iter().zip(created) {
                    // Another claim recorded it first: this one is only late.
                    if !result? {
                        answers[*answer].1 = ClaimOutcome::Late;
                    }
                }
            }
            return Ok((answers, depth));
        }
        Err(self.unavailable(format!(
            "the claims of job {job} lost {MAX_ROUNDS} compare-and-swap races in a row; try again"
        )))
    }
}

/// The same error again, for each claim of a job that failed as a whole
/// (a `StoreError` is not `Clone`: it may hold a source).
fn same_error(error: &StoreError) -> StoreError {
    let message = error.message().to_owned();
    match error.kind() {
        StoreErrorKind::Unavailable => StoreError::unavailable(LEASE_BACKEND, message),
        StoreErrorKind::Invalid => StoreError::invalid(LEASE_BACKEND, message),
        _ => StoreError::protocol(LEASE_BACKEND, message),
    }
}
