//! What happens after a claim: running a won run, and watching someone
//! else's as a backup.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

use super::alerts::{self, Alert, AlertKind};
use super::calls::{
    CALL_TIMEOUT, MAX_CLAIM_AHEAD, STORE_TRIES, lease_claim, timed, with_retries, within,
};
use super::context::{CancelReason, RunContext};
use super::lease_clock::{Holding, LeaseClock, Renew};
use super::metrics::{Event, Metrics};
use super::{Inner, JobSpec, StoreHandle};
use crate::ids::Token;
use crate::retry::RetryPlan;
use crate::store::{
    ClaimOutcome, FinalState, LeaseClaim, LeaseStore, Overlap, Renewal, RunKey, RunOutcome,
    RunState, Win,
};
use crate::time::Timestamp;

/// A backup wakes this long after the lease end it was told, so the store's
/// clock has passed it by the time the backup asks.
const BACKUP_MARGIN: Duration = Duration::from_millis(5);
/// The longest a run that ended waits for the handler starts due at the
/// same instant before it records its outcome (see `start_gate`). A
/// thousand starts take a few milliseconds; a start held up longer is
/// waiting for its store, and the finish goes.
const MOST_HELD_FOR_STARTS: Duration = Duration::from_millis(50);

/// Acts on the answer to a claim. `sent_at` is when the claim was first sent:
/// the lease cannot have started before it. A won run's handler starts at
/// `fire_at` (wall clock) if that is still ahead: claims are sent a little
/// early so the store's round trip does not delay the handler. A caught-up
/// slot's `permit` is held by its run until the handler ends, and freed at
/// once by any other answer.
pub(crate) fn handle_outcome(
    inner: &Arc<Inner>,
    job: Arc<JobSpec>,
    claim: LeaseClaim,
    outcome: ClaimOutcome,
    sent_at: Instant,
    fire_at: Option<Timestamp>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let run = claim.claim.run;
    let m = &inner.metrics;
    match outcome {
        ClaimOutcome::Won(win) => {
            m.count(&run.job, Event::Won(win.cause));
            tracing::info!(job = %run.job, slot = %run.slot, attempt = win.attempt.get(), cause = %win.cause, fence = ?win.fence.map(|f| f.get()), "claim won");
            let token = claim.claim.token;
            let running = run_won(inner.clone(), job, run, token, win, sent_at, fire_at);
            inner.tasks.spawn(async move {
                running.await;
                drop(permit);
            });
        }
        ClaimOutcome::Running {
            lease_until,
            store_now,
        } => {
            m.count(&run.job, Event::Lost);
            m.observe_store_clock(store_now, inner.clock.now());
            tracing::debug!(job = %run.job, slot = %run.slot, %lease_until, "running elsewhere; watching as a backup");
            inner
                .tasks
                .spawn(backup(inner.clone(), job, run, lease_until, store_now));
        }
        // Every instance that asks about a skipped slot is told so: the
        // first one `Overlap`, the others (and its own retry, if the first
        // answer was lost) `Done(Skipped)`. Either way the slot was skipped.
        ClaimOutcome::Done(FinalState::Skipped) => {
            m.count(&run.job, Event::Skipped);
            tracing::info!(job = %run.job, slot = %run.slot, "skipped: the previous run of the job was still going");
        }
        ClaimOutcome::Done(FinalState::Paused) => {
            m.count(&run.job, Event::Paused);
            tracing::debug!(job = %run.job, slot = %run.slot, "not run: the job is paused");
        }
        ClaimOutcome::Lost | ClaimOutcome::Done(_) => {
            m.count(&run.job, Event::Lost);
            tracing::debug!(job = %run.job, slot = %run.slot, ?outcome, "claim lost");
        }
        ClaimOutcome::Unknown => {
            m.count(&run.job, Event::Unknown);
            tracing::warn!(job = %run.job, slot = %run.slot, "no answer to the claim; treated as lost, the slot is not run here");
        }
        ClaimOutcome::Late => {
            m.count(&run.job, Event::Late);
            tracing::debug!(job = %run.job, slot = %run.slot, "the store says the claim is too late; the slot was recorded missed");
        }
        ClaimOutcome::Missed => {
            m.count(&run.job, Event::Missed);
            tracing::warn!(job = %run.job, slot = %run.slot, "the store says the claim is too late; this instance recorded the slot missed");
            let missed = Alert::new(AlertKind::Missed, run, inner.instance.clone());
            alerts::raise(inner, missed);
        }
        ClaimOutcome::Interrupted => {
            m.count(&run.job, Event::Interrupted);
            tracing::warn!(job = %run.job, slot = %run.slot, "the run's lease ran out with no attempts left; this instance recorded it interrupted");
            let ended = Alert::new(AlertKind::Interrupted, run, inner.instance.clone());
            alerts::raise(inner, ended);
        }
        ClaimOutcome::Overlap => {
            m.count(&run.job, Event::Skipped);
            tracing::info!(job = %run.job, slot = %run.slot, "skipped: the previous run of the job is still going");
        }
    }
}

