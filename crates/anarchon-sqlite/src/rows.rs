//! The rows the store's statements read, and how their columns become the
//! core's types.

use anarchon_core::decide::LeaseRecord;
use anarchon_core::stored;
use anarchon_core::{
    AttemptEnd, Fence, InstanceId, PastAttempt, PastAttempts, PauseEnd, Paused, RecordState,
    StoreError, Timestamp, Token,
};
use sqlx::FromRow;

use crate::error::{bad_stored, bad_value};

/// The clock and the run, read at the start of a claim.
#[derive(FromRow)]
pub(crate) struct ClaimRow {
    pub(crate) now: i64,
    pub(crate) state: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) token: Option<String>,
    pub(crate) fence: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) retry_at: Option<i64>,
    pub(crate) instance: Option<String>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) error: Option<String>,
    pub(crate) earlier: Option<String>,
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
            attempt: self
                .attempt
                .map(stored::attempt)
                .transpose()
                .map_err(bad_stored)?,
            holder: self
                .token
                .as_deref()
                .map(|t| Token::parse(t).ok_or_else(|| bad_value("token", t)))
                .transpose()?,
            fence: self
                .fence
                .map(stored::fence)
                .transpose()
                .map_err(bad_stored)?,
            lease_until: self.lease_until.map(Timestamp::from_millis),
            retry_at: self.retry_at.map(Timestamp::from_millis),
        }))
    }

    /// The run's past attempts, with the one `ended` (if any) added: what
    /// the record holds once the claim's decision is applied.
    pub(crate) fn past_after(&self, ended: Option<AttemptEnd>) -> Result<PastAttempts, StoreError> {
        let mut past = PastAttempts::decode(self.earlier.as_deref().unwrap_or_default())
            .map_err(bad_stored)?;
        if let (Some(ended), Some(attempt)) = (ended, self.attempt) {
            past.push(PastAttempt {
                attempt: stored::attempt(attempt).map_err(bad_stored)?,
                ended,
                at: match ended {
                    AttemptEnd::Failed => self.finished_at,
                    AttemptEnd::TakenOver => self.lease_until,
                }
                .map(Timestamp::from_millis),
                instance: self
                    .instance
                    .as_deref()
                    .map(|i| InstanceId::new(i).map_err(|_| bad_value("instance id", i)))
                    .transpose()?,
                error: match ended {
                    AttemptEnd::Failed => self.error.clone(),
                    AttemptEnd::TakenOver => None,
                },
            });
        }
        Ok(past)
    }
}

/// What `peek` reads.
#[derive(FromRow)]
pub(crate) struct PeekRow {
    pub(crate) now: i64,
    pub(crate) state: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) retry_at: Option<i64>,
}

pub(crate) fn parse_state(text: Option<&str>) -> Result<Option<RecordState>, StoreError> {
    text.map(stored::state).transpose().map_err(bad_stored)
}

pub(crate) fn fence_value(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| bad_value("fence", fence.get()))
}
