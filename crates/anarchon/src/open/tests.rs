//! Reading store URLs: every scheme, its parameters and errors, and that
//! no reader shows a password. (Moved here from the CLI with the readers.)

use std::time::Duration;

use anarchon_core::Memory;
use anarchon_core::url::redact;
use anarchon_redis::RedisScriptStore;

use super::*;

/// Reading `url` fails: the error and its message, which does not show
/// the password `s3cret`.
fn refused(url: &str) -> (OpenError, String) {
    let err = StoreUrl::parse(url).unwrap_err();
    let text = err.to_string();
    assert!(!text.contains("s3cret"), "{url}: {text}");
    (err, text)
}

/// Reading `url` fails with a URL error (never a temporary one) that
/// `says` why and does not show the password.
fn assert_refused(url: &str, says: &str) {
    let (err, text) = refused(url);
    assert!(matches!(err, OpenError::InvalidUrl { .. }), "{url}: {text}");
    assert!(err.is_url() && !err.is_temporary(), "{text}");
    assert!(text.contains(says), "{url}: {text}");
}

#[test]
fn unknown_schemes_are_refused_without_the_password() {
    let (err, text) = refused("mysql://app:s3cret@db/cron");
    assert!(matches!(err, OpenError::UnknownScheme { .. }), "{text}");
    assert!(err.is_url() && !err.is_temporary());
    assert!(text.contains("mysql://app:***@db/cron"), "{text}");
    for scheme in [
        "sqlite://",
        "postgres://",
        "redis://",
        "rediss://",
        "amqp://",
        "amqps://",
        "nats://",
    ] {
        assert!(text.contains(scheme), "lists {scheme}: {text}");
    }
    assert!(StoreUrl::parse("anarchon.db").is_err());
}

#[test]
fn sqlite_urls_are_read_without_opening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.db");
    let backend = StoreUrl::parse(&format!("sqlite://{}", path.display())).unwrap();
    assert!(backend.describe().contains("never.db"));
    assert!(backend.is_lease());
    assert_eq!(backend.backend(), "sqlite");
    assert_eq!(backend.kind(), StoreKind::Lease);
    assert!(!path.exists(), "parsing a URL must not create the file");
    for bad in [
        "sqlite://cron.db?bogus=1",
        "sqlite://cron.db?max_connections=0",
        "sqlite://",
        "sqlite://:memory:",
    ] {
        let err = StoreUrl::parse(bad).unwrap_err();
        assert!(err.is_url() && !err.is_temporary(), "{bad}: {err}");
    }
}

#[test]
fn postgres_urls_keep_the_clients_parameters_and_strip_ours() {
    for scheme in ["postgres", "postgresql"] {
        let backend = StoreUrl::parse(&format!(
            "{scheme}://app:s3cret@db.internal:6543/cron?table=cron_runs&pool_size=8&sslmode=require&connect_timeout_ms=1500&statement_timeout_ms=0&migrate=false&application_name=web"
        ))
        .unwrap();
        let Backend::Postgres(options) = &backend.backend else {
            panic!("{backend:?}")
        };
        let server = options.server();
        assert_eq!(options.table().as_str(), "cron_runs");
        assert_eq!(options.pool_size(), 8);
        assert_eq!(options.connect_timeout(), Duration::from_millis(1500));
        assert_eq!(options.statement_timeout(), None);
        assert_eq!(
            options.redacted_url(),
            format!("{scheme}://app:***@db.internal:6543/cron?sslmode=require")
        );
        assert_eq!(server, "db.internal:6543/cron");
        assert!(backend.is_lease());
        assert_eq!(backend.backend(), "postgres");
        assert_eq!(backend.kind(), StoreKind::Lease);
        let described = backend.describe();
        assert!(described.contains("table cron_runs"), "{described}");
        assert!(!described.contains("s3cret"), "{described}");
        assert!(!format!("{backend:?}").contains("s3cret"));
    }
    let plain = StoreUrl::parse("postgres://postgres@127.0.0.1/test").unwrap();
    let Backend::Postgres(options) = &plain.backend else {
        panic!()
    };
    let server = options.server();
    assert_eq!(options.table().as_str(), "anarchon");
    assert_eq!(options.redacted_url(), "postgres://postgres@127.0.0.1/test");
    assert_eq!(server, "127.0.0.1:5432/test");
    // A Unix socket named by the client's `host` parameter.
    let socket = StoreUrl::parse("postgres://app@/cron?host=/run/postgresql").unwrap();
    assert!(socket.describe().contains("/run/postgresql:5432/cron"));
}