/// How long a hand-over at shutdown waits for the aborted handler's task
/// to end before it releases the run.
const HANDLER_ABORT_WAIT: Duration = Duration::from_secs(1);

/// Runs a won run: the handler in its own task, heartbeats, timeout,
/// fencing, finish, and hand-over at shutdown.
pub(crate) async fn run_won(
    inner: Arc<Inner>,
    job: Arc<JobSpec>,
    run: RunKey,
    token: Token,
    win: Win,
    claim_sent_at: Instant,
    fire_at: Option<Timestamp>,
) {
    let lease_store = match &inner.store {
        StoreHandle::Lease(store) => Some(store.clone()),
        StoreHandle::Claim(_) => None,
    };
    if inner.stop.is_cancelled() {
        // Won while shutting down: hand it straight to a backup.
        if let Some(store) = &lease_store {
            hand_over(&inner, store.as_ref(), &run, token, Started::No).await;
        }
        return;
    }
    let span = tracing::info_span!("run", job = %run.job, slot = %run.slot, attempt = win.attempt.get(), instance = %inner.instance);
    let lease = inner.lease;
    let mut lease_clock =
        LeaseClock::with_stop_grace(claim_sent_at, lease, inner.heartbeat, inner.stop_grace);
    // Claimed ahead of time: wait for the fire time (never longer than the
    // head start, whatever the wall clock did meanwhile), renewing the
    // lease on schedule meanwhile.
    let start_at = fire_at.map_or_else(Instant::now, |fire_at| {
        Instant::now() + inner.clock.until(fire_at).min(MAX_CLAIM_AHEAD)
    });
    // Withdrawn once the handler is called, or when the run goes without.
    let expected = inner.starts.expect(start_at);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(start_at) => break,
            () = tokio::time::sleep_until(lease_clock.next_renewal()), if lease_store.is_some() => {
                let Some(store) = &lease_store else { continue };
                if !renew_before_start(&inner, store.as_ref(), &run, token, &mut lease_clock, &span).await {
                    return;
                }
            }
            () = inner.hand_over.cancelled() => {
                if let Some(store) = &lease_store {
                    hand_over(&inner, store.as_ref(), &run, token, Started::No).await;
                }
                return;
            }
        }
    }
    // Never start a handler without lease left: a renewal due by now (the
    // claim was won late, or sent well ahead) is made first.
    if let Some(store) = &lease_store
        && Instant::now() >= lease_clock.next_renewal()
        && !renew_before_start(&inner, store.as_ref(), &run, token, &mut lease_clock, &span).await
    {
        return;
    }
    let ctx = RunContext::new(
        run.job.clone(),
        run.slot,
        win,
        token,
        inner.instance.clone(),
    );
    Metrics::started(&run.job, run.slot.at(), inner.clock.now());
    let handler_started = Instant::now();
    let mut handler = tokio::spawn(job.handler.call(ctx.clone()).instrument(span.clone()));
    drop(expected);

    let mut holding = Holding::start(lease_store.is_some());
    let deadline = job.timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;

    let result = loop {
        tokio::select! {
            joined = &mut handler => break joined,
            () = tokio::time::sleep_until(lease_clock.next_renewal()), if holding.renewing() => {
                let Some(store) = &lease_store else { continue };
                let left = lease_clock.left(Instant::now());
                let renewal = renew(store.as_ref(), &run, token, &mut lease_clock, &span, left).await;
                if let Some(reason) = holding.after(renewal) {
                    // Counted once the handler returns: the run's one
                    // outcome here depends on what the store says then.
                    if holding == Holding::Fenced {
                        span.in_scope(|| tracing::warn!("fenced: another instance holds this run now; cancelling the handler"));
                    } else {
                        // The lease may have run out on the store's clock:
                        // stop before a backup can start.
                        span.in_scope(|| tracing::error!(?lease, "no renewal for a whole lease; cancelling the handler"));
                    }
                    ctx.cancel(reason);
                }
            }
            () = sleep_until_opt(deadline), if deadline.is_some() && !timed_out => {
                timed_out = true;
                span.in_scope(|| tracing::warn!(timeout = ?job.timeout, "timed out; cancelling the handler"));
                ctx.cancel(CancelReason::TimedOut);
            }
            () = inner.hand_over.cancelled() => {
                // The handler had returned already (both were ready at
                // once): its outcome is recorded like any other; handing
                // the run over would run it again.
                if handler.is_finished() {
                    break (&mut handler).await;
                }
                ctx.cancel(CancelReason::Shutdown);
                handler.abort();
                // The run goes to a backup only once the handler's task is
                // gone (its future dropped: a command killed on drop, say),
                // or after a second if it does not stop, as code that never
                // yields does not. A handler that succeeded in the moment
                // before the abort took (its poll was under way on another
                // thread) did the work: that is recorded. Anything else it
                // said after the cancellation is handed over.
                if let Ok(joined @ Ok(Ok(()))) =
                    tokio::time::timeout(HANDLER_ABORT_WAIT, &mut handler).await
                {
                    break joined;
                }
                if let Some(store) = &lease_store {
                    hand_over(&inner, store.as_ref(), &run, token, Started::Yes).instrument(span.clone()).await;
                }
                return;
            }
        }
    };

    let took = handler_started.elapsed();
    // The handlers due now start before this run records anything (see
    // `start_gate`), waiting at most a fraction of the lease left.
    let left = lease_store.as_ref().map_or(MOST_HELD_FOR_STARTS, |_| {
        lease_clock.left(Instant::now()) / 4
    });
    inner.starts.settled(left.min(MOST_HELD_FOR_STARTS)).await;
    Metrics::ended(&run.job, took);
    let retry = lease_store
        .as_ref()
        .and_then(|_| retry_plan(&inner, &job, &run, &win));
    let outcome = match result {
        // A timed-out run failed whatever the handler returned; keep what it
        // said, it usually tells why it was slow.
        _ if timed_out => {
            let limit = job.timeout.unwrap_or_default();
            RunOutcome::Failed {
                error: match &result {
                    Ok(Err(said)) => format!("timed out after {limit:?}: {said}"),
                    _ => format!("timed out after {limit:?}"),
                },
                retry,
            }
        }
        Ok(Ok(())) => RunOutcome::Succeeded,
        Ok(Err(error)) => RunOutcome::Failed { error, retry },
        Err(join) => RunOutcome::Failed {
            error: panic_message(join),
            retry,
        },
    };
    span.in_scope(|| tracing::info!(?outcome, "handler finished"));
    // Each attempt this instance ran is counted once, by how it ended here:
    // the handler's outcome only where the store took it (or, on a
    // claim-only store or when the store cannot be reached, where nothing
    // else is known).
    let ran = |inner: &Inner| {
        let event = match &outcome {
            RunOutcome::Succeeded => Event::Succeeded,
            RunOutcome::Failed { .. } => Event::Failed,
        };
        inner.metrics.count(&run.job, event);
    };
    if holding == Holding::Fenced {
        // Another instance holds the run: nothing of this attempt is
        // recorded.
        inner.metrics.count(&run.job, Event::Fenced);
        return;
    }
    if let (Some(store), Holding::LostContact, false) =
        (&lease_store, holding, outcome == RunOutcome::Succeeded)
    {
        // This runner gave the run up when it could no longer renew, and
        // the handler did not complete: it hands the run to a backup (if
        // the store answers at all; otherwise the lease simply runs out). A
        // handler that did complete is recorded below: `finish` only takes
        // if no backup has taken the run over meanwhile.
        span.in_scope(|| tracing::warn!("the run was given up after losing contact; handing it over instead of recording {outcome:?}"));
        // One try: the store was out of reach for a whole lease already.
        // Bounded like every store call: a store that hangs rather than
        // fails must not hold this task, and with it shutdown, forever.
        let event = match within(CALL_TIMEOUT, store.release(&run, token)).await {
            Ok(Renewal::Renewed) => Event::HandedOver,
            // Taken over already, or still out of reach (the lease runs
            // out): the run is lost to this instance either way.
            Ok(Renewal::Fenced) | Err(_) => Event::Fenced,
        };
        inner.metrics.count(&run.job, event);
        return;
    }
    // The failure as an alert, once the store has it and no retry is
    // pending.
    let failed = |inner: &Inner| {
        if let RunOutcome::Failed { error, .. } = &outcome {
            let failed = Alert::new(AlertKind::Failed, run.clone(), inner.instance.clone())
                .with_attempt(win.attempt)
                .with_error(error.clone());
            alerts::raise(inner, failed);
        }
    };
    if lease_store.is_none() {
        // A claim-only store keeps no outcome: the handler's is the news.
        ran(&inner);
        if outcome == RunOutcome::Succeeded {
            Metrics::succeeded(&run.job, inner.clock.now());
        } else {
            failed(&inner);
        }
    }
    if let Some(store) = &lease_store {
        let tries = std::sync::atomic::AtomicU32::new(0);
        let answer = with_retries("finish", || {
            tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            store.finish(&run, token, outcome.clone())
        })
        .instrument(span.clone())
        .await;
        let retried = tries.load(std::sync::atomic::Ordering::Relaxed) > 1;
        match answer {
            Ok(Renewal::Renewed)
                if let RunOutcome::Failed {
                    retry: Some(plan), ..
                } = &outcome =>
            {
                ran(&inner);
                let retried = watch_for_retry(&inner, job, run.clone(), plan.after)
                    .instrument(span.clone())
                    .await;
                if !retried {
                    failed(&inner);
                }
            }
            Ok(Renewal::Renewed) => {
                ran(&inner);
                if outcome == RunOutcome::Succeeded {
                    Metrics::succeeded(&run.job, inner.clock.now());
                } else {
                    failed(&inner);
                }
            }
            // A try whose reply was lost may have recorded the outcome: the
            // retry then finds the run finished, by this very attempt.
            Ok(Renewal::Fenced)
                if retried
                    && finished_by(
                        store.as_ref(),
                        &run,
                        win.attempt,
                        &inner.instance,
                        outcome.clone().into_record().0,
                    )
                    .await =>
            {
                span.in_scope(|| {
                    tracing::info!("outcome recorded (by a try whose reply was lost)")
                });
                ran(&inner);
                match &outcome {
                    RunOutcome::Succeeded => Metrics::succeeded(&run.job, inner.clock.now()),
                    RunOutcome::Failed { retry: None, .. } => failed(&inner),
                    RunOutcome::Failed { retry: Some(_), .. } => {}
                }
            }
            Ok(Renewal::Fenced) => {
                inner.metrics.count(&run.job, Event::Fenced);
                span.in_scope(|| tracing::warn!("finished after another instance took the run over; the outcome was not recorded"));
            }
            Err(error) => {
                // The handler's outcome is all this instance knows.
                ran(&inner);
                inner.metrics.count(&run.job, Event::StoreError);
                span.in_scope(|| tracing::error!(%error, "could not record the outcome; the lease will run out and a backup may run the slot again"));
            }
        }
    }
}

