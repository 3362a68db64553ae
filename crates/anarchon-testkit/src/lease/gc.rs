//! Garbage collection: what it forgets and what it must keep.

use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, FinalState, JobName, LeaseClaim, LeaseStore, RunKey, RunOutcome, Slot, Token,
};

use crate::claim::job;
use crate::factory::StoreFactory;

use super::{lease_claim, wait_out, won};

/// How long after its claim a run claimed with [`closing_window`] becomes
/// too old for any claim: its window then lies behind it. The claims a
/// check makes inside the window (up to five) must land before it ends,
/// on a loaded machine too.
const WINDOW_LEFT: Duration = Duration::from_secs(2);

/// A late window that lets a claim sent now win `slot` and ends
/// [`WINDOW_LEFT`] from now, so a collection after [`wait_out_windows`] may
/// take the run.
fn closing_window(now_ms: i64, slot: Slot) -> Duration {
    Duration::from_millis(u64::try_from(now_ms - slot.as_millis()).expect("a past slot"))
        + WINDOW_LEFT
}

/// Waits until every window made by [`closing_window`] before the call has
/// ended on the store's clock.
async fn wait_out_windows() {
    wait_out(WINDOW_LEFT).await;
}

/// `collect_garbage(keep)` deletes ended runs older than `keep` and older
/// than their job's late window, and nothing else: recent runs stay, and so
/// does an old running run whose lease has not been over for `keep`. (That
/// the scheduler's `keep` covers its jobs' late windows is the scheduler's
/// part, checked in the kit's scheduler tests.)
pub async fn garbage_collection_forgets_old_ended_runs_only<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let job = job("gc");
    let now = factory.clock().now().as_millis();
    let old = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    // Just older than `old`, so that one window covers both at the claims
    // and neither at the collection.
    let old_running = Slot::from_millis(old.as_millis() - 50);
    let recent = Slot::from_millis(now - now.rem_euclid(1000) - 60_000);
    // The job's window ends shortly: after it only `keep` decides.
    let window = closing_window(now, old_running);
    let catch_up = |slot: Slot| late_claim(&job, slot, window);
    let c_old = catch_up(old);
    let c_running = catch_up(old_running);
    let c_recent = catch_up(recent);
    won(store.claim_lease(&c_old).await.expect("claim"));
    finish_succeeded(&*store, &c_old).await;
    let last = won(store.claim_lease(&c_running).await.expect("claim"));
    won(store.claim_lease(&c_recent).await.expect("claim"));
    finish_succeeded(&*store, &c_recent).await;
    wait_out_windows().await;
    let deleted = store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("gc");
    assert_eq!(deleted, 1, "only the old finished run goes");
    let left: Vec<Slot> = slots_in_history(&*store, &job).await;
    assert_eq!(left, [recent, old_running]);
    let next = Slot::from_millis(recent.as_millis() + 1000);
    let mut claim = catch_up(next);
    claim.claim.max_late = Duration::from_secs(3600);
    let after = won(store.claim_lease(&claim).await.expect("claim"));
    assert!(
        after.fence > last.fence,
        "fences keep growing after a collection"
    );
}

/// A claim by "a" of `job`'s `slot`, which may be up to `max_late` late.
fn late_claim(job: &JobName, slot: Slot, max_late: Duration) -> LeaseClaim {
    let mut claim = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
    claim.claim.max_late = max_late;
    claim
}

/// The holder of `claim` reports its run succeeded.
async fn finish_succeeded<S: LeaseStore + ?Sized>(store: &S, claim: &LeaseClaim) {
    store
        .finish(claim.run(), claim.claim.token, RunOutcome::Succeeded)
        .await
        .expect("finish");
}

/// The slots of the latest ten runs `job`'s history lists, newest first.
async fn slots_in_history<S: LeaseStore + ?Sized>(store: &S, job: &JobName) -> Vec<Slot> {
    let history = store.history(job, 10).await.expect("history");
    history.iter().map(|r| r.run.slot).collect()
}

