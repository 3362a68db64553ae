//! The strategies against a Redis Cluster of three masters and three
//! replicas (`ANARCHON_REDIS_CLUSTER_URL`, or the one `cargo xtask services
//! --start` runs on 127.0.0.1:7000-7005): the claim and lease suites, the
//! `WAIT` option, and what a cluster URL refuses. Each test has its own key
//! prefix, deleted from every master afterwards; each simulated instance
//! is its own store with its own cluster connection. Nothing here assumes
//! which nodes are masters: the failover test (`cluster_faults.rs`) moves
//! them.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anarchon_core::{ClaimOutcome, ClaimStore, JobName, LeaseStore, RunKey, Slot, Token};
use anarchon_redis::{
    Error, RedisIdmpStore, RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore,
};
use anarchon_testkit::StoreFactory;
use anarchon_testkit::fleet::{now_ms, slot_request};
use anarchon_testkit::lease::lease_claim;

use crate::common::{ClusterLeaseFactory, ClusterScriptFactory, ClusterStreamIdFactory};

mod lease_claims {
    anarchon_testkit::claim_suite!(crate::common::ClusterLeaseFactory::new().await);
}

mod lease_leases {
    anarchon_testkit::lease_suite!(crate::common::ClusterLeaseFactory::new().await);
}

mod stream_id_claims {
    anarchon_testkit::claim_suite!(crate::common::ClusterStreamIdFactory::new().await);
}

mod script_claims {
    anarchon_testkit::claim_suite!(crate::common::ClusterScriptFactory::new().await);
}

/// The idmp strategy refuses the cluster's Redis 7 (no `XADD ... IDMP`)
/// as it refuses a single Redis 7, naming the `script` strategy.
#[tokio::test]
async fn the_idmp_strategy_refuses_a_cluster_without_xadd_idmp() {
    let url = common::cluster_url().await;
    let prefix = anarchon_testkit::unique_prefix("cidmp");
    let opts = common::cluster_options(&url, &prefix);
    let (product, version) =
        common::server_version(&common::node_url(&url, &common::cluster_nodes(&url)[0])).await;
    let result = RedisIdmpStore::connect(&opts, RedisIdmpStore::DEFAULT_DURATION).await;
    if product == "Redis" && version >= anarchon_redis::IDMP_MIN_VERSION {
        result.expect("a cluster of Redis 8.6+ takes the idmp strategy");
        return;
    }
    let err = result.expect_err("the idmp strategy must refuse a cluster without XADD IDMP");
    assert!(
        matches!(
            err,
            Error::ServerTooOld {
                strategy: "idmp",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("`script` strategy"), "{err}");
}

fn run(job: &str, slot: i64) -> RunKey {
    RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot))
}

/// Claims of many jobs at one instant (their keys spread over the
/// cluster's hash slots and masters) come back in the caller's order:
/// a second store's batch, half of whose runs the first store already
/// holds, is told `Running` exactly for those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_many_slots_answers_in_order() {
    let factory = ClusterLeaseFactory::new().await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let slot = now_ms();
    let runs: Vec<RunKey> = (0..64).map(|i| run(&format!("job-{i}"), slot)).collect();
    let first: Vec<_> = runs
        .iter()
        .step_by(2)
        .map(|r| lease_claim(r.clone(), Token::generate(), "a"))
        .collect();
    for answer in a.claim_many(&first).await.unwrap() {
        assert!(matches!(answer, Ok(ClaimOutcome::Won(_))), "{answer:?}");
    }
    let second: Vec<_> = runs
        .iter()
        .map(|r| lease_claim(r.clone(), Token::generate(), "b"))
        .collect();
    let answers = b.claim_many(&second).await.unwrap();
    assert_eq!(answers.len(), runs.len());
    for (i, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap();
        if i % 2 == 0 {
            assert!(
                matches!(answer, ClaimOutcome::Running { .. }),
                "{i}: {answer:?}"
            );
        } else {
            assert!(matches!(answer, ClaimOutcome::Won(_)), "{i}: {answer:?}");
        }
    }
}

/// How long a claim of [`claims_wait_for_one_replica`] waits for its
/// replica: under the default response timeout (2 s), and long enough for
/// a replica on a loaded machine.
const REPLICA_ACK: Duration = Duration::from_millis(1_500);

