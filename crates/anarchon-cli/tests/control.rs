//! `pause`, `resume`, `trigger` and `status` against a fleet of daemons.
//!
//! * Three `anarchon run` processes share a store (a SQLite file, a
//!   PostgreSQL table, a Redis prefix, a NATS KV bucket) with a per-second
//!   job. `anarchon pause` (another process, no daemon) stops the job on
//!   all three: its next slots are recorded `paused` and run nowhere;
//!   `status` shows the pause with its reason, as text and JSON; `resume`
//!   lets it run again; no slot ever runs twice.
//! * Bad input is refused with exit status 2 and a sentence, and writes
//!   nothing: a job and `--all` together, a job the crontab lacks, an end
//!   in the past on the store's clock, a time that is not RFC 3339, and a
//!   claim-only store (refused before connecting).

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, crontab_head, now_ms, run_in, wait_for};
use nix::sys::signal::Signal;

/// A crontab on `store` whose per-second job `tick` appends
/// `$ANARCHON_SLOT $PPID` to `log`, and whose job `on-demand` (New Year's
/// midnight only: in the tests it runs only when triggered) appends
/// `$ANARCHON_ORIGIN $ANARCHON_SLOT <start ms> $PPID` to `manual.log` and
/// fails unless the file `ok` exists.
fn crontab(dir: &Path, store: &str, log: &Path) -> String {
    let path = dir.join("anarchon.toml");
    let head = crontab_head(store, ["1s", "300ms", "1s", "500ms"]);
    let job = format!(
        r#"
[[job]]
name = "tick"
every = "1s"
max_late = "5s"
command = "echo \"$ANARCHON_SLOT $PPID\" >> {log}"

[[job]]
name = "on-demand"
schedule = "0 0 1 1 *"
command = "echo \"$ANARCHON_ORIGIN $ANARCHON_SLOT $(date +%s%3N) $PPID\" >> {manual}; test -f {ok}"
"#,
        log = log.display(),
        manual = dir.join("manual.log").display(),
        ok = dir.join("ok").display(),
    );
    std::fs::write(&path, head + &job).expect("writing the crontab");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The slots the job ran, each with the daemons that ran it.
fn ran(log: &Path) -> BTreeMap<i64, Vec<String>> {
    let mut runs: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let (slot, daemon) = line.split_once(' ').expect("`slot pid` lines");
        runs.entry(slot.parse().expect("a slot"))
            .or_default()
            .push(daemon.to_owned());
    }
    runs
}

fn sqlite(dir: &Path, file: &str) -> String {
    format!("sqlite://{}", dir.join(file).display())
}

common::servers::on_every_lease_store!(
    /// A pause holds in the whole fleet and a resume ends it, on each lease store.
    a_paused_job_runs_nowhere_in_a_fleet,
    "clipause",
    the_fleet_obeys_pause_and_resume
);

/// The manual runs in `manual.log`: (origin, slot, start ms, daemon).
fn manual_runs(dir: &Path) -> Vec<(String, i64, i64, String)> {
    std::fs::read_to_string(dir.join("manual.log"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            assert_eq!(parts.len(), 4, "`origin slot start pid` lines: {line:?}");
            (
                parts[0].to_owned(),
                parts[1].parse().expect("a slot"),
                parts[2].parse().expect("a start time"),
                parts[3].to_owned(),
            )
        })
        .collect()
}

