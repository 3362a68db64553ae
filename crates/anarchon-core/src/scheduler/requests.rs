//! Manual runs: how a running scheduler hears of an operator's "run now"
//! and claims the run.
//!
//! The store announces every new request ([`LeaseStore::announcements`]);
//! the scheduler then reads the requests and claims each recent manual run
//! of a job it has, at once, like a slot that is due, and starts a worker
//! for each backfill of such a job. It also reads the requests when it
//! starts, whenever it may have missed news (its receiver lagged, or the
//! store's listener reconnected) and every ten minutes, so a request made
//! while no instance was up, or whose news was lost, still runs. The claims decide
//! who runs what: one instance wins each run, the others are its backups.
//!
//! A backfill worker walks its range's slots oldest first. It claims each
//! with a late window that covers it, as a claim that may re-run a paused
//! slot (so a slot with no record, or a `missed` or `paused` one, runs;
//! one that ran answers `Done`) and waits until the
//! slot's run has ended before it claims the next, taking the run over if
//! its runner dies. Every instance walks the same slots in the same order,
//! so the fleet runs one slot of the backfill at a time; one worker per
//! job at a time in each instance keeps two backfills of a job apart.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::calls::{CALL_TIMEOUT, lease_claim, timed, within};
use super::driver::{Due, claim_batch};
use super::run::handle_outcome;
use super::{Inner, MANUAL_RUN_WINDOW, StoreHandle};
use crate::ids::Token;
use crate::name::JobName;
use crate::request::{Backfill, RequestId, RunRequest};
use crate::store::{ClaimOutcome, LeaseStore, RunKey, RunState};
use crate::time::Slot;

/// How often a backfill worker reads the run it waits for.
const BACKFILL_POLL: Duration = Duration::from_millis(250);

/// What the watcher has acted on: manual runs claimed, backfills started,
/// and one lock per job so its backfills take turns.
#[derive(Default)]
struct Seen {
    claimed: BTreeSet<RunKey>,
    backfills: BTreeSet<(JobName, RequestId)>,
    turns: HashMap<JobName, Arc<tokio::sync::Mutex<()>>>,
}

/// How long after the latest news the scheduler reads the store's requests
/// again by itself, in case news was lost without a lag showing it (a
/// listener that reconnected). Long enough that an idle fleet costs the
/// store next to nothing.
const READ_AGAIN_EVERY: Duration = Duration::from_secs(600);

pub(crate) async fn watch(inner: Arc<Inner>) {
    let StoreHandle::Lease(store) = &inner.store else {
        return;
    };
    // Subscribe before the first read, so a request made in between is
    // heard, not lost.
    let mut news = store.announcements();
    let mut reconnects = store.hand_overs().reconnections();
    let mut seen = Seen::default();
    read_requests(&inner, store, &mut seen).await;
    loop {
        let heard = tokio::select! {
            heard = news.recv() => heard,
            // The listener reconnected: news sent meanwhile is lost.
            Ok(()) = reconnects.changed() => Err(RecvError::Lagged(0)),
            () = tokio::time::sleep(READ_AGAIN_EVERY) => Err(RecvError::Lagged(0)),
            () = inner.stop.cancelled() => return,
        };
        match heard {
            // A request of a job this instance has: read what it asks.
            Ok(run) if run.slot.is_manual() && inner.jobs.iter().any(|j| j.name == run.job) => {
                read_requests(&inner, store, &mut seen).await;
            }
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => read_requests(&inner, store, &mut seen).await,
            Err(RecvError::Closed) => {
                inner.stop.cancelled().await;
                return;
            }
        }
    }
}

