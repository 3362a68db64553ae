//! `pause`, `resume` and `status` against a fleet of daemons.
//!
//! * Three `anarchon run` processes share a SQLite file with a per-second
//!   job. `anarchon pause` (another process, no daemon) stops the job on
//!   all three: its next slots are recorded `paused` and run nowhere;
//!   `status` shows the pause with its reason, as text and JSON; `resume`
//!   lets it run again; no slot ever runs twice.
//! * Bad input is refused with exit status 2 and a sentence, and writes
//!   nothing: a job and `--all` together, a job the crontab lacks, an end
//!   in the past on the store's clock, a time that is not RFC 3339, and a
//!   claim-only store (refused before connecting).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Fleet, anarchon, wait_for};
use nix::sys::signal::Signal;

/// Runs `anarchon args…` in `dir`: (exit code, stdout, stderr).
fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = anarchon()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run anarchon");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}

/// A crontab on `store` whose per-second job `tick` appends
/// `$ANARCHON_SLOT $PPID` to `log`.
fn crontab(dir: &Path, store: &str, log: &Path) -> std::path::PathBuf {
    let path = dir.join("anarchon.toml");
    std::fs::write(
        &path,
        format!(
            r#"store = "{store}"

[scheduler]
lease = "1s"
heartbeat = "300ms"
shutdown_grace = "1s"
kill_grace = "500ms"

[[job]]
name = "tick"
every = "1s"
max_late = "5s"
command = "echo \"$ANARCHON_SLOT $PPID\" >> {log}"
"#,
            log = log.display()
        ),
    )
    .unwrap();
    path
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

#[test]
fn a_paused_job_runs_nowhere_in_the_fleet_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("runs.log");
    let store = format!("sqlite://{}", d.join("fleet.db").display());
    let config = crontab(d, &store, &log);
    let config = config.to_str().unwrap();

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
    std::thread::sleep(Duration::from_millis(3500));
    let (code, history, stderr) = run_in(d, &["history", "tick", "--config", config, "-n", "3"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        history.matches(" paused ").count(),
        3,
        "the latest three slots are paused:\n{history}"
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

#[test]
fn bad_control_input_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("runs.log");
    let store = format!("sqlite://{}", d.join("control.db").display());
    let config = crontab(d, &store, &log);
    let config = config.to_str().unwrap();
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
