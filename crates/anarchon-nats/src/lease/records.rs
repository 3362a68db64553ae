//! What the lease store keeps in its bucket, and the lease flowchart on it.
//!
//! Nothing here talks to the server: [`decide()`] applies the core's lease
//! decision ([`anarchon_core::decide::claim`]) to a job's document at a
//! server time, with the pauses that hold the job. The store reads, calls
//! it, and writes the result back with one compare-and-swap.
//!
//! # Times
//!
//! Every time in a record is a time on the NATS server's clock. A writer
//! cannot know the server's time at the moment its write is stored, so a
//! time it sets "now" is written as [`Stamp::Written`]: "the timestamp the
//! server gives the revision that holds this value, plus `w` ms". Whoever
//! reads the revision turns it into [`Stamp::At`] with the revision's
//! server timestamp (the KV entry's `created`), and writes it back resolved.
//! So a heartbeat sets the lease end to exactly *server time of the write +
//! lease*, without knowing that time.

use std::collections::BTreeMap;
use std::time::Duration;

use anarchon_core::decide::{self, ClaimDecision, Facts, LeaseRecord};
use anarchon_core::time::millis;
use anarchon_core::{
    Attempt, ClaimOutcome, Fence, FinalState, InstanceId, LeaseClaim, PastAttempts, Paused,
    RecordState, RunKey, RunRecord, Timestamp, Token,
};
use serde::{Deserialize, Serialize};

use super::attempts::{self, Failure};
use super::live::LiveRuns;

/// A time on the server's clock, or one relative to the revision that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stamp {
    /// UTC milliseconds on the server's clock.
    At(i64),
    /// The server timestamp of the revision holding this value, plus `w` ms.
    Written {
        /// The offset in ms (negative for "just before").
        w: i64,
    },
}

impl Stamp {
    /// The time the holding revision is written.
    pub(crate) const NOW: Stamp = Stamp::Written { w: 0 };

    /// `d` after the holding revision is written.
    pub(crate) fn after_write(d: Duration) -> Stamp {
        Stamp::Written { w: millis(d) }
    }

    /// This stamp in a revision written at `written_at`.
    pub(crate) fn resolve(self, written_at: i64) -> i64 {
        match self {
            Stamp::At(at) => at,
            Stamp::Written { w } => written_at.saturating_add(w),
        }
    }

    pub(crate) fn fix(&mut self, written_at: i64) {
        *self = Stamp::At(self.resolve(written_at));
    }

    /// The time, once resolved. An unresolved stamp reads as "now" (it can
    /// only be one this process is about to write).
    pub(crate) fn at_or(self, now: i64) -> i64 {
        self.resolve(now)
    }
}

/// The document under `job.<job>`: the job's fence counter and its live
/// runs, plus ended runs not yet moved to their own keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JobDoc {
    /// The last fence handed out for the job. Only grows.
    #[serde(default)]
    pub(crate) fence: u64,
    /// The longest `max_late` (ms) of the job's claims that wrote this
    /// document: garbage collection keeps the job's runs at least that long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) window: Option<i64>,
    /// The highest slot that was ever live or ended here. A slot above it
    /// has no record but possibly a `missed` one, so a claim need not read
    /// its run key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) high: Option<i64>,
    /// Running runs by slot, each parsed only when asked for.
    #[serde(default, skip_serializing_if = "LiveRuns::is_empty")]
    pub(crate) live: LiveRuns,
    /// Runs that ended (succeeded, failed, interrupted, skipped, paused)
    /// and whose record is not yet under its own run key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) ended: BTreeMap<i64, RunDoc>,
}

/// A running run in its job's document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LiveRun {
    /// The holder's token; empty once the run was given back before its
    /// handler started (the attempt was not used).
    pub(crate) token: String,
    /// The attempt, from 1.
    pub(crate) attempt: u32,
    /// The fence of this attempt.
    pub(crate) fence: u64,
    /// The holder's instance id.
    pub(crate) instance: String,
    /// When attempt 1 was claimed.
    pub(crate) started: Stamp,
    /// When the lease ends.
    pub(crate) lease_until: Stamp,
    /// Set when the attempt failed and its retry is pending: the run is
    /// `failed` until the retry starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failed: Option<Failure>,
    /// The run's earlier attempts, as `PastAttempts` writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) earlier: Option<String>,
}

