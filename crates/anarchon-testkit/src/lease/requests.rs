//! Manual runs: an operator's "run now" is one run, claimed like any other,
//! under a key of its own that ages by its request time.

use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, LeaseStore, RecordState, RequestId, RunKey, RunOutcome, RunRequest,
    Slot, Token, TriggerRequest,
};
use futures::future::join_all;

use crate::claim::{RACERS, future_slot, past_slot};
use crate::factory::StoreFactory;

use super::{lease_claim, records_of, short, two_instances, wait_out, won};

/// How long a check waits for news that should come at once.
const NEWS_TIMEOUT: Duration = Duration::from_secs(10);

fn id(text: &str) -> RequestId {
    RequestId::new(text).expect("suite request ids are valid")
}

async fn request<S: LeaseStore + ?Sized>(store: &S, job: &str, request: &str) -> RunRequest {
    let req = TriggerRequest::new(crate::claim::job(job), id(request))
        .with_by("ops@example")
        .expect("a valid author");
    store.request_run(&req).await.expect("request_run")
}

/// Racing instances send the same request (one id) at once: every one is
/// answered the same stored request, the store lists it once, and of the
/// racers' claims of its run exactly one wins.
pub async fn racing_triggers_with_one_id_give_one_run<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let mut instances = Vec::new();
    for _ in 0..RACERS {
        instances.push(factory.instance().await);
    }
    let answers = join_all(
        instances
            .iter()
            .map(|s| request(&**s, "triggered", "button-press")),
    )
    .await;
    let first = answers[0].clone();
    assert!(
        answers.iter().all(|a| a == &first),
        "one id must be one request, whoever sent it: {answers:?}"
    );
    assert_eq!(first.by.as_deref(), Some("ops@example"));
    let run = first.run().expect("a trigger names its run");
    assert!(
        run.slot.is_manual(),
        "a request's run is a manual run: {run:?}"
    );
    let listed = instances[0].run_requests().await.expect("run_requests");
    let ours: Vec<&RunRequest> = listed
        .requests
        .iter()
        .filter(|r| r.job == first.job)
        .collect();
    assert_eq!(ours, vec![&first], "the store lists the request once");

    let outcomes = join_all(instances.iter().enumerate().map(|(i, s)| {
        let claim = lease_claim(run.clone(), Token::generate(), &format!("racer-{i}"));
        async move { s.claim_lease(&claim).await.expect("claim") }
    }))
    .await;
    let wins = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count();
    assert_eq!(wins, 1, "exactly one racer runs a manual run: {outcomes:?}");
    let again = request(&*instances[1], "triggered", "button-press").await;
    assert_eq!(
        again, first,
        "the id sent again later is still the same request"
    );
}

/// Every request of a job gets a run of its own, requests sent in the same
/// millisecond included, and no manual run shares its key with a
/// scheduled slot: the scheduled slot at a manual run's own instant is a
/// separate run that wins separately. History lists manual runs among
/// scheduled ones by their instant.
pub async fn each_trigger_is_a_run_apart_from_the_schedule<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let name = "manual-and-scheduled";
    let ids: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    let sent = join_all(ids.iter().map(|i| request(&*store, name, i))).await;
    let mut stamps: Vec<_> = sent.iter().map(|r| r.requested_at).collect();
    stamps.sort();
    stamps.dedup();
    assert_eq!(
        stamps.len(),
        sent.len(),
        "each request of a job needs a stamp of its own: {sent:?}"
    );
    let manual = sent[0].run().expect("a trigger names its run");
    let scheduled = RunKey::new(manual.job.clone(), Slot::from(manual.slot.at()));
    assert_ne!(manual, scheduled);
    won(store
        .claim_lease(&lease_claim(manual.clone(), Token::generate(), "a"))
        .await
        .expect("claim of the manual run"));
    won(store
        .claim_lease(&lease_claim(scheduled.clone(), Token::generate(), "b"))
        .await
        .expect("claim of the scheduled slot at the same instant"));

    // A scheduled slot an hour back and one ten minutes ahead bracket the
    // manual runs in the history, which goes newest first by instant.
    let past = RunKey::new(manual.job.clone(), past_slot(factory, 3_600_000));
    let mut catch_up = lease_claim(past.clone(), Token::generate(), "c");
    catch_up.claim.max_late = Duration::from_secs(2 * 3600);
    won(store.claim_lease(&catch_up).await.expect("claim"));
    let future = RunKey::new(manual.job.clone(), future_slot(factory, 0));
    won(store
        .claim_lease(&lease_claim(future.clone(), Token::generate(), "d"))
        .await
        .expect("claim"));
    let history = store.history(&manual.job, 3).await.expect("history");
    let slots: Vec<Slot> = history.iter().map(|r| r.run.slot).collect();
    assert_eq!(
        slots.first(),
        Some(&future.slot),
        "the newest run by instant comes first: {slots:?}"
    );
    assert!(
        slots[1..].iter().all(|s| s.at() >= manual.slot.at()),
        "the next newest are the runs at the manual run's instant, not the hour-old slot: {slots:?}"
    );
    let all = store.history(&manual.job, 100).await.expect("history");
    assert_eq!(all.last().map(|r| &r.run), Some(&past), "{all:?}");
    assert!(
        all.iter()
            .any(|r| r.run == manual && r.state == RecordState::Running),
        "history shows the manual run under its own key: {all:?}"
    );
}

