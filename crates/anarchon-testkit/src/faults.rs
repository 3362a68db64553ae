//! Fault checks every backend runs against its real server: a reply lost
//! on the wire, and a random history of faults checked for two runners.
//!
//! These run in each backend's `tests/faults.rs`, one at a time, after the
//! parallel suites (`cargo xtask test-all`).

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimStore, InstanceId, LeaseStore, RunKey, Schedule, Scheduler, Slot, Token,
};
use tokio::time::Instant;

use crate::claim::{claim_request, future_slot, job};
use crate::factory::{Proxyable, StoreFactory};
use crate::history::{self, History, Recorder};
use crate::proxy::FaultProxy;
use crate::stores::Faulty;

/// How a backend answers a claim whose reply was lost and that is sent
/// again with the same token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryResolution {
    /// The store recognises the token: the retry is told `Won`, and the run
    /// has exactly one winner.
    Recognised,
    /// The store cannot tell (RabbitMQ without a confirm): the retry may be
    /// `Unknown`, which the scheduler never runs; the run has at most one
    /// winner and may have none.
    MayStayUnknown,
}

/// The bytes a claim carrying `token` holds on the wire, in each encoding
/// a store might use: hyphenated text, plain hex and the 16 raw bytes.
pub fn token_patterns(token: Token) -> [Vec<u8>; 3] {
    [
        token.to_string().into_bytes(),
        format!("{:032x}", token.as_u128()).into_bytes(),
        token.as_u128().to_be_bytes().to_vec(),
    ]
}

/// Claims through `proxy` while it swallows the reply to the claim itself
/// (the request that carries the claim's token): the store applied the
/// claim, the caller never heard. Every one of the ten runs must lose its
/// reply that way, and then have exactly one winner: the direct instance
/// loses (the claim was applied), and the retry with the same token is
/// told `Won` (or, for stores that cannot tell, is never a second winner).
///
/// `through_proxy` is a factory whose instances connect through `proxy`;
/// `direct` one whose instances connect to the server itself, on the same
/// namespace.
pub async fn lost_reply_resolves_to_one_winner<P, D>(
    through_proxy: &P,
    direct: &D,
    proxy: &FaultProxy,
    resolution: RetryResolution,
) where
    P: StoreFactory,
    D: StoreFactory,
{
    let a = through_proxy.instance().await;
    let b = direct.instance().await;
    let base = future_slot(through_proxy, 0).as_millis();
    for i in 0..10 {
        let run = RunKey::new(job("lost-reply"), Slot::from_millis(base + i * 1000));
        let token = Token::generate();
        let mine = claim_request(run.clone(), token, "a");
        let before = proxy.swallowed();
        let patterns = token_patterns(token);
        proxy.swallow_reply_to(&patterns.iter().map(Vec::as_slice).collect::<Vec<_>>());
        // The store may resend on a new connection by itself; either way
        // its first answer must not be a second winner.
        let first = a.claim(&mine).await;
        assert_eq!(
            proxy.swallowed(),
            before + 1,
            "{run}: the reply to the claim was not swallowed (first answer {first:?}): \
             the check did not lose the reply"
        );
        match (&first, resolution) {
            (Err(e), _) => assert!(e.is_temporary(), "{run}: a lost reply is temporary: {e}"),
            // The store sent the claim again by itself and was answered.
            (Ok(ClaimOutcome::Won(_)), _)
            | (Ok(ClaimOutcome::Unknown), RetryResolution::MayStayUnknown) => {}
            (Ok(other), _) => panic!("{run}: the first answer after a lost reply: {other:?}"),
        }
        let theirs = b
            .claim(&claim_request(run.clone(), Token::generate(), "b"))
            .await
            .expect("the direct instance's claim");
        assert!(
            !matches!(theirs, ClaimOutcome::Won(_)),
            "{run}: the direct instance won a run whose claim had reached the store: {theirs:?}"
        );
        // The retry, with the same token, after whatever reconnecting it takes.
        let mut retried = a.claim(&mine).await;
        for _ in 0..20 {
            if retried.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            retried = a.claim(&mine).await;
        }
        let retried = retried.expect("the retry gets an answer once the line is back");
        match resolution {
            RetryResolution::Recognised => assert!(
                matches!(retried, ClaimOutcome::Won(_)),
                "{run}: the retry with the claim's own token must be recognised as the winner: \
                 {retried:?}"
            ),
            RetryResolution::MayStayUnknown => assert!(
                matches!(
                    retried,
                    ClaimOutcome::Won(_) | ClaimOutcome::Unknown | ClaimOutcome::Lost
                ),
                "{run}: the retry: {retried:?}"
            ),
        }
    }
}

