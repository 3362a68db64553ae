//! The daemon against every server backend, chosen by URL.
//!
//! * Lease-only options (`overlap`, `max_attempts`, `catch_up`, `lease`,
//!   `heartbeat`) on a claim-only URL (`amqp://`, `nats://`, Redis
//!   `stream-id` / `script` / `idmp`) are refused by `run` and by `check`
//!   with exit status 2 and the core's message naming the option and the
//!   backend — before any server is contacted.
//! * The same crontab without them runs a per-second job against the real
//!   RabbitMQ, NATS, Redis and PostgreSQL servers (found as the testkit
//!   finds them: `ANARCHON_*_URL`, else the local default). Claim-only
//!   stores are checked through the command's output file, lease stores
//!   through `anarchon history`.
//! * A store URL's password never shows, whatever fails.
//!
//! Every test uses its own prefix, stream or table and removes it at the
//! end, passed or failed (RabbitMQ's gate queues expire on their own after
//! the 20 s slot TTL the tests set).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anarchon_testkit::servers::{Service, unique_prefix};
use common::servers::{NatsStream, PgTable, RedisKeys, server, with_params};
use common::{Fleet, anarchon, run_in, unknown_scheme_is_refused_masked, wait_for};
use nix::sys::signal::Signal;

/// A crontab on `store` with one per-second job `tick` that appends
/// `$ANARCHON_JOB $ANARCHON_SLOT $PPID` to `log`, plus `extra` lines in
/// the job.
fn crontab(store: &str, log: &Path, extra: &str) -> String {
    format!(
        r#"store = "{store}"

[scheduler]
shutdown_grace = "1s"
kill_grace = "500ms"

[[job]]
name = "tick"
every = "1s"
max_late = "5s"
command = "echo \"$ANARCHON_JOB $ANARCHON_SLOT $PPID\" >> {log}"
{extra}
"#,
        log = log.display()
    )
}

/// The URL of claim-only store `backend` on its real server, under
/// `prefix`, with the settings these tests use (RabbitMQ and NATS forget a
/// run after 20 s, so what a test leaves behind goes soon).
fn claim_only_url(backend: &str, prefix: &str) -> String {
    let (service, params) = match backend {
        "rabbitmq" => (Service::Amqp, "slot_ttl_ms=20000"),
        "nats" => (Service::Nats, "duplicate_window_ms=20000&storage=memory"),
        "redis-stream-id" => (Service::Redis, "strategy=stream-id"),
        other => panic!("no claim-only test URL for {other:?}"),
    };
    with_params(&server(service), &format!("prefix={prefix}&{params}"))
}

/// The claim-only URLs, each on a port where nothing answers, and the
/// backend name each one's errors use. A refusal that came only after
/// contacting the server would fail to open the store instead (status 1),
/// so these prove the options are refused first, and need no server.
const CLAIM_ONLY_URLS: &[(&str, &str)] = &[
    ("amqp://127.0.0.1:1/%2f?slot_ttl_ms=20000", "rabbitmq"),
    (
        "nats://127.0.0.1:1?duplicate_window_ms=20000&storage=memory",
        "nats",
    ),
    ("redis://127.0.0.1:1?strategy=stream-id", "redis-stream-id"),
    (
        "redis://127.0.0.1:1?strategy=script&window_ms=60000",
        "redis-script",
    ),
    // Redis 8.6 is not needed to refuse a crontab for idmp.
    ("redis://127.0.0.1:1?strategy=idmp", "redis-idmp"),
    // A password or token in the URL is not shown either.
    ("amqp://cron:Sentinel-Pw-41@127.0.0.1:1/%2f", "rabbitmq"),
    ("nats://Sentinel-Tok-42@127.0.0.1:1", "nats"),
];