/// Collection keeps each job's runs for as long as the job's own late
/// window, whatever `keep` the collecting scheduler passes: another
/// service's scheduler, whose jobs have short windows, shares the
/// namespace. A run kept is never run again; a run whose window is over
/// goes.
pub async fn garbage_collection_keeps_each_jobs_late_window<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let slot = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    let keep = Duration::from_secs(3600);
    let long_window = Duration::from_secs(24 * 3600);
    let short = job("gc-window-short");
    let long = job("gc-window-long");
    let claim = |job: &JobName, max_late: Duration| late_claim(job, slot, max_late);
    for c in [
        claim(&short, closing_window(now, slot)),
        claim(&long, long_window),
    ] {
        won(store.claim_lease(&c).await.expect("claim"));
        finish_succeeded(&*store, &c).await;
    }
    wait_out_windows().await;
    store.collect_garbage(keep).await.expect("gc");
    assert_eq!(
        slots_in_history(&*store, &long).await,
        [slot],
        "a collection with keep = {keep:?} took a run that its job's late window \
         ({long_window:?}) still covers"
    );
    assert_eq!(
        store
            .claim_lease(&claim(&long, long_window))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Succeeded),
        "a late claim inside the job's window must find the run done"
    );
    assert!(
        store.history(&short, 10).await.expect("history").is_empty(),
        "a run older than both `keep` and its job's window is collected"
    );
}

/// A claim that writes nothing still tells the store its late window.
///
/// Two jobs' runs were claimed with a short window (a regular claim); then
/// the jobs gain a long catch-up window (a rolling deploy, say), and their
/// first catch-up claims find each slot already decided: one job's run
/// ended, the other's still running under someone else's lease (which then
/// ends). Such a claim answers from the record and has nothing of its own
/// to write, yet the store must remember its window: otherwise a
/// collection by another service with a short `keep` takes the ended runs,
/// and the next catch-up claim finds no record and runs the slot again.
pub async fn a_claim_that_writes_nothing_still_widens_the_jobs_window<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let slot = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    let keep = Duration::from_secs(3600);
    let long_window = Duration::from_secs(24 * 3600);
    let short = closing_window(now, slot);
    let found_done = job("gc-widened-by-done");
    let found_running = job("gc-widened-by-running");
    // The catch-up claims, by another instance, with the long window.
    let catch_up = |job: &JobName| {
        let mut claim = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "b");
        claim.claim.max_late = long_window;
        claim
    };
    let ended = late_claim(&found_done, slot, short);
    won(store.claim_lease(&ended).await.expect("claim"));
    finish_succeeded(&*store, &ended).await;
    let running = late_claim(&found_running, slot, short);
    won(store.claim_lease(&running).await.expect("claim"));
    assert_eq!(
        store
            .claim_lease(&catch_up(&found_done))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Succeeded),
        "a catch-up claim of a run that ended finds it done"
    );
    assert!(
        matches!(
            store
                .claim_lease(&catch_up(&found_running))
                .await
                .expect("claim"),
            ClaimOutcome::Running { .. }
        ),
        "a catch-up claim of a run still going finds it running"
    );
    finish_succeeded(&*store, &running).await;
    wait_out_windows().await;
    store.collect_garbage(keep).await.expect("gc");
    for job in [&found_done, &found_running] {
        assert_eq!(
            store.claim_lease(&catch_up(job)).await.expect("claim"),
            ClaimOutcome::Done(FinalState::Succeeded),
            "a collection with keep = {keep:?} took {job}'s run, which a claim asked about \
             with a late window of {long_window:?}: the next catch-up would run it again"
        );
    }
}

