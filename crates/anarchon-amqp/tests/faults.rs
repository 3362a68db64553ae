//! Fault tests: the connection to RabbitMQ is cut mid-test by a TCP proxy
//! between the stores and the broker, and — in the `..._broker_restart`
//! tests — the broker itself is restarted (`rabbitmqctl stop_app` /
//! `start_app`, or `ANARCHON_AMQP_STOP` / `ANARCHON_AMQP_START`), with a
//! guard that starts it again if the test fails half-way; one test edits
//! the local broker's queue table with `rabbitmqctl eval` to make it call
//! a gate's home down. Run alone, under
//! the lock the project's machines use for the shared broker:
//! `flock /tmp/anarchon-rabbitmq.lock cargo test -p anarchon-amqp --test faults -- --test-threads=1`
//! (`cargo xtask test-all` runs them one at a time, after the suites).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore};
use anarchon_core::{ClaimOutcome, ClaimRequest, ClaimStore, Scheduler, StoreError};
use anarchon_testkit::FaultProxy;
use anarchon_testkit::fleet::{
    ClaimRetry, Fleet, claim_retrying, claims_resume_across_a_cut,
    fleet_runs_each_slot_once_across_a_cut, now_ms, retry_after_a_lost_reply, slot_request,
    winners,
};
use anarchon_testkit::restart::{RestartGuard, ServerControl};
use anarchon_testkit::servers::Service;
use futures::future::join_all;
use tokio::time::Instant;

use crate::common::{TEST_SLOT_TTL, connect, options, through, url};

/// Restarts the test broker (stop, start, wait until it answers) off the
/// runtime's threads. The guard starts it again if it is down when the
/// guard is dropped, so a failing test never leaves it stopped.
async fn restart_broker() -> RestartGuard {
    tokio::task::spawn_blocking(|| ServerControl::for_service(Service::Amqp).restart())
        .await
        .unwrap()
}

async fn proxied_store(proxy: &FaultProxy, prefix: &str, timeout: Duration) -> AmqpStore {
    let (url, _) = through(&url().await, Some(proxy));
    connect(
        AmqpOptions::new(url)
            .with_prefix(prefix)
            .with_slot_ttl(TEST_SLOT_TTL)
            .with_timeout(timeout),
    )
    .await
}

async fn start_proxy() -> FaultProxy {
    let (_, upstream) = through(&url().await, None);
    FaultProxy::start(upstream).await.expect("a proxy")
}

/// How the tests retry a claim that met a temporary error.
const RETRY: ClaimRetry = ClaimRetry::Times(10);