/// A backend's refusal of its URL reaches the caller as an invalid URL,
/// with the backend's reason and the password masked. (Each backend's own
/// tests go through every parameter; these are samples of the route.)
#[test]
fn bad_store_urls_are_refused_with_the_backends_reason() {
    for (url, says) in [
        (
            "postgres://app:s3cret@db/cron?tabel=x",
            "unknown parameter \"tabel\"",
        ),
        ("postgres://app:s3cret@/cron", "names no host"),
        (
            "redis://:s3cret@h?strategy=leases",
            "unknown strategy \"leases\"",
        ),
        ("redis://:s3cret@h?prefix=a%20b", "invalid key prefix"),
        ("rediss://:s3cret@h?tls_ca_file=%zz", "broken %-escape"),
    ] {
        assert_refused(url, says);
    }
    let pg = StoreUrl::parse("postgres://app:s3cret@db/cron?pool_size=0").unwrap_err();
    assert!(pg.to_string().contains("app:***@"), "{pg}");
}

#[test]
fn redis_urls_choose_a_strategy() {
    let lease = StoreUrl::parse("redis://:s3cret@127.0.0.1:6379/2?prefix=team.a").unwrap();
    assert!(lease.is_lease());
    assert_eq!(lease.backend(), "redis-lease");
    assert_eq!(lease.kind(), StoreKind::Lease);
    let described = lease.describe();
    assert!(described.contains("127.0.0.1:6379/2"), "{described}");
    assert!(described.contains("key prefix team.a"), "{described}");
    assert!(!described.contains("s3cret") && !format!("{lease:?}").contains("s3cret"));
    let Backend::Redis { options, .. } = &lease.backend else {
        panic!()
    };
    assert!(
        !format!("{options:?}").contains("prefix=team.a"),
        "stripped"
    );

    for (url, name, memory) in [
        (
            "redis://h?strategy=stream-id",
            "redis-stream-id",
            Memory::Forever,
        ),
        (
            "redis://h?strategy=script&window_ms=120000",
            "redis-script",
            Memory::Window(Duration::from_secs(120)),
        ),
        (
            "redis://h?strategy=script",
            "redis-script",
            Memory::Window(RedisScriptStore::DEFAULT_WINDOW),
        ),
        (
            "redis://h?strategy=idmp&duration_ms=3600000&protocol=resp2",
            "redis-idmp",
            Memory::Window(Duration::from_secs(3600)),
        ),
    ] {
        let backend = StoreUrl::parse(url).unwrap();
        assert!(!backend.is_lease(), "{url}");
        assert_eq!(backend.backend(), name);
        let stand_in = backend.info();
        assert_eq!(stand_in.name, name);
        assert_eq!(stand_in.memory, memory);
        assert_eq!(backend.kind(), StoreKind::ClaimOnly);
        assert!(backend.describe().contains("claim-only"));
    }
}

