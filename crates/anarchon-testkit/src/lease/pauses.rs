//! Pauses: an operator's pause holds for every instance, in the claim's
//! own atomic step, on the store's clock.

use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, FinalState, LeaseStore, Overlap, PauseEnd, PauseRequest, PauseScope, RecordState,
    Renewal, RunKey, RunOutcome, Slot, StoreErrorKind, Token, Until,
};
use futures::future::join_all;

use crate::claim::{RACERS, future_slot, job};
use crate::factory::StoreFactory;

use super::clocks::{SKEW, assert_store_clock, skewed_pair};
use super::{lease_claim, records_of, store_now, two_instances, won};

/// How many slots the pause checks race over.
const PAUSED_SLOTS: i64 = 20;

fn paused(outcome: ClaimOutcome, what: &str) {
    assert_eq!(
        outcome,
        ClaimOutcome::Done(FinalState::Paused),
        "{what}: a claim of a paused job must be recorded paused and answer Done(Paused)"
    );
}

async fn claim_of<S: LeaseStore + ?Sized>(store: &S, run: &RunKey, instance: &str) -> ClaimOutcome {
    store
        .claim_lease(&lease_claim(run.clone(), Token::generate(), instance))
        .await
        .expect("claim")
}

async fn state_of<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> Option<RecordState> {
    records_of(store, run, 100).await.first().map(|r| r.state)
}

/// A job paused by one instance: 8 instances racing over 20 of its slots
/// win none, each slot is recorded `paused` once and every claim of it
/// answers `Done(Paused)`; a job nobody paused runs beside it; the pause
/// reads back with its reason and author.
pub async fn paused_slots_run_nowhere_and_are_recorded_paused<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let quiet = job("paused-job");
    let busy = job("unpaused-job");
    let operator = factory.instance().await;
    let scope = PauseScope::Job(quiet.clone());
    let request = PauseRequest::new()
        .with_reason("database migration")
        .and_then(|r| r.with_by("ops@example"))
        .expect("valid notes");
    let pause = operator.pause(&scope, &request).await.expect("pause");
    assert_eq!(pause.scope, scope);
    assert_eq!(pause.end, PauseEnd::OnResume);
    assert_store_clock(
        "the pause's start",
        pause.since,
        store_now(operator.as_ref(), &quiet).await,
    );

    let base = future_slot(factory, 0).as_millis();
    let slots: Vec<Slot> = (0..PAUSED_SLOTS)
        .map(|i| Slot::from_millis(base + i * 1000))
        .collect();
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        racers.push(factory.instance().await);
    }
    let races = racers.iter().enumerate().map(|(i, store)| {
        let slots = slots.clone();
        let (quiet, busy) = (quiet.clone(), busy.clone());
        async move {
            let mut busy_wins = Vec::new();
            for slot in slots {
                crate::claim::interleave(i, slot).await;
                let name = format!("racer-{i}");
                paused(
                    claim_of(store.as_ref(), &RunKey::new(quiet.clone(), slot), &name).await,
                    &format!("racer {i}, slot {slot}"),
                );
                if let ClaimOutcome::Won(_) =
                    claim_of(store.as_ref(), &RunKey::new(busy.clone(), slot), &name).await
                {
                    busy_wins.push(slot);
                }
            }
            busy_wins
        }
    });
    let mut busy_wins: Vec<Slot> = join_all(races).await.into_iter().flatten().collect();
    busy_wins.sort();
    assert_eq!(
        busy_wins, slots,
        "the job nobody paused runs each slot once"
    );

    let history = operator.history(&quiet, 100).await.expect("history");
    assert_eq!(
        history.len(),
        slots.len(),
        "one record per slot: {history:?}"
    );
    for record in &history {
        assert_eq!(
            record.state,
            RecordState::Finished(FinalState::Paused),
            "{record:?}"
        );
        assert!(
            record.attempt.is_none() && record.fence.is_none() && record.instance.is_none(),
            "a paused slot ran nowhere: {record:?}"
        );
    }
    let pauses = operator.pauses().await.expect("pauses");
    assert_eq!(pauses.pauses, vec![pause.clone()], "the pause reads back");
    assert_eq!(pauses.of(&quiet), Some(&pause));
    assert_eq!(pauses.of(&busy), None);
    assert_eq!(pause.reason.as_deref(), Some("database migration"));
    assert_eq!(pause.by.as_deref(), Some("ops@example"));
}

