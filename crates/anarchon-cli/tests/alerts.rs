//! Alert commands across a fleet of daemons.
//!
//! Three `anarchon run` processes share a store (a SQLite file, a
//! PostgreSQL table, a Redis prefix, a NATS KV bucket) and an `[alerts]`
//! command that appends the run's `ANARCHON_*` details to `alerts.log`.
//! A job that always fails raises one `failed` alert per slot, by the daemon
//! that recorded the failure, never one per daemon; a job that succeeds
//! raises none. A manual run of a one-attempt job whose daemon is killed
//! with SIGKILL raises one `interrupted` alert, by the daemon whose claim
//! ended the run once its lease ran out.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, crontab_head, run_in, wait_for};
use nix::sys::signal::Signal;

/// A crontab on `store` with the alert command, a job `broken` that fails
/// every 2 s, a job `fine` that succeeds every 2 s, and a job `fragile`
/// (one attempt, run on demand only) whose command notes its daemon and
/// instance in `fragile.started` and sleeps.
fn crontab(dir: &Path, store: &str) -> String {
    let path = dir.join("anarchon.toml");
    let head = crontab_head(store, ["3s", "1s", "1s", "500ms"]);
    let rest = format!(
        r#"
[alerts]
command = "echo \"$ANARCHON_ALERT|$ANARCHON_JOB|$ANARCHON_SLOT_TIME|${{ANARCHON_ATTEMPT:-none}}|$ANARCHON_INSTANCE|${{ANARCHON_ERROR:-}}\" >> {alerts}"
timeout = "10s"

[[job]]
name = "broken"
every = "2s"
command = "echo disk full >&2; exit 3"

[[job]]
name = "fine"
every = "2s"
command = "true"

[[job]]
name = "fragile"
every = "24h"
max_attempts = 1
command = "echo \"$PPID $ANARCHON_INSTANCE\" > {started}; sleep 20"
"#,
        alerts = dir.join("alerts.log").display(),
        started = dir.join("fragile.started").display(),
    );
    std::fs::write(&path, head + &rest).expect("writing the crontab");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// One line of `alerts.log`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    kind: String,
    job: String,
    slot: String,
    attempt: String,
    instance: String,
    error: String,
}

fn lines(dir: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(dir.join("alerts.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let parts: Vec<&str> = line.splitn(6, '|').collect();
            assert_eq!(
                parts.len(),
                6,
                "`kind|job|slot|attempt|instance|error`: {line:?}"
            );
            Line {
                kind: parts[0].to_owned(),
                job: parts[1].to_owned(),
                slot: parts[2].to_owned(),
                attempt: parts[3].to_owned(),
                instance: parts[4].to_owned(),
                error: parts[5].to_owned(),
            }
        })
        .collect()
}

fn of<'a>(lines: &'a [Line], kind: &str, job: &str) -> Vec<&'a Line> {
    lines
        .iter()
        .filter(|l| l.kind == kind && l.job == job)
        .collect()
}

common::servers::on_every_lease_store!(
    /// The alert command runs once per end, on each lease store.
    each_end_is_alerted_once_in_a_fleet,
    "clialert",
    the_fleet_alerts_each_end_once
);

fn the_fleet_alerts_each_end_once(d: &Path, store: &str) {
    let config = crontab(d, store);
    let config = config.as_str();
    let mut fleet = Fleet::default();
    for _ in 0..3 {
        fleet.start(Path::new(config), d);
    }
    wait_for(
        Duration::from_secs(20),
        "two failures alerted",
        || (of(&lines(d), "failed", "broken").len() >= 2).then_some(()),
        || format!("{:?}\n{}", lines(d), fleet.logs()),
    );

    // A manual run of `fragile`; its daemon dies with it running.
    let (code, stdout, stderr) = run_in(d, &["trigger", "fragile", "--config", config]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (runner_pid, runner_instance) = wait_for(
        Duration::from_secs(15),
        "the manual run to start",
        || {
            let text = std::fs::read_to_string(d.join("fragile.started")).ok()?;
            let (pid, instance) = text.trim().split_once(' ')?;
            Some((pid.parse::<u32>().ok()?, instance.to_owned()))
        },
        || fleet.logs(),
    );
    let runner = fleet
        .daemons
        .iter()
        .position(|daemon| daemon.pid() == runner_pid)
        .unwrap_or_else(|| panic!("no daemon has pid {runner_pid}\n{}", fleet.logs()));
    fleet.daemons[runner].signal(Signal::SIGKILL);
    let interrupted = wait_for(
        Duration::from_secs(20),
        "the interrupted run alerted",
        || {
            let found = of(&lines(d), "interrupted", "fragile").len();
            (found > 0).then_some(found)
        },
        || format!("{:?}\n{}", lines(d), fleet.logs()),
    );
    assert_eq!(interrupted, 1);

    for (i, daemon) in fleet.daemons.iter().enumerate() {
        if i != runner {
            daemon.signal(Signal::SIGTERM);
        }
    }
    for i in 0..fleet.daemons.len() {
        if i != runner {
            assert_eq!(
                fleet.daemons[i].wait(Duration::from_secs(15)),
                Some(0),
                "{}",
                fleet.logs()
            );
        }
    }

    let all = lines(d);
    let mut seen = BTreeMap::new();
    for line in &all {
        let previous = seen.insert((&line.kind, &line.job, &line.slot), line);
        assert!(previous.is_none(), "alerted twice: {line:?}\n{all:?}");
    }
    assert!(of(&all, "failed", "fine").is_empty(), "{all:?}");
    let ended = of(&all, "interrupted", "fragile")[0];
    assert_eq!(ended.attempt, "none", "{ended:?}");
    assert_ne!(
        ended.instance, runner_instance,
        "the dead runner raised nothing"
    );

    // Every failure in the history was alerted once, by the daemon that
    // recorded it — save those of the daemon killed before its alert
    // command could run.
    let (code, json, stderr) = run_in(
        d,
        &[
            "history", "broken", "--json", "-n", "100", "--config", config,
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let runs: Vec<serde_json::Value> = serde_json::from_str(&json).expect("history --json");
    let failed: Vec<&serde_json::Value> = runs.iter().filter(|r| r["state"] == "failed").collect();
    assert!(failed.len() >= 2, "{json}");
    let alerted = of(&all, "failed", "broken");
    for run in failed {
        let slot = run["slot"].as_str().unwrap();
        let instance = run["instance"].as_str().unwrap();
        let line = alerted.iter().find(|l| l.slot == slot);
        match line {
            Some(line) => {
                assert_eq!(line.instance, instance, "{line:?} {run}");
                assert_eq!(line.attempt, "1", "{line:?}");
                assert!(line.error.contains("exit status 3"), "{line:?}");
                assert!(line.error.contains("disk full"), "{line:?}");
            }
            None => assert_eq!(
                instance, runner_instance,
                "the failure of {slot} was never alerted: {all:?}"
            ),
        }
    }
}
