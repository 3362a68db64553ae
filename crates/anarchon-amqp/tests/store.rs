//! The RabbitMQ store against a real broker: bad input, names, the
//! run-time refusal of lease-only options, and why the gate is never read.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore, BACKEND, Error, MAX_PREFIX_LEN};
use anarchon_core::name::MAX_JOB_NAME_LEN;
use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, RunKey, Slot, StoreErrorKind,
    Token,
};
use anarchon_testkit::fleet;
use anarchon_testkit::servers::unique_prefix;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::common::{TEST_SLOT_TTL, connect, options, url};

fn request(job: &str, slot: i64) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot)),
        token: Token::generate(),
        instance: InstanceId::new("test").unwrap(),
        max_late: Duration::from_secs(60),
    }
}

/// The same URL with another password (or vhost).
fn with_userinfo_and_vhost(url: &str, password: Option<&str>, vhost: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, host) = authority
        .rsplit_once('@')
        .unwrap_or(("guest:guest", authority));
    let user = userinfo.split(':').next().unwrap();
    let userinfo = match password {
        Some(p) => format!("{user}:{p}"),
        None => userinfo.to_owned(),
    };
    let path = match vhost {
        Some(v) => format!("/{v}"),
        None => path.to_owned(),
    };
    format!("{scheme}://{userinfo}@{host}{path}")
}