/// The retry a failure of `win` asks for, if the job retries failures and
/// the run has retries left: due after the policy's backoff, and only
/// before the job's next slot after now.
fn retry_plan(inner: &Inner, job: &JobSpec, run: &RunKey, win: &Win) -> Option<RetryPlan> {
    let policy = job.retry?;
    if win.retries >= policy.retries() {
        return None;
    }
    let before = job
        .schedule
        .next_after(inner.clock.now())
        .map_or(Timestamp::from_millis(i64::MAX), |slot| slot.at());
    Some(RetryPlan {
        after: policy.backoff(&run.job, run.slot, win.retries + 1),
        before,
    })
}

/// After a failure recorded with a retry: this instance watches the run as
/// any backup does, and claims the retry when it is due (it has no
/// privilege over the others: whoever claims first runs it). `false` when
/// the store made no retry: the failure is the run's end.
async fn watch_for_retry(
    inner: &Arc<Inner>,
    job: Arc<JobSpec>,
    run: RunKey,
    after: Duration,
) -> bool {
    let StoreHandle::Lease(store) = &inner.store else {
        return true;
    };
    match with_retries("peek", || store.peek(&run)).await {
        Ok(view) => match view.state {
            RunState::RetryPending { retry_at, .. } => {
                tracing::info!(%retry_at, "failed; a retry is due");
                inner
                    .tasks
                    .spawn(backup(inner.clone(), job, run, retry_at, view.store_now));
                true
            }
            RunState::Finished(FinalState::Failed) => {
                tracing::info!("failed; no retry: it would be due after the job's next slot");
                false
            }
            _ => {
                tracing::info!("failed; another instance has taken the run on since");
                true
            }
        },
        Err(error) => {
            // Watch anyway, from this instance's clock: the backup reads
            // the run again before it claims, so an early look costs a
            // read, never a run. Alone, this instance is the only one that
            // would ever retry it. (Whether the store made a retry is not
            // known: no alert is raised, rather than a false one.)
            tracing::warn!(%error, "could not read the run after its failure; watching it for its retry anyway");
            let now = inner.clock.now();
            let due = now.saturating_add(after);
            inner.tasks.spawn(backup(inner.clone(), job, run, due, now));
            true
        }
    }
}

