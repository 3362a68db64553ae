//! The NATS claim store against real servers: bad input, streams that do
//! not fit, names, and the run-time refusal of lease-only options.
//!
//! The tests for a server without JetStream and for credentials start their
//! own `nats-server` on a free port (the shared server has JetStream and no
//! users): set ANARCHON_NATS_SERVER_BIN, or have `nats-server` on the PATH
//! or in /usr/sbin.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon_core::name::MAX_JOB_NAME_LEN;
use anarchon_core::{
    ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, Memory, RunKey, Slot, Token,
};
use anarchon_nats::{BACKEND, ClaimOptions, Error, MAX_PREFIX_LEN, NatsClaimStore, NatsOptions};
use anarchon_testkit::fleet;
use anarchon_testkit::servers::unique_prefix;
use async_nats::jetstream::{self, stream};

use crate::common::{StreamGuard, TEST_WINDOW, claims, connect, create_stream, url};

fn request(job: &str, slot: i64) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot)),
        token: Token::generate(),
        instance: InstanceId::new("test").unwrap(),
        max_late: Duration::from_secs(60),
    }
}

/// A `nats-server` of our own on a free port, killed when dropped.
struct OwnServer {
    child: Child,
    port: u16,
}

impl OwnServer {
    fn start(args: &[&str]) -> Self {
        let binary = std::env::var_os("ANARCHON_NATS_SERVER_BIN")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("PATH").and_then(|path| {
                    std::env::split_paths(&path)
                        .map(|dir| dir.join("nats-server"))
                        .find(|candidate| candidate.is_file())
                })
            })
            .or_else(|| {
                let sbin = PathBuf::from("/usr/sbin/nats-server");
                sbin.is_file().then_some(sbin)
            })
            .unwrap_or_else(|| {
                panic!(
                    "this test starts its own nats-server (without JetStream, or with a password): \
                     install nats-server, or set ANARCHON_NATS_SERVER_BIN to its path"
                )
            });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Self { child, port };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "our nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_server_without_jetstream_is_named() {
    let server = OwnServer::start(&[]);
    let url = format!("nats://127.0.0.1:{}", server.port);
    let err = NatsClaimStore::connect(&NatsOptions::new(&url), claims())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoJetStream { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("has no JetStream") && text.contains("-js"),
        "{text}"
    );
    assert!(!err.is_temporary());
}

#[tokio::test]
async fn credentials_in_the_url_are_used_and_never_shown() {
    let server = OwnServer::start(&["--user", "cron", "--pass", "right-pass-7c1d"]);
    let wrong = format!("nats://cron:wrong-pass-9a8b@127.0.0.1:{}", server.port);
    let err = NatsClaimStore::connect(&NatsOptions::new(&wrong), claims())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::AuthorizationViolation { .. }),
        "{err:?}"
    );
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wrong-pass-9a8b"), "{text}");
    assert!(text.contains("cron:***@"), "{text}");
    assert!(!err.is_temporary());
    // The right password gets in (and finds no JetStream on this server).
    let right = format!("nats://cron:right-pass-7c1d@127.0.0.1:{}", server.port);
    let err = NatsClaimStore::connect(&NatsOptions::new(&right), claims())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoJetStream { .. }), "{err:?}");
    assert!(!err.to_string().contains("right-pass-7c1d"));
}