/// A run's record once it is no longer running: under `run.<job>.<slot>`,
/// or in its job's `ended` until it is moved there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunDoc {
    /// `missed`, `succeeded`, `failed`, `interrupted`, `skipped` or
    /// `paused`.
    pub(crate) state: String,
    /// The last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<u32>,
    /// Its fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fence: Option<u64>,
    /// Who ran it last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instance: Option<String>,
    /// When attempt 1 was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) started: Option<Stamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished: Option<Stamp>,
    /// The last lease end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_until: Option<Stamp>,
    /// A failed run's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The token of the last attempt, so that a finish it sends again
    /// gets the same answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// The run's earlier attempts, as `PastAttempts` writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) earlier: Option<String>,
}

impl RunDoc {
    /// A run that ended without running (missed, skipped, paused), now.
    pub(crate) fn nobody(state: RecordState) -> Self {
        Self {
            state: state.as_str().to_owned(),
            attempt: None,
            fence: None,
            instance: None,
            started: None,
            finished: Some(Stamp::NOW),
            lease_until: None,
            error: None,
            token: None,
            earlier: None,
        }
    }

    /// A live run that ends now in `state`.
    pub(crate) fn from_live(live: &LiveRun, state: FinalState, error: Option<String>) -> Self {
        Self {
            state: state.as_str().to_owned(),
            attempt: Some(live.attempt),
            fence: Some(live.fence),
            instance: Some(live.instance.clone()),
            started: Some(live.started),
            finished: Some(Stamp::NOW),
            lease_until: Some(live.lease_until),
            error,
            token: Some(live.token.clone()),
            earlier: live.earlier.clone(),
        }
    }

    /// Whether this is a buffered slot waiting in its job's document (it
    /// stays there, never moved to its run key, until it starts or ends).
    pub(crate) fn is_waiting(&self) -> bool {
        self.state == RecordState::Waiting.as_str()
    }

    /// Whether `token` ended the run in `state`: a finish it sends again
    /// was already recorded.
    pub(crate) fn finished_by(&self, token: Token, state: FinalState) -> bool {
        self.state == state.as_str() && self.token.as_deref().and_then(Token::parse) == Some(token)
    }

    /// The record's state; `Running` is never stored in a `RunDoc`.
    pub(crate) fn record_state(&self) -> Result<RecordState, String> {
        match RecordState::parse(&self.state) {
            Some(RecordState::Running) | None => Err(format!(
                "a run record has the state {:?}, which is not one of missed, waiting, succeeded, failed, interrupted, skipped, paused, replaced",
                self.state
            )),
            Some(state) => Ok(state),
        }
    }

    fn fix(&mut self, written_at: i64) {
        for stamp in [&mut self.started, &mut self.finished, &mut self.lease_until]
            .into_iter()
            .flatten()
        {
            stamp.fix(written_at);
        }
    }

    /// Decodes a run key's value written at `written_at`.
    pub(crate) fn decode(bytes: &[u8], written_at: i64) -> Result<Self, String> {
        let mut doc: RunDoc = serde_json::from_slice(bytes)
            .map_err(|e| format!("a run record is not valid JSON: {e}"))?;
        doc.record_state()?;
        doc.fix(written_at);
        Ok(doc)
    }

    /// The record as the history reports it.
    pub(crate) fn to_record(&self, run: RunKey) -> Result<RunRecord, String> {
        let at = |s: Option<Stamp>| s.map(|s| Timestamp::from_millis(s.at_or(0)));
        Ok(RunRecord {
            run,
            state: self.record_state()?,
            attempt: self.attempt.map(attempt).transpose()?,
            fence: self.fence.map(Fence::new),
            instance: self.instance.as_deref().map(instance).transpose()?,
            started_at: at(self.started),
            finished_at: at(self.finished),
            lease_until: at(self.lease_until),
            error: self.error.clone(),
            retry_at: None,
            earlier: attempts::past(self.earlier.as_deref())?,
        })
    }
}

impl LiveRun {
    /// The record as the history reports it.
    pub(crate) fn to_record(&self, run: RunKey) -> Result<RunRecord, String> {
        let at = |s: Stamp| Timestamp::from_millis(s.at_or(0));
        Ok(RunRecord {
            run,
            state: match self.failed {
                Some(_) => RecordState::Finished(FinalState::Failed),
                None => RecordState::Running,
            },
            attempt: Some(attempt(self.attempt)?),
            fence: Some(Fence::new(self.fence)),
            instance: Some(instance(&self.instance)?),
            started_at: Some(at(self.started)),
            finished_at: self.failed.as_ref().map(|f| at(f.finished)),
            lease_until: Some(at(self.lease_until)),
            error: self.failed.as_ref().map(|f| f.error.clone()),
            retry_at: self.failed.as_ref().map(|f| at(f.retry_at)),
            earlier: attempts::past(self.earlier.as_deref())?,
        })
    }

