//! Retries across a fleet of daemons.
//!
//! Three `anarchon run` processes share a store (a SQLite file, a
//! PostgreSQL table, a Redis prefix, a NATS KV bucket) with a job that
//! retries failures. Its command fails the first time it runs for a slot
//! and succeeds the second: every slot runs exactly twice in the fleet —
//! attempt 1 (`first`) failed, attempt 2 (`retry`) succeeded, on whichever
//! daemon claimed the retry — and the history says so. `trigger --wait`
//! follows a manual run through its retry and exits 0.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, crontab_head, run_in, wait_for};
use nix::sys::signal::Signal;

/// A crontab on `store` whose job `flaky` runs every 4 s and on demand,
/// retries a failure twice after half a second, and whose command appends
/// `$ANARCHON_SLOT $ANARCHON_ATTEMPT $ANARCHON_ATTEMPT_CAUSE $PPID` to
/// `attempts.log`, then fails if it is the first to run for its slot.
fn crontab(dir: &Path, store: &str) -> String {
    let path = dir.join("anarchon.toml");
    // A lease of a few seconds: a daemon kept off the CPU for a moment on
    // a busy machine must not lose its lease to a takeover, which would
    // be an attempt of its own.
    let head = crontab_head(store, ["3s", "1s", "1s", "500ms"]);
    let job = format!(
        r#"
[[job]]
name = "flaky"
every = "4s"
max_late = "3s"
retries = 2
retry_backoff = "500ms"
command = "echo \"$ANARCHON_SLOT $ANARCHON_ATTEMPT $ANARCHON_ATTEMPT_CAUSE $PPID\" >> {log}; if mkdir {dir}/first-$ANARCHON_SLOT 2>/dev/null; then exit 1; fi"
"#,
        log = dir.join("attempts.log").display(),
        dir = dir.display(),
    );
    std::fs::write(&path, head + &job).expect("writing the crontab");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// Each slot's attempts in `attempts.log`: (attempt, cause, daemon).
fn attempts(dir: &Path) -> BTreeMap<i64, Vec<(u32, String, String)>> {
    let mut out: BTreeMap<i64, Vec<(u32, String, String)>> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("attempts.log")).unwrap_or_default();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts.len(), 4, "`slot attempt cause pid` lines: {line:?}");
        out.entry(parts[0].parse().expect("a slot"))
            .or_default()
            .push((
                parts[1].parse().expect("an attempt"),
                parts[2].to_owned(),
                parts[3].to_owned(),
            ));
    }
    out
}

/// The slots whose retry has run (their second attempt is in the log).
fn retried(dir: &Path) -> Vec<i64> {
    attempts(dir)
        .into_iter()
        .filter(|(_, a)| a.len() >= 2)
        .map(|(slot, _)| slot)
        .collect()
}

common::servers::on_every_lease_store!(
    /// Each failure is retried once by the fleet, on each lease store.
    a_failed_run_is_retried_once_in_a_fleet,
    "cliretry",
    the_fleet_retries_each_failure_once
);

fn the_fleet_retries_each_failure_once(d: &Path, store: &str) {
    let config = crontab(d, store);
    let config = config.as_str();
    let mut fleet = Fleet::default();
    for _ in 0..3 {
        fleet.start(Path::new(config), d);
    }
    wait_for(
        Duration::from_secs(20),
        "two slots retried",
        || (retried(d).len() >= 2).then_some(()),
        || format!("{:?}\n{}", attempts(d), fleet.logs()),
    );

    // A manual run goes through its retry too, and `--wait` follows it.
    let (code, stdout, stderr) = run_in(d, &["trigger", "flaky", "--wait", "--config", config]);
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", fleet.logs());
    assert!(stdout.contains("succeeded"), "{stdout}");

    let (code, json, stderr) = run_in(
        d,
        &["history", "flaky", "--json", "-n", "20", "--config", config],
    );
    assert_eq!(code, 0, "{stderr}");
    let runs: Vec<serde_json::Value> = serde_json::from_str(&json).expect("history --json");
    for daemon in &fleet.daemons {
        daemon.signal(Signal::SIGTERM);
    }
    for i in 0..fleet.daemons.len() {
        assert_eq!(
            fleet.daemons[i].wait(Duration::from_secs(15)),
            Some(0),
            "{}",
            fleet.logs()
        );
    }

    let log = attempts(d);
    let slots = retried(d);
    assert!(slots.len() >= 3, "two slots and a manual run: {log:?}");
    for slot in &slots {
        let tries = &log[slot];
        let how: Vec<(u32, &str)> = tries.iter().map(|(a, c, _)| (*a, c.as_str())).collect();
        assert_eq!(
            how,
            vec![(1, "first"), (2, "retry")],
            "slot {slot}: attempt 1 failed and was retried once, as attempt 2: {log:?}"
        );
    }
    let succeeded: Vec<&serde_json::Value> =
        runs.iter().filter(|r| r["state"] == "succeeded").collect();
    assert!(succeeded.len() >= 3, "{json}");
    for run in succeeded {
        assert_eq!(run["attempt"], 2, "{run}");
        assert_eq!(run["cause"], "retry", "{run}");
        let earlier = run["earlier"].as_array().expect("earlier attempts");
        assert_eq!(earlier.len(), 1, "{run}");
        assert_eq!(earlier[0]["attempt"], 1, "{run}");
        assert_eq!(earlier[0]["ended"], "failed", "{run}");
        assert!(earlier[0]["instance"].is_string(), "{run}");
    }
    let (code, table, stderr) = run_in(d, &["history", "flaky", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert!(table.contains("failed, retried"), "{table}");
}