/// [`lost_reply_resolves_to_one_winner`] with a proxy of its own in front
/// of `direct`'s server.
pub async fn lost_reply_through_a_proxy<F: Proxyable>(direct: &F, resolution: RetryResolution) {
    let proxy = FaultProxy::start(direct.upstream())
        .await
        .expect("a local port for the proxy");
    let through = direct.through_proxy(&proxy);
    lost_reply_resolves_to_one_winner(&through, direct, &proxy, resolution).await;
}

/// How long [`ping_follows_the_line`] gives a ping to answer, up or down.
const PING_WAIT: Duration = Duration::from_secs(20);

/// An instance of `direct` whose connection goes through a proxy of its
/// own answers [`ClaimStore::ping`] while the line is up; fails it (an
/// error, within 20 s, not a hang and not `Ok`) while the proxy
/// cuts the line and refuses new connections; and answers again once the
/// line is back (retrying for a while: a client may reconnect in the
/// background). What a health probe relies on.
///
/// # Panics
///
/// When any of that does not hold.
pub async fn ping_follows_the_line<F: Proxyable>(direct: &F) {
    let proxy = FaultProxy::start(direct.upstream())
        .await
        .expect("a local port for the proxy");
    let store = direct.through_proxy(&proxy).instance().await;
    let name = store.info().name;
    tokio::time::timeout(PING_WAIT, store.ping())
        .await
        .unwrap_or_else(|_| panic!("{name}: a ping over a working line did not answer"))
        .unwrap_or_else(|e| panic!("{name}: a ping over a working line failed: {e}"));

    proxy.cut();
    let down = tokio::time::timeout(PING_WAIT, store.ping())
        .await
        .unwrap_or_else(|_| panic!("{name}: a ping while the line is cut hung"));
    let error = down.expect_err("a ping while the line is cut must fail");
    assert!(
        error.is_temporary(),
        "{name}: an unreachable server is a temporary error: {error}"
    );

    proxy.restore();
    let deadline = Instant::now() + PING_WAIT;
    loop {
        match tokio::time::timeout(PING_WAIT, store.ping()).await {
            Ok(Ok(())) => break,
            Ok(Err(e)) if Instant::now() < deadline => {
                tracing::debug!(%e, "{name}: not answering yet after the line came back");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(e)) => panic!("{name}: still failing after the line came back: {e}"),
            Err(_) => panic!("{name}: a ping after the line came back hung"),
        }
    }
}

