//! The rows the store's statements read, and how their columns become the
//! core's types.

use anarchon_core::decide::LeaseRecord;
use anarchon_core::stored;
use anarchon_core::{Fence, PauseEnd, Paused, RecordState, StoreError, Timestamp, Token};
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

pub(crate) fn parse_state(text: Option<&str>) -> Result<Option<RecordState>, StoreError> {
    text.map(stored::state).transpose().map_err(bad_stored)
}

pub(crate) fn fence_value(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| bad_value("fence", fence.get()))
}
