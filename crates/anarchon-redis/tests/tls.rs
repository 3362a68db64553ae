//! `rediss://` through a TLS terminator in front of the test Redis. The
//! terminator makes a fresh certificate authority for each test: a store
//! told about it connects and claims; a store that trusts only the system's
//! roots (or another authority) is refused at the handshake, with an error
//! that says so and never shows the URL's password.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anarchon_core::{ClaimOutcome, ClaimStore, LeaseStore, RunKey, StoreErrorKind, Token};
use anarchon_redis::{Error, RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore};
use anarchon_testkit::claim::{claim_request, job};
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::servers::unique_prefix;
use anarchon_testkit::{Handshake, TlsTerminator};
use common::proxy::host_port;
use common::{Cleanup, keys_of, within};

const BOUND: Duration = Duration::from_secs(15);

/// A terminator in front of the test Redis, and the test Redis's URL.
async fn terminator() -> (TlsTerminator, String) {
    let url = common::url().await;
    let terminator = TlsTerminator::start(host_port(&url), Handshake::Immediate)
        .await
        .unwrap();
    (terminator, url)
}

/// `plain` (the test server's URL) as `rediss://` to `host:port`, keeping
/// its user info, database and parameters; `password` replaces the
/// password if given.
fn rediss(plain: &str, host: &str, port: u16, password: Option<&str>) -> String {
    let rest = plain.split_once("://").map_or(plain, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = match (authority.rsplit_once('@'), password) {
        (Some((userinfo, _)), None) => format!("{userinfo}@"),
        (Some((userinfo, _)), Some(pw)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{user}:{pw}@")
        }
        (None, Some(pw)) => format!(":{pw}@"),
        (None, None) => String::new(),
    };
    format!("rediss://{userinfo}{host}:{port}{tail}")
}

/// A slot ten minutes from now, on a whole second: never late.
fn slot_ahead() -> anarchon_core::Slot {
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    anarchon_core::Slot::from_millis(now - now.rem_euclid(1000) + 600_000)
}

/// Waits until the terminator has counted `n` refused handshakes (the
/// client's alert reaches it just after the client gave up).
async fn refused_at_least(terminator: &TlsTerminator, n: u64) -> u64 {
    for _ in 0..200 {
        if terminator.refused_handshakes() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    terminator.refused_handshakes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_private_authority_the_lease_stream_id_and_script_stores_win_claims_over_tls() {
    let (terminator, url) = terminator().await;
    let prefix = unique_prefix("tls");
    let _cleanup = Cleanup::new(&url, &prefix);
    let opts = RedisOptions::new(rediss(&url, "localhost", terminator.port(), None))
        .with_prefix(&prefix)
        .unwrap()
        .with_tls_ca_file(terminator.ca_file());
    let slot = slot_ahead();

    let lease = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap();
    let run = RunKey::new(job("tls-lease"), slot);
    let outcome = lease
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
    let other = lease
        .claim_lease(&lease_claim(run, Token::generate(), "b"))
        .await
        .unwrap();
    assert!(
        matches!(other, ClaimOutcome::Running { .. }),
        "a second claim sees the first one's lease: {other:?}"
    );

    let stream_id = within(
        BOUND,
        "stream-id connect",
        RedisStreamIdStore::connect(&opts),
    )
    .await
    .unwrap();
    let script = within(
        BOUND,
        "script connect",
        RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW),
    )
    .await
    .unwrap();
    for (name, store) in [
        ("stream-id", &stream_id as &dyn ClaimStore),
        ("script", &script as &dyn ClaimStore),
    ] {
        let run = RunKey::new(job(&format!("tls-{name}")), slot);
        let first = store
            .claim(&claim_request(run.clone(), Token::generate(), "a"))
            .await
            .unwrap();
        assert!(matches!(first, ClaimOutcome::Won(_)), "{name}: {first:?}");
        let second = store
            .claim(&claim_request(run, Token::generate(), "b"))
            .await
            .unwrap();
        assert!(
            matches!(second, ClaimOutcome::Lost),
            "{name}: another token loses: {second:?}"
        );
    }

    // The claims went through the terminator to the test server.
    let keys = keys_of(&url, &prefix).await;
    for job in ["tls-lease", "tls-stream-id", "tls-script"] {
        assert!(
            keys.iter().any(|k| k.contains(&format!(":{job}}}"))),
            "no key of {job} on the server: {keys:?}"
        );
    }
    assert!(
        terminator.handshakes() >= 3,
        "each store's connection is a TLS handshake: {}",
        terminator.handshakes()
    );
    assert_eq!(terminator.refused_handshakes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_authority_the_certificate_is_refused_and_no_handshake_completes() {
    let (terminator, url) = terminator().await;
    let opts = RedisOptions::new(rediss(&url, "localhost", terminator.port(), None))
        .with_prefix(&unique_prefix("tls-no-ca"))
        .unwrap();

    let err = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(
        !err.is_temporary(),
        "a refused certificate is not temporary"
    );
    let message = err.to_string();
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains("tls_ca_file"), "{message}");
    assert_eq!(
        err.into_store_error("redis-lease").kind(),
        StoreErrorKind::Invalid
    );

    let err = within(
        BOUND,
        "script connect",
        RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");

    assert!(refused_at_least(&terminator, 2).await >= 2);
    assert_eq!(terminator.handshakes(), 0, "no handshake may complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_that_did_not_sign_the_certificate_is_refused() {
    let (terminator, url) = terminator().await;
    let (stranger, _) = self::terminator().await;
    let opts = RedisOptions::new(rediss(&url, "127.0.0.1", terminator.port(), None))
        .with_prefix(&unique_prefix("tls-other-ca"))
        .unwrap()
        .with_tls_ca_file(stranger.ca_file());
    let err = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(refused_at_least(&terminator, 1).await >= 1);
    assert_eq!(terminator.handshakes(), 0);
    assert_eq!(stranger.handshakes() + stranger.refused_handshakes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_a_rediss_url_never_shows_in_errors() {
    let (terminator, url) = terminator().await;
    let secret = unique_prefix("sentinel-tls-password-");
    let tls_url = rediss(&url, "localhost", terminator.port(), Some(&secret));
    assert!(tls_url.contains(&secret));
    let assert_hidden = |what: &str, shown: String| {
        assert!(
            !shown.contains(&secret),
            "the password leaked into the {what}: {shown}"
        );
    };

    // The certificate is refused before the password is ever sent.
    let opts = RedisOptions::new(tls_url.clone())
        .with_prefix(&unique_prefix("tls-secret"))
        .unwrap();
    assert_hidden("options", format!("{opts:?}"));
    let err = within(BOUND, "lease connect", RedisLeaseStore::connect(&opts))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert_hidden("error", err.to_string());
    assert_hidden("error's Debug", format!("{err:?}"));
    let store_error = err.into_store_error("redis-lease");
    assert_hidden("store error", store_error.to_string());
    assert_hidden("store error's Debug", format!("{store_error:?}"));

    // A certificate authority file that is not there: named, no password.
    let missing = std::env::temp_dir().join(unique_prefix("anarchon-missing-ca-"));
    let err = within(
        BOUND,
        "stream-id connect",
        RedisStreamIdStore::connect(&opts.clone().with_tls_ca_file(&missing)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::CaFile { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
    assert_hidden("error", err.to_string());
    assert_hidden("error's Debug", format!("{err:?}"));

    // `#insecure` is refused, and the message does not repeat the password.
    let err = within(
        BOUND,
        "script connect",
        RedisScriptStore::connect(
            &RedisOptions::new(format!("{tls_url}#insecure")),
            RedisScriptStore::DEFAULT_WINDOW,
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert_hidden("error", err.to_string());
    assert_hidden("error's Debug", format!("{err:?}"));

    assert_eq!(terminator.handshakes(), 0);
}