#[tokio::test]
async fn a_wrong_password_is_refused_by_name_without_showing_it() {
    let url = with_userinfo_and_vhost(&url().await, Some("not-the-password-1f2e"), None);
    let err = AmqpStore::connect(AmqpOptions::new(url)).await.unwrap_err();
    assert!(matches!(err, Error::LoginRefused { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("refused the login"), "{text}");
    assert!(text.contains("wrong user name or password"), "{text}");
    assert!(!text.contains("not-the-password-1f2e"), "{text}");
    assert!(!format!("{err:?}").contains("not-the-password-1f2e"));
    assert!(!err.is_temporary());
}

#[tokio::test]
async fn a_missing_vhost_is_named() {
    let vhost = unique_prefix("missing-vhost-");
    let url = with_userinfo_and_vhost(&url().await, None, Some(&vhost));
    let err = AmqpStore::connect(AmqpOptions::new(url)).await.unwrap_err();
    assert!(matches!(err, Error::VhostNotAllowed { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&vhost), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(!err.is_temporary());
}

#[tokio::test]
async fn an_unreachable_broker_is_a_temporary_error() {
    let err = AmqpStore::connect(AmqpOptions::new("amqp://guest:guest@127.0.0.1:1/%2f"))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

#[tokio::test]
async fn a_gate_declared_with_other_arguments_is_named() {
    let options = options().await;
    let first = connect(options.clone()).await;
    // Another instance of the fleet, configured with another slot TTL.
    let other = connect(options.with_slot_ttl(TEST_SLOT_TTL + Duration::from_secs(30))).await;
    let req = request("mismatch", 1_000);
    assert!(matches!(
        first.claim(&req).await.unwrap(),
        ClaimOutcome::Won(_)
    ));
    let err = other.claim(&request("mismatch", 1_000)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let gate = first.gate_queue(&req.run);
    assert!(err.message().contains(&gate), "{err}");
    assert!(err.message().contains("x-expires"), "{err}");
    assert!(err.message().contains("slot_ttl"), "{err}");
    // The broker closed that channel; the store goes on with a new one.
    let next = other.claim(&request("mismatch", 2_000)).await.unwrap();
    assert!(matches!(next, ClaimOutcome::Won(_)), "{next:?}");
}

/// A quorum queue can take more than `x-max-length` messages while its
/// leader changes, so a gate must be a classic queue. When a quorum queue
/// already holds a gate's name (declared by hand, or by a tool that makes
/// every queue a quorum queue), the claim is refused with the queue named,
/// never won through it. (The broker names the first argument that differs,
/// which may be `x-expires` rather than the type.)
#[tokio::test]
async fn a_quorum_queue_in_a_gates_place_is_refused_by_name() {
    let store = connect(options().await).await;
    let req = request("quorum", 1_000);
    let gate = store.gate_queue(&req.run);
    let connection = Connection::connect(&url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            gate.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .unwrap();
    let result = store.claim(&req).await;
    channel
        .queue_delete(gate.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let err = result.expect_err("a claim through a quorum queue must not be won");
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.message().contains(&gate), "{err}");
    assert!(
        err.message()
            .contains("already exists with other arguments"),
        "{err}"
    );
}

/// `stats()` counts the waits for the broker: two for the first channel
/// (opened when the store connects), then two for a winner (the gate's
/// declaration with the claim, the winner's mark), two for a loser (and
/// its probe for a mark of its own), two for the winner's claim sent
/// again (found by its mark), one for a ping.
#[tokio::test]
async fn a_claim_counts_its_round_trips() {
    let options = options().await;
    let a = connect(options.clone()).await;
    let b = connect(options).await;
    assert_eq!(
        a.stats().round_trips,
        2,
        "the first channel: open, confirms"
    );
    let req = request("counted", 11);
    let won = a.claim(&req).await.unwrap();
    assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
    assert_eq!(a.stats().round_trips, 4, "{:?}", a.stats());
    let other = request("counted", 11);
    assert_eq!(b.claim(&other).await.unwrap(), ClaimOutcome::Lost);
    assert_eq!(b.stats().round_trips, 4, "{:?}", b.stats());
    assert_eq!(a.claim(&req).await.unwrap(), won);
    assert_eq!(a.stats().round_trips, 6, "{:?}", a.stats());
    a.ping().await.unwrap();
    assert_eq!(a.stats().round_trips, 7, "{:?}", a.stats());
    assert_eq!(a.stats().connections_opened, 1);
}

#[tokio::test]
async fn the_longest_prefix_job_and_slot_make_valid_queue_names() {
    let prefix = {
        let stem = unique_prefix("t");
        let pad = MAX_PREFIX_LEN - stem.len();
        format!("{stem}{}", "p".repeat(pad))
    };
    assert_eq!(prefix.len(), MAX_PREFIX_LEN);
    let store = connect(
        AmqpOptions::new(url().await)
            .with_prefix(prefix)
            .with_slot_ttl(TEST_SLOT_TTL),
    )
    .await;
    let job = "j".repeat(MAX_JOB_NAME_LEN);
    for slot in [i64::MIN, i64::MAX] {
        let req = request(&job, slot);
        let won = store.claim(&req).await.unwrap();
        assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
        // The retry finds the winner's mark: the longest name RabbitMQ had
        // to accept.
        assert_eq!(store.claim(&req).await.unwrap(), won);
    }
}

#[tokio::test]
async fn invalid_prefixes_are_refused_before_connecting() {
    for bad in ["amq.cron", "amq", "a..b", "a b", "x*"] {
        let err = AmqpStore::connect(
            AmqpOptions::new("amqp://guest:guest@127.0.0.1:1/%2f").with_prefix(bad),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidPrefix { .. }), "{bad}: {err:?}");
    }
}

#[tokio::test]
async fn a_slot_ttl_below_the_minimum_is_refused() {
    let err = AmqpStore::connect(
        AmqpOptions::new(url().await)
            .with_slot_ttl(anarchon_amqp::MIN_SLOT_TTL - Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::SlotTtlOutOfRange { .. }), "{err:?}");
}

#[tokio::test]
async fn it_reports_its_memory_and_is_claim_only() {
    let store = Arc::new(connect(options().await).await);
    let shown = fleet::claim_only_store_reports(&store, BACKEND, TEST_SLOT_TTL);
    assert!(shown.contains(":***@"), "{shown}");
    assert!(!shown.contains("guest:guest"), "{shown}");
}

#[tokio::test]
async fn jobs_later_than_the_slot_ttl_allows_are_refused() {
    let store = Arc::new(connect(options().await.with_slot_ttl(Duration::from_secs(60))).await);
    fleet::jobs_later_than_a_minute_of_memory_are_refused(
        store,
        BACKEND,
        Some(Duration::from_secs(55)),
    );
}

#[tokio::test]
async fn lease_only_options_are_refused_at_run_time() {
    let store: Arc<dyn ClaimStore> = Arc::new(connect(options().await).await);
    fleet::lease_only_options_are_refused_at_run_time(&store, BACKEND, "rabbitmq");
}

/// Why the store never reads the gate to recognise its own retry: a
/// message taken out with `basic.get` (not yet acknowledged) no longer
/// counts against `x-max-length`, so the broker accepts a second claim.
/// If this ever fails, RabbitMQ changed how length limits count.
#[tokio::test]
async fn reading_the_gate_would_let_a_second_claim_in() {
    let connection = Connection::connect(&url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let queue = format!("{}.peek.slot.1", unique_prefix("t"));
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    arguments.insert("x-expires".into(), AMQPValue::LongLongInt(60_000));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .unwrap();
    let publish = |body: &'static [u8]| {
        let channel = channel.clone();
        let queue = queue.clone();
        async move {
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default(),
                )
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    assert!(publish(b"first").await.is_ack());
    assert!(publish(b"second").await.is_nack(), "the gate is closed");
    let peeked = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("the first claim is there");
    assert_eq!(peeked.delivery.data, b"first");
    assert!(
        publish(b"third").await.is_ack(),
        "while the first claim is out being read, the gate takes another"
    );
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}
