//! The lease suite: the flowchart, checked property by property.
//!
//! Checks that need a lease to run out use leases of a few hundred
//! milliseconds and wait them out: real time on a server, no time at all
//! under tokio's paused clock.

mod batches;
mod claims;
mod clocks;
mod gc;
mod holder;
mod overlap;
mod pauses;
mod requests;
mod retries;

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, JobName, LeaseClaim, LeaseStore, MaxAttempts, Overlap, RunKey, RunRecord,
    RunState, RunView, Slot, Timestamp, Token, Win,
};

use crate::claim::{claim_request, future_slot, job};
use crate::factory::StoreFactory;

pub use self::batches::{claim_many_answers_in_order, claim_many_answers_with_each_runs_facts};
pub use self::claims::{
    attempts_exhausted_is_interrupted, expired_lease_is_taken_over,
    fences_grow_and_history_lists_runs, late_claim_is_refused_and_recorded_missed,
    lease_claim_is_exclusive, live_lease_answers_running,
    one_of_racing_claimants_ends_an_exhausted_run, one_of_racing_claimants_records_each_miss,
    overlap_ignores_expired_and_allow_overlaps, overlap_skip_waits_for_the_live_run,
    own_lease_retry_is_recognised, peek_reports_the_state,
};
pub use self::clocks::{SKEW, lease_expiry_is_judged_on_the_store_clock};
pub use self::gc::{
    a_claim_that_writes_nothing_still_widens_the_jobs_window, fences_outlive_garbage_collection,
    garbage_collection_forgets_old_ended_runs_only, garbage_collection_keeps_each_jobs_late_window,
    the_job_index_lists_every_claimed_job,
};
pub use self::holder::{
    a_finish_sent_again_gets_the_same_answer, a_hand_over_wakes_a_waiting_backup,
    a_run_given_back_keeps_its_attempt, an_error_of_any_text_is_recorded,
    failed_run_keeps_its_error, finished_run_is_done, heartbeat_extends_the_lease,
    release_hands_over_at_once, tokens_that_hold_nothing_are_fenced_and_change_nothing,
};
pub use self::overlap::{
    a_waiting_slot_past_its_max_late_is_missed,
    overlap_buffer_one_runs_one_waiting_slot_after_the_live_run,
    overlap_replace_ends_the_runs_still_going,
};
pub use self::pauses::{
    a_backfill_skipped_beside_a_live_run_stays_skipped, a_pause_ends_on_the_store_clock,
    a_pause_leaves_running_runs_and_missed_slots_alone,
    paused_slots_run_nowhere_and_are_recorded_paused, pausing_every_job_holds_each_until_resumed,
};
pub use self::requests::{
    a_manual_run_is_late_by_its_request_time, a_request_is_announced_to_every_instance,
    a_triggered_run_whose_runner_dies_is_taken_over, each_trigger_is_a_run_apart_from_the_schedule,
    manual_runs_are_collected_by_their_request_time, racing_triggers_with_one_id_give_one_run,
    status_answers_what_the_records_say,
};
pub use self::retries::{
    a_failed_run_is_retried_once_per_allowed_retry, a_retry_due_after_the_next_slot_is_not_made,
    a_retry_is_never_claimed_before_it_is_due_on_the_store_clock,
    garbage_collection_keeps_a_pending_retry,
    overlap_skip_sees_a_pending_retry_as_the_run_still_going,
};

/// The lease of checks that wait for one to run out.
pub const SHORT_LEASE: Duration = Duration::from_millis(300);

/// The lease of checks that need one to stay alive.
pub const LONG_LEASE: Duration = Duration::from_secs(30);

/// A lease claim with the suite's defaults and a long lease.
pub fn lease_claim(run: RunKey, token: Token, instance: &str) -> LeaseClaim {
    LeaseClaim {
        claim: claim_request(run, token, instance),
        lease: LONG_LEASE,
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    }
}

/// The store's clock, read through a run of `job` nobody has.
pub(crate) async fn store_now<S: LeaseStore + ?Sized>(store: &S, job: &JobName) -> Timestamp {
    let run = RunKey::new(job.clone(), Slot::from_millis(0));
    store.peek(&run).await.expect("peek").store_now
}

