//! What the Redis strategies do beyond the shared suites: commands per
//! claim, the key layout, what each one remembers, and what a restart
//! without persistence does.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{
    Attempt, ClaimOutcome, ClaimStore, Fence, FinalState, JobName, LeaseStore, Memory,
    PauseRequest, PauseScope, RecordState, RunKey, RunOutcome, Slot, Token, Until, Win,
};
use anarchon_redis::{
    Error, EvictionFinding, MIN_MEMORY, RedisIdmpStore, RedisLeaseStore, RedisOptions,
    RedisScriptStore, RedisStreamIdStore,
};
use anarchon_testkit::StoreFactory;
use anarchon_testkit::claim::{claim_request, future_slot, job};
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::servers::unique_prefix;
use common::proxy::Proxy;
use common::{Cleanup, LeaseFactory, ScriptFactory, StreamIdFactory, forget_prefix, keys_of, raw};
use deadpool_redis::redis;

fn won(outcome: ClaimOutcome) -> Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// Claims a lease on `run` from `store` with `token` as `instance`: the
/// claim must be won.
async fn lease_outcome<S: LeaseStore + ?Sized>(
    store: &S,
    run: RunKey,
    token: Token,
    instance: &str,
) -> ClaimOutcome {
    store
        .claim_lease(&lease_claim(run, token, instance))
        .await
        .unwrap()
}

/// [`lease_outcome`], which must be won.
async fn lease_won<S: LeaseStore + ?Sized>(
    store: &S,
    run: RunKey,
    token: Token,
    instance: &str,
) -> Win {
    won(lease_outcome(store, run, token, instance).await)
}

/// Claims `run` on `store` with a new token as `instance`: the claim must
/// be won.
async fn claim_won<S: ClaimStore + ?Sized>(store: &S, run: RunKey, instance: &str) -> Win {
    won(store
        .claim(&claim_request(run, Token::generate(), instance))
        .await
        .unwrap())
}

fn slot_after(base: Slot, seconds: i64) -> Slot {
    Slot::from_millis(base.as_millis() + seconds * 1000)
}

/// A whole second ten minutes from now: never late.
fn ten_minutes_ahead() -> Slot {
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) + 600_000)
}

/// Options for `url` behind a fresh counting proxy.
async fn through_proxy(stem: &str) -> (Proxy, RedisOptions, Cleanup) {
    let url = common::url().await;
    let proxy = Proxy::start(&url).await;
    let prefix = unique_prefix(stem);
    let opts = RedisOptions::new(proxy.url(&url))
        .with_prefix(&prefix)
        .unwrap();
    (proxy, opts, Cleanup::new(&url, &prefix))
}