/// A manual run ages by its request time: claimed at once it is in time
/// (not judged by its negative key), claimed later than `max_late` after
/// the request it is late and recorded `missed`.
pub async fn a_manual_run_is_late_by_its_request_time<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let fresh = request(&*store, "manual-lateness", "now")
        .await
        .run()
        .expect("a trigger names its run");
    let mut quick = lease_claim(fresh.clone(), Token::generate(), "a");
    quick.claim.max_late = Duration::from_secs(5);
    won(store.claim_lease(&quick).await.expect("claim"));

    let stale = request(&*store, "manual-lateness", "later")
        .await
        .run()
        .expect("a trigger names its run");
    wait_out(Duration::from_millis(300)).await;
    let mut slow = lease_claim(stale.clone(), Token::generate(), "a");
    slow.claim.max_late = Duration::from_millis(100);
    assert_eq!(
        store.claim_lease(&slow).await.expect("claim"),
        ClaimOutcome::Missed,
        "a manual run claimed after its window is late, and recorded missed"
    );
    let records = records_of(&*store, &stale, 100).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].state, RecordState::Missed);
}

/// A manual run whose runner dies is taken over by another instance once
/// its lease runs out: attempt 2, a larger fence, and the old runner is
/// fenced.
pub async fn a_triggered_run_whose_runner_dies_is_taken_over<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = two_instances(factory).await;
    let run = request(&*a, "manual-takeover", "t1")
        .await
        .run()
        .expect("a trigger names its run");
    let dead = Token::generate();
    let first = won(a
        .claim_lease(&short(lease_claim(run.clone(), dead, "a")))
        .await
        .expect("claim"));
    wait_out(super::SHORT_LEASE).await;
    let backup = Token::generate();
    let second = won(b
        .claim_lease(&lease_claim(run.clone(), backup, "b"))
        .await
        .expect("takeover"));
    assert_eq!(second.attempt, Attempt::new(2).expect("2"));
    assert!(
        second.fence > first.fence,
        "a takeover's fence is larger: {first:?} then {second:?}"
    );
    assert_eq!(
        a.finish(&run, dead, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        anarchon_core::Renewal::Fenced
    );
    assert_eq!(
        b.finish(&run, backup, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        anarchon_core::Renewal::Renewed
    );
}

/// Collection measures manual runs and requests by their request time: a
/// young finished manual run and its request stay under a long `keep`;
/// once older than `keep` and the job's window, both go.
pub async fn manual_runs_are_collected_by_their_request_time<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let req = request(&*store, "manual-gc", "g1").await;
    let run = req.run().expect("a trigger names its run");
    let mut claim = lease_claim(run.clone(), Token::generate(), "a");
    // The window must hold the claim on a loaded machine (a CI run once
    // took over 200 ms from the request to the claim) and be waited out
    // below.
    let window = Duration::from_secs(2);
    claim.claim.max_late = window;
    won(store.claim_lease(&claim).await.expect("claim"));
    store
        .finish(&run, claim.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("collect");
    assert_eq!(
        records_of(&*store, &run, 100).await.len(),
        1,
        "a young manual run must survive a collection"
    );
    let listed = store.run_requests().await.expect("run_requests").requests;
    assert!(listed.contains(&req), "a young request stays: {listed:?}");

    wait_out(window).await;
    store
        .collect_garbage(Duration::ZERO)
        .await
        .expect("collect");
    assert!(
        records_of(&*store, &run, 100).await.is_empty(),
        "a finished manual run older than keep and its window is collected"
    );
    let listed = store.run_requests().await.expect("run_requests").requests;
    assert!(
        !listed.iter().any(|r| r.job == req.job),
        "a request older than keep is collected: {listed:?}"
    );
}

/// A new request is announced to every instance of the namespace, and an
/// id sent again is not announced again as a new run.
pub async fn a_request_is_announced_to_every_instance<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (asker, listener) = two_instances(factory).await;
    let mut news = listener.announcements();
    let req = request(&*asker, "announced", "n1").await;
    let heard = tokio::time::timeout(NEWS_TIMEOUT, async {
        loop {
            match news.recv().await {
                Ok(run) if run.slot.is_manual() => return run,
                Ok(_) => {}
                Err(e) => panic!("the announcements ended: {e}"),
            }
        }
    })
    .await
    .expect("another instance must hear of a new request");
    assert_eq!(heard, req.run().expect("a trigger names its run"));
}

