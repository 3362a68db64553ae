//! TLS: both stores through a TLS terminator with its own certificate
//! authority in front of the test server. With the authority they connect
//! and win claims; without it the certificate is refused, in time, with an
//! error that says so and shows no password or token.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use anarchon_core::{ClaimOutcome, ClaimStore, JobName, LeaseStore, RunKey, Token};
use anarchon_nats::{
    ClaimOptions, Error, NatsClaimStore, NatsLeaseOptions, NatsLeaseStore, NatsOptions,
};
use anarchon_testkit::claim::{claim_request, future_slot};
use anarchon_testkit::factory::MemoryFactory;
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::{Handshake, TlsTerminator};

use crate::common::{StreamGuard, claims, leases, upstream, url};

/// A password and a token that must never show.
const SENTINEL: &str = "s3ntinel-Pa55";

async fn terminator(handshake: Handshake) -> TlsTerminator {
    TlsTerminator::start(upstream(&url().await), handshake)
        .await
        .unwrap()
}

/// A run ten minutes ahead.
fn run(job: &str) -> RunKey {
    RunKey::new(
        JobName::new(job).unwrap(),
        future_slot(&MemoryFactory::new(), 0),
    )
}

/// The claim store wins the first claim of `job`'s run.
async fn claim_is_won(store: &NatsClaimStore, job: &str) {
    let outcome = store
        .claim(&claim_request(run(job), Token::generate(), "a"))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
}

/// The lease store wins the first claim of `job`'s run.
async fn lease_is_won(store: &NatsLeaseStore, job: &str) {
    let outcome = store
        .claim_lease(&lease_claim(run(job), Token::generate(), "a"))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
}

/// Both stores on `connection` win a claim: one on a fresh stream, one on a
/// fresh bucket.
async fn both_stores_win(connection: &NatsOptions) {
    let url = url().await;
    let claims = claims();
    let _stream = StreamGuard::new(&url, claims.stream_name());
    let store = NatsClaimStore::connect(connection, claims).await.unwrap();
    claim_is_won(&store, "tls").await;

    let leases = leases();
    let _bucket = StreamGuard::new(&url, leases.stream_name());
    let store = NatsLeaseStore::connect(connection, leases).await.unwrap();
    lease_is_won(&store, "tls").await;
}

#[tokio::test]
async fn both_stores_connect_over_tls_with_the_private_authority() {
    let tls = terminator(Handshake::Nats).await;
    let connection =
        NatsOptions::new(format!("tls://localhost:{}", tls.port())).with_tls_ca_file(tls.ca_file());
    both_stores_win(&connection).await;
    assert!(
        tls.handshakes() >= 2,
        "each store did a TLS handshake: {}",
        tls.handshakes()
    );
    assert_eq!(tls.refused_handshakes(), 0);
}

#[tokio::test]
async fn tls_first_connects_to_a_server_that_starts_with_tls() {
    let tls = terminator(Handshake::Immediate).await;
    let connection = NatsOptions::new(format!("nats://localhost:{}", tls.port()))
        .with_tls_first(true)
        .with_tls_ca_file(tls.ca_file());
    both_stores_win(&connection).await;
    assert!(tls.handshakes() >= 2, "{}", tls.handshakes());
}

#[tokio::test]
async fn store_urls_carry_the_tls_options() {
    let tls = terminator(Handshake::Nats).await;
    let ca = tls.ca_file().display().to_string().replace(' ', "%20");
    let url = url().await;

    let claims = claims();
    let _stream = StreamGuard::new(&url, claims.stream_name());
    let (connection, from_url) = ClaimOptions::from_url(&format!(
        "nats://localhost:{}?prefix={}&duplicate_window_ms=90000&tls=true&tls_ca_file={ca}",
        tls.port(),
        claims.prefix()
    ))
    .unwrap();
    assert!(connection.uses_tls());
    assert_eq!(connection.tls_ca_file(), Some(tls.ca_file()));
    let store = NatsClaimStore::connect(&connection, from_url)
        .await
        .unwrap();
    claim_is_won(&store, "url").await;

    let leases = leases();
    let _bucket = StreamGuard::new(&url, leases.stream_name());
    let (connection, from_url) = NatsLeaseOptions::from_url(&format!(
        "tls://localhost:{}?bucket={}&tls_ca_file={ca}",
        tls.port(),
        leases.bucket()
    ))
    .unwrap();
    let store = NatsLeaseStore::connect(&connection, from_url)
        .await
        .unwrap();
    lease_is_won(&store, "url").await;
    assert!(tls.handshakes() >= 2, "{}", tls.handshakes());
}

