//! The rows the store's statements read, and how their columns become the
//! core's types.

use anarchon_core::{
    Attempt, ClaimOutcome, Fence, Pause, PauseEnd, PauseScope, RecordState, Timestamp, Win,
};
use sqlx::FromRow;

/// One answer of the claim function.
#[derive(FromRow)]
pub(crate) struct ClaimRow {
    #[sqlx(rename = "r_idx")]
    pub(crate) idx: i32,
    #[sqlx(rename = "r_outcome")]
    pub(crate) outcome: String,
    #[sqlx(rename = "r_attempt")]
    pub(crate) attempt: Option<i32>,
    #[sqlx(rename = "r_fence")]
    pub(crate) fence: Option<i64>,
    #[sqlx(rename = "r_lease_until")]
    pub(crate) lease_until: Option<i64>,
    #[sqlx(rename = "r_store_now")]
    pub(crate) store_now: i64,
}

impl ClaimRow {
    pub(crate) fn outcome(&self) -> Result<ClaimOutcome, String> {
        Ok(match self.outcome.as_str() {
            "won" => ClaimOutcome::Won(Win {
                attempt: attempt(self.attempt)?.ok_or("a win without an attempt")?,
                fence: Some(fence(self.fence)?.ok_or("a win without a fence")?),
            }),
            "running" => ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(
                    self.lease_until.ok_or("a live lease without an end")?,
                ),
                store_now: Timestamp::from_millis(self.store_now),
            },
            "late" => ClaimOutcome::Late,
            "overlap" => ClaimOutcome::Overlap,
            other => match RecordState::parse(other) {
                Some(RecordState::Finished(done)) => ClaimOutcome::Done(done),
                _ => return Err(format!("unknown claim outcome {other:?}")),
            },
        })
    }
}

/// One run as `peek` reads it.
#[derive(FromRow)]
pub(crate) struct PeekRow {
    pub(crate) store_now: i64,
    pub(crate) state: Option<String>,
    pub(crate) attempt: Option<i32>,
    pub(crate) lease_until: Option<i64>,
}

/// One run of a job's history.
#[derive(FromRow)]
pub(crate) struct HistoryRow {
    pub(crate) slot: i64,
    pub(crate) state: String,
    pub(crate) attempt: Option<i32>,
    pub(crate) fence: Option<i64>,
    pub(crate) instance: Option<String>,
    pub(crate) started_at: Option<i64>,
    pub(crate) finished_at: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) error: Option<String>,
}

pub(crate) fn attempt(value: Option<i32>) -> Result<Option<Attempt>, String> {
    value
        .map(|n| {
            u32::try_from(n)
                .ok()
                .and_then(Attempt::new)
                .ok_or_else(|| format!("attempt {n} is not a positive number"))
        })
        .transpose()
}

pub(crate) fn fence(value: Option<i64>) -> Result<Option<Fence>, String> {
    value
        .map(|n| {
            u64::try_from(n)
                .map(Fence::new)
                .map_err(|_| format!("fence {n} is negative"))
        })
        .transpose()
}

pub(crate) fn record_state(text: &str) -> Result<RecordState, String> {
    RecordState::parse(text).ok_or_else(|| format!("unknown run state {text:?}"))
}

/// One row of `pauses`: the server's clock, and a pause if there is any.
#[derive(FromRow)]
pub(crate) struct PauseRow {
    pub(crate) store_now: i64,
    pub(crate) scope: Option<String>,
    pub(crate) since: Option<i64>,
    pub(crate) until: Option<i64>,
    pub(crate) reason: Option<String>,
    pub(crate) paused_by: Option<String>,
}

impl PauseRow {
    /// The pause, if the row holds one.
    pub(crate) fn into_pause(self) -> Result<Option<Pause>, String> {
        let Some(key) = self.scope else {
            return Ok(None);
        };
        Ok(Some(Pause {
            scope: PauseScope::from_key(&key)
                .ok_or_else(|| format!("invalid pause scope {key:?}"))?,
            since: Timestamp::from_millis(self.since.ok_or("a pause without a start")?),
            end: PauseEnd::from_millis(self.until),
            reason: self.reason,
            by: self.paused_by,
        }))
    }
}