/// `Control::status` answers what the records say: a job's own pause, its
/// latest runs newest first (a finished manual run among them), the
/// manual run requested and not yet ended as pending, and the backfill
/// the store keeps; a job nobody touched has none of these.
pub async fn status_answers_what_the_records_say<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    use anarchon_core::{Backfill, Control, PauseRequest, PauseScope, Timestamp};
    let (worker, operator) = two_instances(factory).await;
    let control = Control::new(operator);
    let busy = crate::claim::job("status-busy");
    let quiet = crate::claim::job("status-quiet");
    let done = request(&*worker, "status-busy", "done").await;
    let done_run = done.run().expect("a trigger names its run");
    let claim = lease_claim(done_run.clone(), Token::generate(), "worker");
    won(worker.claim_lease(&claim).await.expect("claim"));
    worker
        .finish(&done_run, claim.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
    let waiting = request(&*worker, "status-busy", "waiting").await;
    let now = crate::lease::store_now(&*worker, &busy).await;
    let range = Backfill::new(
        Timestamp::from_millis(now.as_millis() - 60_000),
        Timestamp::from_millis(now.as_millis() - 1_000),
    )
    .expect("range");
    let fill = control
        .backfill(
            &TriggerRequest::backfill(busy.clone(), id("fill"), range),
            None,
        )
        .await
        .expect("backfill");
    let pause = control
        .pause(
            &PauseScope::Job(busy.clone()),
            &PauseRequest::new()
                .with_reason("status check")
                .expect("reason"),
        )
        .await
        .expect("pause");

    let status = control
        .status(&[busy.clone(), quiet.clone()], 10)
        .await
        .expect("status");
    let [of_busy, of_quiet] = &status.jobs[..] else {
        panic!("one status per job asked, in order: {status:?}");
    };
    assert_eq!(of_busy.job, busy);
    assert_eq!(of_busy.pause.as_ref(), Some(&pause), "{of_busy:?}");
    assert_eq!(of_busy.recent.first().map(|r| &r.run), Some(&done_run));
    assert_eq!(
        of_busy.recent.first().map(|r| r.state),
        Some(RecordState::Finished(anarchon_core::FinalState::Succeeded))
    );
    assert_eq!(of_busy.pending, vec![waiting], "{of_busy:?}");
    assert_eq!(of_busy.backfills, vec![fill], "{of_busy:?}");
    assert_eq!(of_quiet.job, quiet);
    assert!(
        of_quiet.pause.is_none()
            && of_quiet.recent.is_empty()
            && of_quiet.pending.is_empty()
            && of_quiet.backfills.is_empty(),
        "{of_quiet:?}"
    );
}