/// Waits until the lease store's hand-over subscription, which opens its
/// own connection in the background, has subscribed through `proxy`, so
/// that what is counted next is the store's calls alone.
async fn until_subscribed(proxy: &Proxy) {
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen.extend(proxy.take().commands);
        if seen.iter().any(|c| c == "SUBSCRIBE") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.iter().any(|c| c == "SUBSCRIBE"),
        "the lease store subscribes to hand-over news: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_claim_is_one_command_and_a_batch_one_round_trip() {
    let (proxy, opts, _cleanup) = through_proxy("cmds").await;
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let base = ten_minutes_ahead();
    let job_a = job("single");
    until_subscribed(&proxy).await;

    // The first claim of a job also adds it to the job list, in the same trip.
    proxy.take();
    lease_won(
        &store,
        RunKey::new(job_a.clone(), base),
        Token::generate(),
        "a",
    )
    .await;
    let first = proxy.take();
    assert_eq!(first.commands, ["SADD", "EVALSHA"], "{first:?}");
    assert_eq!(first.round_trips, 1);

    const N: i64 = 10;
    for i in 1..=N {
        let run = RunKey::new(job_a.clone(), slot_after(base, i));
        lease_won(&store, run, Token::generate(), "a").await;
    }
    let singles = proxy.take();
    assert_eq!(singles.commands.len() as i64, N, "{singles:?}");
    assert_eq!(singles.count("EVALSHA") as i64, N, "{singles:?}");
    assert_eq!(singles.round_trips as i64, N);

    const BATCH: usize = 20;
    let batch: Vec<_> = (0..BATCH)
        .map(|i| {
            lease_claim(
                RunKey::new(job(&format!("batch-{i}")), base),
                Token::generate(),
                "a",
            )
        })
        .collect();
    let outcomes = store.claim_many(&batch).await.unwrap().all().unwrap();
    assert!(outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))));
    let new_jobs = proxy.take();
    assert_eq!(new_jobs.round_trips, 1, "{new_jobs:?}");
    assert_eq!(
        new_jobs.count("EVALSHA"),
        1,
        "a batch is one script call on a single Redis: {new_jobs:?}"
    );
    assert_eq!(new_jobs.count("SADD"), 1, "one SADD registers all new jobs");

    let again = store.claim_many(&batch).await.unwrap().all().unwrap();
    let known_jobs = proxy.take();
    assert_eq!(known_jobs.round_trips, 1);
    assert_eq!(known_jobs.commands, ["EVALSHA"], "{known_jobs:?}");
    assert_eq!(again, outcomes, "own retries: the same wins");

    // A long batch is cut into scripts of a hundred claims, all sent in one
    // round trip and answered in the order of the claims: every seventh run
    // was taken first by another instance, and only those answer running
    // (a pattern that no reversal of a script's hundred answers keeps); each
    // win is the one its own claim, sent again alone, is answered.
    const LONG: usize = 250;
    let runs: Vec<RunKey> = (0..LONG)
        .map(|i| {
            let name = format!("batch-{}", i % BATCH);
            RunKey::new(job(&name), slot_after(base, 1 + i as i64))
        })
        .collect();
    let taken: Vec<_> = runs
        .iter()
        .step_by(7)
        .map(|run| lease_claim(run.clone(), Token::generate(), "b"))
        .collect();
    store.claim_many(&taken).await.unwrap().all().unwrap();
    proxy.take();
    let long: Vec<_> = runs
        .iter()
        .map(|run| lease_claim(run.clone(), Token::generate(), "a"))
        .collect();
    let outcomes = store.claim_many(&long).await.unwrap().all().unwrap();
    let cut = proxy.take();
    assert_eq!(cut.round_trips, 1, "{cut:?}");
    assert_eq!(cut.count("EVALSHA"), 3, "{cut:?}");
    for (i, (claim, outcome)) in long.iter().zip(&outcomes).enumerate() {
        if i % 7 == 0 {
            assert!(
                matches!(outcome, ClaimOutcome::Running { .. }),
                "claim {i}, taken by b: {outcome:?}"
            );
        } else {
            assert!(
                matches!(outcome, ClaimOutcome::Won(_)),
                "claim {i}: {outcome:?}"
            );
            let alone = store.claim_lease(claim).await.unwrap();
            assert_eq!(&alone, outcome, "claim {i} sent again alone");
        }
    }
    proxy.take();

    // Heartbeat, release, finish, peek and history: one script each.
    let run = batch[0].run().clone();
    let token = batch[0].claim.token;
    store
        .heartbeat(&run, token, Duration::from_secs(30))
        .await
        .unwrap();
    store.peek(&run).await.unwrap();
    store
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .unwrap();
    store.history(&run.job, 10).await.unwrap();
    let steps = proxy.take();
    assert_eq!(steps.commands, ["EVALSHA"; 4], "{steps:?}");
    assert_eq!(steps.round_trips, 4);
    eprintln!(
        "lease: {} command(s) per claim, {} round trip(s) for a batch of {BATCH} claims",
        singles.commands.len() as f64 / N as f64,
        known_jobs.round_trips
    );
}

