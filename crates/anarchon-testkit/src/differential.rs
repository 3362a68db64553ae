//! Differential checks: the store's answers against the core's decision.
//!
//! `anarchon_core::decide` says, for a run's record, the store's clock and
//! a request, what a lease store must answer and write. These checks build
//! every record a run can reach through the store's own calls — none,
//! missed, waiting (a buffered slot), each ended state, failed with a
//! retry pending or due, running in attempt 1, 2 or 3 with its lease
//! alive, released or given back — beside another run of the job that is
//! absent, live, run out, waiting for its retry or a waiting slot, and send
//! every kind of request to it: fresh or late, each overlap rule
//! (allowed, skipped, replacing, buffering one), one to three attempts, from the holder
//! or a stranger. Each answer, and the record it leaves, must be exactly
//! what the core's functions say. A store whose script or SQL drifts from
//! the core fails here with the case printed.
//!
//! Every case uses a job of its own, and cases run a few at a time.

use std::time::Duration;

use anarchon_core::decide::{self, ClaimDecision, Facts, FinishDecision, LeaseRecord};
use anarchon_core::retry::NOT_RETRIED;
use anarchon_core::{
    AttemptEnd, ClaimOutcome, FinalState, JobName, LeaseClaim, LeaseStore, MaxAttempts, Overlap,
    PastAttempt, PastAttempts, PauseEnd, PauseRequest, PauseScope, Paused, RecordState, Renewal,
    RetryPlan, RunKey, RunOutcome, RunRecord, RunState, Slot, Timestamp, Token,
};
use futures::StreamExt;

use crate::claim::claim_request;
use crate::factory::StoreFactory;
use crate::lease::{LONG_LEASE, store_now};

/// How many cases run at once.
const AT_ONCE: usize = 8;
/// The late window of the requests under test.
const MAX_LATE: Duration = Duration::from_secs(60);
/// The late window of the claims that build a record: long enough for any
/// slot of a case.
const PLANTING_LATE: Duration = Duration::from_secs(24 * 3600);

/// How a lease that exists was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    /// Alive for a long while.
    Alive,
    /// Released by its holder: run out, holder kept.
    Released,
    /// Given back by its holder: run out, no holder.
    GivenBack,
}

/// A run's record before the request, as the store's own calls build it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prior {
    None,
    Missed,
    Ended(FinalState),
    /// Failed with a retry pending: due already, or not for an hour.
    RetryPending {
        due: bool,
    },
    /// A buffered slot waiting for a run of the job that has since ended.
    Waiting,
    Running {
        attempt: u32,
        lease: Lease,
    },
}

/// How long after its failure a planted retry is due when it must not be
/// due yet.
const RETRY_LATER: Duration = Duration::from_secs(3600);

/// A failure that asks for a retry due `after` from the store's now, with
/// no next slot in the way.
pub(crate) fn failed_with_retry(after: Duration) -> RunOutcome {
    RunOutcome::Failed {
        error: "planted".into(),
        retry: Some(RetryPlan {
            after,
            before: Timestamp::from_millis(i64::MAX),
        }),
    }
}

const PRIORS: [Prior; 20] = [
    Prior::None,
    Prior::Missed,
    Prior::Ended(FinalState::Succeeded),
    Prior::Ended(FinalState::Failed),
    Prior::Ended(FinalState::Interrupted),
    Prior::Ended(FinalState::Skipped),
    Prior::Ended(FinalState::Paused),
    Prior::Ended(FinalState::Replaced),
    Prior::RetryPending { due: false },
    Prior::RetryPending { due: true },
    Prior::Waiting,
    Prior::Running {
        attempt: 1,
        lease: Lease::Alive,
    },
    Prior::Running {
        attempt: 1,
        lease: Lease::Released,
    },
    Prior::Running {
        attempt: 1,
        lease: Lease::GivenBack,
    },
    Prior::Running {
        attempt: 2,
        lease: Lease::Alive,
    },
    Prior::Running {
        attempt: 2,
        lease: Lease::Released,
    },
    Prior::Running {
        attempt: 2,
        lease: Lease::GivenBack,
    },
    Prior::Running {
        attempt: 3,
        lease: Lease::Alive,
    },
    Prior::Running {
        attempt: 3,
        lease: Lease::Released,
    },
    Prior::Running {
        attempt: 3,
        lease: Lease::GivenBack,
    },
];

