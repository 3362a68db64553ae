//! What a handler gets: the run it is running, and a way to learn it must stop.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::ids::{Attempt, Fence, InstanceId, Token};
use crate::name::JobName;
use crate::retry::AttemptCause;
use crate::store::Win;
use crate::time::Slot;

/// Why a run's context was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// A heartbeat or finish found another token holding the run: a backup
    /// took it over. Stop at once; anything written now is stale.
    Fenced,
    /// The store could not be reached for a whole lease period: a backup may
    /// take over soon, so the runner stops first. A handler that stops
    /// early should return an error, and the run is handed to a backup; one
    /// that returns `Ok` says its work is done, and the success is recorded
    /// if no backup has taken the run over meanwhile.
    LostContact,
    /// The job's timeout elapsed.
    TimedOut,
    /// The scheduler is shutting down and its grace period ran out.
    Shutdown,
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelReason::Fenced => "fenced: another instance took the run over",
            CancelReason::LostContact => "lost contact with the store for a whole lease",
            CancelReason::TimedOut => "timed out",
            CancelReason::Shutdown => "the scheduler is shutting down",
        })
    }
}

/// The run a handler is running, and its cancellation signal.
///
/// Handlers should watch [`RunContext::cancelled`] and stop promptly when it
/// fires: after a fence, another instance is running the same run. A
/// handler that stops before its work is done should return an error, not
/// `Ok`: `Ok` says the work is done.
#[derive(Clone)]
pub struct RunContext {
    pub(crate) job: JobName,
    pub(crate) slot: Slot,
    pub(crate) attempt: Attempt,
    pub(crate) fence: Option<Fence>,
    pub(crate) cause: AttemptCause,
    pub(crate) retries: u32,
    pub(crate) token: Token,
    pub(crate) instance: InstanceId,
    pub(crate) cancel: CancellationToken,
    pub(crate) reason: Arc<OnceLock<CancelReason>>,
}

impl RunContext {
    pub(crate) fn new(
        job: JobName,
        slot: Slot,
        win: Win,
        token: Token,
        instance: InstanceId,
    ) -> Self {
        Self {
            job,
            slot,
            attempt: win.attempt,
            fence: win.fence,
            cause: win.cause,
            retries: win.retries,
            token,
            instance,
            cancel: CancellationToken::new(),
            reason: Arc::new(OnceLock::new()),
        }
    }

    pub(crate) fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.cancel.cancel();
    }

    /// The job.
    pub fn job(&self) -> &JobName {
        &self.job
    }

    /// The slot this run is for (not the time it started).
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// 1 for the first runner, +1 for each takeover or retry.
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// How this attempt came to run: the first, a takeover of a runner
    /// that lost its lease, or a retry after a failure.
    pub fn cause(&self) -> AttemptCause {
        self.cause
    }

    /// How many retries the run has had, this attempt's included: 0 until
    /// a failure is retried.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The fence of this win, on lease stores: pass it to systems the
    /// handler writes to so they can refuse a stale runner.
    pub fn fence(&self) -> Option<Fence> {
        self.fence
    }

    /// The claim token that won this run.
    pub fn token(&self) -> Token {
        self.token
    }

    /// This instance's id.
    pub fn instance(&self) -> &InstanceId {
        &self.instance
    }

    /// Whether the run has been told to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Why the run was told to stop, once it was.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }

    /// Completes when the run is told to stop.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future loses nothing.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("job", &self.job)
            .field("slot", &self.slot)
            .field("attempt", &self.attempt)
            .field("fence", &self.fence)
            .field("cause", &self.cause)
            .field("retries", &self.retries)
            .field("instance", &self.instance)
            .field("cancelled", &self.cancel_reason())
            .finish()
    }
}

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A job's work. Implemented for every `Fn(RunContext) -> impl Future<Output
/// = Result<(), E>>` where `E: Display`; the error's text is recorded with a
/// failed run.
pub trait Handler: Send + Sync + 'static {
    /// Runs the job once for `ctx`.
    fn call(&self, ctx: RunContext) -> BoxFuture<Result<(), String>>;
}

impl<F, Fut, E> Handler for F
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    fn call(&self, ctx: RunContext) -> BoxFuture<Result<(), String>> {
        let fut = self(ctx);
        Box::pin(async move { fut.await.map_err(|e| format!("{e:#}")) })
    }
}