/// `run` and `check` refuse every lease-only option on every claim-only
/// URL with status 2, naming the option and the backend, before any
/// server is contacted (the crontab is checked first; the URLs answer
/// nowhere). `history` says such stores keep none.
#[test]
fn lease_only_options_are_refused_on_claim_only_urls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("never.log");
    let config = d.join("anarchon.toml");
    for (option, line, scheduler) in [
        ("overlap", "overlap = \"skip\"", ""),
        ("max_attempts", "max_attempts = 2", ""),
        ("catch_up", "catch_up = \"1h\"", ""),
        ("retries", "retries = 3", ""),
        ("lease", "", "lease = \"10s\""),
        ("heartbeat", "", "heartbeat = \"1s\""),
    ] {
        for &(url, backend) in CLAIM_ONLY_URLS {
            let text = crontab(url, &log, line)
                .replace("[scheduler]\n", &format!("[scheduler]\n{scheduler}\n"));
            std::fs::write(&config, text).unwrap();
            for command in ["run", "check"] {
                let (code, stdout, stderr) =
                    run_in(d, &[command, "--config", config.to_str().unwrap()]);
                let what = format!("{command} with {option} on {backend}");
                assert_eq!(code, 2, "{what}: {stderr}");
                assert!(
                    stderr.contains(&format!(
                        "the `{backend}` store is claim-only and cannot honour `{option}`"
                    )),
                    "{what}: {stderr}"
                );
                assert!(stderr.contains("anarchon.toml"), "{what}: {stderr}");
                if option != "lease" && option != "heartbeat" {
                    assert!(stderr.contains("job \"tick\""), "{what}: {stderr}");
                }
                assert!(
                    !stderr.contains("running") && stdout.is_empty(),
                    "{what}: nothing started\n{stdout}{stderr}"
                );
                assert!(!stderr.contains("Sentinel"), "{what}: {stderr}");
            }
        }
    }
    assert!(!log.exists(), "no command ran");

    // The same crontab without them is fine for `check`, with no server.
    std::fs::write(
        &config,
        crontab("amqp://guest:guest@127.0.0.1:1/%2f", &log, ""),
    )
    .unwrap();
    let stdout = check_describes(d, &config, "RabbitMQ", "claim-only");
    assert!(stdout.contains("1 job(s) OK"), "{stdout}");

    // A claim-only store keeps no history.
    for &(url, backend) in CLAIM_ONLY_URLS {
        let (code, _, stderr) = run_in(d, &["history", "--store", url]);
        assert_eq!(code, 2, "{backend}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "the `{backend}` store is claim-only and keeps no history"
            )),
            "{stderr}"
        );
    }
}

/// `check` in `dir` accepts the crontab `config` and describes its store
/// with `describes` and as `kind` (`claim-only` or `a lease store`).
/// Hands back what it printed.
fn check_describes(dir: &Path, config: &Path, describes: &str, kind: &str) -> String {
    let config = config.to_str().expect("a UTF-8 path");
    let (code, stdout, stderr) = run_in(dir, &["check", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(describes) && stdout.contains(kind),
        "{stdout}"
    );
    stdout
}

/// The lines the job's command wrote: slot → the daemons (by pid) that ran
/// it.
fn runs(log: &Path) -> BTreeMap<i64, Vec<String>> {
    let mut runs: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "malformed line {line:?}");
        assert_eq!(fields[0], "tick", "{line}");
        let slot: i64 = fields[1].parse().expect("ANARCHON_SLOT is a number");
        assert_eq!(slot % 1000, 0, "slots of an every-1s job are whole seconds");
        runs.entry(slot).or_default().push(fields[2].to_owned());
    }
    runs
}

/// Two daemons on one claim-only store: `check` describes it, both start
/// and stop cleanly, the job runs, and no slot runs twice.
fn two_daemons_share_a_claim_only_store(url: &str, describes: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let log = d.join("runs.log");
    let config = d.join("anarchon.toml");
    std::fs::write(&config, crontab(url, &log, "")).expect("write the crontab");
    check_describes(d, &config, describes, "claim-only");

    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    fleet.start(&config, d);
    wait_for(
        Duration::from_secs(30),
        "three runs of the per-second job",
        || (runs(&log).len() >= 3).then_some(()),
        || fleet.logs(),
    );
    for daemon in &fleet.daemons {
        daemon.signal(Signal::SIGTERM);
    }
    for daemon in &mut fleet.daemons {
        let code = daemon.wait(Duration::from_secs(15));
        assert_eq!(code, Some(0), "SIGTERM stops the daemon cleanly");
    }
    let logs = fleet.logs();
    for (slot, daemons) in runs(&log) {
        assert_eq!(daemons.len(), 1, "slot {slot} ran {daemons:?}\n{logs}");
    }
    for daemon in &fleet.daemons {
        let text = std::fs::read_to_string(&daemon.stderr).expect("the daemon's log");
        assert!(text.contains("claim-only store"), "{text}");
        assert!(!text.contains("Sentinel"), "{text}");
        // RabbitMQ's client warns of every returned publish, and a losing
        // claim's probe for its mark is one: the daemon's log leaves them out.
        assert!(!text.contains("returned us a message"), "{text}");
    }
}

#[test]
fn a_per_second_job_runs_on_rabbitmq() {
    let prefix = unique_prefix("cli");
    let url = claim_only_url("rabbitmq", &prefix);
    two_daemons_share_a_claim_only_store(&url, &format!("queue prefix {prefix}"));
}

