//! The rows the store's statements read, and how their columns become the
//! core's types.

use anarchon_core::stored;
use anarchon_core::{ClaimOutcome, PastAttempts, Pause, RecordState, Timestamp};
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
    /// With a win: the run's past attempts as the claim left them (the
    /// `earlier` column's JSON text; `None` for none).
    #[sqlx(rename = "r_earlier")]
    pub(crate) earlier: Option<String>,
}

impl ClaimRow {
    pub(crate) fn outcome(&self) -> Result<ClaimOutcome, String> {
        Ok(match self.outcome.as_str() {
            "won" => {
                let attempt =
                    stored::attempt(self.attempt.ok_or("a win without an attempt")?.into())
                        .map_err(reason)?;
                let fence =
                    stored::fence(self.fence.ok_or("a win without a fence")?).map_err(reason)?;
                // The past attempts tell how this attempt came to run.
                let past = PastAttempts::decode(self.earlier.as_deref().unwrap_or_default())
                    .map_err(reason)?;
                ClaimOutcome::Won(past.win(attempt, Some(fence)))
            }
            "running" => ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(
                    self.lease_until.ok_or("a live lease without an end")?,
                ),
                store_now: Timestamp::from_millis(self.store_now),
            },
            "late" => ClaimOutcome::Late,
            "recorded-missed" => ClaimOutcome::Missed,
            "recorded-interrupted" => ClaimOutcome::Interrupted,
            "overlap" => ClaimOutcome::Overlap,
            other => match stored::state(other) {
                Ok(RecordState::Finished(done)) => ClaimOutcome::Done(done),
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
    pub(crate) retry_at: Option<i64>,
}

/// A stored value the core's types cannot hold, as the reason of a
/// protocol error.
pub(crate) fn reason(e: stored::BadValue) -> String {
    e.to_string()
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
        let Some(scope) = self.scope else {
            return Ok(None);
        };
        let since = self.since.ok_or("a pause without a start")?;
        stored::pause((scope, since, self.until, self.reason, self.paused_by))
            .map(Some)
            .map_err(reason)
    }
}