/// Whether the store's record of `run` says it ended `ended` by `attempt`
/// of `instance` (not, say, `replaced` meanwhile): what a retried `finish`
/// told `Fenced` checks before it
/// reports the outcome as not recorded.
async fn finished_by(
    store: &dyn LeaseStore,
    run: &RunKey,
    attempt: crate::ids::Attempt,
    instance: &crate::ids::InstanceId,
    ended: FinalState,
) -> bool {
    /// The run just finished is among a job's newest records; past this
    /// many the answer stays "not recorded".
    const LOOK_BACK: usize = 50;
    let Ok(records) = within(CALL_TIMEOUT, store.history(&run.job, LOOK_BACK)).await else {
        return false;
    };
    records.iter().any(|r| {
        r.run == *run
            && r.state == crate::store::RecordState::Finished(ended)
            && r.attempt == Some(attempt)
            && r.instance.as_ref() == Some(instance)
    })
}

/// Sends one heartbeat, waiting at most `limit`, and notes the result.
/// While a handler runs, `limit` is the lease surely left: a heartbeat that
/// hangs must not hold the runner past its lease. Before the handler
/// starts it is the call timeout.
async fn renew(
    store: &dyn LeaseStore,
    run: &RunKey,
    token: Token,
    clock: &mut LeaseClock,
    span: &tracing::Span,
    limit: Duration,
) -> Renew {
    let sent = Instant::now();
    let left = limit.max(Duration::from_millis(1));
    let answer = timed(
        "heartbeat",
        within(left, store.heartbeat(run, token, clock.lease())),
    )
    .instrument(span.clone())
    .await;
    if let Err(error) = &answer {
        span.in_scope(|| tracing::warn!(%error, "heartbeat failed"));
    }
    clock.heartbeat_ended(sent, Instant::now(), answer.ok())
}