/// A pause for a while ends when the store's clock says so: asked from an
/// instance whose clock is a minute ahead, it still starts and ends on the
/// store's clock; an instance a minute behind sees slots paused until
/// then and running after. A pause whose end has already passed on the
/// store's clock is refused, and nothing is written.
pub async fn a_pause_ends_on_the_store_clock<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (ahead, behind) = skewed_pair(factory).await;
    let job = job("paused-for-a-while");
    let scope = PauseScope::Job(job.clone());
    // Long enough that the two claims below come inside it on a loaded
    // machine; its end is waited for on the store's clock.
    let length = Duration::from_secs(2);

    let before = store_now(behind.as_ref(), &job).await;
    let refused = ahead
        .pause(
            &scope,
            &PauseRequest::new().with_until(Until::At(before.saturating_sub(SKEW / 2))),
        )
        .await
        .expect_err("a pause that ended before it began");
    assert_eq!(refused.kind(), StoreErrorKind::Invalid, "{refused}");
    assert!(!refused.is_temporary(), "{refused}");
    assert!(
        ahead.pauses().await.expect("pauses").pauses.is_empty(),
        "a refused pause writes nothing"
    );

    let pause = ahead
        .pause(&scope, &PauseRequest::new().with_until(Until::For(length)))
        .await
        .expect("pause");
    assert_store_clock("the pause's start", pause.since, before);
    assert_eq!(pause.end, PauseEnd::At(pause.since.saturating_add(length)));

    let base = future_slot(factory, 0).as_millis();
    let first = RunKey::new(job.clone(), Slot::from_millis(base));
    paused(
        claim_of(behind.as_ref(), &first, "behind").await,
        "during the pause",
    );
    paused(
        claim_of(ahead.as_ref(), &first, "ahead").await,
        "the same slot again",
    );

    // Wait on the store's clock, as the store sees it, until the end.
    let end = pause.since.saturating_add(length);
    while store_now(behind.as_ref(), &job).await < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = RunKey::new(job.clone(), Slot::from_millis(base + 1000));
    won(claim_of(behind.as_ref(), &second, "behind").await);
    assert_eq!(
        state_of(ahead.as_ref(), &first).await,
        Some(RecordState::Finished(FinalState::Paused)),
        "a slot paused stays paused"
    );
    assert!(
        ahead.pauses().await.expect("pauses").pauses.is_empty(),
        "an ended pause is not listed"
    );
}

/// A pause of every job holds each job, whoever pauses it; resuming one
/// job does not lift it; resuming every job lets the next slots run while
/// the slots recorded `paused` stay so (they are not caught up).
pub async fn pausing_every_job_holds_each_until_resumed<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (operator, worker) = two_instances(factory).await;
    let jobs = [job("every-job-a"), job("every-job-b")];
    let base = future_slot(factory, 0).as_millis();
    let pause = operator
        .pause(&PauseScope::All, &PauseRequest::new())
        .await
        .expect("pause every job");
    for job in &jobs {
        let run = RunKey::new(job.clone(), Slot::from_millis(base));
        paused(
            claim_of(worker.as_ref(), &run, "worker").await,
            job.as_str(),
        );
        assert_eq!(
            operator.pauses().await.expect("pauses").of(job),
            Some(&pause),
            "{job} is held by the pause of every job"
        );
    }
    assert!(
        !operator
            .resume(&PauseScope::Job(jobs[0].clone()))
            .await
            .expect("resume one job"),
        "no pause of the job itself to remove"
    );
    let still = RunKey::new(jobs[0].clone(), Slot::from_millis(base + 1000));
    paused(
        claim_of(worker.as_ref(), &still, "worker").await,
        "after resuming only the job",
    );
    assert!(
        operator
            .resume(&PauseScope::All)
            .await
            .expect("resume every job"),
        "the pause of every job is removed"
    );
    for job in &jobs {
        let next = RunKey::new(job.clone(), Slot::from_millis(base + 2000));
        won(claim_of(worker.as_ref(), &next, "worker").await);
        let old = RunKey::new(job.clone(), Slot::from_millis(base));
        paused(
            claim_of(worker.as_ref(), &old, "worker").await,
            "a slot paused before the resume",
        );
    }
    assert!(operator.pauses().await.expect("pauses").pauses.is_empty());
}

