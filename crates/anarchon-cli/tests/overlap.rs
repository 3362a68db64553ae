//! `overlap = "replace"` across a fleet of daemons.
//!
//! Three `anarchon run` processes share a store (a SQLite file, a
//! PostgreSQL table, a Redis prefix, a NATS KV bucket) with a job every 2 s
//! whose command would run for 30 s. Each new slot replaces the run still
//! going: the old command gets SIGTERM (its trap writes to the log), the
//! new one starts, every slot starts once, and the history says
//! `replaced`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, crontab_head, run_in, wait_for};
use nix::sys::signal::Signal;

/// A crontab on `store` whose job `long` runs every 2 s with `overlap =
/// "replace"`; its command logs `start <slot>`, and `term <slot>` when it
/// gets SIGTERM, and otherwise sleeps 30 s.
fn crontab(dir: &Path, store: &str) -> String {
    let path = dir.join("anarchon.toml");
    // A lease longer than the period: a daemon kept off the CPU for a
    // moment on a busy machine must not lose its lease to a takeover.
    let head = crontab_head(store, ["3s", "1s", "1s", "500ms"]);
    let log = dir.join("events.log");
    let job = format!(
        r#"
[[job]]
name = "long"
every = "2s"
max_late = "1s"
overlap = "replace"
command = "trap 'echo \"term $ANARCHON_SLOT\" >> {log}; exit 143' TERM; echo \"start $ANARCHON_SLOT $ANARCHON_ATTEMPT\" >> {log}; sleep 30 & wait"
"#,
        log = log.display(),
    );
    std::fs::write(&path, head + &job).expect("writing the crontab");
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// Each slot's events in the log, in order: `start <attempt>`, `term`.
fn events(dir: &Path) -> BTreeMap<i64, Vec<String>> {
    let mut out: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let event = match parts.as_slice() {
            ["start", _, attempt] => format!("start {attempt}"),
            ["term", _] => "term".to_owned(),
            _ => panic!("`start slot attempt` or `term slot` lines: {line:?}"),
        };
        out.entry(parts[1].parse().expect("a slot"))
            .or_default()
            .push(event);
    }
    out
}

common::servers::on_every_lease_store!(
    /// `replace` stops the old command and runs the new slot, on each lease store.
    replace_stops_the_old_command_in_a_fleet,
    "clireplace",
    each_slot_replaces_the_one_before
);

fn each_slot_replaces_the_one_before(d: &Path, store: &str) {
    let config = crontab(d, store);
    let config = config.as_str();
    let mut fleet = Fleet::default();
    for _ in 0..3 {
        fleet.start(Path::new(config), d);
    }
    // Two slots replaced: three started, the first two stopped.
    wait_for(
        Duration::from_secs(20),
        "two slots replaced",
        || {
            let replaced = events(d)
                .values()
                .filter(|e| e.iter().any(|x| x == "term"))
                .count();
            (replaced >= 2).then_some(())
        },
        || format!("{:?}\n{}", events(d), fleet.logs()),
    );
    let (code, history, stderr) = run_in(d, &["history", "long", "--config", config]);
    assert_eq!(code, 0, "{stderr}");
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
    let log = events(d);
    let slots: Vec<i64> = log.keys().copied().collect();
    for (slot, happened) in &log {
        let mut starts: Vec<&String> = happened.iter().filter(|e| e.starts_with("start")).collect();
        let all = starts.len();
        starts.dedup();
        assert_eq!(
            starts.len(),
            all,
            "slot {slot}: each attempt started once: {log:?}"
        );
        assert!(happened[0].starts_with("start"), "slot {slot}: {log:?}");
    }
    // Every slot but the newest (stopped by the daemons' shutdown) was
    // stopped by the one after it.
    let newest = slots.iter().max().copied().unwrap_or_default();
    let stopped: Vec<i64> = log
        .iter()
        .filter(|(slot, e)| **slot != newest && e.iter().any(|x| x == "term"))
        .map(|(slot, _)| *slot)
        .collect();
    assert!(stopped.len() >= 2, "{log:?}");
    for slot in &stopped {
        assert!(
            slots.iter().any(|s| *s == slot + 2_000),
            "slot {slot} was replaced by the slot after it: {log:?}"
        );
    }
    assert!(
        history.matches(" replaced ").count() >= 2,
        "the history says replaced:\n{history}"
    );
}