/// Claims as the scheduler does: temporary errors are retried with the same
/// token (a few times, briefly).
async fn claim(store: &AmqpStore, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    claim_retrying(store, req, RETRY).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_resume_after_the_connection_is_cut() {
    let proxy = start_proxy().await;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let a = proxied_store(&proxy, &prefix, Duration::from_secs(2)).await;
    let b = proxied_store(&proxy, &prefix, Duration::from_secs(2)).await;
    claims_resume_across_a_cut(&proxy, &a, &b, RETRY, |during| match during {
        Err(e) => assert!(e.is_temporary(), "{e}"),
        Ok(outcome) => assert_eq!(outcome, ClaimOutcome::Unknown),
    })
    .await;
    assert!(a.connections_opened() >= 2, "a reconnected");
    assert!(b.connections_opened() >= 2, "b reconnected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_confirm_is_lost_is_unknown_and_never_won_twice() {
    let proxy = start_proxy().await;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let store = proxied_store(&proxy, &prefix, Duration::from_secs(1)).await;
    let req = slot_request("doubt", 1_000, "a");

    proxy.stall_replies_after(b"anarchon claim");
    let first = store.claim(&req).await.unwrap();
    assert_eq!(first, ClaimOutcome::Unknown, "no confirm came back");
    proxy.cut();
    proxy.restore();

    // The broker did take the claim: anyone else loses the run. The same
    // token, sent again after the reconnect, cannot be told it won (its
    // mark was never left) and is not told a false "lost" either.
    let direct = connect(options().await.with_prefix(&prefix)).await;
    let again = retry_after_a_lost_reply(&store, &direct, &req, RETRY).await;
    assert_eq!(again, ClaimOutcome::Unknown);
    assert!(store.connections_opened() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_keep_claiming_across_a_cut() {
    let proxy = start_proxy().await;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(Arc::new(
            proxied_store(&proxy, &prefix, Duration::from_secs(2)).await,
        ));
    }
    fleet_runs_each_slot_once_across_a_cut(&proxy, stores.iter().cloned().map(Scheduler::builder))
        .await;
    for store in &stores {
        assert!(store.connections_opened() >= 2, "each store reconnected");
    }
}

/// The kit's fault checks: the claim suite over a slow line (a claim's
/// declare, publish and confirm take milliseconds, so racers overlap as
/// between hosts), and a claim whose confirm is lost after the broker took
/// it: RabbitMQ cannot always tell a retried claim whose confirm was lost,
/// so the run has at most one winner and an `Unknown` that is never run.
mod kit {
    anarchon_testkit::fault_suite!(
        claims: crate::common::AmqpFactory::new().await,
        anarchon_testkit::faults::RetryResolution::MayStayUnknown
    );
}

/// A direct store (no proxy) on `prefix`, each with its own connection, as
/// separate processes would have.
async fn direct_store(prefix: &str) -> AmqpStore {
    connect(
        options()
            .await
            .with_prefix(prefix)
            .with_timeout(Duration::from_secs(2)),
    )
    .await
}

/// Three schedulers, each on its own connection, run a job every second
/// while the broker really restarts. Without restarting anything of their
/// own they claim again afterwards, and no slot runs twice — before, during
/// or after the restart. The runs won before the restart are still
/// remembered after it: the gate queues are durable and the claims in them
/// persistent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedulers_keep_claiming_across_a_broker_restart() {
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(Arc::new(direct_store(&prefix).await));
    }
    let fleet = Fleet::start(stores.iter().cloned().map(Scheduler::builder));
    let within = Duration::from_secs(30);
    fleet
        .wait_for_slots(i64::MIN, 2, within, "two runs before the restart")
        .await;
    let before = fleet.log().slots_after(i64::MIN);
    let guard = restart_broker().await;
    let back = now_ms();
    fleet
        .wait_for_slots(back, 3, within, "three runs after the restart")
        .await;
    fleet.shutdown().await.assert_each_slot_ran_once();
    for store in &stores {
        assert!(
            store.connections_opened() >= 2,
            "each store reconnected by itself (was the broker behind the test URL restarted?)"
        );
    }
    // Every run won before the restart is still taken: a new instance asking
    // for it now (as a late or retried claim would) loses.
    let late = direct_store(&prefix).await;
    for slot in before {
        let outcome = claim(&late, &slot_request("tick", slot, "late"))
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ClaimOutcome::Lost,
            "slot {slot}, won before the restart, was open again after it"
        );
    }
    drop(guard);
}

/// What one claim, sent again and again with the same token while the
/// broker restarts (as the scheduler retries a temporary error), saw.
struct Retried {
    /// Errors and `Unknown` answers while the broker was going down or away.
    interrupted: usize,
    /// The answer to the first try sent after the broker was back.
    after: ClaimOutcome,
}

