//! Store calls as the scheduler makes them: how long one may take, how
//! often it is sent again, and the claim a slot is asked for with.
//!
//! The timer (`driver`) and the runs it starts (`run`) both call the store
//! through these; neither imports the other's helpers, so the dependency
//! between the two runs one way: the timer hands answers to `run`.

use std::time::Duration;

use tokio::time::Instant;

use super::{Inner, JobSpec};
use crate::error::StoreError;
use crate::ids::Token;
use crate::store::{ClaimRequest, LeaseClaim, RunKey};
use crate::time::Slot;

/// The least head start a slot's claim gets before its fire time. The
/// handler still starts at the fire time: claiming ahead takes the store's
/// round trip (and, for a batch of a thousand jobs, its length) out of the
/// lateness. The head start grows to twice the last batch's claim time when
/// that is longer, up to [`MAX_CLAIM_AHEAD`].
pub(crate) const MIN_CLAIM_AHEAD: Duration = Duration::from_millis(100);
/// The most head start a claim gets.
pub(crate) const MAX_CLAIM_AHEAD: Duration = Duration::from_secs(2);
/// The head start before any batch has been timed. A fleet started together
/// sends its first claims at the same instant, and on a store where claims
/// of one run contend (NATS KV, 8 processes × 200 jobs: 140–250 ms) that
/// first batch takes longer than [`MIN_CLAIM_AHEAD`]; from there the head
/// start follows what batches take, shrinking by a tenth a batch.
pub(crate) const FIRST_CLAIM_AHEAD: Duration = Duration::from_millis(500);

/// How many times a claim is sent in all when the store is unavailable.
pub(crate) const STORE_TRIES: u32 = 4;
/// The first pause between tries; it doubles each time.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// How long one store call may take before the scheduler gives up on its
/// answer and treats it as lost (the request may still have been done; the
/// retry with the same token finds out).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `op`, or a temporary error if it has not answered within `limit`.
pub(crate) async fn within<T, Fut>(limit: Duration, op: Fut) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    match tokio::time::timeout(limit, op).await {
        Ok(answer) => answer,
        Err(_) => Err(StoreError::unavailable(
            "scheduler",
            format!("the store did not answer within {limit:?}"),
        )),
    }
}

/// `call`, timed: its time in the store-call histogram, and a failure
/// (a timeout included) in the store-error counter, both labelled with
/// `operation` (see [`super::metrics::names`]).
pub(crate) async fn timed<T, Fut>(operation: &'static str, call: Fut) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    use super::metrics::names;
    let started = Instant::now();
    let answer = call.await;
    ::metrics::histogram!(names::STORE_CALL, "operation" => operation)
        .record(started.elapsed().as_secs_f64());
    if answer.is_err() {
        ::metrics::counter!(names::STORE_ERRORS, "operation" => operation).increment(1);
    }
    answer
}

/// Sends `op` until it succeeds, fails for good, or [`STORE_TRIES`] runs out.
/// Every try sends the same request, so a lost reply is answered on the retry.
pub(crate) async fn with_retries<T, F, Fut>(what: &'static str, op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    with_retries_until(what, None, op).await
}

/// [`with_retries`], but no try is sent, nor waited for, at or after
/// `deadline`: for claims a store only remembers for a while, every try
/// must reach it while it still remembers the run.
pub(crate) async fn with_retries_until<T, F, Fut>(
    what: &'static str,
    deadline: Option<Instant>,
    mut op: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut tries = 1;
    loop {
        let limit = match deadline {
            None => CALL_TIMEOUT,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(StoreError::unavailable(
                        "scheduler",
                        format!("{what} not sent again: past the slot's late window"),
                    ));
                }
                left.min(CALL_TIMEOUT)
            }
        };
        match timed(what, within(limit, op())).await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_temporary() && tries < STORE_TRIES => {
                tracing::debug!(error = %e, tries, "{what} failed; trying again with the same token");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The claim `inner` makes for `job`'s `slot` with `token`: the job's late
/// window, the scheduler's lease, the job's overlap rule and attempts.
pub(crate) fn lease_claim(inner: &Inner, job: &JobSpec, slot: Slot, token: Token) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(job.name.clone(), slot),
            token,
            instance: inner.instance.clone(),
            max_late: if slot.is_manual() {
                job.window().max(super::MANUAL_RUN_WINDOW)
            } else {
                job.window()
            },
        },
        lease: inner.lease,
        overlap: job.overlap,
        max_attempts: job.claim_attempts(),
        rerun_paused: false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_does_not_answer_in_time_is_a_temporary_error() {
        let started = Instant::now();
        let answer: Result<(), StoreError> =
            within(Duration::from_secs(3), std::future::pending()).await;
        assert!(answer.unwrap_err().is_temporary());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn temporary_errors_are_tried_store_tries_times_in_all() {
        let tries = AtomicU32::new(0);
        let answer: Result<(), StoreError> = with_retries("call", || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err(StoreError::unavailable("test", "down")) }
        })
        .await;
        assert!(answer.is_err());
        assert_eq!(tries.load(Ordering::Relaxed), STORE_TRIES);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_that_is_not_temporary_is_not_tried_again() {
        let tries = AtomicU32::new(0);
        let answer: Result<(), StoreError> = with_retries("call", || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err(StoreError::protocol("test", "nonsense")) }
        })
        .await;
        assert!(answer.is_err());
        assert_eq!(tries.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn no_try_is_sent_at_or_after_the_deadline() {
        let tries = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_millis(120);
        let answer: Result<(), StoreError> = with_retries_until("claim", Some(deadline), || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err(StoreError::unavailable("test", "down")) }
        })
        .await;
        assert!(answer.unwrap_err().is_temporary());
        // Tries at 0, 50 and 150 ms would be sent without a deadline; the
        // third falls after it.
        assert_eq!(tries.load(Ordering::Relaxed), 2);
        assert!(Instant::now() >= deadline);
    }
}