#[test]
fn a_per_second_job_runs_on_nats() {
    let prefix = unique_prefix("cli");
    let _stream = NatsStream::named(&server(Service::Nats), format!("{prefix}-claims"));
    let url = claim_only_url("nats", &prefix);
    two_daemons_share_a_claim_only_store(&url, &format!("stream {prefix}-claims"));
}

#[test]
fn a_per_second_job_runs_on_redis_stream_id() {
    let prefix = unique_prefix("cli");
    let _keys = RedisKeys::under(&server(Service::Redis), &prefix);
    let url = claim_only_url("redis-stream-id", &prefix);
    two_daemons_share_a_claim_only_store(&url, "strategy stream-id");
}

/// One daemon on a lease store runs the job; `history` then shows its runs
/// as succeeded — by job name, and for every job of the crontab. Without
/// either, it says the store cannot list its jobs.
fn a_lease_store_records_runs(url: &str, describes: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let log = d.join("runs.log");
    let config = d.join("anarchon.toml");
    let c = config.to_str().expect("a UTF-8 path");
    std::fs::write(
        &config,
        crontab(url, &log, "overlap = \"skip\"\nmax_attempts = 2"),
    )
    .expect("write the crontab");
    check_describes(d, &config, describes, "a lease store");

    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    let history = || run_in(d, &["history", "tick", "-n", "100", "--store", url]);
    wait_for(
        Duration::from_secs(30),
        "two recorded runs of the per-second job",
        || {
            let (code, stdout, _) = history();
            (code == 0 && stdout.matches("succeeded").count() >= 2).then_some(())
        },
        || fleet.logs(),
    );
    fleet.stop_cleanly(0);
    let (code, stdout, stderr) = history();
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("SLOT (LOCAL)"), "{stdout}");
    let ran = runs(&log);
    for (slot, daemons) in &ran {
        assert_eq!(daemons.len(), 1, "slot {slot} ran twice");
    }
    // Every run the command logged is in the history, as succeeded.
    let succeeded = stdout
        .lines()
        .filter(|l| l.contains(" tick ") && l.contains("succeeded"))
        .count();
    assert!(
        succeeded >= ran.len().saturating_sub(1),
        "{stdout}\n{ran:?}"
    );

    // The crontab's jobs, from --config.
    let (code, by_config, stderr) = run_in(d, &["history", "--config", c, "-n", "100"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(by_config.contains("succeeded"), "{by_config}");
    // Neither a job nor a crontab: the store's job index names the jobs.
    let (code, by_index, stderr) = run_in(d, &["history", "--store", url, "-n", "100"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        by_index.lines().filter(|l| l.contains(" tick ")).count() >= 2,
        "{by_index}"
    );
    // A job nothing ran.
    let (code, stdout, stderr) = run_in(d, &["history", "other", "--store", url]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "no runs recorded for job \"other\"\n");
}

#[test]
fn a_per_second_job_runs_on_redis_lease() {
    let base = server(Service::Redis);
    let prefix = unique_prefix("cli");
    let _keys = RedisKeys::under(&base, &prefix);
    let url = with_params(&base, &format!("prefix={prefix}"));
    a_lease_store_records_runs(&url, "strategy lease");
}

#[test]
fn a_per_second_job_runs_on_postgres() {
    let base = server(Service::Postgres);
    let table = unique_prefix("cli");
    let _table = PgTable::named(&base, &table);
    let url = with_params(&base, &format!("table={table}&pool_size=2"));
    // `history` before anything ran creates nothing.
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run_in(dir.path(), &["history", "tick", "--store", &url]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("no anarchon table \"{table}\"")),
        "{stderr}"
    );
    a_lease_store_records_runs(&url, &format!("table {table}"));
}

#[test]
fn a_per_second_job_runs_on_nats_kv() {
    let base = server(Service::Nats);
    let bucket = unique_prefix("cli");
    let _bucket = NatsStream::named(&base, format!("KV_{bucket}"));
    let url = with_params(
        &base.replacen("nats://", "nats-kv://", 1),
        &format!("bucket={bucket}"),
    );
    a_lease_store_records_runs(&url, &format!("bucket {bucket}"));
}

/// URLs with a sentinel password (or token) that answer nowhere: `run`
/// fails to open the store with status 1, `check` succeeds, a malformed one
/// is refused with status 2 — and the password shows in none of it.
#[test]
fn passwords_in_store_urls_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = d.join("anarchon.toml");
    let c = config.to_str().unwrap();
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    )
    .unwrap();
    for (url, shown) in [
        (
            "postgres://app:Sentinel-Pw-1@127.0.0.1:1/cron?connect_timeout_ms=2000",
            "postgres://app:***@127.0.0.1:1/cron",
        ),
        (
            "postgresql://127.0.0.1:1/cron?user=app&password=Sentinel-Pw-2",
            "postgresql://127.0.0.1:1/cron?user=app&password=***",
        ),
        (
            "redis://:Sentinel-Pw-3@127.0.0.1:1/0",
            "redis://:***@127.0.0.1:1/0",
        ),
        (
            "redis://app:Sentinel-Pw-4@127.0.0.1:1?strategy=script",
            "redis://app:***@127.0.0.1:1",
        ),
        (
            "amqp://cron:Sentinel-Pw-5@127.0.0.1:1/%2f",
            "amqp://cron:***@127.0.0.1:1/%2f",
        ),
        (
            "nats://cron:Sentinel-Pw-6@127.0.0.1:1",
            "nats://cron:***@127.0.0.1:1",
        ),
        (
            "nats://Sentinel-Tok-7@127.0.0.1:1",
            "nats://***@127.0.0.1:1",
        ),
    ] {
        let (code, stdout, stderr) = run_in(d, &["run", "--config", c, "--store", url]);
        assert_eq!(code, 1, "run {url}: {stderr}");
        assert!(stderr.contains("cannot open the store"), "{stderr}");
        assert!(stderr.contains(shown), "{shown}: {stderr}");
        assert!(!(stdout + &stderr).contains("Sentinel"), "{stderr}");
        // Not at the most verbose log level either, from us or a client crate.
        let traced = anarchon()
            .current_dir(d)
            .env("ANARCHON_LOG", "trace")
            .args(["run", "--config", c, "--store", url])
            .output()
            .expect("run anarchon");
        let all = String::from_utf8_lossy(&traced.stdout).into_owned()
            + &String::from_utf8_lossy(&traced.stderr);
        assert!(!all.contains("Sentinel"), "at trace level: {all}");

        let (code, stdout, stderr) = run_in(d, &["check", "--config", c, "--store", url]);
        assert_eq!(code, 0, "check {url}: {stderr}");
        assert!(stdout.contains(shown), "{shown}: {stdout}");
        assert!(!(stdout + &stderr).contains("Sentinel"), "{url}");

        let bad = with_params(url, "bogus=1");
        for command in ["run", "check"] {
            let (code, stdout, stderr) = run_in(d, &[command, "--config", c, "--store", &bad]);
            assert_eq!(code, 2, "{command} {bad}: {stderr}");
            assert!(stderr.contains("bogus"), "{stderr}");
            assert!(!(stdout + &stderr).contains("Sentinel"), "{stderr}");
        }
    }
    // An unknown scheme lists the known ones.
    let stderr = unknown_scheme_is_refused_masked(d, c, "Sentinel-Pw-8", "Sentinel");
    for scheme in ["sqlite://", "postgres://", "redis://", "amqp://", "nats://"] {
        assert!(stderr.contains(scheme), "{stderr}");
    }
}