/// Sends `req` to `store` every 50 ms until `back` is set and a try sent
/// after that has an answer.
async fn retry_across(store: Arc<AmqpStore>, req: ClaimRequest, back: Arc<AtomicBool>) -> Retried {
    let start = Instant::now();
    let mut interrupted = 0;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the broker did not come back for {}",
            req.run
        );
        let sent_after_restart = back.load(Ordering::SeqCst);
        match store.claim(&req).await {
            Ok(after) if sent_after_restart => return Retried { interrupted, after },
            Ok(ClaimOutcome::Unknown) => interrupted += 1,
            Ok(_) => {}
            Err(e) => {
                assert!(e.is_temporary(), "{} failed for good: {e}", req.run);
                interrupted += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Claims of runs won before a real broker restart are retried through the
/// restart with the same token and answered right after it: the winner's
/// own retry is still told it won (its mark survived), every other claim
/// is not (the gate and the claim in it survived), and a run first claimed
/// while the broker was away gets at most one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_retried_across_a_broker_restart_never_win_a_run_twice() {
    const WON: i64 = 8;
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let a = Arc::new(direct_store(&prefix).await);
    let b = Arc::new(direct_store(&prefix).await);

    // Runs 0..WON: a wins each, b loses each.
    let mut won_runs = Vec::new();
    for slot in 0..WON {
        let won = slot_request("gate", slot, "a");
        assert!(matches!(a.claim(&won).await.unwrap(), ClaimOutcome::Won(_)));
        let lost = slot_request("gate", slot, "b");
        assert_eq!(b.claim(&lost).await.unwrap(), ClaimOutcome::Lost);
        won_runs.push(won);
    }

    let back = Arc::new(AtomicBool::new(false));
    // Every won run is asked about again and again through the restart:
    // the even ones by their winner with its own token, the odd ones by b
    // with a new token. (Not both on one run: a winner's retry that reached
    // an emptied gate first would fill it again and hide the hole.)
    let (own_runs, other_runs): (Vec<_>, Vec<_>) = won_runs
        .iter()
        .cloned()
        .partition(|won| won.run.slot.as_millis() % 2 == 0);
    let own: Vec<_> = own_runs
        .iter()
        .map(|won| tokio::spawn(retry_across(a.clone(), won.clone(), back.clone())))
        .collect();
    let others: Vec<_> = other_runs
        .iter()
        .map(|won| {
            let other = slot_request("gate", won.run.slot.as_millis(), "b");
            tokio::spawn(retry_across(b.clone(), other, back.clone()))
        })
        .collect();
    // Runs nobody claimed before: both stores start claiming them once the
    // broker is seen going away, and keep trying until it is back.
    let fresh = {
        let (a, b, back) = (a.clone(), b.clone(), back.clone());
        let probe = b.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            // Wait until a claim fails: the broker is going down.
            loop {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the broker never went away"
                );
                match probe.claim(&slot_request("probe", 0, "probe")).await {
                    Err(_) | Ok(ClaimOutcome::Unknown) => break,
                    Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            let mut tries = Vec::new();
            for slot in 100..104 {
                tries.push(tokio::spawn(retry_across(
                    a.clone(),
                    slot_request("gate", slot, "a"),
                    back.clone(),
                )));
                tries.push(tokio::spawn(retry_across(
                    b.clone(),
                    slot_request("gate", slot, "b"),
                    back.clone(),
                )));
            }
            let mut answers = Vec::new();
            for t in join_all(tries).await {
                answers.push(t.unwrap().after);
            }
            answers
        })
    };

    let guard = restart_broker().await;
    back.store(true, Ordering::SeqCst);

    // Each group of retries saw the broker go away, and after it the
    // answer its group expects.
    type Expected = fn(&ClaimOutcome) -> bool;
    let groups: [(&str, &[ClaimRequest], _, Expected, &str); 2] = [
        (
            "the winner's",
            &own_runs,
            own,
            |after| matches!(after, ClaimOutcome::Won(_)),
            "the winner retried its claim after the restart",
        ),
        (
            "b's",
            &other_runs,
            others,
            |after| matches!(after, ClaimOutcome::Lost | ClaimOutcome::Unknown),
            "it was won before the restart, and another claim retried right after it",
        ),
    ];
    for (whose, runs, tries, expected, what) in groups {
        for (won, retried) in runs.iter().zip(join_all(tries).await) {
            let retried = retried.unwrap();
            assert!(
                retried.interrupted > 0,
                "{whose} retries of {} never saw the broker go away",
                won.run
            );
            assert!(
                expected(&retried.after),
                "{}: {what} and was told {:?}",
                won.run,
                retried.after
            );
        }
    }
    let fresh = fresh.await.unwrap();
    for pair in fresh.chunks(2) {
        assert!(
            winners(pair) <= 1,
            "a run first claimed during the restart was won twice: {pair:?}"
        );
    }

    // Asked once more, by a store that connects only now: every run won
    // before the restart is still taken.
    let late = direct_store(&prefix).await;
    for won in &won_runs {
        let slot = won.run.slot.as_millis();
        assert_eq!(
            claim(&late, &slot_request("gate", slot, "late"))
                .await
                .unwrap(),
            ClaimOutcome::Lost,
            "slot {slot}"
        );
    }
    assert!(a.connections_opened() >= 2, "a reconnected by itself");
    assert!(b.connections_opened() >= 2, "b reconnected by itself");
    drop(guard);
}

/// Runs `expression` on the local broker's node with `rabbitmqctl eval`
/// and returns what it printed; fails the test with what went wrong.
fn broker_eval(expression: &str) -> String {
    if std::env::var(Service::Amqp.env_var()).is_ok_and(|u| !u.trim().is_empty()) {
        panic!(
            "this test edits the local broker's queue table with `rabbitmqctl eval`, which cannot reach the broker named by {}: unset it to run the test against the local broker",
            Service::Amqp.env_var()
        );
    }
    let out = std::process::Command::new("rabbitmqctl")
        .args(["eval", expression])
        .output()
        .expect("rabbitmqctl runs (it comes with the rabbitmq-server package)");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rabbitmqctl eval failed ({}): {printed}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    printed
}

