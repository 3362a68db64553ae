//! `anarchon audit` against a store with a gap made on purpose: a daemon
//! runs a per-second job, stops for a few seconds, runs again. The audit
//! lists exactly the slots that did not run — the gap's, with "no record"
//! — and exits 1; a window with no gap exits 0.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, now_ms, run_in, sqlite_crontab_head, wait_for};

/// The slots the job ran, from its log.
fn ran(log: &Path) -> BTreeSet<i64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().expect("a slot per line"))
        .collect()
}

fn run_for(config: &Path, dir: &Path, log: &Path, slots: usize) {
    let mut fleet = Fleet::default();
    fleet.start(config, dir);
    let before = ran(log).len();
    wait_for(
        Duration::from_secs(20),
        "the daemon's runs",
        || (ran(log).len() >= before + slots).then_some(()),
        || fleet.logs(),
    );
    fleet.stop_cleanly(0);
}

#[test]
fn audit_lists_exactly_the_slots_nobody_ran() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = d.join("audit.db");
    let log = d.join("ran.log");
    let config = d.join("anarchon.toml");
    std::fs::write(
        &config,
        format!(
            "{head}\n[[job]]\nname = \"tick\"\nevery = \"1s\"\nmax_late = \"500ms\"\ncommand = \"echo $ANARCHON_SLOT >> {log}\"\n",
            head = sqlite_crontab_head(&db, ["2s", "500ms", "1s", "500ms"]),
            log = log.display(),
        ),
    )
    .unwrap();
    let started = now_ms();
    run_for(&config, d, &log, 3);
    std::thread::sleep(Duration::from_millis(3_500));
    run_for(&config, d, &log, 3);
    // Every slot old enough to judge is past its late window.
    std::thread::sleep(Duration::from_millis(1_000));

    let since_ms = now_ms() - started + 5_000;
    let since = format!("{}ms", since_ms);
    let config_arg = config.to_str().unwrap();
    let (code, stdout, stderr) = run_in(
        d,
        &["audit", "--since", &since, "--config", config_arg, "--json"],
    );
    assert_eq!(code, 1, "gaps found exit 1: {stdout}{stderr}");
    assert!(stderr.contains("missing or failed"), "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("audit --json");
    let job = &doc["jobs"][0];
    assert_eq!(job["job"], "tick");
    let reported: BTreeSet<String> = job["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["slot"].as_str().unwrap().to_owned())
        .collect();
    let ran = ran(&log);
    let first = *ran.first().unwrap();
    let last = *ran.last().unwrap();
    // Between the first and the last run, the gap's slots are exactly those
    // not in the log, and each is reported as having no record.
    let gap: BTreeSet<i64> = (first..last)
        .step_by(1000)
        .filter(|s| !ran.contains(s))
        .collect();
    assert!(
        gap.len() >= 2,
        "the daemon was down for a few slots: {ran:?}"
    );
    let utc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    for slot in &gap {
        assert!(
            reported.contains(&utc(*slot)),
            "the gap's slot {} is reported: {stdout}",
            utc(*slot)
        );
    }
    for slot in &ran {
        assert!(
            !reported.contains(&utc(*slot)),
            "a slot that ran is not reported: {stdout}"
        );
    }
    for problem in job["problems"].as_array().unwrap() {
        let at = problem["slot"].as_str().unwrap();
        let ms = chrono::DateTime::parse_from_rfc3339(at)
            .unwrap()
            .timestamp_millis();
        if gap.contains(&ms) {
            assert_eq!(
                problem["verdict"], "no record (no instance claimed it)",
                "{stdout}"
            );
        }
    }

    // The text form lists them too; a window inside the second run has
    // nothing to report.
    let (code, text, _) = run_in(d, &["audit", "--since", &since, "--config", config_arg]);
    assert_eq!(code, 1);
    assert!(text.starts_with("tick: "), "{text}");
    assert!(text.contains("no record"), "{text}");
    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    let before = ran.len();
    wait_for(
        Duration::from_secs(20),
        "three more runs",
        || (self::ran(&log).len() >= before + 3).then_some(()),
        || fleet.logs(),
    );
    let (code, clean, stderr) = run_in(d, &["audit", "--since", "2s", "--config", config_arg]);
    assert_eq!(code, 0, "{clean}{stderr}\n{}", fleet.logs());
    assert!(clean.contains(" 0 missing or failed"), "{clean}");
}