/// Claims the runs of the store's manual-run requests that are young
/// enough to run, and starts a worker for each backfill not started yet.
async fn read_requests(inner: &Arc<Inner>, store: &Arc<dyn LeaseStore>, seen: &mut Seen) {
    let requests = match within(CALL_TIMEOUT, store.run_requests()).await {
        Ok(requests) => requests,
        Err(error) => {
            tracing::warn!(%error, "could not read the manual-run requests; they are read again later");
            return;
        }
    };
    let oldest = requests.store_now.saturating_sub(MANUAL_RUN_WINDOW);
    // Forget what is too old to be announced again.
    seen.claimed.retain(|run: &RunKey| run.slot.at() >= oldest);
    for request in requests.requests {
        match (request.run(), request.backfill) {
            (Some(run), _) if request.requested_at >= oldest => {
                claim(inner, run, &mut seen.claimed).await;
            }
            (None, Some(range)) => start_backfill(inner, store, seen, request, range),
            _ => {}
        }
    }
}

/// Starts the worker of one backfill, once per request.
fn start_backfill(
    inner: &Arc<Inner>,
    store: &Arc<dyn LeaseStore>,
    seen: &mut Seen,
    request: RunRequest,
    range: Backfill,
) {
    let Some(index) = inner.jobs.iter().position(|j| j.name == request.job) else {
        return;
    };
    if !seen
        .backfills
        .insert((request.job.clone(), request.id.clone()))
    {
        return;
    }
    let turn = seen.turns.entry(request.job.clone()).or_default().clone();
    let (inner, store) = (inner.clone(), store.clone());
    inner.clone().tasks.spawn(async move {
        let _turn = turn.lock().await;
        tracing::info!(job = %request.job, request = %request.id, from = %range.from(), to = %range.to(), "backfill started");
        backfill(&inner, &store, index, range).await;
        tracing::info!(job = %request.job, request = %request.id, "backfill done");
    });
}

/// The pause after a backfill claim failed, cut short by shutdown.
async fn pause_unless_stopped(inner: &Inner) {
    tokio::select! {
        () = tokio::time::sleep(MANUAL_RUN_WINDOW / 100) => {}
        () = inner.stop.cancelled() => {}
    }
}

/// How many backfill claims in a row the store may refuse for good (each
/// slot then left out) before the backfill stops.
const BACKFILL_REFUSALS: u32 = 3;