    /// Whether `token` holds this run: it won it, and the run is running
    /// (not failed, waiting for its retry).
    pub(crate) fn held_by(&self, token: Token) -> bool {
        self.failed.is_none() && Token::parse(&self.token) == Some(token)
    }
}

fn attempt(n: u32) -> Result<Attempt, String> {
    Attempt::new(n).ok_or_else(|| "a run record has attempt 0".to_owned())
}

fn instance(id: &str) -> Result<InstanceId, String> {
    InstanceId::new(id).map_err(|e| format!("a run record has an invalid instance id: {e}"))
}

impl JobDoc {
    /// Decodes a job key's value written at `written_at`, resolving every
    /// stamp with it.
    pub(crate) fn decode(bytes: &[u8], written_at: i64) -> Result<Self, String> {
        let mut doc: JobDoc = serde_json::from_slice(bytes)
            .map_err(|e| format!("a job document is not valid JSON: {e}"))?;
        doc.live.resolve(written_at)?;
        for ended in doc.ended.values_mut() {
            ended.record_state()?;
            ended.fix(written_at);
        }
        Ok(doc)
    }

    /// The document as JSON.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Serialising plain maps, strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn raise_high(&mut self, slot: i64) {
        self.high = Some(self.high.map_or(slot, |h| h.max(slot)));
    }

    /// The job's next fence; an error when the counter is at its maximum
    /// (only a hand-written document can put it there): handing the same
    /// fence to two winners would defeat fencing.
    fn next_fence(&mut self) -> Result<u64, String> {
        self.fence = self.fence.checked_add(1).ok_or_else(|| {
            format!(
                "the job's fence counter is at its maximum ({}): the document was written by hand; \
                 no fence can be handed out",
                self.fence
            )
        })?;
        Ok(self.fence)
    }

    /// Whether a slot of the job other than `slot` waits at `now`: recorded
    /// `waiting`, its wait (kept as its lease end) not over.
    fn another_is_waiting(&self, slot: i64, now: i64) -> bool {
        self.ended.iter().any(|(s, r)| {
            *s != slot && r.is_waiting() && r.lease_until.is_some_and(|u| u.at_or(now) >= now)
        })
    }

    /// The ended runs that move to their run keys: all but waiting slots.
    pub(crate) fn movable(&self) -> impl Iterator<Item = (i64, &RunDoc)> {
        self.ended
            .iter()
            .filter(|(_, r)| !r.is_waiting())
            .map(|(s, r)| (*s, r))
    }

    /// Whether a claim of `slot` may start a run and so swap the document:
    /// the slot is neither live here nor ended here (a waiting slot may
    /// start). A claim of a live slot writes only when it takes a lapsed
    /// lease over, and one of an ended slot never does.
    pub(crate) fn may_start(&self, slot: i64) -> bool {
        !self.live.contains(slot) && self.ended.get(&slot).is_none_or(RunDoc::is_waiting)
    }

    /// Whether a run of the job other than `slot` is live at `now`: holds
    /// a live lease, or failed with its retry not due yet.
    /// Every other live run is parsed to tell.
    fn another_run_is_live(&self, slot: i64, now: i64) -> Result<bool, String> {
        for entry in self.live.iter() {
            let (s, live) = entry?;
            if s != slot && live.live_until(now) >= now {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// What the run key of a slot that is not in its job's document says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outside {
    /// Not read: the slot is above the document's `high`, so it has no
    /// record or only a `missed` one.
    NoneOrMissed,
    /// No record.
    Absent,
    /// A `missed` record.
    Missed,
    /// The run ended.
    Ended(FinalState),
}

/// What a claim makes the store write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Nothing.
    None,
    /// The job document changed: compare-and-swap it.
    Job,
    /// Create the slot's run key as `missed`, if it has none.
    CreateMissed,
}

/// Whether a claim's answer depends on the server's time, judging by the
/// document as read. When no claim of a batch does, the store answers
/// without asking the server for its time.
pub(crate) fn needs_time(doc: &JobDoc, outside: Option<Outside>, req: &LeaseClaim) -> bool {
    let slot = req.run().slot.as_millis();
    let outside = outside.unwrap_or(Outside::NoneOrMissed);
    doc.lease_record(slot, outside, None).is_ok_and(|record| {
        decide::claim(record.as_ref(), Facts::NONE, req) == Err(decide::Needs::Now)
    })
}

impl JobDoc {
    /// The record of `slot` as the core's decisions read it, from the
    /// document or, for a slot not in it, from what its run key says. A
    /// lease end still relative to a write this process is making resolves
    /// against `now`, and is unknown without it (the decision asks for the
    /// time before it reads a lease end).
    fn lease_record(
        &self,
        slot: i64,
        outside: Outside,
        now: Option<i64>,
    ) -> Result<Option<LeaseRecord>, String> {
        if let Some(ended) = self.ended.get(&slot) {
            let state = ended.record_state()?;
            return Ok(Some(LeaseRecord {
                state,
                attempt: ended.attempt.map(attempt).transpose()?,
                holder: ended.token.as_deref().and_then(Token::parse),
                fence: ended.fence.map(Fence::new),
                // A waiting slot's lease end is the end of its wait.
                lease_until: ended
                    .lease_until
                    .filter(|_| ended.is_waiting())
                    .map(|u| Timestamp::from_millis(u.at_or(now.unwrap_or_default()))),
                retry_at: None,
            }));
        }
        if let Some(live) = self.live.get(slot)? {
            let holder = if live.token.is_empty() {
                None
            } else {
                Some(Token::parse(&live.token).ok_or_else(|| {
                    format!(
                        "a live run has the token {:?}, which is not a token",
                        live.token
                    )
                })?)
            };
            let resolved = |stamp: Stamp| match stamp {
                Stamp::At(at) => Some(Timestamp::from_millis(at)),
                Stamp::Written { w } => {
                    now.map(|now| Timestamp::from_millis(now.saturating_add(w)))
                }
            };
            return Ok(Some(LeaseRecord {
                state: match live.failed {
                    Some(_) => RecordState::Finished(FinalState::Failed),
                    None => RecordState::Running,
                },
                attempt: Some(attempt(live.attempt)?),
                holder,
                fence: Some(Fence::new(live.fence)),
                lease_until: resolved(live.lease_until),
                retry_at: live.failed.as_ref().and_then(|f| resolved(f.retry_at)),
            }));
        }
        let ended = |state| LeaseRecord {
            state,
            attempt: None,
            holder: None,
            fence: None,
            lease_until: None,
            retry_at: None,
        };
        Ok(match outside {
            Outside::NoneOrMissed | Outside::Absent => None,
            Outside::Missed => Some(ended(RecordState::Missed)),
            Outside::Ended(state) => Some(ended(RecordState::Finished(state))),
        })
    }
}

/// What a claim still lacks before [`decide()`] can settle it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// The server's time.
    Time,
    /// The pauses of the job and of every job.
    Pauses,
    /// What the slot's run key says: a pause holds, and the slot is not in
    /// the document, so it may have no record (recorded `paused`) or a
    /// `missed` one (which stays so).
    RunKey,
}