/// Another run of the same job, for the overlap rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Other {
    None,
    Live,
    RunOut,
    /// Failed, with its retry due in an hour: still going, for overlap.
    RetryPending,
    /// A buffered slot waiting (for a run that has since ended).
    Waiting,
}

/// One claim case.
#[derive(Clone, Copy, Debug)]
struct ClaimCase {
    prior: Prior,
    other: Other,
    late: bool,
    overlap: Overlap,
    max_attempts: u32,
    /// The request comes from the token that holds (or last held) the run.
    from_holder: bool,
    /// The job is paused when the request comes.
    paused: bool,
    /// The claim may start a slot recorded `paused` (a backfill's).
    rerun_paused: bool,
}

/// Every claim case: 20 records × 5 other runs (but two waiting slots) ×
/// fresh or late × `Allow` or `Skip` × 1–3 attempts × holder or stranger,
/// with the job not paused; and the same records, other runs, lateness and
/// overlap rules from a stranger allowed 3 attempts while the job is
/// paused; and both of those from a stranger whose claim may re-run a
/// paused slot (a backfill's). With `Replace`, a stranger's claim; with
/// `BufferOne`, a stranger's claim, paused or not.
fn claim_cases() -> Vec<ClaimCase> {
    let mut cases = Vec::new();
    let others = [
        Other::None,
        Other::Live,
        Other::RunOut,
        Other::RetryPending,
        Other::Waiting,
    ];
    for prior in PRIORS {
        for other in others {
            if prior == Prior::Waiting && other == Other::Waiting {
                continue;
            }
            for late in [false, true] {
                let case = |overlap, paused| ClaimCase {
                    prior,
                    other,
                    late,
                    overlap,
                    max_attempts: 3,
                    from_holder: false,
                    paused,
                    rerun_paused: false,
                };
                cases.push(case(Overlap::Replace, false));
                cases.push(case(Overlap::BufferOne, false));
                cases.push(case(Overlap::BufferOne, true));
                for overlap in [Overlap::Allow, Overlap::Skip] {
                    let case = |max_attempts, from_holder, paused, rerun_paused| ClaimCase {
                        prior,
                        other,
                        late,
                        overlap,
                        max_attempts,
                        from_holder,
                        paused,
                        rerun_paused,
                    };
                    for max_attempts in 1..=3 {
                        for from_holder in [false, true] {
                            cases.push(case(max_attempts, from_holder, false, false));
                        }
                    }
                    cases.push(case(3, false, true, false));
                    cases.push(case(3, false, false, true));
                    cases.push(case(3, false, true, true));
                }
            }
        }
    }
    cases
}

fn planting(run: &RunKey, token: Token, max_late: Duration, max_attempts: u32) -> LeaseClaim {
    let mut claim = claim_request(run.clone(), token, "planter");
    claim.max_late = max_late;
    LeaseClaim {
        claim,
        lease: LONG_LEASE,
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::new(max_attempts).expect("not zero"),
        rerun_paused: false,
    }
}

async fn expect_won<S: LeaseStore + ?Sized>(store: &S, claim: &LeaseClaim, what: &str) {
    match store.claim_lease(claim).await.expect("claim") {
        ClaimOutcome::Won(_) => {}
        other => panic!("building the record ({what}): expected Won, got {other:?}"),
    }
}

fn renewed(answer: Result<Renewal, anarchon_core::StoreError>, what: &str) {
    assert_eq!(
        answer.expect(what),
        Renewal::Renewed,
        "building the record ({what})"
    );
}