/// Waits until the store's clock, read through `store`, has passed `at`:
/// what a check that needs time to pass waits for, rather than a sleep a
/// busy machine could outrun.
pub(crate) async fn until_store_clock_passes<S: LeaseStore + ?Sized>(
    store: &S,
    run: &RunKey,
    at: Timestamp,
) {
    while store_now(store, &run.job).await <= at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn short(mut claim: LeaseClaim) -> LeaseClaim {
    claim.lease = SHORT_LEASE;
    claim
}

async fn wait_out(lease: Duration) {
    tokio::time::sleep(lease + Duration::from_millis(250)).await;
}

fn won(outcome: ClaimOutcome) -> Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

fn lease_end(view: &RunView) -> Timestamp {
    match view.state {
        RunState::Running { lease_until, .. } => lease_until,
        ref other => panic!("expected a running run, got {other:?}"),
    }
}

/// Two instances of `factory`'s store: a check's cast of two processes.
async fn two_instances<F: StoreFactory>(factory: &F) -> (Arc<F::Store>, Arc<F::Store>) {
    (factory.instance().await, factory.instance().await)
}

/// Two instances of `factory`'s store, and a run of the job `name` at a
/// future slot: most lease checks' cast, a holder and another instance.
async fn two_instances_and_a_run<F: StoreFactory>(
    factory: &F,
    name: &str,
) -> (Arc<F::Store>, Arc<F::Store>, RunKey) {
    let (a, b) = two_instances(factory).await;
    (a, b, RunKey::new(job(name), future_slot(factory, 0)))
}

/// Claims `run` as "a" with a new token, which must win: the holder's
/// token.
async fn hold<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> Token {
    let token = Token::generate();
    won(store
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .expect("claim"));
    token
}

/// What `peek` and `history` say about one run, to compare before and after.
async fn facts<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> (RunState, Vec<RunRecord>) {
    let state = store.peek(run).await.expect("peek").state;
    (state, records_of(store, run, 100).await)
}

/// The records of `run` among the latest `limit` of its job's history.
pub(crate) async fn records_of<S: LeaseStore + ?Sized>(
    store: &S,
    run: &RunKey,
    limit: usize,
) -> Vec<RunRecord> {
    let history = store.history(&run.job, limit).await.expect("history");
    history.into_iter().filter(|r| &r.run == run).collect()
}

/// The lease suite as one `#[tokio::test]` per check; arguments as for
/// [`claim_suite!`](crate::claim_suite).
#[macro_export]
macro_rules! lease_suite {
    ($factory:expr $(, $attr:meta)?) => {
        $crate::__with_test_attr!(__lease_checks, $factory $(, $attr)?);
    };
}

/// The lease suite's checks, under the test attribute `$attr`.
#[doc(hidden)]
#[macro_export]
macro_rules! __lease_checks {
    ($factory:expr, $attr:meta) => {
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::lease,
            lease_claim_is_exclusive,
            claim_many_answers_in_order,
            own_lease_retry_is_recognised,
            live_lease_answers_running,
            late_claim_is_refused_and_recorded_missed,
            finished_run_is_done,
            a_finish_sent_again_gets_the_same_answer,
            failed_run_keeps_its_error,
            an_error_of_any_text_is_recorded,
            heartbeat_extends_the_lease,
            expired_lease_is_taken_over,
            attempts_exhausted_is_interrupted,
            one_of_racing_claimants_records_each_miss,
            one_of_racing_claimants_ends_an_exhausted_run,
            a_run_given_back_keeps_its_attempt,
            a_hand_over_wakes_a_waiting_backup,
            overlap_skip_waits_for_the_live_run,
            overlap_ignores_expired_and_allow_overlaps,
            release_hands_over_at_once,
            peek_reports_the_state,
            fences_grow_and_history_lists_runs,
            garbage_collection_forgets_old_ended_runs_only,
            garbage_collection_keeps_each_jobs_late_window,
            a_claim_that_writes_nothing_still_widens_the_jobs_window,
            lease_expiry_is_judged_on_the_store_clock,
            fences_outlive_garbage_collection,
            tokens_that_hold_nothing_are_fenced_and_change_nothing,
            claim_many_answers_with_each_runs_facts,
            paused_slots_run_nowhere_and_are_recorded_paused,
            a_pause_ends_on_the_store_clock,
            pausing_every_job_holds_each_until_resumed,
            a_pause_leaves_running_runs_and_missed_slots_alone,
            a_backfill_skipped_beside_a_live_run_stays_skipped,
            the_job_index_lists_every_claimed_job,
            racing_triggers_with_one_id_give_one_run,
            each_trigger_is_a_run_apart_from_the_schedule,
            a_manual_run_is_late_by_its_request_time,
            a_triggered_run_whose_runner_dies_is_taken_over,
            manual_runs_are_collected_by_their_request_time,
            a_request_is_announced_to_every_instance,
            status_answers_what_the_records_say,
            a_failed_run_is_retried_once_per_allowed_retry,
            a_retry_is_never_claimed_before_it_is_due_on_the_store_clock,
            a_retry_due_after_the_next_slot_is_not_made,
            overlap_skip_sees_a_pending_retry_as_the_run_still_going,
            garbage_collection_keeps_a_pending_retry,
            overlap_replace_ends_the_runs_still_going,
            overlap_buffer_one_runs_one_waiting_slot_after_the_live_run,
            a_waiting_slot_past_its_max_late_is_missed,
        );
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::differential,
            claims_follow_the_core_decision,
            renewals_follow_the_core_decision,
        );
        $crate::__scheduler_lease_checks!($factory, $attr);
    };
}
