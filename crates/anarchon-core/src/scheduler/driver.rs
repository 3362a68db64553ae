//! The timer queue and the claims it fires.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::calls::{
    CALL_TIMEOUT, FIRST_BACKOFF, MAX_CLAIM_AHEAD, MIN_CLAIM_AHEAD, STORE_TRIES, lease_claim, timed,
    with_retries_until, within,
};
use super::metrics::{Event, Metrics};
use super::run::handle_outcome;
use super::{Inner, JobSpec, StoreHandle};
use crate::ids::Token;
use crate::store::{ClaimRequest, LeaseClaim, LeaseStore, Overlap, Renewal, RunKey};
use crate::time::{Slot, Timestamp, millis};

/// The longest the timer sleeps before it looks at the wall clock again, so
/// a clock step or a suspend is noticed within this long.
const MAX_NAP: Duration = Duration::from_secs(1);
/// The head start claims get now.
pub(crate) fn claim_ahead(inner: &Inner) -> Duration {
    Duration::from_millis(
        inner
            .claim_ahead_ms
            .load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// Learns from a batch that took `took`: twice that, or what we had decayed
/// by a tenth, within the bounds. A longer head start wakes the timer: it
/// may be asleep until the next slot's claim time as the shorter one put it.
fn learn_claim_time(inner: &Inner, took: Duration) {
    let had = claim_ahead(inner);
    let next = (took * 2)
        .max(had.mul_f64(0.9))
        .clamp(MIN_CLAIM_AHEAD, MAX_CLAIM_AHEAD);
    inner
        .claim_ahead_ms
        .store(millis(next) as u64, std::sync::atomic::Ordering::Relaxed);
    if next > had {
        inner.claim_ahead_grew.notify_one();
    }
}
/// The most claims sent in one `claim_many` call.
const BATCH_LIMIT: usize = 1000;
/// How often lease stores are asked to forget old runs.
const GC_EVERY: Duration = Duration::from_secs(3600);
/// How long one collection may take before it is given up until the next.
const GC_TIMEOUT: Duration = Duration::from_secs(300);

/// The offset of a slot's claim inside the job's jitter: FNV-1a of the job
/// name and the slot, so every instance (and every build) picks the same.
pub(crate) fn jitter_offset(job: &JobSpec, slot: Slot) -> Duration {
    let Some(jitter) = job.jitter else {
        return Duration::ZERO;
    };
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in job
        .name
        .as_str()
        .bytes()
        .chain(slot.as_millis().to_le_bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let span = u64::try_from(millis(jitter)).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(hash % span)
}

/// The queue: (fire time, job index) → (slot, whether the job's catch-up
/// was already limited on the way to this slot).
type Queue = BTreeMap<(Timestamp, usize), (Slot, bool)>;

/// A slot to claim now, and when its handler may start.
#[derive(Debug)]
pub(crate) struct Due {
    pub(crate) index: usize,
    pub(crate) slot: Slot,
    pub(crate) fire_at: Timestamp,
    /// Whether the timer reached this slot after its fire time, with the
    /// job's catch-up window still open: it runs only when a place among
    /// the caught-up runs is free.
    pub(crate) caught_up: bool,
    /// For a caught-up slot, its place among the runs this instance catches
    /// up at once; held until its handler ends.
    pub(crate) permit: Option<OwnedSemaphorePermit>,
}

fn enqueue(queue: &mut Queue, jobs: &[Arc<JobSpec>], index: usize, slot: Slot, limited: bool) {
    let fire_at = slot.at().saturating_add(jitter_offset(&jobs[index], slot));
    queue.insert((fire_at, index), (slot, limited));
}

/// How many of `job`'s slots lie after `after` and before `now`, counting
/// no further than `cap`.
fn missed_after(job: &JobSpec, after: Timestamp, now: Timestamp, cap: usize) -> usize {
    let before_now = Timestamp::from_millis(now.as_millis() - 1);
    job.schedule.slots_between(after, before_now, cap).len()
}

/// The first slot to catch up of those from `from` to `now`: `from` itself
/// when at most the job's `catch_up_limit` slots lie in between, otherwise
/// the oldest of the newest `limit` (found by halving the span, so a dense
/// schedule with a long window costs no more than a few dozen counts of
/// `limit` slots). The older ones are passed over, and the log says so.
fn limit_catch_up(job: &JobSpec, from: Slot, now: Timestamp) -> Option<Slot> {
    let limit = job.catch_up_limit;
    let before_from = Timestamp::from_millis(from.as_millis() - 1);
    if missed_after(job, before_from, now, limit + 1) <= limit {
        return Some(from);
    }
    // Halve (too_many, few_enough]: more than `limit` slots lie after
    // `too_many`, at most `limit` after `few_enough`. When they are 1 ms
    // apart, exactly `limit` slots lie after `few_enough`.
    let (mut too_many, mut few_enough) = (before_from.as_millis(), now.as_millis());
    while few_enough - too_many > 1 {
        let mid = too_many + (few_enough - too_many) / 2;
        if missed_after(job, Timestamp::from_millis(mid), now, limit + 1) > limit {
            too_many = mid;
        } else {
            few_enough = mid;
        }
    }
    let first = job.schedule.next_after(Timestamp::from_millis(few_enough));
    tracing::warn!(
        job = %job.name,
        from = %from,
        to = ?first,
        limit,
        "more than {limit} missed slots are inside the catch-up window: only the newest {limit} are caught up (catch_up_limit); the older ones are not claimed"
    );
    first
}

pub(crate) async fn drive(inner: Arc<Inner>) {
    let jobs = inner.jobs.clone();
    let mut queue = Queue::new();
    // Caught-up slots waiting for a place to run: (slot, job index) → due,
    // so the oldest, over all jobs, goes first. A job's later slots wait
    // behind its caught-up ones, so each job's runs start in slot order.
    let mut backlog: BTreeMap<(Slot, usize), Due> = BTreeMap::new();
    let mut waiting = vec![0_usize; jobs.len()];
    let permits = inner.catch_up_permits.clone();
    let start = inner.clock.now();
    for (index, job) in jobs.iter().enumerate() {
        // Without catch-up the first slot is the next one; with it, the
        // oldest slot inside the window, so missed runs are claimed now
        // (no more than the job's limit: `take_due` sees to that).
        let after = match job.catch_up {
            Some(window) => start.saturating_sub(window),
            None => Timestamp::from_millis(start.as_millis() - 1),
        };
        if let Some(slot) = job.schedule.next_after(after) {
            enqueue(&mut queue, &jobs, index, slot, false);
        }
    }
    if let StoreHandle::Lease(_) = inner.store {
        inner.tasks.spawn(collect_garbage(inner.clone()));
        inner.tasks.spawn(super::requests::watch(inner.clone()));
    }
    loop {
        // Free places go to the oldest waiting caught-up slots.
        let mut ready = Vec::new();
        while let Some(entry) = backlog.first_entry() {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                break;
            };
            let mut due = entry.remove();
            waiting[due.index] -= 1;
            due.permit = Some(permit);
            ready.push(due);
        }
        if !ready.is_empty() {
            spawn_claims(&inner, ready, inner.clock.now());
        }
        let now = inner.clock.now();
        let ahead = claim_ahead(&inner);
        let nap = match queue.first_key_value() {
            Some((&(fire_at, _), _)) => {
                let claim_at = fire_at.saturating_sub(ahead);
                (claim_at > now).then(|| claim_at.since(now).min(MAX_NAP))
            }
            None => Some(MAX_NAP),
        };
        if let Some(nap) = nap {
            tokio::select! {
                () = tokio::time::sleep(nap) => continue,
                () = inner.claim_ahead_grew.notified() => continue,
                _ = permits.acquire(), if !backlog.is_empty() => continue,
                () = inner.stop.cancelled() => return,
            }
        }
        if inner.stop.is_cancelled() {
            return;
        }
        let ask_store = matches!(inner.store, StoreHandle::Lease(_));
        let due = take_due(&mut queue, &jobs, now, ahead, ask_store, &inner.metrics);
        let mut on_time = Vec::new();
        for d in due {
            if d.caught_up || waiting[d.index] > 0 {
                waiting[d.index] += 1;
                backlog.insert((d.slot, d.index), d);
            } else {
                on_time.push(d);
            }
        }
        if !on_time.is_empty() {
            spawn_claims(&inner, on_time, now);
        }
    }
}

/// Starts the claims of `due` as of `now`: at once, except those of a job
/// whose overlap rule looks at its other runs, which are claimed at their
/// fire time, not ahead of it. The store judges "another run is still
/// going" when the claim arrives, and a run that ends in the head start
/// before the slot must not get the slot skipped, replace it or make it
/// wait. (Such a handler starts a round trip after the fire time instead
/// of at it.)
fn spawn_claims(inner: &Arc<Inner>, due: Vec<Due>, now: Timestamp) {
    let (ahead_ok, held): (Vec<Due>, Vec<Due>) = due
        .into_iter()
        .partition(|d| d.fire_at <= now || inner.jobs[d.index].overlap == Overlap::Allow);
    if !ahead_ok.is_empty() {
        inner.tasks.spawn(claim_batch(inner.clone(), ahead_ok));
    }
    let mut by_fire_time: BTreeMap<Timestamp, Vec<Due>> = BTreeMap::new();
    for d in held {
        by_fire_time.entry(d.fire_at).or_default().push(d);
    }
    for (fire_at, due) in by_fire_time {
        inner
            .tasks
            .spawn(claim_at_fire_time(inner.clone(), fire_at, due));
    }
}

/// Claims `due` once the instance's clock reaches `fire_at` (see the
/// timer's loop: the overlap rules judge other runs at the slot's time).
async fn claim_at_fire_time(inner: Arc<Inner>, fire_at: Timestamp, due: Vec<Due>) {
    loop {
        let now = inner.clock.now();
        if now >= fire_at {
            break;
        }
        // Napped in steps, so that a clock step is noticed as the timer
        // notices it.
        tokio::select! {
            () = tokio::time::sleep(fire_at.since(now).min(MAX_NAP)) => {}
            () = inner.stop.cancelled() => return,
        }
    }
    claim_batch(inner, due).await;
}

/// How many slots of one job that the timer finds too old are sent to a
/// lease store at one wake, to be recorded `missed`; past that they are
/// only counted in the log.
const MISSED_REPORT_LIMIT: usize = 100;

/// Pops every entry due for its claim at `now` (fire time within `ahead`),
/// queues each job's next slot, and returns the slots to claim, oldest
/// first. If a job fell far behind (a long suspend, a clock step) it jumps
/// straight to its window instead of walking every slot in between, and a
/// job with `catch_up` claims no more than its `catch_up_limit` of the
/// slots it fell behind by.
///
/// Slots older than their job's window by this instance's clock are not
/// dropped here when `ask_store` (a lease store): they are claimed like any
/// other, and the store decides on its own clock — it records `missed` and
/// answers `Late`, or, if this clock was wrong, the slot runs. At most
/// [`MISSED_REPORT_LIMIT`] such slots per job and wake go to the store.
/// Claim-only stores cannot record a miss; there the slots are skipped and
/// logged.
fn take_due(
    queue: &mut Queue,
    jobs: &[Arc<JobSpec>],
    now: Timestamp,
    ahead: Duration,
    ask_store: bool,
    metrics: &Metrics,
) -> Vec<Due> {
    let mut due = Vec::new();
    while let Some(entry) = queue.first_entry() {
        if entry.key().0 > now.saturating_add(ahead) {
            break;
        }
        let ((fire_at, index), (slot, mut limited)) = entry.remove_entry();
        let job = &jobs[index];
        // Older than the job's `max_late` (at start, or after a suspend)
        // but inside its window: a caught-up slot, which only `catch_up`
        // lets run and which waits for a catch-up place. A slot merely
        // claimed after its fire time (the timer woke late, the clock
        // stepped a little) is on time and never waits. (A slot past the
        // window is reported to the store below, to be recorded missed.)
        let age = now.since(slot.at());
        let caught_up = job.catch_up.is_some() && age > job.max_late && age <= job.window();
        if caught_up && !limited {
            // Claim no more than the job's limit of the slots up to now,
            // once per fall.
            limited = true;
            if let Some(from) = limit_catch_up(job, slot, now)
                && from != slot
            {
                enqueue(queue, jobs, index, from, true);
                continue;
            }
        }
        let window = job.window();
        let too_old = |s: Slot| now.since(s.at()) > window;
        if !too_old(slot) || ask_store {
            due.push(Due {
                index,
                slot,
                fire_at,
                caught_up,
                permit: None,
            });
        } else {
            metrics.count(&job.name, Event::Late);
            tracing::warn!(job = %job.name, %slot, late_by = ?now.since(slot.at()), "slot skipped: the timer woke too late to claim it");
        }
        let mut next = job.schedule.next_after(slot.at());
        if next.is_some_and(too_old) {
            let resume = job.schedule.next_after(now.saturating_sub(window));
            // A lease store records the passed-over slots `missed` (up to
            // a limit): walk them from the oldest.
            let mut asked = 0;
            let mut walk = next;
            while ask_store && asked < MISSED_REPORT_LIMIT {
                let Some(old) = walk.filter(|s| Some(*s) != resume && too_old(*s)) else {
                    break;
                };
                // Asked with its own time as the fire time: that is past,
                // so a slot the store still allows runs at once.
                due.push(Due {
                    index,
                    slot: old,
                    fire_at: old.at(),
                    caught_up: false,
                    permit: None,
                });
                asked += 1;
                walk = job.schedule.next_after(old.at());
            }
            tracing::warn!(job = %job.name, from = ?next, to = ?resume, asked, "the timer fell behind: slots older than the late window are passed over; the store records those asked about as missed");
            metrics.count(&job.name, Event::Late);
            next = resume;
            limited = false;
        }
        if let Some(next) = next {
            // The limit holds for this fall while the job is still behind.
            let still_behind = limited && next.at() < now;
            enqueue(queue, jobs, index, next, still_behind);
        }
    }
    due.sort_by_key(|d| d.slot);
    due
}

/// Claims one batch on a lease store and acts on each answer.
///
/// While the store gives no answer at all, the whole batch is sent again
/// with the same tokens. A claim that failed on its own is sent again alone
/// (with the others still pending) while its error is temporary; one that
/// cannot be settled is given up, and given back in case the store took it,
/// so that a win the answer did not reach is handed to a backup at once
/// rather than when its lease runs out. One job's bad data never costs the
/// other claims of the batch their answers.
async fn claim_lease_batch(
    inner: &Arc<Inner>,
    store: &Arc<dyn LeaseStore>,
    pending: Vec<(Due, LeaseClaim)>,
    sent_at: Instant,
) {
    let mut pending = pending;
    let mut backoff = FIRST_BACKOFF;
    for tries in 1..=STORE_TRIES {
        let batch: Vec<LeaseClaim> = pending.iter().map(|(_, c)| c.clone()).collect();
        let last = tries == STORE_TRIES;
        let answers = match timed("claim", within(CALL_TIMEOUT, store.claim_many(&batch))).await {
            Ok(answers) if answers.len() == batch.len() => answers,
            Ok(answers) => {
                Metrics::add(&inner.metrics.store_errors);
                tracing::error!(
                    sent = batch.len(),
                    answered = answers.len(),
                    "the store answered a batch claim with the wrong number of outcomes"
                );
                give_up(inner, store, pending);
                return;
            }
            Err(error) if error.is_temporary() && !last => {
                tracing::debug!(%error, tries, "claim failed; trying again with the same tokens");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                continue;
            }
            Err(error) => {
                Metrics::add(&inner.metrics.store_errors);
                tracing::error!(%error, claims = batch.len(), "claim failed; a run this instance may have won is given back");
                give_up(inner, store, pending);
                return;
            }
        };
        let mut again = Vec::new();
        let mut failed = Vec::new();
        for ((d, claim), answer) in pending.into_iter().zip(answers) {
            match answer {
                Ok(outcome) => {
                    let job = inner.jobs[d.index].clone();
                    handle_outcome(
                        inner,
                        job,
                        claim,
                        outcome,
                        sent_at,
                        Some(d.fire_at),
                        d.permit,
                    );
                }
                Err(error) if error.is_temporary() && !last => again.push((d, claim)),
                Err(error) => {
                    Metrics::add(&inner.metrics.store_errors);
                    tracing::error!(%error, job = %claim.run().job, slot = %claim.run().slot, "claim failed; the others of its batch go on");
                    failed.push((d, claim));
                }
            }
        }
        give_up(inner, store, failed);
        if again.is_empty() {
            return;
        }
        pending = again;
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
}

/// Gives back claims whose answer never came, in case the store took them:
/// `give_back` is token-checked, so a claim that was not won changes
/// nothing, and a win this instance never ran does not use up an attempt.
fn give_up(inner: &Arc<Inner>, store: &Arc<dyn LeaseStore>, claims: Vec<(Due, LeaseClaim)>) {
    for (_, claim) in claims {
        let store = store.clone();
        inner.tasks.spawn(async move {
            let run = claim.run();
            match timed("give back", within(CALL_TIMEOUT, store.give_back(run, claim.claim.token))).await {
                Ok(Renewal::Renewed) => {
                    tracing::warn!(job = %run.job, slot = %run.slot, "a claim whose answer was lost had been won: given back for a backup");
                }
                Ok(Renewal::Fenced) => {}
                Err(error) => {
                    tracing::debug!(%error, job = %run.job, slot = %run.slot, "could not give back a claim whose answer was lost");
                }
            }
        });
    }
}

pub(crate) async fn claim_batch(inner: Arc<Inner>, due: Vec<Due>) {
    let sent_at = Instant::now();
    claim_due(&inner, due, sent_at).await;
    learn_claim_time(&inner, sent_at.elapsed());
}

async fn claim_due(inner: &Arc<Inner>, due: Vec<Due>, sent_at: Instant) {
    match &inner.store {
        StoreHandle::Lease(store) => {
            let mut due = due.into_iter().peekable();
            while due.peek().is_some() {
                let chunk: Vec<(Due, LeaseClaim)> = due
                    .by_ref()
                    .take(BATCH_LIMIT)
                    .map(|d| {
                        let claim =
                            lease_claim(inner, &inner.jobs[d.index], d.slot, Token::generate());
                        (d, claim)
                    })
                    .collect();
                claim_lease_batch(inner, store, chunk, sent_at).await;
            }
        }
        StoreHandle::Claim(store) => {
            let claims = due.iter().map(|d| {
                let job = inner.jobs[d.index].clone();
                let store = store.clone();
                let inner = inner.clone();
                let (slot, fire_at) = (d.slot, d.fire_at);
                async move {
                    let req = ClaimRequest {
                        run: RunKey::new(job.name.clone(), slot),
                        token: Token::generate(),
                        instance: inner.instance.clone(),
                        max_late: job.max_late,
                    };
                    // The store remembers the run for `max_late` plus a
                    // margin: every try must be sent, and answered, inside
                    // the late window by this instance's clock.
                    let left = slot
                        .at()
                        .saturating_add(job.max_late)
                        .since(inner.clock.now());
                    let deadline = Instant::now() + left;
                    let answer =
                        with_retries_until("claim", Some(deadline), || store.claim(&req)).await;
                    match answer {
                        Ok(outcome) => {
                            let claim = LeaseClaim::from_plain(&req);
                            handle_outcome(
                                &inner,
                                job,
                                claim,
                                outcome,
                                sent_at,
                                Some(fire_at),
                                None,
                            );
                        }
                        Err(error) => {
                            Metrics::add(&inner.metrics.store_errors);
                            tracing::error!(%error, job = %req.run.job, slot = %req.run.slot, "claim failed; the slot is not run by this instance");
                        }
                    }
                }
            });
            join_all(claims).await;
        }
    }
}

async fn collect_garbage(inner: Arc<Inner>) {
    let StoreHandle::Lease(store) = &inner.store else {
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(GC_EVERY) => {}
            () = inner.stop.cancelled() => return,
        }
        // Shutdown (which waits for this task) does not wait for a
        // collection, and a store that hangs does not hold it for ever: a
        // collection cut short is done again at the next turn (each of its
        // deletions stands on its own). It gets longer than a claim: it
        // may page through many records.
        let collected = tokio::select! {
            collected = within(GC_TIMEOUT, store.collect_garbage(inner.keep)) => collected,
            () = inner.stop.cancelled() => return,
        };
        match collected {
            Ok(deleted) => tracing::debug!(deleted, "collected old run records"),
            Err(error) => tracing::warn!(%error, "could not collect old run records"),
        }
    }
}