/// Builds `prior` for `run` through the store's own calls and returns the
/// token that holds (or last held) it, if any.
async fn plant<S: LeaseStore + ?Sized>(store: &S, run: &RunKey, prior: Prior) -> Option<Token> {
    match prior {
        Prior::None => None,
        Prior::Missed => {
            // A claim whose window the slot has already left.
            let age = store_now(store, &run.job).await.since(run.slot.at());
            let mut claim = planting(run, Token::generate(), PLANTING_LATE, 3);
            claim.claim.max_late = age.saturating_sub(Duration::from_millis(500));
            assert_eq!(
                store.claim_lease(&claim).await.expect("claim"),
                ClaimOutcome::Missed,
                "building a missed record"
            );
            None
        }
        Prior::Ended(state @ (FinalState::Succeeded | FinalState::Failed)) => {
            let token = Token::generate();
            expect_won(store, &planting(run, token, PLANTING_LATE, 3), "to finish").await;
            let outcome = if state == FinalState::Succeeded {
                RunOutcome::Succeeded
            } else {
                RunOutcome::Failed {
                    error: "planted".into(),
                    retry: None,
                }
            };
            renewed(store.finish(run, token, outcome).await, "finish");
            Some(token)
        }
        Prior::RetryPending { due } => {
            let token = Token::generate();
            expect_won(store, &planting(run, token, PLANTING_LATE, 3), "to fail").await;
            let after = if due {
                Duration::from_millis(1)
            } else {
                RETRY_LATER
            };
            renewed(
                store.finish(run, token, failed_with_retry(after)).await,
                "finish",
            );
            if due {
                wait_for_the_store_clock_past(store, run).await;
            }
            Some(token)
        }
        Prior::Ended(FinalState::Interrupted) => {
            let token = Token::generate();
            expect_won(
                store,
                &planting(run, token, PLANTING_LATE, 1),
                "to interrupt",
            )
            .await;
            renewed(store.release(run, token).await, "release");
            assert_eq!(
                store
                    .claim_lease(&planting(run, Token::generate(), PLANTING_LATE, 1))
                    .await
                    .expect("claim"),
                ClaimOutcome::Interrupted,
                "building an interrupted record"
            );
            Some(token)
        }
        Prior::Ended(FinalState::Paused) => {
            // Claimed while the job was paused, then resumed.
            let scope = PauseScope::Job(run.job.clone());
            store
                .pause(&scope, &PauseRequest::new())
                .await
                .expect("pause");
            assert_eq!(
                store
                    .claim_lease(&planting(run, Token::generate(), PLANTING_LATE, 3))
                    .await
                    .expect("claim"),
                ClaimOutcome::Done(FinalState::Paused),
                "building a paused record"
            );
            assert!(store.resume(&scope).await.expect("resume"), "resumed");
            None
        }
        Prior::Ended(FinalState::Skipped) => {
            plant_blocked(store, run, Overlap::Skip).await;
            None
        }
        Prior::Ended(FinalState::Replaced) => {
            // Running, then replaced by a later slot.
            let holder = Token::generate();
            expect_won(store, &planting(run, holder, PLANTING_LATE, 3), "to run").await;
            let later = RunKey::new(
                run.job.clone(),
                Slot::from_millis(run.slot.as_millis() + 7_000),
            );
            let mut replacing = planting(&later, Token::generate(), PLANTING_LATE, 3);
            replacing.overlap = Overlap::Replace;
            expect_won(store, &replacing, "to replace").await;
            Some(holder)
        }
        Prior::Waiting => {
            plant_blocked(store, run, Overlap::BufferOne).await;
            None
        }
        Prior::Running { attempt, lease } => {
            let mut holder = Token::generate();
            expect_won(store, &planting(run, holder, PLANTING_LATE, 3), "to run").await;
            for _ in 1..attempt {
                renewed(store.release(run, holder).await, "release");
                holder = Token::generate();
                expect_won(
                    store,
                    &planting(run, holder, PLANTING_LATE, 3),
                    "to take over",
                )
                .await;
            }
            match lease {
                Lease::Alive => Some(holder),
                Lease::Released => {
                    renewed(store.release(run, holder).await, "release");
                    Some(holder)
                }
                Lease::GivenBack => {
                    renewed(store.give_back(run, holder).await, "give back");
                    Some(holder)
                }
            }
        }
    }
}

