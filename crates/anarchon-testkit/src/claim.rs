//! The claim suite: what every store, claim-only or lease, must do.
//!
//! Each check is a public async function taking the test's factory; the
//! [`claim_suite!`](crate::claim_suite) macro turns each into its own test.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, RunKey, Slot, Token,
};
use futures::future::join_all;

use crate::factory::StoreFactory;

/// How many simulated instances race in the exclusivity checks.
pub const RACERS: usize = 8;
/// How many slots they race for.
pub const RACED_SLOTS: usize = 200;

/// A job name for a check.
pub fn job(name: &str) -> JobName {
    JobName::new(name).expect("suite job names are valid")
}

/// A slot `offset_ms` after the whole second ten minutes from the factory's
/// clock: in the future, so no check is ever late by accident.
pub fn future_slot<F: StoreFactory>(factory: &F, offset_ms: i64) -> Slot {
    let now = factory.clock().now().as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) + 600_000 + offset_ms)
}

/// The slot `ago_ms` before the whole second of the factory's clock: in
/// the past, for late claims and collections.
pub fn past_slot<F: StoreFactory>(factory: &F, ago_ms: i64) -> Slot {
    let now = factory.clock().now().as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) - ago_ms)
}

/// A plain claim of `run` by `instance` with `token`.
pub fn claim_request(run: RunKey, token: Token, instance: &str) -> ClaimRequest {
    ClaimRequest {
        run,
        token,
        instance: InstanceId::new(instance).expect("suite instance ids are valid"),
        max_late: Duration::from_secs(60),
    }
}

/// Lets the other racers go first a varying number of times, so racers'
/// claims alternate in changing orders even on one thread with a store
/// that answers without waiting (an in-process store on a paused clock).
pub(crate) async fn interleave(racer: usize, slot: Slot) {
    let turns = (slot.as_millis() / 1000 + racer as i64).rem_euclid(3);
    for _ in 0..turns {
        tokio::task::yield_now().await;
    }
}

/// Races [`RACERS`] instances of `factory`, each with its own handle, for
/// [`RACED_SLOTS`] future slots of `job` (each in slot order, all at once):
/// `claim` makes one racer's claim of one run, as the instance it names,
/// and says whether it won. Returns the slots, and how many racers won each.
pub(crate) async fn race<F, C, Fut>(
    factory: &F,
    job: JobName,
    claim: C,
) -> (Vec<Slot>, HashMap<Slot, usize>)
where
    F: StoreFactory,
    C: Fn(Arc<F::Store>, RunKey, String) -> Fut,
    Fut: Future<Output = bool>,
{
    let base = future_slot(factory, 0).as_millis();
    let slots: Vec<Slot> = (0..RACED_SLOTS as i64)
        .map(|i| Slot::from_millis(base + i * 1000))
        .collect();
    let stores = instances(factory, RACERS).await;
    let racers = stores.into_iter().enumerate().map(|(i, store)| {
        let (job, slots, claim) = (&job, slots.clone(), &claim);
        async move {
            let mut won = Vec::new();
            for slot in slots {
                interleave(i, slot).await;
                let run = RunKey::new(job.clone(), slot);
                if claim(store.clone(), run, format!("racer-{i}")).await {
                    won.push(slot);
                }
            }
            won
        }
    });
    let mut winners: HashMap<Slot, usize> = HashMap::new();
    for won in join_all(racers).await {
        for slot in won {
            *winners.entry(slot).or_default() += 1;
        }
    }
    (slots, winners)
}

fn is_won(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::Won(_))
}

async fn instances<F: StoreFactory>(factory: &F, n: usize) -> Vec<Arc<F::Store>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(factory.instance().await);
    }
    out
}

/// 8 instances, each with its own handle, claim the same 200 slots (each in
/// slot order, all at once): every slot has exactly one winner.
pub async fn claim_is_exclusive<F: StoreFactory>(factory: &F) {
    let (slots, winners) = race(factory, job("exclusive"), |store, run, racer| async move {
        let req = claim_request(run, Token::generate(), &racer);
        let outcome = store.claim(&req).await.expect("claim failed");
        assert!(
            !matches!(outcome, ClaimOutcome::Unknown),
            "a claim with a healthy store must not be Unknown"
        );
        is_won(&outcome)
    })
    .await;
    for slot in &slots {
        assert_eq!(
            winners.get(slot).copied().unwrap_or(0),
            1,
            "slot {slot} must have exactly one winner"
        );
    }
}

