//! Batches: `claim_many` answers each claim as a claim of its own would.

use std::collections::HashMap;
use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, FinalState, LeaseClaim, LeaseStore, RunKey, RunOutcome, Slot, Timestamp,
    Token,
};

use crate::claim::{future_slot, job, past_slot};
use crate::factory::StoreFactory;

use super::{LONG_LEASE, lease_claim, lease_end, records_of, two_instances, won};

/// `claim_many` answers in order, like claims one by one.
pub async fn claim_many_answers_in_order<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = two_instances(factory).await;
    let slot = future_slot(factory, 0);
    let claims_a: Vec<LeaseClaim> = (0..50)
        .map(|i| {
            lease_claim(
                RunKey::new(job(&format!("batch-{i}")), slot),
                Token::generate(),
                "a",
            )
        })
        .collect();
    // b claims every other job first.
    for claim in claims_a.iter().step_by(2) {
        let mine = lease_claim(claim.run().clone(), Token::generate(), "b");
        won(b.claim_lease(&mine).await.expect("claim"));
    }
    let outcomes = claim_batch(&*a, &claims_a, "claim_many").await;
    assert_eq!(outcomes.len(), claims_a.len());
    for (i, outcome) in outcomes.iter().enumerate() {
        if i % 2 == 0 {
            assert!(
                matches!(outcome, ClaimOutcome::Running { .. }),
                "job {i}: {outcome:?}"
            );
        } else {
            assert!(
                matches!(outcome, ClaimOutcome::Won(_)),
                "job {i}: {outcome:?}"
            );
        }
    }
    let again = claim_batch(&*a, &claims_a, "claim_many again").await;
    // The same answers, except the store's clock, which has moved on.
    let without_clock = |outcomes: &[ClaimOutcome]| -> Vec<ClaimOutcome> {
        outcomes
            .iter()
            .map(|o| match o {
                ClaimOutcome::Running { lease_until, .. } => ClaimOutcome::Running {
                    lease_until: *lease_until,
                    store_now: Timestamp::from_millis(0),
                },
                other => other.clone(),
            })
            .collect()
    };
    assert_eq!(
        without_clock(&again),
        without_clock(&outcomes),
        "a retried batch with the same tokens gets the same answers"
    );
    assert!(a.claim_many(&[]).await.expect("empty batch").is_empty());
}

/// `store`'s answers to `batch`, one per claim (`what` names the call in
/// a failure).
async fn claim_batch<S: LeaseStore + ?Sized>(
    store: &S,
    batch: &[LeaseClaim],
    what: &str,
) -> Vec<ClaimOutcome> {
    store
        .claim_many(batch)
        .await
        .expect(what)
        .all()
        .expect("every claim of the batch answered")
}

/// A permutation of `0..n` from `seed` (Fisher–Yates on splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = crate::faults::SplitMix(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// What a claim in a batch should meet, set up before the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Free,
    HeldByOther,
    Finished,
    Old,
}

/// `claim_many` answers each claim with that run's own facts, in the
/// batch's order, for odd-sized and shuffled batches mixing jobs, runs of
/// one job, live leases, finished and late runs: a `Won` carries the fence
/// `history` records for that run, a `Running` the lease end its holder
/// sees, a `Done` the run's own end.
pub async fn claim_many_answers_with_each_runs_facts<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let (a, b) = two_instances(factory).await;
    let base = future_slot(factory, 0).as_millis();
    let old_base = past_slot(factory, 3_600_000).as_millis();
    for (round, size) in [1usize, 3, 7, 13].into_iter().enumerate() {
        let setups: Vec<Setup> = (0..size)
            .map(|i| match (i * 7 + round) % 4 {
                0 => Setup::Free,
                1 => Setup::HeldByOther,
                2 => Setup::Finished,
                _ => Setup::Old,
            })
            .collect();
        let runs: Vec<RunKey> = (0..size)
            .map(|i| {
                let job = job(&format!("facts-{round}-{}", i % 3));
                let slot = match setups[i] {
                    Setup::Old => old_base + i as i64 * 1000,
                    _ => base + i as i64 * 1000,
                };
                RunKey::new(job, Slot::from_millis(slot))
            })
            .collect();
        // b holds or finishes some runs, each with its own lease length,
        // so every `Running` answer names one holder.
        let mut holders_end = HashMap::new();
        for (i, run) in runs.iter().enumerate() {
            let token = Token::generate();
            let mut claim = lease_claim(run.clone(), token, "b");
            claim.lease = LONG_LEASE + Duration::from_millis(100 * i as u64);
            match setups[i] {
                Setup::HeldByOther => {
                    won(b.claim_lease(&claim).await.expect("claim"));
                    holders_end.insert(i, lease_end(&b.peek(run).await.expect("peek")));
                }
                Setup::Finished => {
                    won(b.claim_lease(&claim).await.expect("claim"));
                    let outcome = if i % 2 == 0 {
                        RunOutcome::Succeeded
                    } else {
                        RunOutcome::Failed {
                            error: "set up".to_owned(),
                            retry: None,
                        }
                    };
                    b.finish(run, token, outcome).await.expect("finish");
                }
                Setup::Free | Setup::Old => {}
            }
        }
        let order = shuffled(size, 0x5eed + round as u64);
        let batch: Vec<LeaseClaim> = order
            .iter()
            .map(|&i| lease_claim(runs[i].clone(), Token::generate(), "a"))
            .collect();
        let answers = claim_batch(&*a, &batch, "claim_many").await;
        assert_eq!(answers.len(), batch.len(), "one answer per claim");
        let mut fences = Vec::new();
        for (answer, &i) in answers.iter().zip(&order) {
            let run = &runs[i];
            let context = format!("batch of {size}, claim of {run} ({:?})", setups[i]);
            match (setups[i], answer) {
                (Setup::Free, ClaimOutcome::Won(win)) => {
                    assert_eq!(win.attempt, Attempt::FIRST, "{context}");
                    let record = records_of(&*a, run, 100)
                        .await
                        .into_iter()
                        .next()
                        .unwrap_or_else(|| panic!("{context}: won but not in the history"));
                    assert_eq!(record.fence, win.fence, "{context}: the fence of this run");
                    assert_eq!(
                        record.instance.as_ref().map(|i| i.as_str()),
                        Some("a"),
                        "{context}"
                    );
                    fences.push((run.job.clone(), win.fence));
                }
                (Setup::HeldByOther, ClaimOutcome::Running { lease_until, .. }) => {
                    assert_eq!(
                        Some(lease_until),
                        holders_end.get(&i),
                        "{context}: the lease end of this run's holder"
                    );
                }
                (Setup::Finished, ClaimOutcome::Done(state)) => {
                    let expected = if i % 2 == 0 {
                        FinalState::Succeeded
                    } else {
                        FinalState::Failed
                    };
                    assert_eq!(*state, expected, "{context}: this run's own end");
                }
                // The batch's claim is the first of the slot: it records the miss.
                (Setup::Old, ClaimOutcome::Missed) => {}
                (_, other) => panic!("{context}: answered {other:?}"),
            }
        }
        let distinct: std::collections::HashSet<_> = fences.iter().collect();
        assert_eq!(
            distinct.len(),
            fences.len(),
            "each win of a job has its own fence: {fences:?}"
        );
    }
}