/// Records `run` skipped (`Overlap::Skip`) or waiting
/// (`Overlap::BufferOne`): another run of the job 7 s before it is live
/// while it is claimed, then released.
async fn plant_blocked<S: LeaseStore + ?Sized>(store: &S, run: &RunKey, overlap: Overlap) {
    let blocker = RunKey::new(
        run.job.clone(),
        Slot::from_millis(run.slot.as_millis() - 7_000),
    );
    let token = Token::generate();
    expect_won(
        store,
        &planting(&blocker, token, PLANTING_LATE, 3),
        "to block",
    )
    .await;
    let mut claim = planting(run, Token::generate(), PLANTING_LATE, 3);
    claim.overlap = overlap;
    let answer = store.claim_lease(&claim).await.expect("claim");
    match overlap {
        Overlap::Skip => assert_eq!(answer, ClaimOutcome::Overlap, "building a skipped record"),
        _ => assert!(
            matches!(answer, ClaimOutcome::Running { .. }),
            "building a waiting record: expected Running, got {answer:?}"
        ),
    }
    renewed(store.release(&blocker, token).await, "release");
}

/// Waits until the store's clock has passed the retry of `run`.
async fn wait_for_the_store_clock_past<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) {
    loop {
        let view = store.peek(run).await.expect("peek");
        match view.state {
            RunState::RetryPending { retry_at, .. } if retry_at >= view.store_now => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            RunState::RetryPending { .. } => return,
            other => panic!("building a due retry: expected a pending retry, got {other:?}"),
        }
    }
}

/// The past attempts a run's record must hold after `decision`: those
/// before it, and the attempt it ended, if it ended one.
fn past_after(
    decision: &ClaimDecision,
    record: Option<&LeaseRecord>,
    before: Option<&RunRecord>,
) -> PastAttempts {
    let mut past = before.map(|r| r.earlier.clone()).unwrap_or_default();
    if let (Some(ended), Some(b)) = (decision.ends_attempt(record), before)
        && let Some(attempt) = b.attempt
    {
        past.push(PastAttempt {
            attempt,
            ended,
            at: match ended {
                AttemptEnd::Failed => b.finished_at,
                AttemptEnd::TakenOver => b.lease_until,
            },
            instance: b.instance.clone(),
            error: match ended {
                AttemptEnd::Failed => b.error.clone(),
                AttemptEnd::TakenOver => None,
            },
        });
    }
    past
}

/// The run's record as history shows it.
async fn record_of<S: LeaseStore + ?Sized>(store: &S, run: &RunKey) -> Option<RunRecord> {
    crate::lease::records_of(store, run, 20)
        .await
        .into_iter()
        .next()
}

/// The record as the core's decisions read it: history's facts plus the
/// holder the case knows.
fn lease_record(
    record: Option<&RunRecord>,
    prior: Prior,
    holder: Option<Token>,
) -> Option<LeaseRecord> {
    let r = record?;
    let given_back = matches!(
        prior,
        Prior::Running {
            lease: Lease::GivenBack,
            ..
        }
    );
    Some(LeaseRecord {
        state: r.state,
        attempt: r.attempt,
        holder: if given_back { None } else { holder },
        fence: r.fence,
        lease_until: r.lease_until,
        retry_at: r.retry_at,
    })
}

/// For every record a run can reach and every kind of claim, the store
/// answers and writes exactly what `anarchon_core::decide::claim` says.
pub async fn claims_follow_the_core_decision<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let cases = claim_cases();
    assert!(cases.len() >= 500, "{} cases", cases.len());
    let store = &store;
    futures::stream::iter(cases.into_iter().enumerate())
        .for_each_concurrent(AT_ONCE, |(i, case)| async move {
            check_claim(store.as_ref(), i, case).await;
        })
        .await;
}