/// A real server that lets the connection in (the test server trusts
/// local connections, so the password is sent and ignored): nothing the
/// daemon or sqlx logs at trace level shows the password.
#[test]
fn a_password_the_server_ignores_is_never_logged_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pg = server(Service::Postgres);
    // `scheme://user@host…` becomes `scheme://user:Sentinel-Pw-8@host…`.
    let (scheme, rest) = pg.split_once("://").expect("a URL");
    let user = rest
        .split_once('@')
        .map(|(user, _)| user)
        .filter(|user| !user.is_empty() && !user.contains(':'))
        .unwrap_or_else(|| {
            panic!(
                "this test sends a password the server ignores: it needs a PostgreSQL \
                 test server URL that names a user and no password, and a server that \
                 trusts local connections (as docker-compose.yml's does; see docs/testing.md)"
            )
        });
    let with_password = format!(
        "{scheme}://{user}:Sentinel-Pw-8@{}",
        &rest[user.len() + 1..]
    );
    let url = with_params(&with_password, &format!("table={}", unique_prefix("cli")));
    let traced = anarchon()
        .current_dir(d)
        .env("ANARCHON_LOG", "trace")
        .args(["history", "tick", "--store", &url])
        .output()
        .expect("run anarchon");
    let all = String::from_utf8_lossy(&traced.stdout).into_owned()
        + &String::from_utf8_lossy(&traced.stderr);
    assert!(
        all.contains("TRACE") || all.contains("DEBUG"),
        "trace logging is on: {all}"
    );
    assert!(!all.contains("Sentinel"), "at trace level: {all}");
}