/// With `wait_for_replicas(1, …)` every claim, heartbeat and finish is
/// acknowledged by the master's one replica before it answers; the three
/// strategies claim as without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_for_one_replica() {
    let factory = ClusterLeaseFactory::new().await;
    let opts = factory.opts.clone().wait_for_replicas(1, REPLICA_ACK);
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let other = factory.instance().await;
    let slot = now_ms();
    let runs: Vec<RunKey> = (0..8).map(|i| run(&format!("wait-{i}"), slot)).collect();
    let claims: Vec<_> = runs
        .iter()
        .map(|r| lease_claim(r.clone(), Token::generate(), "a"))
        .collect();
    for answer in store.claim_many(&claims).await.unwrap() {
        assert!(matches!(answer, Ok(ClaimOutcome::Won(_))), "{answer:?}");
    }
    let theirs = other
        .claim_lease(&lease_claim(runs[0].clone(), Token::generate(), "b"))
        .await
        .unwrap();
    assert!(matches!(theirs, ClaimOutcome::Running { .. }), "{theirs:?}");
    let renewed = store
        .heartbeat(&runs[0], claims[0].claim.token, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(renewed, anarchon_core::Renewal::Renewed);
    let finished = store
        .finish(
            &runs[0],
            claims[0].claim.token,
            anarchon_core::RunOutcome::Succeeded,
        )
        .await
        .unwrap();
    assert_eq!(finished, anarchon_core::Renewal::Renewed);

    let script_opts = ClusterScriptFactory::new()
        .await
        .opts
        .wait_for_replicas(1, REPLICA_ACK);
    let script = RedisScriptStore::connect(&script_opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap();
    let won = script.claim(&slot_request("w", slot, "a")).await.unwrap();
    assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
    let sid_opts = ClusterStreamIdFactory::new()
        .await
        .opts
        .wait_for_replicas(1, REPLICA_ACK);
    let sid = RedisStreamIdStore::connect(&sid_opts).await.unwrap();
    let won = sid.claim(&slot_request("w", slot, "a")).await.unwrap();
    assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
}

/// Asking for two replicas where each master has one: the claim waits the
/// timeout and fails with a temporary error that says how many replicas
/// acknowledged; the claim stands on the master (another instance is told
/// `Running`), and the same token sent again is its own claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_is_a_clear_temporary_error() {
    let factory = ClusterLeaseFactory::new().await;
    let opts = factory
        .opts
        .clone()
        .wait_for_replicas(2, Duration::from_millis(200));
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    let claim = lease_claim(run("two", now_ms()), Token::generate(), "a");
    let err = store.claim_lease(&claim).await.unwrap_err();
    assert!(err.is_temporary(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("only 1 of the 2 replicas") && message.contains("WAIT"),
        "{message}"
    );
    let other = factory.instance().await;
    let theirs = other
        .claim_lease(&lease_claim(claim.run().clone(), Token::generate(), "b"))
        .await
        .unwrap();
    assert!(matches!(theirs, ClaimOutcome::Running { .. }), "{theirs:?}");
    let plain = factory.instance().await;
    let again = plain.claim_lease(&claim).await.unwrap();
    assert!(matches!(again, ClaimOutcome::Won(_)), "{again:?}");
}

/// A `WAIT` timeout as long as the response timeout is refused before
/// anything is sent, naming both settings.
#[tokio::test]
async fn a_wait_as_long_as_the_response_timeout_is_refused() {
    let url = common::cluster_url().await;
    let opts = common::cluster_options(&url, "unused")
        .with_response_timeout(Duration::from_millis(500))
        .wait_for_replicas(1, Duration::from_millis(500));
    let err = RedisLeaseStore::connect(&opts).await.unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, Error::InvalidSetting { .. }) && message.contains("response timeout"),
        "{message}"
    );
}

/// A cluster node opened without `cluster=true` is refused with what to
/// add; `cluster=true` on the single test server is refused too.
#[tokio::test]
async fn the_url_must_say_whether_it_is_a_cluster() {
    let url = common::cluster_url().await;
    let node = common::node_url(&url, &common::cluster_nodes(&url)[0]);
    let err = RedisStreamIdStore::connect(&RedisOptions::new(node))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cluster=true"), "{err}");

    let single = common::url().await;
    let err = RedisStreamIdStore::connect(&RedisOptions::new(single).with_cluster(true))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not a Redis Cluster node"),
        "{err}"
    );
}

/// A cluster nobody answers for fails at once with a temporary error that
/// names the seeds it tried and never the password; a password the
/// cluster does not take is refused without being shown.
#[tokio::test]
async fn an_unreachable_cluster_or_a_wrong_password_is_clear() {
    let (opts, _) =
        RedisOptions::from_url("redis://:s3cret@127.0.0.1:1?cluster=true&seed=127.0.0.1:2")
            .unwrap();
    let opts = opts.with_connect_timeout(Duration::from_millis(300));
    let err = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(err.is_temporary(), "{message}");
    assert!(
        message.contains("127.0.0.1:1") && message.contains("127.0.0.1:2"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "{message}");
    assert!(!format!("{err:?}").contains("s3cret"));

    let url = common::cluster_url().await;
    let node = common::cluster_nodes(&url)[0].clone();
    let (opts, _) =
        RedisOptions::from_url(&format!("redis://:s3cret@{node}?cluster=true")).unwrap();
    let err = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(!message.contains("s3cret"), "{message}");
    assert!(!format!("{err:?}").contains("s3cret"));
    assert!(!err.is_temporary(), "{message}");
}