#[test]
fn tls_urls_carry_a_private_authority() {
    let redis = StoreUrl::parse(
        "rediss://:s3cret@h:6380/0?strategy=script&tls_ca_file=/etc/ca%20files/team.pem",
    )
    .unwrap();
    assert_eq!(redis.backend(), "redis-script");
    let Backend::Redis { options, .. } = &redis.backend else {
        panic!()
    };
    assert_eq!(
        options.tls_ca_file(),
        Some(std::path::Path::new("/etc/ca files/team.pem"))
    );
    assert!(!format!("{redis:?}").contains("s3cret"));

    // The RabbitMQ store reads its authority file as the URL is read,
    // so a wrong path shows up in `anarchon check`.
    let (_, err) = refused("amqps://u:s3cret@h/%2f?tls_ca_file=/nonexistent/ca.pem");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");

    for url in [
        "tls://tok3n@h:4222",
        "nats+tls://tok3n@h:4222",
        "nats://tok3n@h:4222?tls_ca_file=/etc/ca.pem",
    ] {
        let backend = StoreUrl::parse(url).unwrap();
        assert_eq!(backend.backend(), "nats", "{url}");
        let Backend::Nats { connection, .. } = &backend.backend else {
            panic!()
        };
        assert!(connection.uses_tls(), "{url}");
    }
    let kv = StoreUrl::parse("nats-kv+tls://tok3n@h:4222?tls_ca_file=/etc/ca.pem").unwrap();
    assert!(kv.is_lease());
    let Backend::NatsKv { connection, .. } = &kv.backend else {
        panic!()
    };
    assert!(connection.uses_tls());
    assert_eq!(
        connection.tls_ca_file(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
    assert!(!format!("{kv:?}").contains("tok3n"));
}

/// `url` with `params` added to its query.
fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// What a URL tells without opening its store — the name, whether it is
/// a lease store, how long it remembers a run, which `anarchon check` and
/// the daemon's pre-start validation rely on — is what the store opened
/// from each of `urls` on the real server reports; `names` are the
/// backends they open, in order. What an open made under `prefix` is
/// removed (NATS's through the server at `nats`).
///
/// One test per server, named `…_on_<server>`, so that `cargo xtask
/// test-all --backends` can leave out the tests of a server it leaves out.
async fn what_urls_tell_matches_the_stores_opened_from_them(
    urls: &[String],
    names: &[&str],
    prefix: &str,
    nats: Option<&str>,
) {
    let mut seen = Vec::new();
    for url in urls {
        let backend = StoreUrl::parse(url).unwrap();
        let opened = backend.open().await;
        // Clean up before asserting, so a failure leaves nothing behind.
        if let (Ok(opened), Backend::Postgres(options)) = (&opened, &backend.backend) {
            opened.close().await;
            let store = anarchon_pg::PgStore::connect_with(options.clone())
                .await
                .unwrap();
            store.drop_schema().await.unwrap();
            store.close().await;
        }
        if let (Ok(_), Some(nats)) = (&opened, nats) {
            let client = async_nats::connect(nats).await.unwrap();
            let jetstream = async_nats::jetstream::new(client);
            match backend.backend {
                Backend::Nats { .. } => {
                    jetstream
                        .delete_stream(format!("{prefix}-claims"))
                        .await
                        .unwrap();
                }
                Backend::NatsKv { .. } => {
                    jetstream.delete_key_value(prefix).await.unwrap();
                }
                _ => {}
            }
        }
        let opened = opened.unwrap_or_else(|e| panic!("{}: {e}", redact(url)));
        let store = opened.claim_store();
        let stand_in = backend.info();
        let (real, assumed) = (store.info(), stand_in);
        assert_eq!(real.name, backend.backend(), "{url}");
        let is_lease = store.clone().as_lease_store().is_some();
        assert_eq!(is_lease, backend.is_lease(), "{url}");
        assert_eq!(backend.kind() == StoreKind::Lease, is_lease, "{url}");
        assert_eq!(opened.kind(), backend.kind(), "{url}");
        assert_eq!(opened.lease_store().is_some(), is_lease, "{url}");
        if !is_lease {
            assert_eq!(assumed.name, real.name, "{url}");
            assert_eq!(assumed.memory, real.memory, "{url}");
        }
        opened.close().await;
        seen.push(real.name);
    }
    assert_eq!(seen, names);
}

#[tokio::test]
async fn what_a_url_tells_matches_the_store_opened_from_it_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("cron.db").display());
    what_urls_tell_matches_the_stores_opened_from_them(&[url], &["sqlite"], "", None).await;
}

#[tokio::test]
async fn what_a_url_tells_matches_the_store_opened_from_it_on_postgres() {
    use anarchon_testkit::servers::{Service, require, unique_prefix};
    let prefix = unique_prefix("clistandin");
    let pg = require(Service::Postgres).await;
    let url = with_params(&pg, &format!("table={prefix}"));
    what_urls_tell_matches_the_stores_opened_from_them(&[url], &["postgres"], &prefix, None).await;
}

#[tokio::test]
async fn what_a_url_tells_matches_the_store_opened_from_it_on_redis() {
    use anarchon_testkit::servers::{Service, require, unique_prefix};
    let prefix = unique_prefix("clistandin");
    let redis = require(Service::Redis).await;
    let urls = [
        with_params(&redis, &format!("prefix={prefix}")),
        with_params(&redis, &format!("prefix={prefix}&strategy=stream-id")),
        with_params(
            &redis,
            &format!("prefix={prefix}&strategy=script&window_ms=90000"),
        ),
    ];
    let names = ["redis-lease", "redis-stream-id", "redis-script"];
    what_urls_tell_matches_the_stores_opened_from_them(&urls, &names, &prefix, None).await;
}