/// A pause stops no run already going (its holder renews and finishes it)
/// and leaves a `missed` slot missed; a second pause of the same job
/// replaces the first.
pub async fn a_pause_leaves_running_runs_and_missed_slots_alone<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("pause-running");
    let scope = PauseScope::Job(job.clone());
    let run = RunKey::new(job.clone(), future_slot(factory, 0));
    let token = Token::generate();
    won(store
        .claim_lease(&lease_claim(run.clone(), token, "holder"))
        .await
        .expect("claim"));

    // A slot a minute and a half old, claimed with a one-minute window.
    let now = store_now(store.as_ref(), &job).await.as_millis();
    let missed = RunKey::new(
        job.clone(),
        Slot::from_millis(now - now.rem_euclid(1000) - 90_000),
    );
    assert_eq!(
        claim_of(store.as_ref(), &missed, "late").await,
        ClaimOutcome::Missed
    );

    store
        .pause(&scope, &PauseRequest::new().with_until(Until::For(SKEW)))
        .await
        .expect("pause");
    let second = store
        .pause(&scope, &PauseRequest::new())
        .await
        .expect("pause again");
    assert_eq!(
        store.pauses().await.expect("pauses").pauses,
        vec![second],
        "the second pause replaces the first"
    );

    assert_eq!(
        store
            .heartbeat(&run, token, Duration::from_secs(30))
            .await
            .expect("heartbeat"),
        Renewal::Renewed,
        "a running run goes on"
    );
    let mut wide = lease_claim(missed.clone(), Token::generate(), "wide");
    wide.claim.max_late = Duration::from_secs(3600);
    assert_eq!(
        store.claim_lease(&wide).await.expect("claim"),
        ClaimOutcome::Late,
        "a missed slot stays missed while the job is paused"
    );
    assert_eq!(
        state_of(store.as_ref(), &missed).await,
        Some(RecordState::Missed)
    );
    assert_eq!(
        store
            .finish(&run, token, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );
    assert_eq!(
        state_of(store.as_ref(), &run).await,
        Some(RecordState::Finished(FinalState::Succeeded))
    );
}

/// A backfill of a paused slot that finds another run of its job going,
/// under `overlap = skip`, records the slot `skipped`, and it stays so:
/// asked again after that run ended, the slot is done, not started.
///
/// The backfill is sent in one batch with the claim of a new slot (also
/// skipped). (NATS KV moves ended records out of the job's document in a
/// call that may start a run, and drops them from the document in its
/// swap: the batch moved the `paused` record, its backfill claim wrote
/// `skipped` over it, and the drop took the `skipped` with it, so the next
/// backfill found `paused` and ran the slot.)
pub async fn a_backfill_skipped_beside_a_live_run_stays_skipped<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("backfill-skipped");
    let scope = PauseScope::Job(job.clone());
    let live_slot = future_slot(factory, 0);
    let paused_slot = future_slot(factory, 60_000);
    let new_slot = future_slot(factory, 120_000);
    let claim = |slot: Slot, backfill: bool| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.overlap = Overlap::Skip;
        c.rerun_paused = backfill;
        c
    };
    let live = claim(live_slot, false);
    won(store.claim_lease(&live).await.expect("claim"));
    store
        .pause(&scope, &PauseRequest::new())
        .await
        .expect("pause");
    paused(
        store
            .claim_lease(&claim(paused_slot, false))
            .await
            .expect("claim"),
        "the claim while paused",
    );
    assert!(
        store.resume(&scope).await.expect("resume"),
        "the pause was there"
    );
    let answers = store
        .claim_many(&[claim(paused_slot, true), claim(new_slot, false)])
        .await
        .expect("claims")
        .all()
        .expect("every claim answered");
    assert_eq!(
        answers,
        [ClaimOutcome::Overlap, ClaimOutcome::Overlap],
        "a backfill of a paused slot, and a new slot, beside a live run are skipped under overlap = skip"
    );
    store
        .finish(live.run(), live.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    assert_eq!(
        store
            .claim_lease(&claim(paused_slot, true))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Skipped),
        "a slot recorded skipped ran on the next backfill"
    );
    assert_eq!(
        state_of(store.as_ref(), &RunKey::new(job.clone(), paused_slot)).await,
        Some(RecordState::Finished(FinalState::Skipped))
    );
}