/// Renews a lease whose handler has not started yet; `false` when it must
/// never start: fenced (another instance holds the run), or no lease left
/// (handed over, if the store answers).
async fn renew_before_start(
    inner: &Inner,
    store: &dyn LeaseStore,
    run: &RunKey,
    token: Token,
    clock: &mut LeaseClock,
    span: &tracing::Span,
) -> bool {
    // No handler runs yet, so waiting for an answer costs nothing but
    // time: each try may take a whole call timeout, and a lease that may
    // have run out meanwhile is asked about again. `Renewed` proves the
    // token still held the run, and the new lease counts from that send.
    for _ in 0..STORE_TRIES {
        match renew(store, run, token, clock, span, CALL_TIMEOUT).await {
            Renew::Held | Renew::Failed if !clock.expired(Instant::now()) => return true,
            Renew::Fenced => {
                inner.metrics.count(&run.job, Event::Fenced);
                span.in_scope(|| {
                    tracing::warn!(
                        "fenced before the handler started: another instance holds this run now"
                    )
                });
                return false;
            }
            Renew::Held | Renew::Failed | Renew::Expired => {}
        }
    }
    span.in_scope(|| {
        tracing::error!(
            "no lease left before the handler started; not starting it, handing the run over"
        )
    });
    hand_over(inner, store, run, token, Started::No).await;
    false
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn panic_message(join: tokio::task::JoinError) -> String {
    if join.is_cancelled() {
        return "handler task was cancelled".into();
    }
    let payload = join.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    format!("handler panicked: {text}")
}

/// Whether a run's handler started before the run was handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started {
    /// It started: the attempt is used, and a takeover is the next one.
    Yes,
    /// It never started: the run is given back and its attempt with it.
    No,
}