/// What [`decide()`] made of one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decided {
    /// The answer, and what to write (the document is changed already).
    Answer(ClaimOutcome, Effect),
    /// A fact to read before deciding again; nothing was changed.
    Needs(Missing),
}

/// One claim on the job's document as read, at the server time `now`, with
/// the pauses that hold the job: the core's decision ([`decide::claim`])
/// applied to the document. Changes `doc` as the answer requires and says
/// what else to write, or says which fact it lacks.
///
/// `outside` is what the run key says when the slot is not in `doc`.
pub(crate) fn decide(
    doc: &mut JobDoc,
    outside: Outside,
    now: Option<i64>,
    paused: Option<Paused>,
    req: &LeaseClaim,
) -> Result<Decided, String> {
    let slot = req.run().slot.as_millis();
    let record = doc.lease_record(slot, outside, now)?;
    let facts = Facts {
        now: now.map(Timestamp::from_millis),
        paused,
        ..Facts::NONE
    };
    let decision = match decide::claim(record.as_ref(), facts, req) {
        Ok(decision) => decision,
        Err(decide::Needs::Now) => return Ok(Decided::Needs(Missing::Time)),
        Err(decide::Needs::Pauses) => return Ok(Decided::Needs(Missing::Pauses)),
        Err(decide::Needs::OverlapCheck | decide::Needs::WaitingCheck) => {
            let Some(now) = now else {
                return Ok(Decided::Needs(Missing::Time));
            };
            // Both overlap facts are in the document.
            let facts = Facts {
                another_run_live: Some(doc.another_run_is_live(slot, now)?),
                another_waiting: Some(doc.another_is_waiting(slot, now)),
                ..facts
            };
            decide::claim(record.as_ref(), facts, req).map_err(|needs| {
                format!("the decision still needs {needs:?} with every fact given")
            })?
        }
    };
    // A slot the document never held may have a `missed` record, which a
    // pause leaves alone: only its run key tells.
    if decision == ClaimDecision::RecordPaused && outside == Outside::NoneOrMissed {
        return Ok(Decided::Needs(Missing::RunKey));
    }
    let fence = if decision.needs_fence() {
        Some(doc.next_fence()?)
    } else {
        None
    };
    let past_now = now.unwrap_or_default();
    let mut past = match doc.live.get(slot)? {
        Some(live) => attempts::past(live.earlier.as_deref())?,
        None => PastAttempts::NONE,
    };
    let was_waiting = doc.ended.get(&slot).is_some_and(RunDoc::is_waiting);
    if decision == ClaimDecision::StartReplacing {
        let now_or_zero = now.unwrap_or_default();
        let others: Vec<i64> = doc.live.slots().filter(|s| *s != slot).collect();
        for other in others {
            if let Some(live) = doc.live.remove(other)? {
                let error = live.failed.as_ref().map(|f| f.error.clone());
                let mut replaced = RunDoc::from_live(&live, FinalState::Replaced, error);
                replaced.lease_until = Some(Stamp::At(live.lease_until.at_or(now_or_zero)));
                doc.ended.insert(other, replaced);
            }
        }
    }
    let effect = match &decision {
        ClaimDecision::Answer(_) | ClaimDecision::Resent { .. } => Effect::None,
        // A waiting slot is in the document: it ends missed there, and
        // moves to its run key like any ended run.
        ClaimDecision::RecordMissed if was_waiting => {
            doc.ended.insert(slot, RunDoc::nobody(RecordState::Missed));
            Effect::Job
        }
        ClaimDecision::RecordMissed => Effect::CreateMissed,
        ClaimDecision::RecordWaiting { until, .. } => {
            let mut waiting = RunDoc::nobody(RecordState::Waiting);
            waiting.finished = None;
            waiting.lease_until = Some(Stamp::At(until.as_millis()));
            doc.ended.insert(slot, waiting);
            doc.raise_high(slot);
            Effect::Job
        }
        ClaimDecision::RecordSkipped => {
            let skipped = RunDoc::nobody(RecordState::Finished(FinalState::Skipped));
            doc.ended.insert(slot, skipped);
            doc.raise_high(slot);
            Effect::Job
        }
        ClaimDecision::RecordPaused => {
            // In the document, like a skipped slot: the swap that records
            // it is the one outcome of the slot.
            let paused = RunDoc::nobody(RecordState::Finished(FinalState::Paused));
            doc.ended.insert(slot, paused);
            doc.raise_high(slot);
            Effect::Job
        }
        ClaimDecision::Start | ClaimDecision::StartReplacing => {
            // A backfill may start a slot recorded `paused` in the
            // document, and a waiting slot starts where it waited: the
            // live run replaces that record.
            doc.ended.remove(&slot);
            doc.live.insert(
                slot,
                LiveRun {
                    token: req.claim.token.to_string(),
                    attempt: Attempt::FIRST.get(),
                    fence: fence.unwrap_or_default(),
                    instance: req.claim.instance.as_str().to_owned(),
                    started: Stamp::NOW,
                    lease_until: Stamp::after_write(req.lease),
                    failed: None,
                    earlier: None,
                },
            );
            doc.raise_high(slot);
            Effect::Job
        }
        ClaimDecision::TakeOver { attempt } | ClaimDecision::Retry { attempt } => {
            let Some(live) = doc.live.get_mut(slot)? else {
                return Err("the live run vanished from the document".into());
            };
            if let Some(ended) = decision.ends_attempt(record.as_ref()) {
                past = live.past_with(ended, past_now)?;
                live.earlier = attempts::stored(&past);
            }
            live.failed = None;
            live.attempt = attempt.get();
            live.token = req.claim.token.to_string();
            live.fence = fence.unwrap_or_default();
            live.instance = req.claim.instance.as_str().to_owned();
            live.lease_until = Stamp::after_write(req.lease);
            Effect::Job
        }
        ClaimDecision::Interrupt => {
            let Some(live) = doc.live.remove(slot)? else {
                return Err("the live run vanished from the document".into());
            };
            let mut ended = RunDoc::from_live(&live, FinalState::Interrupted, None);
            ended.lease_until = record
                .and_then(|r| r.lease_until)
                .map(|until| Stamp::At(until.as_millis()));
            doc.ended.insert(slot, ended);
            Effect::Job
        }
    };
    Ok(Decided::Answer(
        decision.outcome(fence.map(Fence::new), &past),
        effect,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::{ClaimRequest, JobName, MaxAttempts, Overlap, PauseEnd, Slot, Win};

    const LEASE: Duration = Duration::from_millis(300);

    fn claim(slot: i64, token: Token) -> LeaseClaim {
        LeaseClaim {
            claim: ClaimRequest {
                run: RunKey::new(JobName::new("j").expect("name"), Slot::from_millis(slot)),
                token,
                instance: InstanceId::new("i").expect("id"),
                max_late: Duration::from_secs(60),
            },
            lease: LEASE,
            overlap: Overlap::Allow,
            max_attempts: MaxAttempts::new(2).expect("2"),
            rerun_paused: false,
        }
    }

    /// Encodes as a writer does and decodes as the next reader, whose
    /// revision the server stamped at `written_at`.
    fn store(doc: &JobDoc, written_at: i64) -> JobDoc {
        JobDoc::decode(&doc.encode(), written_at).expect("decodes")
    }

    fn run(doc: &mut JobDoc, now: i64, req: &LeaseClaim) -> (ClaimOutcome, Effect) {
        match decide(
            doc,
            Outside::NoneOrMissed,
            Some(now),
            Some(Paused::NONE),
            req,
        ) {
            Ok(Decided::Answer(outcome, effect)) => (outcome, effect),
            other => panic!("every fact given, yet {other:?}"),
        }
    }

    #[test]
    fn a_lease_ends_at_the_server_time_of_its_write_plus_the_lease() {
        let (a, b) = (Token::generate(), Token::generate());
        let mut doc = JobDoc::default();
        let slot = 1_000_000;
        let (won, effect) = run(&mut doc, slot, &claim(slot, a));
        assert!(matches!(won, ClaimOutcome::Won(_)));
        assert_eq!(effect, Effect::Job);
        // The write is stored 40 ms after the decision's time.
        let mut doc = store(&doc, slot + 40);
        let live = doc
            .live
            .get(slot)
            .expect("valid")
            .expect("live")
            .into_owned();
        assert_eq!(live.lease_until, Stamp::At(slot + 40 + 300));
        assert_eq!(live.started, Stamp::At(slot + 40));
        // Alive up to and including its end, on the server's clock.
        match run(&mut doc, slot + 340, &claim(slot, b)).0 {
            ClaimOutcome::Running {
                lease_until,
                store_now,
            } => {
                assert_eq!(lease_until.as_millis(), slot + 340);
                assert_eq!(store_now.as_millis(), slot + 340);
            }
            other => panic!("{other:?}"),
        }
        let (taken, effect) = run(&mut doc, slot + 341, &claim(slot, b));
        assert_eq!(effect, Effect::Job);
        assert_eq!(
            taken,
            ClaimOutcome::Won(Win {
                attempt: Attempt::FIRST.next(),
                fence: Some(Fence::new(2)),
                cause: anarchon_core::AttemptCause::Takeover,
                retries: 0,
            })
        );
        // No attempts left after the second: the next expiry interrupts.
        let mut doc = store(&doc, slot + 400);
        let (done, _) = run(&mut doc, slot + 701, &claim(slot, Token::generate()));
        assert_eq!(done, ClaimOutcome::Interrupted);
        let doc = store(&doc, slot + 710);
        assert!(doc.live.is_empty());
        assert_eq!(doc.ended[&slot].finished, Some(Stamp::At(slot + 710)));
        assert_eq!(doc.ended[&slot].lease_until, Some(Stamp::At(slot + 700)));
        assert_eq!(doc.fence, 2, "fences never go back");
    }

    #[test]
    fn answers_that_do_not_need_the_time_come_without_it() {
        let a = Token::generate();
        let mut doc = JobDoc::default();
        let slot = 5_000;
        run(&mut doc, slot, &claim(slot, a));
        let mut doc = store(&doc, slot);
        assert!(!needs_time(&doc, None, &claim(slot, a)));
        assert!(needs_time(&doc, None, &claim(slot, Token::generate())));
        assert!(needs_time(&doc, Some(Outside::Absent), &claim(slot + 1, a)));
        assert!(!needs_time(
            &doc,
            Some(Outside::Ended(FinalState::Failed)),
            &claim(slot + 1, a)
        ));
        let own = decide(&mut doc, Outside::NoneOrMissed, None, None, &claim(slot, a));
        assert!(matches!(
            own,
            Ok(Decided::Answer(ClaimOutcome::Won(_), Effect::None))
        ));
        let other = decide(
            &mut doc,
            Outside::NoneOrMissed,
            None,
            None,
            &claim(slot, Token::generate()),
        );
        assert_eq!(
            other,
            Ok(Decided::Needs(Missing::Time)),
            "a foreign lease needs the time"
        );
    }

    #[test]
    fn late_claims_create_missed_once_and_skips_are_recorded() {
        let mut doc = JobDoc::default();
        let slot = 0;
        let late_now = 61_001;
        let (late, effect) = run(&mut doc, late_now, &claim(slot, Token::generate()));
        assert_eq!((late, effect), (ClaimOutcome::Missed, Effect::CreateMissed));
        let again = decide(
            &mut doc,
            Outside::Missed,
            Some(late_now),
            Some(Paused::NONE),
            &claim(slot, Token::generate()),
        );
        assert_eq!(again, Ok(Decided::Answer(ClaimOutcome::Late, Effect::None)));
        // Overlap skip while another run is live.
        let mut skip = claim(100_000, Token::generate());
        run(&mut doc, 100_000, &skip);
        skip.claim.run.slot = Slot::from_millis(100_001);
        skip.claim.token = Token::generate();
        skip.overlap = Overlap::Skip;
        let mut doc = store(&doc, 100_000);
        let (outcome, effect) = run(&mut doc, 100_010, &skip);
        assert_eq!((outcome, effect), (ClaimOutcome::Overlap, Effect::Job));
        let doc = store(&doc, 100_020);
        assert_eq!(doc.ended[&100_001].state, "skipped");
        assert_eq!(doc.high, Some(100_001));
        assert_eq!(doc.fence, 1, "a skip takes no fence");
    }

    #[test]
    fn releases_end_the_lease_just_before_their_write() {
        let mut doc = JobDoc::default();
        let a = Token::generate();
        run(&mut doc, 10, &claim(10, a));
        let mut doc = store(&doc, 10);
        if let Some(live) = doc.live.get_mut(10).expect("valid") {
            live.lease_until = Stamp::Written { w: -1 };
        }
        let mut doc = store(&doc, 50);
        let live = doc.live.get(10).expect("valid").expect("live");
        assert_eq!(live.lease_until, Stamp::At(49));
        let (taken, _) = run(&mut doc, 50, &claim(10, Token::generate()));
        assert!(matches!(taken, ClaimOutcome::Won(w) if w.attempt.get() == 2));
    }

    #[test]
    fn a_paused_job_records_fresh_slots_in_its_document_and_leaves_missed_ones() {
        let mut doc = JobDoc::default();
        let now = 500_000;
        let paused = Paused {
            job: None,
            all: Some(PauseEnd::At(Timestamp::from_millis(now + 1))),
        };
        let fresh = claim(now, Token::generate());
        // The pauses are asked for only once the time is known.
        assert_eq!(
            decide(&mut doc, Outside::Absent, None, None, &fresh),
            Ok(Decided::Needs(Missing::Time))
        );
        assert_eq!(
            decide(&mut doc, Outside::Absent, Some(now), None, &fresh),
            Ok(Decided::Needs(Missing::Pauses))
        );
        // A slot the document never held may be `missed`: read its key.
        assert_eq!(
            decide(
                &mut doc,
                Outside::NoneOrMissed,
                Some(now),
                Some(paused),
                &fresh
            ),
            Ok(Decided::Needs(Missing::RunKey))
        );
        assert_eq!(doc, JobDoc::default(), "nothing changed yet");
        assert_eq!(
            decide(&mut doc, Outside::Missed, Some(now), Some(paused), &fresh),
            Ok(Decided::Answer(ClaimOutcome::Late, Effect::None))
        );
        assert_eq!(
            decide(&mut doc, Outside::Absent, Some(now), Some(paused), &fresh),
            Ok(Decided::Answer(
                ClaimOutcome::Done(FinalState::Paused),
                Effect::Job
            ))
        );
        let doc = store(&doc, now + 10);
        assert_eq!(doc.ended[&now].state, "paused");
        assert_eq!(doc.ended[&now].finished, Some(Stamp::At(now + 10)));
        assert_eq!(doc.fence, 0, "a paused slot takes no fence");
        assert_eq!(doc.high, Some(now));
        // Once recorded, the slot answers from the document, paused or not.
        let mut doc = doc;
        let again = claim(now, Token::generate());
        assert!(!needs_time(&doc, None, &again));
        assert_eq!(
            decide(&mut doc, Outside::NoneOrMissed, None, None, &again),
            Ok(Decided::Answer(
                ClaimOutcome::Done(FinalState::Paused),
                Effect::None
            ))
        );
        // At its end the pause no longer holds.
        let next = claim(now + 1, Token::generate());
        assert!(matches!(
            decide(
                &mut doc,
                Outside::Absent,
                Some(now + 1),
                Some(paused),
                &next
            ),
            Ok(Decided::Answer(ClaimOutcome::Won(_), Effect::Job))
        ));
    }

    #[test]
    fn a_claim_writes_the_other_live_runs_back_as_it_read_them() {
        let (a, b) = (Token::generate(), Token::generate());
        // Field order and spacing no printer of ours produces: a parse and
        // print would change them.
        let other = format!(
            r#"{{"lease_until":900000, "fence":1,"token":"{a}","attempt":1,"instance":"i","started":5}}"#
        );
        let read = format!(r#"{{"fence":1,"high":1000,"live":{{"1000":{other}}}}}"#);
        let mut doc = JobDoc::decode(read.as_bytes(), 10).expect("decodes");
        let (won, effect) = run(&mut doc, 2_000, &claim(2_000, b));
        assert!(matches!(won, ClaimOutcome::Won(w) if w.fence == Some(Fence::new(2))));
        assert_eq!(effect, Effect::Job);
        let written = String::from_utf8(doc.encode()).expect("UTF-8");
        assert!(written.contains(&format!(r#""1000":{other}"#)), "{written}");
        // And the next reader reads both runs.
        let next = store(&doc, 2_010);
        assert_eq!(next.live.slots().collect::<Vec<_>>(), [1_000, 2_000]);
        let theirs = next.live.get(1_000).expect("valid").expect("live");
        assert_eq!(theirs.lease_until, Stamp::At(900_000));
        assert!(theirs.held_by(a));
        let ours = next.live.get(2_000).expect("valid").expect("live");
        assert_eq!(ours.lease_until, Stamp::At(2_010 + 300));
    }

    #[test]
    fn broken_documents_are_refused() {
        for bad in [
            &b"not json"[..],
            br#"{"live":{"1":[]]}}"#,
            br#"{"ended":{"1":{"state":"running"}}}"#,
        ] {
            assert!(JobDoc::decode(bad, 0).is_err());
        }
        // A live run is checked when it is read: a claim of its slot fails,
        // and a claim of another slot goes on.
        let mut doc = JobDoc::decode(
            br#"{"fence":1,"high":1,"live":{"1":{"token":"x","attempt":1,"fence":1,"instance":"i","started":1,"lease_until":2}}}"#,
            0,
        )
        .expect("the document parses; its entries are read when asked for");
        let err = decide(
            &mut doc,
            Outside::NoneOrMissed,
            Some(1),
            Some(Paused::NONE),
            &claim(1, Token::generate()),
        )
        .expect_err("a broken live run");
        assert!(err.contains("not a UUID"), "{err}");
        assert!(matches!(
            run(&mut doc, 2, &claim(2, Token::generate())).0,
            ClaimOutcome::Won(_)
        ));
        assert!(RunDoc::decode(br#"{"state":"bogus"}"#, 0).is_err());
        let missed = RunDoc::decode(br#"{"state":"missed","finished":{"w":0}}"#, 77).expect("ok");
        assert_eq!(missed.finished, Some(Stamp::At(77)));
    }
}