async fn check_claim<S: LeaseStore + ?Sized>(store: &S, i: usize, case: ClaimCase) {
    let job = JobName::new(&format!("diff-claim-{i}")).expect("valid name");
    let now = store_now(store, &job).await.as_millis();
    let age = if case.late { 120_000 } else { 1_000 };
    let slot = Slot::from_millis(now - now.rem_euclid(1000) - age);
    let run = RunKey::new(job.clone(), slot);
    let holder = plant(store, &run, case.prior).await;
    let other = RunKey::new(job.clone(), Slot::from_millis(slot.as_millis() + 3_000));
    match case.other {
        Other::None => {}
        Other::Waiting => plant_blocked(store, &other, Overlap::BufferOne).await,
        Other::Live | Other::RunOut | Other::RetryPending => {
            let token = Token::generate();
            expect_won(store, &planting(&other, token, PLANTING_LATE, 3), "other").await;
            if case.other == Other::RunOut {
                renewed(store.release(&other, token).await, "release other");
            }
            if case.other == Other::RetryPending {
                let failed = failed_with_retry(RETRY_LATER);
                renewed(store.finish(&other, token, failed).await, "fail other");
            }
        }
    }
    let paused = if case.paused {
        let scope = PauseScope::Job(job.clone());
        let pause = store
            .pause(&scope, &PauseRequest::new())
            .await
            .expect("pause");
        assert_eq!(pause.end, PauseEnd::OnResume, "a pause until resumed");
        Paused {
            job: Some(pause.end),
            all: None,
        }
    } else {
        Paused::NONE
    };
    // One read of the job gives the run's record and the job's highest
    // fence, which a new win must pass.
    let runs = store.history(&job, 20).await.expect("history");
    let before = runs.iter().find(|r| r.run == run).cloned();
    let highest_fence = runs.iter().filter_map(|r| r.fence).max();
    let token = match (case.from_holder, holder) {
        (true, Some(holder)) => holder,
        _ => Token::generate(),
    };
    let mut claim = LeaseClaim {
        claim: claim_request(run.clone(), token, "claimer"),
        lease: LONG_LEASE,
        overlap: case.overlap,
        max_attempts: MaxAttempts::new(case.max_attempts).expect("not zero"),
        rerun_paused: case.rerun_paused,
    };
    claim.claim.max_late = MAX_LATE;
    let now = store_now(store, &job).await;
    let other_live = match case.other {
        Other::Live | Other::RetryPending => true,
        Other::None | Other::RunOut | Other::Waiting => false,
    };
    let other_waiting = case.other == Other::Waiting;
    let record = lease_record(before.as_ref(), case.prior, holder);
    let decision = decide::claim(
        record.as_ref(),
        Facts::all(now, other_live, paused, other_waiting),
        &claim,
    )
    .expect("every fact given");
    let answer = store.claim_lease(&claim).await.expect("claim");
    let after = record_of(store, &run).await;
    let context = format!(
        "case {case:?}\nrecord before {before:?}\ncore decision {decision:?}\nstore answered {answer:?}\nrecord after {after:?}"
    );
    let past = past_after(&decision, record.as_ref(), before.as_ref());
    match (&decision, &answer) {
        (
            ClaimDecision::Start
            | ClaimDecision::StartReplacing
            | ClaimDecision::TakeOver { .. }
            | ClaimDecision::Retry { .. },
            ClaimOutcome::Won(win),
        ) => {
            let want = decision.clone().outcome(win.fence, &past);
            assert_eq!(answer, want, "{context}");
            assert!(
                win.fence.is_some() && win.fence > highest_fence,
                "a new fence above the job's highest: {context}"
            );
        }
        // A waiting slot is told to look again one lease after the
        // store's now at the claim, which the check can only bound.
        (ClaimDecision::RecordWaiting { .. }, ClaimOutcome::Running { lease_until, .. }) => {
            assert_looks_again_a_lease_later(*lease_until, now, store, &job, &context).await
        }
        (
            ClaimDecision::Answer(ClaimOutcome::Running { .. }),
            ClaimOutcome::Running { lease_until, .. },
        ) if case.prior == Prior::Waiting => {
            assert_looks_again_a_lease_later(*lease_until, now, store, &job, &context).await
        }
        (_, ClaimOutcome::Running { lease_until, .. }) => {
            match decision.clone().outcome(None, &past) {
                ClaimOutcome::Running {
                    lease_until: want, ..
                } => assert_eq!(*lease_until, want, "{context}"),
                _ => panic!("{context}"),
            }
        }
        _ => assert_eq!(answer, decision.clone().outcome(None, &past), "{context}"),
    }
    if decision == ClaimDecision::StartReplacing {
        let all_after = store.history(&job, 20).await.expect("history");
        assert_the_others_replaced(&runs, &all_after, &run, &context);
    }
    let after_record = after.as_ref();
    match decision {
        ClaimDecision::Answer(_) | ClaimDecision::Resent { .. } => {
            assert_eq!(after, before, "nothing written: {context}")
        }
        ClaimDecision::RecordMissed => {
            assert_eq!(
                after_record.map(|r| r.state),
                Some(RecordState::Missed),
                "{context}"
            )
        }
        ClaimDecision::RecordSkipped => assert_eq!(
            after_record.map(|r| r.state),
            Some(RecordState::Finished(FinalState::Skipped)),
            "{context}"
        ),
        ClaimDecision::RecordPaused => assert_eq!(
            after_record.map(|r| r.state),
            Some(RecordState::Finished(FinalState::Paused)),
            "{context}"
        ),
        ClaimDecision::RecordWaiting { until, .. } => {
            let r = after_record.unwrap_or_else(|| panic!("no record: {context}"));
            assert_eq!(r.state, RecordState::Waiting, "{context}");
            assert_eq!(r.lease_until, Some(until), "the end of its wait: {context}");
        }
        ClaimDecision::Start
        | ClaimDecision::StartReplacing
        | ClaimDecision::TakeOver { .. }
        | ClaimDecision::Retry { .. } => {
            let r = after_record.unwrap_or_else(|| panic!("no record: {context}"));
            assert_eq!(r.earlier, past, "the past attempts: {context}");
            assert_eq!(
                (r.retry_at, r.finished_at, r.error.as_deref()),
                (None, None, None),
                "a running run has no retry, end or error: {context}"
            );
            let ClaimOutcome::Won(win) = answer else {
                unreachable!("checked above")
            };
            assert_eq!(r.state, RecordState::Running, "{context}");
            assert_eq!(r.attempt, Some(win.attempt), "{context}");
            assert_eq!(r.fence, win.fence, "{context}");
            assert_eq!(
                r.instance.as_ref().map(|i| i.as_str()),
                Some("claimer"),
                "{context}"
            );
            assert!(
                r.lease_until.is_some_and(|until| until > now),
                "a live lease: {context}"
            );
        }
        ClaimDecision::Interrupt => assert_eq!(
            after_record.map(|r| r.state),
            Some(RecordState::Finished(FinalState::Interrupted)),
            "{context}"
        ),
    }
}