/// Runs the slots of `range` that never ran, oldest first, one at a time.
async fn backfill(inner: &Arc<Inner>, store: &Arc<dyn LeaseStore>, index: usize, range: Backfill) {
    let job = inner.jobs[index].clone();
    // Claims the store refused for good, one slot after the other: past
    // [`BACKFILL_REFUSALS`] the refusal is the job's, not a slot's.
    let mut refused_in_a_row = 0;
    let mut after = range.from().saturating_sub(Duration::from_millis(1));
    while let Some(slot) = job
        .schedule
        .next_after(after)
        .filter(|s| s.at() <= range.to())
    {
        after = slot.at();
        // One token per claim: a claim sent again after an error keeps it,
        // so that if the store took the claim whose answer was lost, the
        // claim sent again is told `Won` (its own) rather than `Running`,
        // which would leave the won run to wait out its lease.
        let mut token = Token::generate();
        // The lease is counted from the claim's first send, as the timer's
        // claims count it: a claim sent again may be told it won a lease
        // that started at that first send.
        let mut first_sent: Option<Instant> = None;
        loop {
            if inner.stop.is_cancelled() {
                return;
            }
            let mut claim = lease_claim(inner, &job, slot, token);
            // A window that covers the slot, on any clock a little off; and
            // a slot recorded `paused` may run too.
            claim.claim.max_late = inner.clock.now().since(slot.at()) + MANUAL_RUN_WINDOW;
            claim.rerun_paused = true;
            let sent_at = *first_sent.get_or_insert_with(Instant::now);
            let outcome = match timed("claim", within(CALL_TIMEOUT, store.claim_lease(&claim)))
                .await
            {
                Ok(outcome) => outcome,
                Err(error) if error.is_temporary() => {
                    tracing::warn!(%error, job = %job.name, %slot, "backfill claim failed; trying again");
                    pause_unless_stopped(inner).await;
                    continue;
                }
                // Sending it again cannot help (the store refuses the
                // claim itself): the slot is left out, and given back in
                // case an earlier send of this claim was taken.
                Err(error) => {
                    let run = RunKey::new(job.name.clone(), slot);
                    let _ = within(CALL_TIMEOUT, store.give_back(&run, token)).await;
                    refused_in_a_row += 1;
                    if refused_in_a_row >= BACKFILL_REFUSALS {
                        tracing::error!(%error, job = %job.name, %slot, "backfill claims refused by the store {refused_in_a_row} times in a row; the backfill stops here");
                        return;
                    }
                    tracing::error!(%error, job = %job.name, %slot, "backfill claim refused by the store; this slot is left out");
                    pause_unless_stopped(inner).await;
                    break;
                }
            };
            refused_in_a_row = 0;
            // A claim of this slot after this one (a takeover once its
            // lease ran out) is a claim of its own.
            token = Token::generate();
            first_sent = None;
            match outcome {
                ClaimOutcome::Won(_) => {
                    let run = claim.claim.run.clone();
                    let now = inner.clock.now();
                    handle_outcome(inner, job.clone(), claim, outcome, sent_at, Some(now), None);
                    if !wait_until_ended(inner, store, &run).await {
                        continue;
                    }
                    break;
                }
                ClaimOutcome::Running { .. } => {
                    if !wait_until_ended(inner, store, &claim.claim.run).await {
                        // Its lease ran out: claim it again, a takeover.
                        continue;
                    }
                    break;
                }
                // This claim ended the run, or recorded the slot missed:
                // that is told as any claim's answer is; then the next.
                ClaimOutcome::Interrupted | ClaimOutcome::Missed => {
                    handle_outcome(inner, job.clone(), claim, outcome, sent_at, None, None);
                    break;
                }
                // Ran already, skipped, paused, late or not for us: next.
                _ => break,
            }
        }
    }
}

/// Waits until `run` is no longer going: `true` when it ended, `false`
/// when a claim is due — its lease ran out on the store's clock (a
/// takeover), its retry is due, or it waits for another run of the job
/// (a `buffer-one` slot: the claim starts it once that run ended).
async fn wait_until_ended(inner: &Arc<Inner>, store: &Arc<dyn LeaseStore>, run: &RunKey) -> bool {
    loop {
        if inner.stop.is_cancelled() {
            return true;
        }
        tokio::time::sleep(BACKFILL_POLL).await;
        match timed("peek", within(CALL_TIMEOUT, store.peek(run))).await {
            Ok(view) => match view.state {
                RunState::Running { lease_until, .. } if lease_until < view.store_now => {
                    return false;
                }
                RunState::RetryPending { retry_at, .. } if retry_at < view.store_now => {
                    return false;
                }
                RunState::Waiting { .. } => return false,
                RunState::Running { .. } | RunState::RetryPending { .. } => {}
                RunState::Absent | RunState::Missed | RunState::Finished(_) => return true,
            },
            Err(error) => {
                tracing::debug!(%error, %run, "could not read a backfilled run; reading again");
            }
        }
    }
}

/// Claims one manual run if this instance has its job and has not claimed
/// it yet.
async fn claim(inner: &Arc<Inner>, run: RunKey, claimed: &mut BTreeSet<RunKey>) {
    let Some(index) = inner.jobs.iter().position(|j| j.name == run.job) else {
        return;
    };
    if !claimed.insert(run.clone()) {
        return;
    }
    let slot: Slot = run.slot;
    tracing::info!(job = %run.job, %slot, "manual run requested");
    let due = Due {
        index,
        slot,
        fire_at: inner.clock.now(),
        caught_up: false,
        permit: None,
    };
    inner.tasks.spawn(claim_batch(inner.clone(), vec![due]));
}