/// Finishes that arrive together go in one round trip, a hundred to a
/// script, and each is answered for its own run: a stranger's token and a
/// run never claimed are fenced, a finish sent twice is recorded once and
/// answered twice, a retry is kept, and a run whose live set holds the
/// wrong type fails alone, naming the key, with nothing written. (On
/// Tokio's single-threaded runtime the finishes of a `join_all` are all
/// queued before the task that sends them runs, so the group is the same
/// on every run.)
#[tokio::test]
async fn finishes_sent_together_are_one_round_trip_each_answered_for_its_run() {
    let (proxy, opts, _cleanup) = through_proxy("fin").await;
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let base = ten_minutes_ahead();
    until_subscribed(&proxy).await;
    const N: usize = 150;
    let held: Vec<_> = (0..N)
        .map(|i| {
            let run = RunKey::new(job(&format!("fin-{i}")), base);
            lease_claim(run, Token::generate(), "a")
        })
        .collect();
    store.claim_many(&held).await.unwrap().all().unwrap();
    let broken_live = anarchon_redis::job_key(store.prefix(), &held[7].run().job, "live");
    let mut conn = raw(&common::url().await).await;
    let _: () = redis::cmd("SET")
        .arg(&broken_live)
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .unwrap();
    let run = |i: usize| held[i].run().clone();
    let own = |i: usize| held[i].claim.token;
    let retried = RunOutcome::Failed {
        error: "flaky".into(),
        retry: Some(anarchon_core::RetryPlan {
            after: Duration::from_secs(5),
            before: anarchon_core::Timestamp::from_millis(base.as_millis() + 3_600_000),
        }),
    };
    let never_claimed = RunKey::new(job("fin-none"), base);
    let mut burst = vec![
        (run(0), Token::generate(), RunOutcome::Succeeded),
        (run(1), own(1), retried),
        (run(2), own(2), RunOutcome::Succeeded),
        (run(2), own(2), RunOutcome::Succeeded),
        (never_claimed, Token::generate(), RunOutcome::Succeeded),
    ];
    // A stranger's token in the second script too: answers stay in place.
    let token = |i: usize| if i == 120 { Token::generate() } else { own(i) };
    burst.extend((3..N).map(|i| (run(i), token(i), RunOutcome::Succeeded)));
    proxy.take();
    let answers = futures::future::join_all(
        burst
            .iter()
            .map(|(run, token, end)| store.finish(run, *token, end.clone())),
    )
    .await;
    let sent = proxy.take();
    assert_eq!(
        (sent.round_trips, sent.count("EVALSHA"), sent.commands.len()),
        (1, 2, 2),
        "{} finishes: two scripts in one round trip, {sent:?}",
        burst.len()
    );
    for ((run, _, _), answer) in burst.iter().zip(answers) {
        let i = held.iter().position(|c| c.run() == run);
        match i {
            None | Some(0) | Some(120) => {
                assert_eq!(answer.unwrap(), anarchon_core::Renewal::Fenced, "{run}")
            }
            Some(7) => {
                let err = answer.unwrap_err();
                assert!(err.to_string().contains(&broken_live), "{err}");
            }
            Some(_) => assert_eq!(answer.unwrap(), anarchon_core::Renewal::Renewed, "{run}"),
        }
    }
    let record = |i: usize| {
        let (store, job) = (&store, held[i].run().job.clone());
        async move { store.history(&job, 1).await.unwrap().remove(0) }
    };
    assert_eq!(
        record(0).await.state,
        RecordState::Running,
        "fenced: unchanged"
    );
    let failed = record(1).await;
    assert_eq!(failed.state, RecordState::Finished(FinalState::Failed));
    assert!(failed.retry_at.is_some(), "the retry is kept: {failed:?}");
    assert_eq!(
        record(7).await.state,
        RecordState::Running,
        "refused: unchanged"
    );
    assert_eq!(
        record(120).await.state,
        RecordState::Running,
        "fenced: unchanged"
    );
    for i in [2, 3, 119, 121, N - 1] {
        assert_eq!(
            record(i).await.state,
            RecordState::Finished(FinalState::Succeeded)
        );
    }

    // A finish alone is one script of its own.
    proxy.take();
    let fenced = store
        .finish(&run(0), Token::generate(), RunOutcome::Succeeded)
        .await
        .unwrap();
    assert_eq!(fenced, anarchon_core::Renewal::Fenced);
    let alone = proxy.take();
    assert_eq!(
        (alone.round_trips, alone.commands.len()),
        (1, 1),
        "{alone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_only_strategies_cost_one_round_trip_per_claim() {
    const N: usize = 10;
    // stream-id: XADD and XRANGE, sent together.
    let (proxy, opts, _cleanup) = through_proxy("cmds").await;
    let a = RedisStreamIdStore::connect(&opts).await.unwrap();
    let b = RedisStreamIdStore::connect(&opts).await.unwrap();
    let base = ten_minutes_ahead();
    proxy.take();
    for i in 0..N as i64 {
        let run = RunKey::new(job("sid"), slot_after(base, i));
        claim_won(&a, run.clone(), "a").await;
        assert_eq!(
            b.claim(&claim_request(run, Token::generate(), "b"))
                .await
                .unwrap(),
            ClaimOutcome::Lost
        );
    }
    let traffic = proxy.take();
    assert_eq!(traffic.round_trips as usize, 2 * N, "{traffic:?}");
    assert_eq!(traffic.count("XADD"), 2 * N);
    assert_eq!(traffic.count("XRANGE"), 2 * N);
    assert_eq!(traffic.commands.len(), 4 * N);
    eprintln!("stream-id: 2 commands, 1 round trip per claim");

    // script: one EVALSHA.
    let (proxy, opts, _cleanup) = through_proxy("cmds").await;
    let store = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap();
    proxy.take();
    for i in 0..N as i64 {
        let run = RunKey::new(job("script"), slot_after(base, i));
        claim_won(&store, run, "a").await;
    }
    let traffic = proxy.take();
    assert_eq!(traffic.commands, vec!["EVALSHA"; N], "{traffic:?}");
    assert_eq!(traffic.round_trips as usize, N);
    eprintln!("script: 1 command, 1 round trip per claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_job_starts_with_its_hash_tag() {
    // Names that would break out of `{prefix:job}` are not job names.
    for bad in ["a}b", "a{b", "a:b", "a*", "a b", "a?", "[a]", "a\\b"] {
        assert!(JobName::new(bad).is_err(), "{bad:?} must not be a job name");
    }
    let jobs = ["plain", "with-dash", "with_underscore", "MixedCase09"];
    let lease = LeaseFactory::new().await;
    let sid = StreamIdFactory::new().await;
    let script = ScriptFactory::new().await;
    let lease_store = lease.instance().await;
    let sid_store = sid.instance().await;
    let script_store = script.instance().await;
    let slot = future_slot(&lease, 0);
    for name in jobs {
        let run = RunKey::new(job(name), slot);
        let token = Token::generate();
        lease_won(&*lease_store, run.clone(), token, "a").await;
        lease_store
            .heartbeat(&run, token, Duration::from_secs(30))
            .await
            .unwrap();
        lease_store
            .finish(&run, token, RunOutcome::Succeeded)
            .await
            .unwrap();
        lease_store
            .collect_garbage(Duration::from_secs(3600))
            .await
            .unwrap();
        claim_won(&*sid_store, run.clone(), "a").await;
        claim_won(&*script_store, run, "a").await;
    }
    for (factory_url, prefix, suffixes, extra) in [
        (
            &lease.url,
            &lease.prefix,
            &["runs", "slots", "fence", "window"][..],
            Some("jobs"),
        ),
        (&sid.url, &sid.prefix, &["stream-id"][..], None),
        (&script.url, &script.prefix, &["script"][..], None),
    ] {
        let keys = keys_of(factory_url, prefix).await;
        let mut expected: Vec<String> = jobs
            .iter()
            .flat_map(|j| {
                suffixes
                    .iter()
                    .map(move |s| format!("{{{prefix}:{j}}}:{s}"))
            })
            .collect();
        if let Some(extra) = extra {
            expected.push(format!("{{{prefix}}}:{extra}"));
        }
        expected.sort();
        // `live` is empty once the runs finished, so Redis removed it.
        assert_eq!(keys, expected, "keys under {prefix}");
        for key in &keys {
            assert_eq!(key.matches('{').count(), 1, "{key}");
            assert_eq!(key.matches('}').count(), 1, "{key}");
            let tag = &key[..=key.find('}').unwrap()];
            assert!(
                tag == format!("{{{prefix}}}")
                    || jobs.iter().any(|j| tag == format!("{{{prefix}:{j}}}")),
                "{key} must carry the tag of one job of {prefix}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_id_loses_a_slot_older_than_one_already_claimed() {
    let factory = StreamIdFactory::new().await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let base = future_slot(&factory, 0);
    let job = job("order");
    let later = RunKey::new(job.clone(), slot_after(base, 60));
    let earlier = RunKey::new(job.clone(), base);
    claim_won(&*a, later, "a").await;
    // Nobody claimed `earlier`, but it can no longer be added: lost, not doubled.
    assert_eq!(
        b.claim(&claim_request(earlier.clone(), Token::generate(), "b"))
            .await
            .unwrap(),
        ClaimOutcome::Lost
    );
    assert_eq!(b.out_of_order_losses(), 1);
    assert_eq!(
        a.claim(&claim_request(earlier, Token::generate(), "a"))
            .await
            .unwrap(),
        ClaimOutcome::Lost,
        "and nobody else can claim it either"
    );
    assert_eq!(a.info().memory, Memory::Forever);
    assert!(Arc::clone(&a).as_lease_store().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_remembers_a_claim_for_its_window() {
    let factory = ScriptFactory::new().await;
    let store = factory.instance().await;
    let window = RedisScriptStore::DEFAULT_WINDOW;
    assert_eq!(store.info().memory, Memory::Window(window));
    assert!(Arc::clone(&store).as_lease_store().is_none());
    let mut conn = raw(&factory.url).await;
    let key = format!("{{{}:window}}:script", factory.prefix);
    let server_now = {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        secs * 1000 + micros / 1000
    };
    let base = future_slot(&factory, 0);
    let inside = RunKey::new(job("window"), base);
    let outside = RunKey::new(job("window"), slot_after(base, 1));
    // Someone claimed `outside` just before the window, `inside` just within it.
    let window_ms = window.as_millis() as i64;
    for (run, at) in [
        (&outside, server_now - window_ms - 5_000),
        (&inside, server_now - window_ms + 30_000),
    ] {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg(format!("{at}-0"))
            .arg("slot")
            .arg(run.slot.as_millis())
            .arg("token")
            .arg(Token::generate().to_string())
            .arg("instance")
            .arg("other")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(
        store
            .claim(&claim_request(inside, Token::generate(), "a"))
            .await
            .unwrap(),
        ClaimOutcome::Lost,
        "a claim inside the window is remembered"
    );
    claim_won(&*store, outside, "a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_only_memories_are_checked_when_built_and_by_the_scheduler() {
    let (_, _, opts, _cleanup) = common::fresh("mem").await;
    for window in [
        Duration::ZERO,
        Duration::from_secs(5),
        MIN_MEMORY - Duration::from_millis(1),
    ] {
        let err = RedisScriptStore::connect(&opts, window).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    strategy: "script",
                    option: "window",
                    ..
                }
            ),
            "{err}"
        );
    }
    for duration in [
        Duration::from_secs(5),
        Duration::from_millis(60_500),
        Duration::from_secs(2 * 86_400),
    ] {
        let err = RedisIdmpStore::connect(&opts, duration).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    strategy: "idmp",
                    option: "duration",
                    ..
                }
            ),
            "{duration:?}: {err}"
        );
    }
    // A 60 s window is too short for the default max_late of 60 s + 10 s margin.
    let store = Arc::new(
        RedisScriptStore::connect(&opts, Duration::from_secs(60))
            .await
            .unwrap(),
    );
    anarchon_testkit::fleet::jobs_later_than_a_minute_of_memory_are_refused(
        store,
        "redis-script",
        None,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_reports_the_server_it_found() {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let (product, version) = common::server_version(&factory.url).await;
    let server = store.server();
    assert_eq!(
        (server.product, server.version),
        (product.as_str(), version)
    );
    assert!(!server.run_id.is_empty());
    let mut conn = raw(&factory.url).await;
    let policy = common::config_get(&mut conn, "maxmemory-policy").await;
    assert_eq!(server.eviction, EvictionFinding::from_policy(&policy));
    assert_eq!(server.eviction.policy(), Some(policy.as_str()));
    let aof = common::config_get(&mut conn, "appendonly").await;
    assert_eq!(server.aof_enabled, Some(aof == "yes"));
    assert!(
        !store.check_server().await.unwrap(),
        "the same server is not news"
    );
    assert_eq!(store.server_changes(), 0);
}

/// What a Redis restart without AOF does: every key is gone, so a finished
/// run can be claimed — and run — again, and fences start over. Shown by
/// deleting this test's keys, which is exactly what the restart leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_forgets_every_run() {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let run = RunKey::new(job("forgotten"), future_slot(&factory, 0));
    let token = Token::generate();
    let first = lease_won(&*store, run.clone(), token, "a").await;
    store
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .unwrap();
    assert_eq!(
        lease_outcome(&*store, run.clone(), Token::generate(), "b").await,
        ClaimOutcome::Done(FinalState::Succeeded)
    );

    assert!(forget_prefix(&factory.url, &factory.prefix).await > 0);

    let again = lease_won(&*store, run.clone(), Token::generate(), "b").await;
    assert_eq!(
        again.attempt,
        Attempt::FIRST,
        "the run is claimed a second time"
    );
    assert_eq!(again.fence, Some(Fence::new(1)));
    assert_eq!(first.fence, again.fence, "and fences start over");
    let history = store.history(&run.job, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].state, RecordState::Running);

    // The claim-only strategies forget the same way.
    let sid = StreamIdFactory::new().await;
    let sid_store = sid.instance().await;
    let run = RunKey::new(job("forgotten"), future_slot(&sid, 0));
    claim_won(&*sid_store, run.clone(), "a").await;
    assert_eq!(
        sid_store
            .claim(&claim_request(run.clone(), Token::generate(), "b"))
            .await
            .unwrap(),
        ClaimOutcome::Lost
    );
    forget_prefix(&sid.url, &sid.prefix).await;
    claim_won(&*sid_store, run, "b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_and_garbage_collection_match_the_memory_store() {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let job = job("gc-more");
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    let old = Slot::from_millis(now - now.rem_euclid(1000) - 7_200_000);
    // A late claim records `missed`; GC removes old records of every kind
    // except running runs whose lease is recent.
    assert_eq!(
        lease_outcome(
            &*store,
            RunKey::new(job.clone(), old),
            Token::generate(),
            "a"
        )
        .await,
        ClaimOutcome::Missed
    );
    let mut catch_up = lease_claim(
        RunKey::new(job.clone(), slot_after(old, 1)),
        Token::generate(),
        "a",
    );
    // A window that lets this claim win (on a loaded machine too) and is
    // over two seconds later: the collection below may then take the run.
    catch_up.claim.max_late =
        Duration::from_millis(u64::try_from(now - catch_up.run().slot.as_millis()).unwrap() + 2000);
    won(store.claim_lease(&catch_up).await.unwrap());
    store
        .finish(
            catch_up.run(),
            catch_up.claim.token,
            RunOutcome::Failed {
                error: String::new(),
                retry: None,
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2250)).await;
    let history = store.history(&job, 10).await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].state, RecordState::Finished(FinalState::Failed));
    assert_eq!(
        history[0].error.as_deref(),
        Some(""),
        "an empty error is kept as such"
    );
    assert_eq!(history[1].state, RecordState::Missed);
    assert_eq!(store.history(&job, usize::MAX).await.unwrap(), history);
    assert!(store.history(&job, 0).await.unwrap().is_empty());
    assert_eq!(
        store
            .collect_garbage(Duration::from_secs(3600))
            .await
            .unwrap(),
        2
    );
    assert!(store.history(&job, 10).await.unwrap().is_empty());
    assert_eq!(
        store
            .collect_garbage(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
}

/// A pause is a hash under its scope's tag — `{p:job}:pause` for a job,
/// `{p}:pause` for every job — listed in `{p}:pauses`; resuming removes
/// both. The namespace is the prefix: pausing every job of one prefix
/// leaves another prefix's jobs running. A claim of a paused job is still
/// one command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pauses_are_kept_under_their_scopes_tag_and_listed() {
    let factory = LeaseFactory::new().await;
    let other = LeaseFactory::new().await;
    let store = factory.instance().await;
    let neighbour = other.instance().await;
    let p = &factory.prefix;
    let nightly = job("nightly");
    let request = PauseRequest::new()
        .with_until(Until::For(Duration::from_secs(3600)))
        .with_reason("migration: {p}:pause, \"quoted\"")
        .unwrap();
    let own = store
        .pause(&PauseScope::Job(nightly.clone()), &request)
        .await
        .unwrap();
    let all = store
        .pause(
            &PauseScope::All,
            &PauseRequest::new().with_by("ops").unwrap(),
        )
        .await
        .unwrap();
    let mut expected = vec![
        format!("{{{p}:nightly}}:pause"),
        format!("{{{p}}}:pause"),
        format!("{{{p}}}:pauses"),
    ];
    expected.sort();
    assert_eq!(keys_of(&factory.url, p).await, expected);
    let mut conn = raw(&factory.url).await;
    let scopes: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{{{p}}}:pauses"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut scopes = scopes;
    scopes.sort();
    assert_eq!(scopes, ["*", "nightly"]);
    assert_eq!(store.pauses().await.unwrap().pauses, vec![all, own]);

    // Another prefix is another namespace.
    let slot = future_slot(&factory, 0);
    lease_won(
        &*neighbour,
        RunKey::new(nightly.clone(), slot),
        Token::generate(),
        "n",
    )
    .await;
    assert!(neighbour.pauses().await.unwrap().pauses.is_empty());

    let (proxy, opts, _cleanup) = through_proxy("paused-cmds").await;
    let counted = RedisLeaseStore::connect(&opts).await.unwrap();
    counted
        .pause(&PauseScope::All, &PauseRequest::new())
        .await
        .unwrap();
    proxy.take();
    assert_eq!(
        lease_outcome(
            &counted,
            RunKey::new(nightly.clone(), slot),
            Token::generate(),
            "c"
        )
        .await,
        ClaimOutcome::Done(FinalState::Paused)
    );
    // The job's first claim through this handle also registers the job.
    // A connection the pool opens on the way introduces itself (CLIENT
    // SETINFO): that is the connection's cost, not the claim's.
    let traffic = proxy.take();
    let commands: Vec<&str> = traffic
        .commands
        .iter()
        .map(String::as_str)
        .filter(|c| !matches!(*c, "SUBSCRIBE" | "CLIENT"))
        .collect();
    assert_eq!(commands, ["SADD", "EVALSHA"], "{traffic:?}");

    assert!(store.resume(&PauseScope::All).await.unwrap());
    assert!(
        store
            .resume(&PauseScope::Job(nightly.clone()))
            .await
            .unwrap()
    );
    assert!(!store.resume(&PauseScope::All).await.unwrap());
    assert!(keys_of(&factory.url, p).await.is_empty());
}

/// The claims of one batch script share what none of them writes: the
/// pauses are read once per script. A pause of one job holds that job
/// only, the others of the batch start; a pause of every job holds each
/// claim of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_of_one_batch_each_see_their_own_jobs_pause() {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let slot = future_slot(&factory, 0);
    store
        .pause(&PauseScope::Job(job("held")), &PauseRequest::new())
        .await
        .unwrap();
    let claims = |names: &[&str], slot: Slot| -> Vec<_> {
        names
            .iter()
            .map(|name| lease_claim(RunKey::new(job(name), slot), Token::generate(), "a"))
            .collect()
    };
    let batch = claims(&["free", "held", "also-free"], slot);
    let outcomes = store.claim_many(&batch).await.unwrap().all().unwrap();
    assert!(matches!(outcomes[0], ClaimOutcome::Won(_)), "{outcomes:?}");
    assert_eq!(outcomes[1], ClaimOutcome::Done(FinalState::Paused));
    assert!(matches!(outcomes[2], ClaimOutcome::Won(_)), "{outcomes:?}");

    store
        .pause(&PauseScope::All, &PauseRequest::new())
        .await
        .unwrap();
    let next = Slot::from_millis(slot.as_millis() + 1000);
    let batch = claims(&["free", "held", "also-free"], next);
    let outcomes = store.claim_many(&batch).await.unwrap().all().unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| *o == ClaimOutcome::Done(FinalState::Paused)),
        "{outcomes:?}"
    );
}