/// Three daemons on `store` run a per-second job; a pause from another
/// process stops it on all of them, `status` shows it, `resume` restarts
/// it, and no slot ever runs twice. Then `trigger` runs the on-demand job
/// once, on one daemon, within a second of the request, the same id again
/// runs nothing, and `trigger --wait` exits with the run's outcome.
fn the_fleet_obeys_pause_and_resume(d: &Path, store: &str) {
    let log = d.join("runs.log");
    let config = crontab(d, store, &log);
    let config = config.as_str();

    let before_fleet = now_ms();
    let mut fleet = Fleet::default();
    for _ in 0..3 {
        fleet.start(Path::new(config), d);
    }
    wait_for(
        Duration::from_secs(20),
        "three ticks before the pause",
        || (ran(&log).len() >= 3).then_some(()),
        || fleet.logs(),
    );

    let (code, stdout, stderr) = run_in(
        d,
        &[
            "pause",
            "tick",
            "--config",
            config,
            "--reason",
            "disk full",
            "--by",
            "ops",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let paused_at = now_ms();
    assert!(stdout.starts_with("paused job tick since "), "{stdout}");
    assert!(
        stdout.contains("until resumed: disk full (by ops)"),
        "{stdout}"
    );

    let (code, status, stderr) = run_in(d, &["status", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert!(status.contains("paused   job tick since"), "{status}");
    assert!(status.contains("disk full"), "{status}");
    assert!(status.contains("next     "), "{status}");
    let (code, json, stderr) = run_in(d, &["status", "tick", "--json", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("status --json is JSON");
    assert_eq!(doc["jobs"][0]["job"], "tick", "{json}");
    assert_eq!(doc["jobs"][0]["paused"]["reason"], "disk full", "{json}");
    assert_eq!(doc["jobs"][0]["paused"]["until"], serde_json::Value::Null);

    // Slots after the pause are recorded paused by whoever claims them;
    // none runs. (The slot being claimed as the pause lands may run.)
    let latest_three = || {
        let (code, history, stderr) =
            run_in(d, &["history", "tick", "--config", config, "-n", "3"]);
        assert_eq!(code, 0, "{stderr}");
        history
    };
    wait_for(
        Duration::from_secs(10),
        "the latest three slots recorded paused",
        || (latest_three().matches(" paused ").count() == 3).then_some(()),
        || format!("{}\n{}", latest_three(), fleet.logs()),
    );
    let late_runs: Vec<i64> = ran(&log)
        .into_keys()
        .filter(|slot| *slot > paused_at + 1000)
        .collect();
    assert!(
        late_runs.is_empty(),
        "slots ran while paused: {late_runs:?}"
    );

    let (code, stdout, stderr) = run_in(d, &["resume", "tick", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("resumed job tick"), "{stdout}");
    let resumed_at = now_ms();
    wait_for(
        Duration::from_secs(10),
        "a tick after the resume",
        || {
            ran(&log)
                .keys()
                .any(|slot| *slot > resumed_at)
                .then_some(())
        },
        || fleet.logs(),
    );
    let (code, stdout, _) = run_in(d, &["resume", "tick", "--config", config]);
    assert_eq!(code, 0);
    assert!(stdout.contains("was not paused"), "{stdout}");

    the_fleet_runs_triggers_once(d, config, &fleet);
    the_fleet_backfills_the_slots_before_it(d, config, &fleet, before_fleet);

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
    for (slot, daemons) in ran(&log) {
        assert_eq!(daemons.len(), 1, "slot {slot} ran on {daemons:?}");
    }
}

/// `trigger` against the running fleet: one run per request id, started
/// within a second, on one daemon; `--wait` exits 1 for a failed run and
/// 0 for a run that succeeded.
fn the_fleet_runs_triggers_once(d: &Path, config: &str, fleet: &Fleet) {
    let press = [
        "trigger",
        "on-demand",
        "--id",
        "press-1",
        "--config",
        config,
    ];
    let (code, stdout, stderr) = run_in(d, &press);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("requested a manual run of job on-demand at "),
        "{stdout}"
    );
    wait_for(
        Duration::from_secs(10),
        "the triggered run",
        || (!manual_runs(d).is_empty()).then_some(()),
        || fleet.logs(),
    );
    let (origin, requested_at, started_at, _) = manual_runs(d)[0].clone();
    assert_eq!(origin, "manual");
    assert!(
        started_at - requested_at <= 1000,
        "the manual run started {} ms after its request; at most 1 s is the promise",
        started_at - requested_at
    );
    let (code, again, stderr) = run_in(d, &press);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(again, stdout, "the same id is the same request");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        manual_runs(d).len(),
        1,
        "one id, one run: {:?}",
        manual_runs(d)
    );

    let (code, stdout, stderr) = run_in(d, &["trigger", "on-demand", "--wait", "--config", config]);
    assert_eq!(code, 1, "a failed run: {stdout}{stderr}");
    assert!(stderr.contains("ended failed"), "{stderr}");
    std::fs::write(d.join("ok"), "").unwrap();
    let (code, stdout, stderr) = run_in(d, &["trigger", "on-demand", "--wait", "--config", config]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("succeeded"), "{stdout}");

    let runs = manual_runs(d);
    assert_eq!(runs.len(), 3, "three requests, three runs: {runs:?}");
    let mut slots: Vec<i64> = runs.iter().map(|r| r.1).collect();
    slots.dedup();
    assert_eq!(slots.len(), 3, "each run once: {runs:?}");
    let (code, history, stderr) = run_in(d, &["history", "on-demand", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(history.matches(" manual ").count(), 3, "{history}");
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("a time")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `backfill --wait` of the five seconds before the fleet started, when no
/// daemon was up: it returns once each of the five slots ran, once, on one
/// daemon.
fn the_fleet_backfills_the_slots_before_it(d: &Path, config: &str, fleet: &Fleet, before: i64) {
    let from = before - before.rem_euclid(1000) - 6000;
    let to = from + 4000;
    let (code, stdout, stderr) = run_in(
        d,
        &[
            "backfill",
            "tick",
            "--from",
            &rfc3339(from),
            "--to",
            &rfc3339(to),
            "--wait",
            "--config",
            config,
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("requested a backfill of job tick from "),
        "{stdout}"
    );
    assert!(
        stdout.contains("is done: each of its 5 slots has ended"),
        "{stdout}"
    );
    let backfilled = || -> BTreeMap<i64, Vec<String>> {
        ran(&d.join("runs.log"))
            .into_iter()
            .filter(|(slot, _)| (from..=to).contains(slot))
            .collect()
    };
    wait_for(
        Duration::from_secs(20),
        "five backfilled slots",
        || (backfilled().len() == 5).then_some(()),
        || fleet.logs(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    for (slot, daemons) in backfilled() {
        assert_eq!(
            daemons.len(),
            1,
            "backfilled slot {slot} ran on {daemons:?}"
        );
    }
    let (code, status, stderr) = run_in(d, &["status", "tick", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    assert!(status.contains("  backfill "), "{status}");
}

#[test]
fn bad_control_input_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("runs.log");
    let config = crontab(d, &sqlite(d, "control.db"), &log);
    let config = config.as_str();
    // The store exists once a daemon (or the library) opened it.
    let mut fleet = Fleet::default();
    fleet.start(Path::new(config), d);
    wait_for(
        Duration::from_secs(20),
        "a first tick",
        || (!ran(&log).is_empty()).then_some(()),
        || fleet.logs(),
    );

    let refused = |args: &[&str], says: &str| {
        let (code, stdout, stderr) = run_in(d, args);
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    refused(&["pause", "tick", "--all", "--config", config], "not both");
    refused(&["pause", "--config", config], "name one job");
    refused(
        &["pause", "nope", "--config", config],
        "has no job \"nope\"",
    );
    refused(
        &[
            "pause",
            "tick",
            "--until",
            "2001-01-01T00:00:00Z",
            "--config",
            config,
        ],
        "not after the store's clock",
    );
    refused(
        &["pause", "tick", "--until", "tomorrow", "--config", config],
        "RFC 3339",
    );
    refused(
        &[
            "pause",
            "tick",
            "--reason",
            &"x".repeat(300),
            "--config",
            config,
        ],
        "reason",
    );
    refused(
        &[
            "pause",
            "tick",
            "--store",
            "amqp://guest:s3cret@127.0.0.1:1/",
        ],
        "claim-only",
    );
    refused(&["status", "--store", "nats://127.0.0.1:1"], "claim-only");
    refused(
        &["trigger", "tick", "--store", "nats://127.0.0.1:1"],
        "claim-only",
    );
    refused(
        &["trigger", "nope", "--config", config],
        "has no job \"nope\"",
    );
    refused(
        &["trigger", "tick", "--id", "has space", "--config", config],
        "invalid request id",
    );
    refused(
        &[
            "backfill",
            "tick",
            "--from",
            "2030-01-01T00:00:00Z",
            "--to",
            "2030-01-02T00:00:00Z",
            "--config",
            config,
        ],
        "after the store's clock",
    );
    refused(
        &[
            "backfill",
            "tick",
            "--from",
            "2026-01-02T00:00:00Z",
            "--to",
            "2026-01-01T00:00:00Z",
            "--config",
            config,
        ],
        "start before the end",
    );
    refused(
        &[
            "backfill",
            "tick",
            "--from",
            "2020-01-01T00:00:00Z",
            "--to",
            "2020-01-02T00:00:00Z",
            "--config",
            config,
        ],
        "history retention",
    );
    let (code, status, stderr) = run_in(d, &["status", "--json", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        doc["jobs"][0]["paused"],
        serde_json::Value::Null,
        "{status}"
    );
    assert!(!status.contains("s3cret"));
    fleet.daemons[0].signal(Signal::SIGTERM);
    assert_eq!(fleet.daemons[0].wait(Duration::from_secs(15)), Some(0));
}