/// Checks that `lease_until` is one [`LONG_LEASE`] after the store's clock
/// at the claim: between `before` (read before it) and the clock read now.
async fn assert_looks_again_a_lease_later<S: LeaseStore + ?Sized>(
    lease_until: Timestamp,
    before: Timestamp,
    store: &S,
    job: &JobName,
    context: &str,
) {
    let after = store_now(store, job).await;
    assert!(
        lease_until >= before.saturating_add(LONG_LEASE)
            && lease_until <= after.saturating_add(LONG_LEASE),
        "look again one lease after the claim: {context}"
    );
}

/// Checks what a `Replace` claim that started did to the job's other
/// runs: each one still going before it (running, or waiting for a
/// retry) ended `replaced`; the others are as they were.
fn assert_the_others_replaced(
    before: &[RunRecord],
    after: &[RunRecord],
    run: &RunKey,
    context: &str,
) {
    for old in before.iter().filter(|r| &r.run != run) {
        let new = after
            .iter()
            .find(|r| r.run == old.run)
            .unwrap_or_else(|| panic!("{} vanished: {context}", old.run));
        if old.state == RecordState::Running || old.retry_at.is_some() {
            assert_eq!(
                (new.state, new.retry_at),
                (RecordState::Finished(FinalState::Replaced), None),
                "{} was going and must end replaced: {context}",
                old.run
            );
            assert!(new.finished_at.is_some(), "{context}");
        } else {
            assert_eq!(new, old, "{} must be left alone: {context}", old.run);
        }
    }
}