#[tokio::test]
async fn what_a_url_tells_matches_the_store_opened_from_it_on_rabbitmq() {
    use anarchon_testkit::servers::{Service, require, unique_prefix};
    let prefix = unique_prefix("clistandin");
    let amqp = require(Service::Amqp).await;
    let url = with_params(&amqp, &format!("prefix={prefix}&slot_ttl_ms=90000"));
    what_urls_tell_matches_the_stores_opened_from_them(&[url], &["rabbitmq"], &prefix, None).await;
}

#[tokio::test]
async fn what_a_url_tells_matches_the_store_opened_from_it_on_nats() {
    use anarchon_testkit::servers::{Service, require, unique_prefix};
    let prefix = unique_prefix("clistandin");
    let nats = require(Service::Nats).await;
    let urls = [
        with_params(
            &nats,
            &format!("prefix={prefix}&duplicate_window_ms=90000&storage=memory"),
        ),
        with_params(
            &nats.replacen("nats://", "nats-kv://", 1),
            &format!("bucket={prefix}&storage=memory"),
        ),
    ];
    let names = ["nats", "nats-kv"];
    what_urls_tell_matches_the_stores_opened_from_them(&urls, &names, &prefix, Some(&nats)).await;
}

#[test]
fn broker_urls_are_claim_only() {
    let amqp =
        StoreUrl::parse("amqp://guest:s3cret@127.0.0.1:5672/%2f?prefix=billing&slot_ttl_ms=90000")
            .unwrap();
    assert_eq!(amqp.backend(), "rabbitmq");
    assert!(!amqp.is_lease());
    let stand_in = amqp.info();
    assert_eq!(stand_in.name, "rabbitmq");
    assert_eq!(stand_in.memory, Memory::Window(Duration::from_secs(90)));
    assert_eq!(amqp.kind(), StoreKind::ClaimOnly);
    let described = amqp.describe();
    assert!(described.contains("queue prefix billing"), "{described}");
    assert!(!described.contains("s3cret"), "{described}");

    let nats =
        StoreUrl::parse("nats://tok3n@127.0.0.1:4222?prefix=billing&duplicate_window_ms=600000")
            .unwrap();
    assert_eq!(nats.backend(), "nats");
    assert!(!nats.is_lease());
    assert_eq!(nats.info().memory, Memory::Window(Duration::from_secs(600)));
    let described = nats.describe();
    assert!(described.contains("stream billing-claims"), "{described}");
    assert!(!described.contains("tok3n"), "{described}");

    for (url, says) in [
        ("amqp://u:s3cret@h/%2f?bogus=1", "unknown parameter"),
        ("amqp://u:s3cret@h/%2f?slot_ttl_ms=1000", "slot_ttl"),
        ("amqps://u:s3cret@h/%2f?prefix=amq.x", "prefix"),
        ("nats://u:s3cret@h?bogus=1", "unknown parameter"),
        (
            "nats://u:s3cret@h?duplicate_window_ms=1000",
            "duplicate_window",
        ),
        ("nats://u:s3cret@h:notaport", "not valid"),
    ] {
        assert_refused(url, says);
    }
}

/// A password of five-to-eight-character pieces joined by characters
/// that break URL structure (and others), so any piece a parser quotes
/// is long enough to be found in its message.
fn awkward_password(seed: &mut u64) -> String {
    const JOINERS: &[char] = &['/', '?', '#', '@', ':', '%', '&', '=', '[', ']', ' ', '"'];
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let pieces = 2 + next() % 3;
    let mut password = String::new();
    for i in 0..pieces {
        if i > 0 {
            password.push(JOINERS[(next() % JOINERS.len() as u64) as usize]);
        }
        let len = 5 + next() % 4;
        for _ in 0..len {
            // Printable ASCII without the joiners, and some beyond ASCII.
            let c = match next() % 70 {
                n @ 0..=25 => char::from(b'a' + n as u8),
                n @ 26..=51 => char::from(b'A' + (n - 26) as u8),
                n @ 52..=61 => char::from(b'0' + (n - 52) as u8),
                62 => 'é',
                63 => 'ß',
                64 => '東',
                65 => '!',
                66 => '*',
                67 => '+',
                68 => '~',
                _ => '$',
            };
            password.push(c);
        }
    }
    password
}