/// The same token claiming again (a retry after a lost reply) is told it won.
pub async fn own_retry_is_recognised<F: StoreFactory>(factory: &F) {
    let store = factory.instance().await;
    let run = RunKey::new(job("retry"), future_slot(factory, 0));
    let req = claim_request(run, Token::generate(), "a");
    let first = store.claim(&req).await.expect("claim");
    assert!(is_won(&first), "first claim must win, got {first:?}");
    let again = store.claim(&req).await.expect("claim again");
    assert_eq!(
        again, first,
        "the same token must be told it won, with the same attempt"
    );
    let other = factory.instance().await;
    let again = other
        .claim(&req)
        .await
        .expect("claim through another handle");
    assert_eq!(
        again, first,
        "the same token through another connection is still its own"
    );
}

/// A different token loses a run that was already won.
pub async fn other_token_loses<F: StoreFactory>(factory: &F) {
    let a = factory.instance().await;
    let b = factory.instance().await;
    let run = RunKey::new(job("other"), future_slot(factory, 0));
    let first = a
        .claim(&claim_request(run.clone(), Token::generate(), "a"))
        .await
        .expect("claim");
    assert!(is_won(&first), "{first:?}");
    let second = b
        .claim(&claim_request(run, Token::generate(), "b"))
        .await
        .expect("claim");
    assert!(
        !is_won(&second),
        "a second token must not win, got {second:?}"
    );
}

/// Runs of different jobs, and different slots of one job, are independent.
pub async fn runs_are_independent<F: StoreFactory>(factory: &F) {
    let store = factory.instance().await;
    let slot = future_slot(factory, 0);
    let next = Slot::from_millis(slot.as_millis() + 1000);
    for run in [
        RunKey::new(job("indep-a"), slot),
        RunKey::new(job("indep-b"), slot),
        RunKey::new(job("indep-a"), next),
    ] {
        let outcome = store
            .claim(&claim_request(run.clone(), Token::generate(), "a"))
            .await
            .expect("claim");
        assert!(
            is_won(&outcome),
            "{run} must be won on its own, got {outcome:?}"
        );
    }
}

/// Names that differ only in case or in `-` versus `_` are different jobs
/// in the store: no two accepted names share a key.
pub async fn similar_names_stay_apart<F: StoreFactory>(factory: &F) {
    let store = factory.instance().await;
    let slot = future_slot(factory, 0);
    for name in ["name-a", "name_a", "Name-a", "NAME-A", "name-a-", "name-a_"] {
        let run = RunKey::new(job(name), slot);
        let outcome = store
            .claim(&claim_request(run, Token::generate(), "a"))
            .await
            .expect("claim");
        assert!(
            is_won(&outcome),
            "{name} must be its own job, got {outcome:?}"
        );
    }
}

/// The claim suite as one `#[tokio::test]` per check.
///
/// `$factory` is an expression (it may `.await`) that makes a fresh factory;
/// an optional second argument replaces the test attribute, e.g.
/// `tokio::test(start_paused = true)` for in-process stores.
#[macro_export]
macro_rules! claim_suite {
    ($factory:expr $(, $attr:meta)?) => {
        $crate::__with_test_attr!(__claim_checks, $factory $(, $attr)?);
    };
}

/// Calls the kit's macro `$checks` with `$factory` and the test attribute:
/// the one given, or by default a multi-threaded tokio test, the attribute
/// every suite uses for stores on a server.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_test_attr {
    ($checks:ident, $factory:expr) => {
        $crate::$checks!(
            $factory,
            tokio::test(flavor = "multi_thread", worker_threads = 4)
        );
    };
    ($checks:ident, $factory:expr, $attr:meta) => {
        $crate::$checks!($factory, $attr);
    };
}

/// The claim suite's checks, under the test attribute `$attr`.
#[doc(hidden)]
#[macro_export]
macro_rules! __claim_checks {
    ($factory:expr, $attr:meta) => {
        $crate::__suite_tests!(
            $factory,
            $attr,
            $crate::claim,
            claim_is_exclusive,
            own_retry_is_recognised,
            other_token_loses,
            runs_are_independent,
            similar_names_stay_apart,
        );
        $crate::__scheduler_claim_checks!($factory, $attr);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    ($factory:expr, $attr:meta, $module:path, $($check:ident),+ $(,)?) => {
        $(
            #[$attr]
            async fn $check() {
                use $module as suite;
                let factory = $factory;
                suite::$check(&factory).await;
            }
        )+
    };
}