/// Fails unless `error` is a TLS error about the certificate, in no form
/// (message, `Debug`, the core's error) showing the secret.
fn assert_certificate_refused(error: Error) {
    let shown = error.to_string();
    assert!(matches!(error, Error::Tls { .. }), "{shown}");
    assert!(shown.contains("TLS"), "{shown}");
    assert!(shown.contains("certificate"), "{shown}");
    assert!(!error.is_temporary(), "{shown}");
    assert!(!shown.contains(SENTINEL), "{shown}");
    assert!(!format!("{error:?}").contains(SENTINEL), "{error:?}");
    let store_error = anarchon_core::StoreError::from(error);
    assert!(!store_error.is_temporary(), "{store_error}");
    assert!(!store_error.to_string().contains(SENTINEL), "{store_error}");
    assert!(
        !format!("{store_error:?}").contains(SENTINEL),
        "{store_error:?}"
    );
}

#[tokio::test]
async fn without_the_authority_the_certificate_is_refused_in_time() {
    let tls = terminator(Handshake::Nats).await;
    let limit = Duration::from_secs(2);
    let claims_url = format!("tls://cron:{SENTINEL}@localhost:{}", tls.port());
    let lease_url = format!("tls://{SENTINEL}@localhost:{}", tls.port());

    let start = Instant::now();
    let claim_error = NatsClaimStore::connect(
        &NatsOptions::new(claims_url).with_connect_timeout(limit),
        ClaimOptions::new().with_duplicate_window(common::TEST_WINDOW),
    )
    .await
    .expect_err("an unknown authority must be refused");
    assert_certificate_refused(claim_error);
    let lease_error = NatsLeaseStore::connect(
        &NatsOptions::new(lease_url).with_connect_timeout(limit),
        NatsLeaseOptions::new(),
    )
    .await
    .expect_err("an unknown authority must be refused");
    assert_certificate_refused(lease_error);
    assert!(
        start.elapsed() < 2 * (limit + Duration::from_secs(1)),
        "both connects gave up within their limit: {:?}",
        start.elapsed()
    );

    assert_eq!(tls.handshakes(), 0, "no handshake completed");
    for _ in 0..100 {
        if tls.refused_handshakes() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        tls.refused_handshakes() >= 2,
        "{}",
        tls.refused_handshakes()
    );
}

#[tokio::test]
async fn required_tls_is_never_given_up_for_plain_text() {
    // The test server itself speaks no TLS.
    let url = url().await;
    let started = Instant::now();
    let error = NatsClaimStore::connect(
        &NatsOptions::new(&url)
            .with_require_tls(true)
            .with_connect_timeout(Duration::from_secs(2)),
        ClaimOptions::new().with_duplicate_window(common::TEST_WINDOW),
    )
    .await
    .expect_err("a plain-text server cannot give TLS");
    let shown = error.to_string();
    assert!(matches!(error, Error::Tls { .. }), "{shown}");
    assert!(shown.contains("TLS"), "{shown}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_unusable_authority_file_is_named() {
    let missing = std::env::temp_dir().join("anarchon-nats-no-such-ca.pem");
    let error = NatsClaimStore::connect(
        &NatsOptions::new("tls://localhost:4222").with_tls_ca_file(&missing),
        ClaimOptions::new(),
    )
    .await
    .expect_err("no such file");
    assert!(
        matches!(&error, Error::TlsCaFile { path, .. } if *path == missing),
        "{error}"
    );
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );

    let garbage = std::env::temp_dir().join(format!(
        "anarchon-nats-garbage-ca-{}.pem",
        std::process::id()
    ));
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let error = NatsLeaseStore::connect(
        &NatsOptions::new("tls://localhost:4222").with_tls_ca_file(&garbage),
        NatsLeaseOptions::new(),
    )
    .await
    .expect_err("not a certificate");
    let _ = std::fs::remove_file(&garbage);
    assert!(
        matches!(&error, Error::TlsCaFile { path, .. } if *path == garbage),
        "{error}"
    );
    assert!(!error.is_temporary());
}
