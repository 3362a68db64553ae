//! The randomized history test over `MemoryStore`: four schedulers, five
//! jobs, random faults on every instance's connection; every store call is
//! recorded and the checker asserts "one runner per run" on the history.
//!
//! The seed is printed; `ANARCHON_SEED=<n> cargo test -p anarchon-testkit
//! --test history` replays it. `ANARCHON_HISTORY_SECONDS` lengthens the run
//! (a soak).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    Attempt, BackendInfo, ClaimOutcome, ClaimRequest, ClaimStore, Clock, FinalState, InstanceId,
    JobName, LeaseClaim, LeaseStore, Memory, MemoryStore, Renewal, RunKey, RunOutcome, RunRecord,
    RunView, Schedule, Scheduler, Slot, StoreError, Timestamp, Token, Win,
};
use anarchon_testkit::faults::{SplitMix, heal_and_shut_down};
use anarchon_testkit::history::{self, Answer, Call, Event, HandlerRun, History, Recorder};
use anarchon_testkit::{Faulty, TestClock};

#[tokio::test(start_paused = true)]
async fn random_faults_never_give_a_run_two_runners() {
    let seed = history::seed();
    println!("history test seed: {seed} (replay with ANARCHON_SEED={seed})");
    let seconds: u64 = std::env::var("ANARCHON_HISTORY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let mut rng = SplitMix(seed);

    let now = anarchon_core::SystemClock.now().as_millis();
    let clock = TestClock::starting_at(Timestamp::from_millis(now - now.rem_euclid(60_000)));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let history = History::new();
    let lease = Duration::from_secs(2);

    let mut faulty = Vec::new();
    let mut schedulers = Vec::new();
    for instance in 0..4 {
        let f = Faulty::new(store.clone());
        faulty.push(f.clone());
        let recorder = Recorder::new(f, instance, history.clone());
        let mut b = Scheduler::builder(recorder)
            .clock(clock.clone())
            .instance_id(InstanceId::new(&format!("i{instance}")).unwrap())
            .lease(lease)
            .heartbeat(Duration::from_millis(500));
        for job in 0..5u64 {
            // Jobs of different lengths: some finish at once, some outlive
            // several heartbeats and get caught by faults.
            let work = Duration::from_millis(job * 900);
            b.job(
                format!("job{job}"),
                Schedule::every(Duration::from_secs(1 + job % 3)).unwrap(),
            )
            .unwrap()
            .max_attempts(3)
            .run(history.working_handler(instance, work))
            .unwrap();
        }
        schedulers.push(b.start().unwrap());
    }

    // The fault driver: every so often, pick an instance and a fault.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(1500))).await;
        let i = rng.below(4) as usize;
        match rng.below(7) {
            0 => faulty[i].set_down(true),
            1 => faulty[i].set_heartbeats_down(true),
            2 => faulty[i].set_heartbeats_hang(true),
            3 => store.lose_replies(1 + rng.below(3) as u32),
            4 => faulty[i].set_replies_lost(true),
            _ => faulty[i].heal(),
        }
    }
    heal_and_shut_down(&faulty, schedulers).await;

    history::check_seeded(&history, seed).assert_faults_bit(seed, 101);
}

#[test]
fn the_checker_catches_two_winners() {
    // A store that says yes to everyone, recorded: the checker must object.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let history = History::new();
        let yes = Arc::new(Yes);
        let a = Recorder::new(yes.clone(), 0, history.clone());
        let b = Recorder::new(yes, 1, history.clone());
        let run = anarchon_core::RunKey::new(
            anarchon_core::JobName::new("j").unwrap(),
            anarchon_core::Slot::from_millis(0),
        );
        use anarchon_core::LeaseStore;
        let claim = |t| anarchon_testkit::lease::lease_claim(run.clone(), t, "x");
        a.claim_lease(&claim(anarchon_core::Token::generate()))
            .await
            .unwrap();
        b.claim_lease(&claim(anarchon_core::Token::generate()))
            .await
            .unwrap();
        let err = history::check(&history).unwrap_err();
        assert!(
            err.0.iter().any(|v| v.contains("won by two tokens")),
            "{err:?}"
        );
    });
}

/// Hand-built histories, one per property of the checker: each breaks
/// that property alone, and the checker must name it.
mod the_checker_objects_to {
    use super::*;
    use tokio::time::Instant;

    const LEASE: Duration = Duration::from_secs(10);

    fn run() -> RunKey {
        RunKey::new(JobName::new("j").unwrap(), Slot::from_millis(0))
    }

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn claim(base: Instant, from: u64, to: u64, token: Token, outcome: ClaimOutcome) -> Event {
        Event {
            instance: 0,
            run: run(),
            call: Call::Claim {
                token,
                lease: LEASE,
            },
            invoked: at(base, from),
            completed: Some(at(base, to)),
            answer: Some(Answer::Claimed(outcome)),
        }
    }

    fn won(attempt: u32) -> ClaimOutcome {
        ClaimOutcome::Won(Win {
            attempt: Attempt::new(attempt).unwrap(),
            ..Win::first(None)
        })
    }

    fn violations(history: &History) -> Vec<String> {
        match history::check(history) {
            Ok(summary) => panic!("the checker passed a broken history: {summary:?}"),
            Err(v) => v.0,
        }
    }

    fn assert_names(history: &History, says: &str) {
        let found = violations(history);
        assert!(
            found.iter().any(|v| v.contains(says)),
            "expected a violation saying {says:?}, got {found:?}"
        );
    }