/// A call that renews, ends or hands over a run.
#[derive(Clone, Copy, Debug)]
enum Call {
    Heartbeat,
    Succeed,
    Fail,
    /// Fail, asking for a retry due in an hour.
    FailRetrying,
    /// Fail, asking for a retry that would be due after the next slot.
    FailPastTheNextSlot,
    Release,
    GiveBack,
}

/// For every record a run can reach, a heartbeat, finish, release or
/// give-back from its holder or a stranger answers and writes exactly what
/// `anarchon_core::decide` says; after a release or give-back, the next
/// claim runs the attempt the core says.
pub async fn renewals_follow_the_core_decision<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store = factory.instance().await;
    let mut cases = Vec::new();
    for prior in PRIORS {
        for call in [
            Call::Heartbeat,
            Call::Succeed,
            Call::Fail,
            Call::FailRetrying,
            Call::FailPastTheNextSlot,
            Call::Release,
            Call::GiveBack,
        ] {
            for from_holder in [false, true] {
                cases.push((prior, call, from_holder));
            }
        }
    }
    let store = &store;
    futures::stream::iter(cases.into_iter().enumerate())
        .for_each_concurrent(AT_ONCE, |(i, (prior, call, from_holder))| async move {
            check_renewal(store.as_ref(), i, prior, call, from_holder).await;
        })
        .await;
}

