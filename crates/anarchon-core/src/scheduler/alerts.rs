//! Alerts: the run ends an operator wants to hear about, told once for the
//! whole fleet.
//!
//! Every instance of a fleet runs the same jobs, so a naive "tell me when a
//! run fails" would page once per instance, or, for a missed slot, once for
//! each instance that noticed. An alert here comes from the one instance
//! that *recorded* the end:
//!
//! * `failed`: the runner whose handler failed, once the store has taken
//!   the outcome and no retry of it is pending (a failure that will be
//!   retried is not an end yet). On a claim-only store, the one winner.
//! * `interrupted`: the instance whose claim found the lease run out with no
//!   attempts left and ended the run so ([`ClaimOutcome::Interrupted`]).
//! * `missed`: the instance whose claim recorded the slot `missed`
//!   ([`ClaimOutcome::Missed`]). A slot no instance was up to claim has no
//!   record and no alert: `anarchon audit` finds those.
//!
//! The hook is called on the scheduler's task, so it must return quickly:
//! hand the alert to a channel or spawn a task for anything slow.
//!
//! [`ClaimOutcome::Interrupted`]: crate::store::ClaimOutcome::Interrupted
//! [`ClaimOutcome::Missed`]: crate::store::ClaimOutcome::Missed

use std::fmt;
use std::sync::Arc;

use crate::ids::{Attempt, InstanceId};
use crate::store::RunKey;

/// How a run ended that raises an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlertKind {
    /// The handler failed (returned an error, panicked or timed out) and no
    /// retry is pending.
    Failed,
    /// The runner's lease ran out with no attempts left.
    Interrupted,
    /// The slot was too late to run.
    Missed,
}

impl AlertKind {
    /// The name of the run's state: `failed`, `interrupted`, `missed`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Failed => "failed",
            AlertKind::Interrupted => "interrupted",
            AlertKind::Missed => "missed",
        }
    }

    /// Every kind.
    pub const ALL: [AlertKind; 3] = [AlertKind::Failed, AlertKind::Interrupted, AlertKind::Missed];
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run that ended `failed`, `interrupted` or `missed`, as the instance
/// that recorded it tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Alert {
    /// How the run ended.
    pub kind: AlertKind,
    /// The run: its job and slot.
    pub run: RunKey,
    /// The attempt that failed; `None` for `interrupted` and `missed`,
    /// where the recording instance did not run it.
    pub attempt: Option<Attempt>,
    /// The instance that recorded the end (this one).
    pub instance: InstanceId,
    /// What the handler said, for `failed`.
    pub error: Option<String>,
}

impl Alert {
    /// An alert of `kind` about `run`, recorded by `instance`, with no
    /// attempt and no error.
    pub fn new(kind: AlertKind, run: RunKey, instance: InstanceId) -> Self {
        Self {
            kind,
            run,
            attempt: None,
            instance,
            error: None,
        }
    }

    /// The same alert, naming the attempt that ended.
    #[must_use]
    pub fn with_attempt(mut self, attempt: Attempt) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// The same alert, with what the handler said.
    #[must_use]
    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }
}

/// The function a scheduler calls with each alert
/// ([`SchedulerBuilder::on_alert`](super::SchedulerBuilder::on_alert)).
pub type AlertHook = Arc<dyn Fn(Alert) + Send + Sync>;

/// Tells `inner`'s hook, if any, of `alert`, and logs it. A hook that
/// panics is logged and otherwise ignored: an alert must never stop the
/// scheduler.
pub(crate) fn raise(inner: &super::Inner, alert: Alert) {
    tracing::warn!(
        job = %alert.run.job,
        slot = %alert.run.slot,
        kind = %alert.kind,
        attempt = alert.attempt.map(|a| a.get()),
        "alert: the run ended {}", alert.kind
    );
    let Some(hook) = &inner.alert else {
        return;
    };
    let (job, slot) = (alert.run.job.clone(), alert.run.slot);
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(alert)));
    if called.is_err() {
        tracing::error!(%job, %slot, "the alert hook panicked");
    }
}