#[tokio::test]
async fn an_unreachable_server_is_a_temporary_error() {
    let err = NatsClaimStore::connect(&NatsOptions::new("nats://127.0.0.1:1"), claims())
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

/// Creates the stream `made_first` as someone else would, then connects a
/// claim store with `claims`: the error it is refused with.
async fn refused_after_another_stream(
    url: &str,
    made_first: stream::Config,
    claims: &ClaimOptions,
) -> Error {
    let jetstream = jetstream::new(async_nats::connect(url).await.unwrap());
    create_stream(&jetstream, made_first).await;
    NatsClaimStore::connect(&NatsOptions::new(url), claims.clone())
        .await
        .unwrap_err()
}

#[tokio::test]
async fn a_stream_with_other_subjects_is_named() {
    let url = url().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let err = refused_after_another_stream(
        &url,
        stream::Config {
            name: claims.stream_name(),
            subjects: vec![format!("{}.>", claims.prefix())],
            duplicate_window: TEST_WINDOW,
            ..Default::default()
        },
        &claims,
    )
    .await;
    assert!(matches!(err, Error::StreamMismatch { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&claims.stream_name()), "{text}");
    assert!(text.contains("subjects"), "{text}");
}

#[tokio::test]
async fn a_stream_with_a_shorter_window_is_refused_and_a_longer_one_used() {
    let url = url().await;
    let options = NatsOptions::new(&url);
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let first = connect(&options, claims.clone()).await;
    assert_eq!(first.duplicate_window(), TEST_WINDOW);
    let wants_more = claims.clone().with_duplicate_window(TEST_WINDOW * 2);
    let err = NatsClaimStore::connect(&options, wants_more)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StreamMismatch { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&claims.stream_name()) && text.contains("shorter"),
        "{text}"
    );
    let wants_less = connect(
        &options,
        claims.with_duplicate_window(Duration::from_secs(60)),
    )
    .await;
    assert_eq!(
        wants_less.info().memory,
        Memory::Window(TEST_WINDOW),
        "the store reports the stream's real window"
    );
}

#[tokio::test]
async fn subjects_taken_by_another_stream_are_named() {
    let url = url().await;
    let claims = claims();
    let squatter = format!("{}-squatter", claims.prefix());
    let _guard = StreamGuard::new(&url, squatter.clone());
    let err = refused_after_another_stream(
        &url,
        stream::Config {
            name: squatter,
            subjects: vec![claims.subject_filter()],
            ..Default::default()
        },
        &claims,
    )
    .await;
    assert!(matches!(err, Error::SubjectsOverlap { .. }), "{err:?}");
    assert!(err.to_string().contains(&claims.subject_filter()), "{err}");
}

#[tokio::test]
async fn invalid_names_and_windows_are_refused_before_connecting() {
    let nowhere = NatsOptions::new("nats://127.0.0.1:1");
    for (claims, what) in [
        (ClaimOptions::new().with_prefix("a.*"), "prefix"),
        (ClaimOptions::new().with_prefix("a b"), "prefix"),
        (ClaimOptions::new().with_stream("a.b"), "stream"),
        (
            ClaimOptions::new().with_duplicate_window(Duration::from_secs(5)),
            "duplicate_window",
        ),
    ] {
        let err = NatsClaimStore::connect(&nowhere, claims).await.unwrap_err();
        assert!(!err.is_temporary(), "{what}: {err:?}");
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

#[tokio::test]
async fn the_longest_prefix_and_job_make_valid_subjects_and_ids() {
    let url = url().await;
    let prefix = {
        let stem = unique_prefix("t");
        format!("{stem}{}", "p".repeat(MAX_PREFIX_LEN - stem.len()))
    };
    let claims = ClaimOptions::new()
        .with_prefix(prefix)
        .with_duplicate_window(TEST_WINDOW);
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = connect(&NatsOptions::new(&url), claims).await;
    let job = "j".repeat(MAX_JOB_NAME_LEN);
    for slot in [i64::MIN, i64::MAX] {
        let req = request(&job, slot);
        let won = store.claim(&req).await.unwrap();
        assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
        assert_eq!(store.claim(&req).await.unwrap(), won, "read back by id");
        let other = store.claim(&request(&job, slot)).await.unwrap();
        assert_eq!(other, ClaimOutcome::Lost);
    }
}

#[tokio::test]
async fn a_foreign_message_holding_the_run_makes_it_lost() {
    let url = url().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = connect(&NatsOptions::new(&url), claims).await;
    let req = request("foreign", 7);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", NatsClaimStore::message_id(&req.run).as_str());
    let jetstream = jetstream::new(store.client().clone());
    jetstream
        .publish_with_headers(store.subject(&req.run.job), headers, "not ours".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Lost);
}

/// `stats()` counts the waits for the server a claim makes: one for a
/// winner (the publish and its acknowledgement), two for a loser (and the
/// read of the stored claim), two for the winner's claim sent again (told
/// `Won` by the same read), one for a ping.
#[tokio::test]
async fn a_claim_counts_its_round_trips() {
    let url = url().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let a = connect(&NatsOptions::new(&url), claims.clone()).await;
    let b = connect(&NatsOptions::new(&url), claims).await;
    let req = request("counted", 11);
    assert_eq!(
        a.claim(&req).await.unwrap(),
        ClaimOutcome::Won(anarchon_core::Win::first(None))
    );
    assert_eq!(a.stats().round_trips, 1, "a winner publishes once");
    let other = request("counted", 11);
    assert_eq!(b.claim(&other).await.unwrap(), ClaimOutcome::Lost);
    assert_eq!(
        b.stats().round_trips,
        2,
        "a loser also reads the claim back"
    );
    assert!(matches!(a.claim(&req).await.unwrap(), ClaimOutcome::Won(_)));
    assert_eq!(
        a.stats().round_trips,
        3,
        "a retry is a duplicate, read back"
    );
    a.ping().await.unwrap();
    assert_eq!(a.stats().round_trips, 4);
}

#[tokio::test]
async fn it_reports_its_memory_and_is_claim_only() {
    let url = url().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = Arc::new(
        connect(
            &NatsOptions::new(url.replace("nats://", "nats://someone:secret-3b@")),
            claims,
        )
        .await,
    );
    let shown = fleet::claim_only_store_reports(&store, BACKEND, TEST_WINDOW);
    assert!(!shown.contains("secret-3b"), "{shown}");
}

#[tokio::test]
async fn jobs_later_than_the_window_allows_are_refused() {
    let url = url().await;
    let claims = claims().with_duplicate_window(Duration::from_secs(60));
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store = Arc::new(connect(&NatsOptions::new(&url), claims).await);
    fleet::jobs_later_than_a_minute_of_memory_are_refused(
        store,
        BACKEND,
        Some(Duration::from_secs(55)),
    );
}

#[tokio::test]
async fn lease_only_options_are_refused_at_run_time() {
    let url = url().await;
    let claims = claims();
    let _guard = StreamGuard::new(&url, claims.stream_name());
    let store: Arc<dyn ClaimStore> = Arc::new(connect(&NatsOptions::new(&url), claims).await);
    fleet::lease_only_options_are_refused_at_run_time(&store, BACKEND, "`nats`");
}