/// The name of the broker process that holds a hidden queue's record.
const HIDER: &str = "anarchon_hidden_gate";

/// Hides the durable queue `queue` (vhost `/`) from the broker's table of
/// live queues while leaving it in its table of durable queues: the state
/// in which RabbitMQ answers a declaration with "home node … is down or
/// inaccessible". A RabbitMQ 3.x broker shows a declaration that state for
/// a moment when another connection is declaring the queue for the first
/// time. The record comes back on [`GateHidden::restore`], on drop, or
/// after 30 s, whichever is first.
struct GateHidden;

impl GateHidden {
    fn hide(queue: &str) -> Self {
        let printed = broker_eval(&format!(
            r#"QN = rabbit_misc:r(<<"/">>, queue, <<"{queue}">>),
               [Q] = mnesia:dirty_read(rabbit_queue, QN),
               ok = mnesia:dirty_delete(rabbit_queue, QN),
               Keeper = spawn(fun () ->
                   receive restore -> ok after 30000 -> ok end,
                   ok = mnesia:dirty_write(rabbit_queue, Q)
               end),
               true = register({HIDER}, Keeper),
               hidden."#
        ));
        assert!(
            printed.contains("hidden"),
            "the queue was not hidden: {printed}"
        );
        GateHidden
    }

    /// Puts the record back and waits until the broker lists the queue again.
    fn restore(self) {
        broker_eval(&format!(
            "case whereis({HIDER}) of undefined -> ok; Keeper -> Ref = monitor(process, Keeper), Keeper ! restore, receive {{'DOWN', Ref, _, _, _}} -> ok end end."
        ));
        std::mem::forget(self);
    }
}

impl Drop for GateHidden {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args([
                "eval",
                &format!(
                    "case whereis({HIDER}) of undefined -> ok; Keeper -> Keeper ! restore end."
                ),
            ])
            .output();
    }
}

/// While the broker calls a gate's home down (see [`GateHidden`]), a claim
/// keeps sending itself again until its time limit rather than failing at
/// once: one with a short limit ends in a temporary error that names the
/// queue, one still waiting when the broker recovers is answered as usual
/// (`Lost`, the gate being taken), and the run keeps its one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_out_a_gate_whose_home_the_broker_calls_down() {
    let prefix = anarchon_testkit::servers::unique_prefix("t");
    let open = |timeout: Duration| {
        let prefix = prefix.clone();
        async move { connect(options().await.with_prefix(prefix).with_timeout(timeout)).await }
    };
    let winner = open(Duration::from_secs(10)).await;
    let impatient = open(Duration::from_millis(500)).await;
    let patient = Arc::new(open(Duration::from_secs(20)).await);

    let slot = (now_ms() / 1000 + 3600) * 1000;
    let first = slot_request("homedown", slot, "winner");
    assert!(matches!(
        winner.claim(&first).await.expect("the first claim"),
        ClaimOutcome::Won(_)
    ));
    let gate = winner.gate_queue(&first.run);
    let hidden = tokio::task::spawn_blocking({
        let gate = gate.clone();
        move || GateHidden::hide(&gate)
    })
    .await
    .unwrap();

    let refused = impatient
        .claim(&slot_request("homedown", slot, "impatient"))
        .await
        .expect_err("no claim goes through while the broker calls the gate's home down");
    assert!(refused.is_temporary(), "{refused}");
    assert!(
        refused.message().contains("down or inaccessible") && refused.message().contains(&gate),
        "the error says what the broker said, and of which queue: {refused}"
    );

    let late = slot_request("homedown", slot, "patient");
    let waiting = tokio::spawn({
        let patient = patient.clone();
        async move { patient.claim(&late).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a claim refused so keeps trying until its time limit: {:?}",
        waiting.await
    );
    tokio::task::spawn_blocking(move || hidden.restore())
        .await
        .unwrap();
    assert_eq!(
        waiting
            .await
            .unwrap()
            .expect("the claim goes through once the broker recovers"),
        ClaimOutcome::Lost
    );
    assert!(
        matches!(
            winner.claim(&first).await.expect("the winner's retry"),
            ClaimOutcome::Won(_)
        ),
        "the winner's own claim, sent again, is still the winner"
    );
}