    /// Claims by fresh tokens, each (invoked, completed, outcome) in ms
    /// from now: the checker must object, and say `says`.
    fn assert_claims_named<const N: usize>(claims: [(u64, u64, ClaimOutcome); N], says: &str) {
        let base = Instant::now();
        let h = History::new();
        for (from, to, outcome) in claims {
            h.push(claim(base, from, to, Token::generate(), outcome));
        }
        assert_names(&h, says);
    }

    #[test]
    fn two_winners_of_one_attempt() {
        assert_claims_named([(0, 1, won(1)), (0, 2, won(1))], "won by two tokens");
    }

    #[test]
    fn attempts_that_go_backwards() {
        assert_claims_named([(0, 1, won(2)), (20_000, 20_001, won(1))], "a later winner");
    }

    #[test]
    fn a_takeover_inside_the_lease() {
        assert_claims_named([(0, 1, won(1)), (5_000, 5_001, won(2))], "inside its");
    }

    #[test]
    fn a_renewal_after_a_takeover() {
        let base = Instant::now();
        let h = History::new();
        let old = Token::generate();
        h.push(claim(base, 0, 1, old, won(1)));
        h.push(claim(base, 20_000, 20_001, Token::generate(), won(2)));
        h.push(Event {
            instance: 0,
            run: run(),
            call: Call::Heartbeat {
                token: old,
                lease: LEASE,
            },
            invoked: at(base, 20_002),
            completed: Some(at(base, 20_003)),
            answer: Some(Answer::Renewal(Renewal::Renewed)),
        });
        assert_names(&h, "was renewed after");
    }

    #[test]
    fn a_win_after_done() {
        assert_claims_named(
            [
                (0, 1, ClaimOutcome::Done(FinalState::Succeeded)),
                (2, 3, won(1)),
            ],
            "won after the run was done",
        );
    }

    #[test]
    fn handlers_that_overlap() {
        let base = Instant::now();
        let h = History::new();
        let handler = |instance, attempt, from, to: Option<u64>| HandlerRun {
            instance,
            run: run(),
            attempt: Attempt::new(attempt).unwrap(),
            started: at(base, from),
            ended: to.map(|to| at(base, to)),
        };
        h.push_handler(handler(0, 1, 0, Some(15_000)));
        h.push_handler(handler(1, 2, 12_000, Some(13_000)));
        assert_names(&h, "two handlers ran at once");
        let h = History::new();
        h.push_handler(handler(0, 1, 0, None));
        h.push_handler(handler(1, 2, 12_000, Some(13_000)));
        assert_names(&h, "it never did");
        // Back to back is no overlap.
        let h = History::new();
        h.push_handler(handler(0, 1, 0, Some(12_000)));
        h.push_handler(handler(1, 2, 12_000, Some(13_000)));
        history::check(&h).expect("handlers back to back");
    }
}

/// A broken store: every claim wins attempt 1, every renewal succeeds.
struct Yes;

/// What `Yes` answers every claim.
fn won() -> Result<ClaimOutcome, StoreError> {
    Ok(ClaimOutcome::Won(Win::first(None)))
}

#[async_trait::async_trait]
impl ClaimStore for Yes {
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        won()
    }
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "yes",
            memory: Memory::Forever,
        }
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl LeaseStore for Yes {
    async fn claim_lease(&self, _: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        won()
    }
    async fn peek(&self, _: &RunKey) -> Result<RunView, StoreError> {
        Err(StoreError::invalid("yes", "no peeking"))
    }
    async fn heartbeat(&self, _: &RunKey, _: Token, _: Duration) -> Result<Renewal, StoreError> {
        Ok(Renewal::Renewed)
    }
    async fn finish(&self, _: &RunKey, _: Token, _: RunOutcome) -> Result<Renewal, StoreError> {
        Ok(Renewal::Renewed)
    }
    async fn release(&self, _: &RunKey, _: Token) -> Result<Renewal, StoreError> {
        Ok(Renewal::Renewed)
    }
    async fn give_back(&self, _: &RunKey, _: Token) -> Result<Renewal, StoreError> {
        Ok(Renewal::Renewed)
    }
    fn hand_overs(&self) -> &anarchon_core::HandOvers {
        // Nobody announces anything here.
        static BOARD: std::sync::LazyLock<anarchon_core::HandOvers> =
            std::sync::LazyLock::new(anarchon_core::HandOvers::new);
        &BOARD
    }
    async fn history(&self, _: &JobName, _: usize) -> Result<Vec<RunRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn collect_garbage(&self, _: Duration) -> Result<u64, StoreError> {
        Ok(0)
    }
    async fn pause(
        &self,
        _: &anarchon_core::PauseScope,
        _: &anarchon_core::PauseRequest,
    ) -> Result<anarchon_core::Pause, anarchon_core::StoreError> {
        Err(anarchon_core::StoreError::invalid("yes", "no pausing"))
    }
    async fn resume(
        &self,
        _: &anarchon_core::PauseScope,
    ) -> Result<bool, anarchon_core::StoreError> {
        Ok(false)
    }
    async fn jobs(&self) -> Result<Vec<JobName>, anarchon_core::StoreError> {
        Ok(Vec::new())
    }
    async fn pauses(&self) -> Result<anarchon_core::Pauses, anarchon_core::StoreError> {
        Ok(anarchon_core::Pauses::holding(
            Vec::new(),
            anarchon_core::Timestamp::from_millis(0),
        ))
    }
    async fn request_run(
        &self,
        _: &anarchon_core::TriggerRequest,
    ) -> Result<anarchon_core::RunRequest, StoreError> {
        Err(StoreError::invalid("yes", "no requests"))
    }
    async fn run_requests(&self) -> Result<anarchon_core::RunRequests, StoreError> {
        Ok(anarchon_core::RunRequests {
            store_now: anarchon_core::Timestamp::from_millis(0),
            requests: Vec::new(),
        })
    }
}
