//! Failed attempts waiting for their retry, and the past attempts a run's
//! record keeps.
//!
//! A run whose attempt failed with a retry pending stays among its job's
//! live runs (the claim that starts the retry, and the overlap check, read
//! only the job's document), marked with its [`Failure`]. Its past
//! attempts are kept as the JSON text `anarchon_core::PastAttempts` writes.

use anarchon_core::{AttemptEnd, PastAttempt, PastAttempts, Timestamp};
use serde::{Deserialize, Serialize};

use super::records::{LiveRun, Stamp};

/// The failure of a live run's attempt whose retry is pending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Failure {
    /// When the attempt failed.
    pub(crate) finished: Stamp,
    /// Its error.
    pub(crate) error: String,
    /// When its retry is due.
    pub(crate) retry_at: Stamp,
}

impl Failure {
    pub(crate) fn fix(&mut self, written_at: i64) {
        self.finished = Stamp::At(self.finished.resolve(written_at));
        self.retry_at = Stamp::At(self.retry_at.resolve(written_at));
    }
}

/// Reads stored past attempts; none when there are none.
pub(crate) fn past(earlier: Option<&str>) -> Result<PastAttempts, String> {
    PastAttempts::decode(earlier.unwrap_or_default()).map_err(|e| format!("a run record has {e}"))
}

/// Stores past attempts; nothing for none.
pub(crate) fn stored(past: &PastAttempts) -> Option<String> {
    (!past.is_empty()).then(|| past.encode())
}

impl LiveRun {
    /// The run's past attempts, with its current attempt added as ended
    /// `ended` (failed: at its failure; taken over: at its lease end, as
    /// of `now`).
    pub(crate) fn past_with(&self, ended: AttemptEnd, now: i64) -> Result<PastAttempts, String> {
        let mut past = past(self.earlier.as_deref())?;
        let (at, error) = match (ended, &self.failed) {
            (AttemptEnd::Failed, Some(failure)) => {
                (failure.finished.at_or(now), Some(failure.error.clone()))
            }
            _ => (self.lease_until.at_or(now), None),
        };
        past.push(PastAttempt {
            attempt: anarchon_core::Attempt::new(self.attempt)
                .ok_or_else(|| "a live run has attempt 0".to_owned())?,
            ended,
            at: Some(Timestamp::from_millis(at)),
            instance: anarchon_core::InstanceId::new(&self.instance).ok(),
            error,
        });
        Ok(past)
    }

    /// Until when the run counts as going on for the overlap check: its
    /// lease end, or for a failed attempt its retry's due time.
    pub(crate) fn live_until(&self, now: i64) -> i64 {
        match &self.failed {
            Some(failure) => failure.retry_at.at_or(now),
            None => self.lease_until.at_or(now),
        }
    }
}
