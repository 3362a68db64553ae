//! The rows the store's statements read, and how their columns become the
//! core's types.

use anarchon_core::decide::LeaseRecord;
use anarchon_core::{
    Attempt, Fence, InstanceId, JobName, Pause, PauseEnd, PauseScope, Paused, RecordState, RunKey,
    RunRecord, Slot, StoreError, Timestamp, Token,
};
use sqlx::FromRow;

use crate::error::bad_value;

/// The clock and the run, read at the start of a claim.
#[derive(FromRow)]
pub(crate) struct ClaimRow {
    pub(crate) now: i64,
    pub(crate) state: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) token: Option<String>,
    pub(crate) fence: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) job_paused: Option<i64>,
    pub(crate) job_until: Option<i64>,
    pub(crate) all_paused: Option<i64>,
    pub(crate) all_until: Option<i64>,
}

impl ClaimRow {
    /// The pauses of the run's job and of every job.
    pub(crate) fn paused(&self) -> Paused {
        let end = |paused: Option<i64>, until| paused.map(|_| PauseEnd::from_millis(until));
        Paused {
            job: end(self.job_paused, self.job_until),
            all: end(self.all_paused, self.all_until),
        }
    }

    /// The run's record as the core's decisions read it; `None` when the
    /// run has no record.
    pub(crate) fn lease_record(&self) -> Result<Option<LeaseRecord>, StoreError> {
        let Some(state) = parse_state(self.state.as_deref())? else {
            return Ok(None);
        };
        Ok(Some(LeaseRecord {
            state,
            attempt: self.attempt.map(parse_attempt).transpose()?,
            holder: self
                .token
                .as_deref()
                .map(|t| Token::parse(t).ok_or_else(|| bad_value("token", t)))
                .transpose()?,
            fence: self.fence.map(parse_fence).transpose()?,
            lease_until: self.lease_until.map(Timestamp::from_millis),
        }))
    }
}

/// What `peek` reads.
#[derive(FromRow)]
pub(crate) struct PeekRow {
    pub(crate) now: i64,
    pub(crate) state: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) lease_until: Option<i64>,
}

/// One run of a job's history.
#[derive(FromRow)]
pub(crate) struct HistoryRow {
    pub(crate) slot: i64,
    pub(crate) state: String,
    pub(crate) attempt: Option<i64>,
    pub(crate) fence: Option<i64>,
    pub(crate) instance: Option<String>,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) error: Option<String>,
}

impl HistoryRow {
    pub(crate) fn into_record(self, job: &JobName) -> Result<RunRecord, StoreError> {
        let state =
            RecordState::parse(&self.state).ok_or_else(|| bad_value("run state", &self.state))?;
        let instance = self
            .instance
            .map(|i| InstanceId::new(&i).map_err(|_| bad_value("instance id", &i)))
            .transpose()?;
        Ok(RunRecord {
            run: RunKey::new(job.clone(), Slot::from_millis(self.slot)),
            state,
            attempt: self.attempt.map(parse_attempt).transpose()?,
            fence: self.fence.map(parse_fence).transpose()?,
            instance,
            started_at: self.started_at.map(Timestamp::from_millis),
            finished_at: self.finished_at.map(Timestamp::from_millis),
            lease_until: self.lease_until.map(Timestamp::from_millis),
            error: self.error,
        })
    }
}

pub(crate) fn parse_state(text: Option<&str>) -> Result<Option<RecordState>, StoreError> {
    text.map(|s| RecordState::parse(s).ok_or_else(|| bad_value("run state", s)))
        .transpose()
}

pub(crate) fn parse_attempt(n: i64) -> Result<Attempt, StoreError> {
    u32::try_from(n)
        .ok()
        .and_then(Attempt::new)
        .ok_or_else(|| bad_value("attempt", n))
}

pub(crate) fn parse_fence(n: i64) -> Result<Fence, StoreError> {
    u64::try_from(n)
        .map(Fence::new)
        .map_err(|_| bad_value("fence", n))
}

pub(crate) fn fence_value(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| bad_value("fence", fence.get()))
}

/// One pause as `pauses` reads it.
#[derive(FromRow)]
pub(crate) struct PauseRow {
    pub(crate) scope: String,
    pub(crate) since: i64,
    pub(crate) until: Option<i64>,
    pub(crate) reason: Option<String>,
    pub(crate) paused_by: Option<String>,
}

impl PauseRow {
    pub(crate) fn into_pause(self) -> Result<Pause, StoreError> {
        Ok(Pause {
            scope: PauseScope::from_key(&self.scope)
                .ok_or_else(|| bad_value("pause scope", &self.scope))?,
            since: Timestamp::from_millis(self.since),
            end: PauseEnd::from_millis(self.until),
            reason: self.reason,
            by: self.paused_by,
        })
    }
}