/// Releases (or gives back) the run for a backup, and counts the attempt:
/// handed over when the store took it, fenced when another instance holds
/// the run already or the store cannot be reached (its lease runs out).
async fn hand_over(
    inner: &Inner,
    store: &dyn LeaseStore,
    run: &RunKey,
    token: Token,
    started: Started,
) {
    let answer = match started {
        Started::Yes => with_retries("release", || store.release(run, token)).await,
        Started::No => with_retries("give back", || store.give_back(run, token)).await,
    };
    match answer {
        Ok(Renewal::Renewed) => {
            inner.metrics.count(&run.job, Event::HandedOver);
            tracing::info!(job = %run.job, slot = %run.slot, ?started, "run handed over for a backup to take over");
        }
        Ok(Renewal::Fenced) => inner.metrics.count(&run.job, Event::Fenced),
        Err(error) => {
            inner.metrics.count(&run.job, Event::Fenced);
            tracing::warn!(%error, job = %run.job, slot = %run.slot, "could not hand the run over; a backup takes over when its lease runs out");
        }
    }
}

/// Watches a run another instance holds; takes it over when its lease runs
/// out. Costs one read per lease period while the lease is alive.
pub(crate) async fn backup(
    inner: Arc<Inner>,
    job: Arc<JobSpec>,
    run: RunKey,
    mut lease_until: Timestamp,
    mut store_now: Timestamp,
) {
    let StoreHandle::Lease(store) = &inner.store else {
        return;
    };
    loop {
        // Until the holder's lease ends, or news that it handed the run
        // over; either way the run is read again.
        let mut wait = lease_until.since(store_now) + BACKUP_MARGIN;
        if job.overlap == Overlap::BufferOne {
            // A waiting slot starts as soon as the run before it ends, which
            // no news announces: its watchers look once a heartbeat.
            wait = wait.min(inner.heartbeat);
        }
        tokio::select! {
            _ = store.wait_for_hand_over(&run, wait) => {}
            () = inner.stop.cancelled() => return,
        }
        let view = match with_retries("peek", || store.peek(&run)).await {
            Ok(view) => {
                inner
                    .metrics
                    .observe_store_clock(view.store_now, inner.clock.now());
                view
            }
            Err(error) => {
                tracing::warn!(%error, job = %run.job, slot = %run.slot, "backup could not read the run; trying again after a heartbeat");
                lease_until = store_now.saturating_add(inner.heartbeat);
                continue;
            }
        };
        match view.state {
            RunState::Running {
                lease_until: until, ..
            }
            | RunState::RetryPending {
                retry_at: until, ..
            } if until >= view.store_now => {
                lease_until = until;
                store_now = view.store_now;
                continue;
            }
            // A lease ran out, a retry is due, or a waiting slot may start:
            // the claim decides which.
            RunState::Running { .. } | RunState::RetryPending { .. } | RunState::Waiting { .. } => {
            }
            RunState::Absent | RunState::Missed | RunState::Finished(_) => return,
        }
        // The lease ran out: try to take over, under the store's lock.
        let claim = lease_claim(&inner, &job, run.slot, Token::generate());
        let sent_at = Instant::now();
        match with_retries("claim", || store.claim_lease(&claim)).await {
            Ok(ClaimOutcome::Running {
                lease_until: until,
                store_now: now,
            }) => {
                lease_until = until;
                store_now = now;
            }
            Ok(outcome) => {
                if matches!(outcome, ClaimOutcome::Won(_)) {
                    tracing::info!(job = %run.job, slot = %run.slot, "the lease ran out; taking over");
                }
                handle_outcome(&inner, job, claim, outcome, sent_at, None, None);
                return;
            }
            Err(error) => {
                inner.metrics.count(&run.job, Event::StoreError);
                tracing::warn!(%error, job = %run.job, slot = %run.slot, "takeover claim failed; still watching");
                lease_until = view.store_now.saturating_add(inner.heartbeat);
                store_now = view.store_now;
            }
        }
    }
}