/// Collecting every run of a job forgets none of its fences: the next win
/// of the job gets a fence above every earlier one, whether collection took
/// all the job's runs or only its highest-fenced one.
pub async fn fences_outlive_garbage_collection<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let now = factory.clock().now().as_millis();
    let second = now - now.rem_euclid(1000);
    // Old slots lie close together, so one window can cover them all at the
    // claims and none of them at the collection.
    let old = |i: i64| Slot::from_millis(second - 7_200_000 + i * 50);
    let recent = |i: i64| Slot::from_millis(second - 60_000 + i * 1000);
    let keep = Duration::from_secs(3600);
    // Every window ends shortly, so `keep` decides what is collected.
    let window = closing_window(now, old(0));
    let catch_up = |job: &JobName, slot: Slot| late_claim(job, slot, window);
    let fence_of = |outcome: ClaimOutcome| won(outcome).fence.expect("lease stores fence");

    // A claim after the collection, its window `keep`: the job's next fence.
    let next_fence = async |job: &JobName, slot: Slot| {
        let claim = late_claim(job, slot, keep);
        fence_of(
            store
                .claim_lease(&claim)
                .await
                .expect("claim after collection"),
        )
    };

    // Job one: every run is collected.
    let all_gone = job("gc-fence-all");
    let mut highest = None;
    for i in 0..3 {
        let claim = catch_up(&all_gone, old(i));
        highest = highest.max(Some(fence_of(
            store.claim_lease(&claim).await.expect("claim"),
        )));
        finish_succeeded(&*store, &claim).await;
    }
    // Job two: only the highest-fenced run is collected; an older fence stays.
    let top_gone = job("gc-fence-top");
    let kept = catch_up(&top_gone, recent(0));
    let kept_fence = fence_of(store.claim_lease(&kept).await.expect("claim"));
    let collected = catch_up(&top_gone, old(0));
    let top = fence_of(store.claim_lease(&collected).await.expect("claim"));
    assert!(top > kept_fence);
    finish_succeeded(&*store, &collected).await;

    wait_out_windows().await;
    store.collect_garbage(keep).await.expect("gc");

    assert!(
        store
            .history(&all_gone, 10)
            .await
            .expect("history")
            .is_empty(),
        "collection takes every finished run older than `keep`"
    );
    assert_eq!(
        store.jobs().await.expect("jobs"),
        [all_gone.clone(), top_gone.clone()],
        "the job index keeps a job whose runs were all collected, as its fence counter"
    );
    let next = next_fence(&all_gone, recent(0)).await;
    assert!(
        Some(next) > highest,
        "after collecting every run of a job its next fence {next:?} must exceed every \
         earlier one (up to {highest:?})"
    );

    let left: Vec<Slot> = slots_in_history(&*store, &top_gone).await;
    assert_eq!(left, [recent(0)], "collection took the old run only");
    let next = next_fence(&top_gone, recent(1)).await;
    assert!(
        next > top,
        "the next fence {next:?} must exceed the collected run's {top:?}, not only the \
         fences of the runs that remain ({kept_fence:?})"
    );
}

/// Three instances each claim a run of their own job: a fourth instance's
/// job index lists the three, in name order, and a job claimed again is
/// listed once.
pub async fn the_job_index_lists_every_claimed_job<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let names = ["index-c", "index-a", "index-b"];
    let mut claimers = Vec::new();
    for name in names {
        let store = factory.instance().await;
        let run = RunKey::new(job(name), crate::claim::future_slot(factory, 0));
        won(store
            .claim_lease(&lease_claim(run.clone(), Token::generate(), name))
            .await
            .expect("claim"));
        claimers.push((store, run));
    }
    let (again, run) = &claimers[0];
    let next = RunKey::new(
        run.job.clone(),
        Slot::from_millis(run.slot.as_millis() + 1000),
    );
    won(again
        .claim_lease(&lease_claim(next, Token::generate(), "again"))
        .await
        .expect("claim"));
    let reader = factory.instance().await;
    assert_eq!(
        reader.jobs().await.expect("jobs"),
        [job("index-a"), job("index-b"), job("index-c")],
        "every job a claim started, once each, in name order"
    );
}