/// The pieces of `password` a parser could quote.
fn pieces(password: &str) -> Vec<&str> {
    password
        .split(['/', '?', '#', '@', ':', '%', '&', '=', '[', ']', ' ', '"'])
        .filter(|p| p.chars().count() >= 5)
        .collect()
}

/// What a backend crate's own URL reader answers for `url` — an error, or
/// the options' `Debug` — as text.
fn read_directly(url: &str) -> String {
    fn said<T: std::fmt::Debug, E: std::fmt::Display + std::fmt::Debug>(
        read: Result<T, E>,
    ) -> String {
        match read {
            Ok(options) => format!("{options:?}"),
            Err(e) => format!("{e} {e:?}"),
        }
    }
    match url.split_once("://").map_or("", |(s, _)| s) {
        "postgres" | "postgresql" => said(anarchon_pg::PgOptions::from_url(url)),
        "redis" | "rediss" => said(anarchon_redis::RedisOptions::from_url(url)),
        "amqp" | "amqps" => said(anarchon_amqp::AmqpOptions::from_url(url)),
        "nats" | "tls" | "nats+tls" => said(anarchon_nats::ClaimOptions::from_url(url)),
        "nats-kv" | "nats-kv+tls" => said(anarchon_nats::NatsLeaseOptions::from_kv_url(url)),
        other => panic!("no reader for {other}"),
    }
}

/// For random passwords, whatever reading (and, for PostgreSQL,
/// opening) a store URL answers — an error, or the options' `Debug`
/// and description, through [`StoreUrl::parse`] and through each backend
/// crate's own reader — never shows the password or a piece of it, and
/// neither does any log line written meanwhile.
#[tokio::test]
async fn no_url_reader_shows_a_password() {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Lines::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..150 {
        let password = awkward_password(&mut seed);
        let secret = pieces(&password);
        let shows =
            |text: &str| text.contains(&password) || secret.iter().any(|p| text.contains(p));
        // Alone in the user info, what precedes a `:` is a user name by
        // the URL's grammar: only what follows it is the secret.
        let lone = password
            .split_once(':')
            .map_or(password.as_str(), |(_, p)| p);
        let lone_secret = pieces(lone);
        let shows_lone =
            |text: &str| text.contains(lone) || lone_secret.iter().any(|p| text.contains(p));
        for (url, alone) in [
            (format!("postgres://app:{password}@127.0.0.1:9/cron"), false),
            (format!("redis://app:{password}@127.0.0.1:9"), false),
            (format!("rediss://{password}@127.0.0.1:9"), true),
            (format!("amqp://app:{password}@127.0.0.1:9/%2f"), false),
            (format!("nats://app:{password}@127.0.0.1:9?prefix=p"), false),
            (format!("nats-kv://{password}@127.0.0.1:9"), true),
            (
                format!("postgresql://app:{password}@127.0.0.1:9/cron"),
                false,
            ),
            (format!("amqps://app:{password}@127.0.0.1:9/%2f"), false),
            (format!("tls://{password}@127.0.0.1:9"), true),
            (format!("nats-kv+tls://app:{password}@127.0.0.1:9"), false),
        ] {
            let leaks = |text: &str| if alone { shows_lone(text) } else { shows(text) };
            let said = match StoreUrl::parse(&url) {
                Ok(backend) => {
                    format!("{} {:?} {backend:?}", backend.describe(), backend.backend())
                }
                Err(e) => format!("{e} {e:?}"),
            };
            assert!(!leaks(&said), "{url:?} -> {said}");
            // The backend crates' own readers, as a library user calls them.
            let direct = read_directly(&url);
            assert!(!leaks(&direct), "{url:?} read directly -> {direct}");
            assert!(!leaks(&redact(&url)), "{url:?} -> {}", redact(&url));
        }
        let opened = anarchon_pg::PgStore::connect_with(
            anarchon_pg::PgOptions::new(format!("postgres://app:{password}@127.0.0.1:9/cron"))
                .with_connect_timeout(std::time::Duration::from_millis(300)),
        )
        .await;
        if let Err(e) = opened {
            let said = format!("{e} {e:?}");
            assert!(!shows(&said), "postgres open -> {said}");
        }
        let written = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        assert!(!shows(&written), "a log line shows the password: {written}");
    }
}