/// The fault checks as tests, for a backend whose factory is
/// [`Proxyable`]:
///
/// * `claim_suite_through_a_slow_proxy`: the whole claim suite, every
///   instance behind [`behind_a_slow_proxy`](crate::factory::behind_a_slow_proxy);
/// * `lost_reply_resolves_to_one_winner`: [`lost_reply_through_a_proxy`];
/// * `ping_follows_the_line`: [`ping_follows_the_line`];
/// * for lease stores (`leases:`), also
///   `random_faults_never_give_a_run_two_runners` for 15 s.
///
/// ```text
/// // tests/faults.rs, run alone (cargo test --test faults -- --test-threads=1):
/// mod kit {
///     anarchon_testkit::fault_suite!(leases: MyFactory::new().await, RetryResolution::Recognised);
/// }
/// ```
#[macro_export]
macro_rules! fault_suite {
    (claims: $factory:expr, $resolution:expr) => {
        mod claim_suite_through_a_slow_proxy {
            #[allow(unused_imports)]
            use super::*;
            $crate::claim_suite!($crate::factory::behind_a_slow_proxy($factory).await);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn lost_reply_resolves_to_one_winner() {
            let factory = $factory;
            $crate::faults::lost_reply_through_a_proxy(&factory, $resolution).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ping_follows_the_line() {
            let factory = $factory;
            $crate::faults::ping_follows_the_line(&factory).await;
        }
    };
    (leases: $factory:expr, $resolution:expr) => {
        $crate::fault_suite!(claims: $factory, $resolution);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn random_faults_never_give_a_run_two_runners() {
            let factory = $factory;
            $crate::faults::random_faults_never_give_a_run_two_runners(
                &factory,
                ::std::time::Duration::from_secs(15),
            )
            .await;
        }
    };
}

/// Four schedulers on `factory`'s store, each behind a [`Faulty`] handle
/// and recorded into one [`History`], run per-second jobs of different
/// lengths for `duration` of real time (longer, up to twice, until a
/// takeover has happened) while random faults (connection
/// down, heartbeats failing, heartbeats hanging, replies lost after the
/// store did the call) come and go. Every handler records its start and
/// end. The history must show one runner per run, and the faults must
/// have bitten: takeovers happened, and calls ended uncertain.
///
/// Prints its seed; `ANARCHON_SEED` replays one.
pub async fn random_faults_never_give_a_run_two_runners<F: StoreFactory>(
    factory: &F,
    duration: Duration,
) where
    F::Store: LeaseStore,
{
    let seed = history::seed();
    println!("fault history seed: {seed} (replay with ANARCHON_SEED={seed})");
    let mut rng = SplitMix(seed);
    let history = History::new();
    let mut handles = Vec::new();
    let mut schedulers = Vec::new();
    for instance in 0..4 {
        let faulty = Faulty::new(factory.instance().await);
        handles.push(faulty.clone());
        let recorder = Recorder::new(faulty, instance, history.clone());
        let mut b = Scheduler::builder(recorder)
            .clock(factory.clock())
            .instance_id(InstanceId::new(&format!("i{instance}")).expect("valid id"))
            .lease(Duration::from_millis(800))
            .heartbeat(Duration::from_millis(200));
        for j in 0..3u64 {
            let work = Duration::from_millis(j * 700);
            b.job(
                format!("fault-job{j}"),
                Schedule::every(Duration::from_secs(1)).expect("1 s"),
            )
            .expect("job")
            .max_attempts(3)
            .run(history.working_handler(instance, work))
            .expect("handler");
        }
        schedulers.push(b.start().expect("start"));
    }
    // The faults go on for `duration`, and past it (up to twice as long)
    // until they have caused a takeover: a history without one has not
    // tested the case that matters most.
    let started = tokio::time::Instant::now();
    let took_over = || {
        history
            .events()
            .iter()
            .any(|e| matches!(&e.answer, Some(history::Answer::Claimed(ClaimOutcome::Won(w))) if w.attempt.get() > 1))
    };
    while started.elapsed() < duration || (started.elapsed() < 2 * duration && !took_over()) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(900))).await;
        let h = &handles[rng.below(4) as usize];
        match rng.below(6) {
            0 => h.set_down(true),
            1 => h.set_heartbeats_down(true),
            2 => h.set_heartbeats_hang(true),
            3 => h.set_replies_lost(true),
            _ => h.heal(),
        }
    }
    heal_and_shut_down(&handles, schedulers).await;
    history::check_seeded(&history, seed).assert_faults_bit(seed, 1);
}

/// Ends a randomized fault run: heals every fault, then shuts every
/// scheduler down, so the history ends with the fleet's last calls.
pub async fn heal_and_shut_down<S: LeaseStore + ?Sized>(
    faulty: &[Arc<Faulty<S>>],
    schedulers: Vec<Scheduler>,
) {
    for f in faulty {
        f.heal();
    }
    for s in schedulers {
        s.shutdown().await;
    }
}

/// splitmix64, for reproducible fault schedules: small, fast, and the
/// same everywhere, so a seed replays a schedule.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}
