//! The daemon's `[http]` side against each lease store: `/metrics` parses
//! as the Prometheus text format and counts the runs just made,
//! `/healthz` answers, `/api/status` is what `anarchon status --json` says,
//! `/api/history` is `history --json`, and the page lists each job with a
//! cell per slot. On a claim-only store `/healthz` asks the store too and
//! follows a cut line. A non-loopback address is refused unless allowed.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anarchon_testkit::FaultProxy;
use anarchon_testkit::proxy::host_port;
use anarchon_testkit::servers::{Service, unique_prefix};
use common::servers::{RedisKeys, server, with_params};
use common::{Fleet, crontab_head, run_in, wait_for};

/// A free loopback port, for the daemon to listen on.
fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `GET path` over plain HTTP/1.1: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    ))
}

/// A chunked body, joined.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

fn crontab(dir: &Path, store: &str, addr: SocketAddr) -> String {
    let path = dir.join("anarchon.toml");
    let head = crontab_head(store, ["3s", "1s", "1s", "500ms"]);
    let jobs = format!(
        r#"
[http]
listen = "{addr}"

[[job]]
name = "good"
schedule = "0 0 1 1 *"
command = "true"

[[job]]
name = "bad"
schedule = "0 0 1 1 *"
command = "echo broken >&2; exit 4"
"#
    );
    std::fs::write(&path, head + &jobs).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The sample of `name` with these labels, from a scrape.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

common::servers::on_every_lease_store!(
    /// `/metrics`, `/api/status` and the page match the store, on each lease store.
    the_daemon_serves_metrics_status_and_its_page,
    "clihttp",
    serves_what_the_store_says
);

fn serves_what_the_store_says(d: &Path, store: &str) {
    let addr = free_port();
    let config = crontab(d, store, addr);
    let config = config.as_str();
    let mut fleet = Fleet::default();
    fleet.start(Path::new(config), d);
    wait_for(
        Duration::from_secs(20),
        "the daemon's HTTP side",
        || get(addr, "/healthz").filter(|(code, _)| *code == 200),
        || fleet.logs(),
    );
    // Runs with known outcomes: two successes and a failure.
    for job in ["good", "good", "bad"] {
        let (code, out, err) = run_in(d, &["trigger", job, "--wait", "--config", config]);
        assert_eq!(
            code,
            i32::from(job == "bad"),
            "{out}{err}\n{}",
            fleet.logs()
        );
    }

    let (code, text) = get(addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let runs = |job, outcome| {
        sample(
            &scrape,
            "anarchon_runs_total",
            &[("job", job), ("outcome", outcome)],
        )
    };
    assert_eq!(runs("good", "succeeded"), Some(2.0), "{text}");
    assert_eq!(runs("bad", "failed"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &scrape,
            "anarchon_claims_total",
            &[("job", "good"), ("result", "won")]
        ),
        Some(2.0),
        "{text}"
    );
    assert!(
        sample(
            &scrape,
            "anarchon_last_success_timestamp_seconds",
            &[("job", "good")]
        )
        .is_some_and(|at| at > 1.7e9),
        "{text}"
    );
    assert!(
        text.contains("anarchon_run_duration_seconds_bucket"),
        "durations are histograms: {text}"
    );
    assert!(
        !text.contains("password") && !text.contains("://"),
        "{text}"
    );

    // /api/status is `status --json`, but for the store's clock.
    let (code, api) = get(addr, "/api/status").unwrap();
    assert_eq!(code, 200, "{api}");
    let (code, cli, err) = run_in(d, &["status", "--json", "--config", config]);
    assert_eq!(code, 0, "{err}");
    let mut api: serde_json::Value = serde_json::from_str(&api).unwrap();
    let mut cli: serde_json::Value = serde_json::from_str(&cli).unwrap();
    api["store_now"] = serde_json::Value::Null;
    cli["store_now"] = serde_json::Value::Null;
    assert_eq!(api, cli, "/api/status matches `anarchon status --json`");

    let (code, history) = get(addr, "/api/history?job=bad").unwrap();
    assert_eq!(code, 200);
    let (_, cli_history, _) = run_in(d, &["history", "bad", "--json", "--config", config]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&history).unwrap(),
        serde_json::from_str::<serde_json::Value>(&cli_history).unwrap()
    );
    let (code, _) = get(addr, "/api/history?job=not%20a%20job").unwrap();
    assert_eq!(code, 400);

    // The page: a section per job, a cell per recorded slot, by state.
    let (code, page) = get(addr, "/").unwrap();
    assert_eq!(code, 200);
    assert!(
        page.contains("data-job=\"good\"") && page.contains("data-job=\"bad\""),
        "{page}"
    );
    assert_eq!(
        page.matches("data-state=\"succeeded\"").count(),
        2,
        "{page}"
    );
    assert_eq!(page.matches("data-state=\"failed\"").count(), 1, "{page}");
    assert!(!page.contains("://"), "no store URL on the page: {page}");

    fleet.stop_cleanly(0);
    assert!(
        get(addr, "/healthz").is_none(),
        "the server stops with the daemon"
    );
}

/// On a claim-only store (Redis `stream-id`) `/healthz` asks the store
/// too: 200 while the line to Redis is up, 503 naming the store while a
/// proxy cuts it and refuses new connections, 200 again once it is back.
/// Before, a claim-only store was reported healthy without being asked.
#[test]
fn healthz_asks_a_claim_only_store_on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The proxy's tasks run on this runtime's thread while the test waits.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let redis = server(Service::Redis);
    let upstream = host_port(&redis, 6379).expect("the Redis URL names a host");
    let proxy = runtime.block_on(FaultProxy::start(upstream)).unwrap();
    let prefix = unique_prefix("clihealth");
    let _keys = RedisKeys::under(&redis, &prefix);
    let store = with_params(
        &proxy.url_through(&redis),
        &format!("strategy=stream-id&prefix={prefix}"),
    );
    let addr = free_port();
    let config = d.join("anarchon.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"{store}\"\n\n[http]\nlisten = \"{addr}\"\n\n[[job]]\nname = \"idle\"\nschedule = \"0 0 1 1 *\"\ncommand = \"true\"\n"
        ),
    )
    .unwrap();
    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    let (code, body) = wait_for(
        Duration::from_secs(20),
        "the daemon's /healthz",
        || get(addr, "/healthz"),
        || fleet.logs(),
    );
    assert_eq!(code, 200, "{body}\n{}", fleet.logs());

    proxy.cut();
    let (code, body) = wait_for(
        Duration::from_secs(20),
        "/healthz to report the cut line",
        || get(addr, "/healthz").filter(|(code, _)| *code != 200),
        || fleet.logs(),
    );
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("does not answer") || body.contains("did not answer"),
        "{body}"
    );
    assert!(!body.contains("://"), "no store URL in the answer: {body}");

    proxy.restore();
    wait_for(
        Duration::from_secs(20),
        "/healthz to recover with the line",
        || get(addr, "/healthz").filter(|(code, _)| *code == 200),
        || fleet.logs(),
    );

    fleet.stop_cleanly(0);
    drop(proxy);
    runtime.shutdown_background();
}

#[test]
fn a_page_for_other_hosts_needs_to_be_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = d.join("anarchon.toml");
    std::fs::write(
        &config,
        "[http]\nlisten = \"0.0.0.0:9464\"\n\n[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let (code, _, stderr) = run_in(d, &["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not a loopback address"), "{stderr}");
    assert!(stderr.contains("allow_remote = true"), "{stderr}");
    std::fs::write(
        &config,
        "[http]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true\n\n[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let (code, _, stderr) = run_in(d, &["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
}