/// A losing claim is answered from its record's text when that record is
/// someone else's and says it is running or succeeded (see
/// `lua/lease_claim.lua`, the losers' path). That reading must not be
/// fooled by what a record quotes: a failed run's error that spells out
/// another state and lease is still read as the failed run it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_claims_read_each_record_by_its_own_state_whatever_it_quotes() {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let job = job("losers");
    let base = ten_minutes_ahead();
    let decoy = r#"boom "state":"succeeded","state":"running","lease":"99999999999999""#;
    let claim = |seconds: i64, token: Token| {
        lease_claim(
            RunKey::new(job.clone(), slot_after(base, seconds)),
            token,
            "a",
        )
    };

    // Someone else's running run: the loser is told it runs, until when,
    // and the holder's own claim again still wins.
    let holder = Token::generate();
    let running = claim(0, holder);
    won(store.claim_lease(&running).await.unwrap());
    let ClaimOutcome::Running { lease_until, .. } = store
        .claim_lease(&claim(0, Token::generate()))
        .await
        .unwrap()
    else {
        panic!("a live lease held by someone else");
    };
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    assert!(
        (now..now + 120_000).contains(&lease_until.as_millis()),
        "the lease read from the record ends a lease from now: {lease_until:?}"
    );
    won(store.claim_lease(&running).await.unwrap());

    // A failed run whose error quotes `succeeded`: done, as failed.
    let failed = claim(1, Token::generate());
    won(store.claim_lease(&failed).await.unwrap());
    store
        .finish(
            failed.run(),
            failed.claim.token,
            RunOutcome::Failed {
                error: decoy.into(),
                retry: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_lease(&claim(1, Token::generate()))
            .await
            .unwrap(),
        ClaimOutcome::Done(FinalState::Failed)
    );

    // A failed run with a retry pending, whose error quotes a running
    // state and a lease far ahead: it counts as going until its retry is
    // due, not until the quoted lease.
    let retrying = claim(2, Token::generate());
    won(store.claim_lease(&retrying).await.unwrap());
    store
        .finish(
            retrying.run(),
            retrying.claim.token,
            RunOutcome::Failed {
                error: decoy.into(),
                retry: Some(anarchon_core::RetryPlan {
                    after: Duration::from_secs(3600),
                    before: anarchon_core::Timestamp::from_millis(now + 7_200_000),
                }),
            },
        )
        .await
        .unwrap();
    let ClaimOutcome::Running { lease_until, .. } = store
        .claim_lease(&claim(2, Token::generate()))
        .await
        .unwrap()
    else {
        panic!("a retry pending counts as going");
    };
    assert!(
        (now + 3_000_000..now + 4_000_000).contains(&lease_until.as_millis()),
        "going until the retry is due, an hour from now: {lease_until:?}"
    );

    // A succeeded run: done, as succeeded.
    let succeeded = claim(3, Token::generate());
    won(store.claim_lease(&succeeded).await.unwrap());
    store
        .finish(
            succeeded.run(),
            succeeded.claim.token,
            RunOutcome::Succeeded,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_lease(&claim(3, Token::generate()))
            .await
            .unwrap(),
        ClaimOutcome::Done(FinalState::Succeeded)
    );
}

/// A manual-run request nobody can read (written by hand, or by something
/// else) is passed over: the other requests are still read by every
/// instance, and collection takes the unreadable one instead of failing.
///
/// Failed before the fix: one such entry failed every read of the
/// requests, so no instance learnt of any manual run or backfill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_request_is_passed_over() {
    use anarchon_core::{RequestId, TriggerRequest};
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let job = job("requested");
    let request = TriggerRequest::new(job.clone(), RequestId::new("good").unwrap());
    store.request_run(&request).await.expect("request_run");
    let key = format!("{{{}}}:requests", store.prefix().as_str());
    let mut conn = raw(&factory.url).await;
    for (field, value) in [
        (format!("{job} broken"), "not a stamp"),
        ("no-id-here".to_owned(), "1 - -"),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let read = store
        .run_requests()
        .await
        .expect("the good request is read");
    let ids: Vec<&str> = read.requests.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["good"]);
    store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("a collection passes over what it cannot read");
    let left: bool = redis::cmd("HEXISTS")
        .arg(&key)
        .arg(format!("{job} broken"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!left, "the entry with no readable stamp is collected");
}
