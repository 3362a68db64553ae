//! `amqps://` against the test RabbitMQ, through a TLS terminator with a
//! certificate authority of its own (made fresh for each test): trusted
//! with [`AmqpOptions::tls_ca_file`], refused without it.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore, Error};
use anarchon_core::Token;
use anarchon_core::{ClaimOutcome, ClaimRequest, ClaimStore, InstanceId, JobName, RunKey, Slot};
use anarchon_testkit::servers::unique_prefix;
use anarchon_testkit::{Handshake, TlsTerminator};

use crate::common::{TEST_SLOT_TTL, url};

/// The test broker's `host:port` and the `user:password` of its URL.
async fn broker() -> (String, String) {
    let url = url().await;
    let rest = url.split_once("://").unwrap().1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let (userinfo, host) = authority
        .rsplit_once('@')
        .unwrap_or(("guest:guest", authority));
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5672")
    };
    (host, userinfo.to_owned())
}

/// A terminator in front of the test broker, and its `amqps://` URL for
/// `localhost` with `userinfo`.
async fn terminator(userinfo: Option<&str>) -> (TlsTerminator, String) {
    let (host, broker_userinfo) = broker().await;
    let terminator = TlsTerminator::start(host, Handshake::Immediate)
        .await
        .unwrap();
    let userinfo = userinfo.unwrap_or(&broker_userinfo);
    let url = format!("amqps://{userinfo}@localhost:{}/%2f", terminator.port());
    (terminator, url)
}

fn request(slot: i64) -> ClaimRequest {
    ClaimRequest {
        run: RunKey::new(JobName::new("tls").unwrap(), Slot::from_millis(slot)),
        token: Token::generate(),
        instance: InstanceId::new("tls-test").unwrap(),
        max_late: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn a_claim_is_won_over_amqps_with_the_private_authority() {
    let (terminator, url) = terminator(None).await;
    let options = AmqpOptions::new(url)
        .with_prefix(unique_prefix("t"))
        .with_slot_ttl(TEST_SLOT_TTL)
        .with_tls_ca_file(terminator.ca_file());
    let first = AmqpStore::connect(options.clone()).await.unwrap();
    let second = AmqpStore::connect(options).await.unwrap();
    assert!(matches!(
        first.claim(&request(1)).await.unwrap(),
        ClaimOutcome::Won(_)
    ));
    assert_eq!(second.claim(&request(1)).await.unwrap(), ClaimOutcome::Lost);
    assert_eq!(terminator.handshakes(), 2, "one TLS connection per store");
    assert_eq!(terminator.refused_handshakes(), 0);
}

#[tokio::test]
async fn the_same_ca_file_works_from_a_store_url() {
    let (terminator, url) = terminator(None).await;
    let path = terminator.ca_file().display().to_string();
    assert!(!path.contains(['&', '%', '#', ' ']), "{path}");
    let options = AmqpOptions::from_url(&format!(
        "{url}?prefix={}&slot_ttl_ms=90000&tls_ca_file={path}",
        unique_prefix("t")
    ))
    .unwrap();
    assert_eq!(options.tls_ca_file(), Some(terminator.ca_file()));
    let store = AmqpStore::connect(options).await.unwrap();
    assert!(matches!(
        store.claim(&request(2)).await.unwrap(),
        ClaimOutcome::Won(_)
    ));
    assert_eq!(terminator.handshakes(), 1);
}

#[tokio::test]
async fn without_the_authority_the_certificate_is_refused_and_no_handshake_completes() {
    const SENTINEL: &str = "sentinel-pw-7d1c9e";
    let (terminator, url) = terminator(Some(&format!("guest:{SENTINEL}"))).await;
    let err = AmqpStore::connect(AmqpOptions::new(url).with_prefix(unique_prefix("t")))
        .await
        .unwrap_err();
    let text = err.to_string();
    let debug = format!("{err:?}");
    assert!(matches!(err, Error::Tls { .. }), "{debug}");
    assert!(text.contains("certificate"), "{text}");
    assert!(text.contains("tls_ca_file"), "{text}");
    assert!(!text.contains(SENTINEL), "{text}");
    assert!(!debug.contains(SENTINEL), "{debug}");
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        assert!(!cause.to_string().contains(SENTINEL), "{cause}");
        source = cause.source();
    }
    assert!(
        !err.is_temporary(),
        "a certificate nobody vouched for is not temporary"
    );

    // The terminator saw the client give up on the handshake.
    let waited = tokio::time::Instant::now();
    while terminator.refused_handshakes() == 0 && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(terminator.handshakes(), 0, "no TLS session was set up");
    assert!(terminator.refused_handshakes() >= 1);
}

#[tokio::test]
async fn amqps_to_a_plain_amqp_port_fails_instead_of_falling_back() {
    let (host, userinfo) = broker().await;
    let err = AmqpStore::connect(AmqpOptions::new(format!("amqps://{userinfo}@{host}/%2f")))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("TLS"), "{err}");
}