async fn check_renewal<S: LeaseStore + ?Sized>(
    store: &S,
    i: usize,
    prior: Prior,
    call: Call,
    from_holder: bool,
) {
    let job = JobName::new(&format!("diff-renew-{i}")).expect("valid name");
    let now = store_now(store, &job).await.as_millis();
    let run = RunKey::new(
        job.clone(),
        Slot::from_millis(now - now.rem_euclid(1000) - 1_000),
    );
    let holder = plant(store, &run, prior).await;
    let token = match (from_holder, holder) {
        (true, Some(holder)) => holder,
        _ => Token::generate(),
    };
    let before = record_of(store, &run).await;
    let record = lease_record(before.as_ref(), prior, holder);
    let context = |answer: &dyn std::fmt::Debug, after: &Option<RunRecord>| {
        format!(
            "prior {prior:?}, {call:?} from {}\nrecord before {before:?}\nstore answered {answer:?}\nrecord after {after:?}",
            if from_holder {
                "the holder"
            } else {
                "a stranger"
            }
        )
    };
    let now = store_now(store, &job).await;
    match call {
        Call::Heartbeat => {
            let want = decide::heartbeat(record.as_ref(), token);
            let answer = store
                .heartbeat(&run, token, LONG_LEASE)
                .await
                .expect("heartbeat");
            let after = record_of(store, &run).await;
            let context = context(&answer, &after);
            assert_eq!(answer, want, "{context}");
            if want == Renewal::Renewed {
                let until = after.as_ref().and_then(|r| r.lease_until);
                assert!(
                    until.is_some_and(|u| u >= now.saturating_add(LONG_LEASE / 2)),
                    "the lease was extended: {context}"
                );
            } else {
                assert_eq!(after, before, "nothing written: {context}");
            }
        }
        Call::Succeed | Call::Fail | Call::FailRetrying | Call::FailPastTheNextSlot => {
            let outcome = match call {
                Call::Succeed => RunOutcome::Succeeded,
                Call::FailRetrying => failed_with_retry(RETRY_LATER),
                Call::FailPastTheNextSlot => RunOutcome::Failed {
                    error: "planted".into(),
                    retry: Some(RetryPlan {
                        after: RETRY_LATER,
                        before: now.saturating_add(RETRY_LATER / 2),
                    }),
                },
                _ => RunOutcome::Failed {
                    error: "planted".into(),
                    retry: None,
                },
            };
            let want = decide::finish(record.as_ref(), token, &outcome, now);
            let answer = store.finish(&run, token, outcome).await.expect("finish");
            let after = record_of(store, &run).await;
            let finished_by = store_now(store, &job).await;
            let context = context(&answer, &after);
            assert_eq!(answer, want.renewal(), "{context}");
            match want {
                FinishDecision::Finish {
                    state,
                    retry_at,
                    not_retried,
                } => {
                    let r = after.as_ref().expect("a record");
                    assert_eq!(r.state, RecordState::Finished(state), "{context}");
                    match retry_at {
                        None => assert_eq!(r.retry_at, None, "no retry: {context}"),
                        Some(_) => assert!(
                            r.retry_at
                                .is_some_and(|at| at >= now.saturating_add(RETRY_LATER)
                                    && at <= finished_by.saturating_add(RETRY_LATER)),
                            "the retry is due an hour after the finish, on the store's clock: {context}"
                        ),
                    }
                    let error = r.error.as_deref().unwrap_or_default();
                    assert_eq!(
                        error.ends_with(NOT_RETRIED),
                        not_retried,
                        "the error says whether a wanted retry was not made: {context}"
                    );
                }
                FinishDecision::AlreadyFinished | FinishDecision::Fenced => {
                    assert_eq!(after, before, "nothing written: {context}")
                }
            }
        }
        Call::Release | Call::GiveBack => {
            let giving_back = matches!(call, Call::GiveBack);
            let want = if giving_back {
                decide::give_back(record.as_ref(), token)
            } else {
                decide::release(record.as_ref(), token)
            };
            let answer = if giving_back {
                store.give_back(&run, token).await
            } else {
                store.release(&run, token).await
            }
            .expect("release");
            let after = record_of(store, &run).await;
            let context = context(&answer, &after);
            assert_eq!(answer, want, "{context}");
            if want == Renewal::Fenced {
                assert_eq!(after, before, "nothing written: {context}");
                return;
            }
            let view = store.peek(&run).await.expect("peek");
            match view.state {
                RunState::Running { lease_until, .. } => {
                    assert!(lease_until < view.store_now, "the lease ended: {context}")
                }
                other => panic!("still running, got {other:?}: {context}"),
            }
            // The next claim runs the attempt the core says: the same one
            // after a give-back, the next after a release.
            let handed = record.map(|mut r| {
                r.holder = if giving_back { None } else { Some(token) };
                r.lease_until = Some(Timestamp::from_millis(view.store_now.as_millis() - 1));
                r
            });
            let next = planting(&run, Token::generate(), PLANTING_LATE, 3);
            let decision = decide::claim(
                handed.as_ref(),
                Facts::all(view.store_now, false, Paused::NONE, false),
                &next,
            )
            .expect("every fact given");
            let answer = store.claim_lease(&next).await.expect("claim");
            match (decision, &answer) {
                (ClaimDecision::TakeOver { attempt }, ClaimOutcome::Won(win)) => {
                    assert_eq!(win.attempt, attempt, "{context}\nnext claim {answer:?}")
                }
                (decision, answer) => assert_eq!(
                    *answer,
                    decision.outcome(None, &PastAttempts::NONE),
                    "{context}\nnext claim {answer:?}"
                ),
            }
        }
    }
}
