//! Four `anarchon` processes share one SQLite file.
//!
//! * A per-second job runs at least 15 slots; every slot is run by exactly
//!   one process.
//! * A long job's runner is killed with SIGKILL; a survivor takes the run
//!   over as attempt 2 once the (short) lease runs out.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{Fleet, now_ms, sqlite_crontab_head, wait_for};
use nix::sys::signal::Signal;

const PROCESSES: usize = 4;
const TICKS: usize = 15;

/// One line a command appended: `job slot daemon-pid attempt group`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    job: String,
    slot: i64,
    daemon: u32,
    attempt: u32,
    group: i32,
}

fn read_log(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 5, "malformed log line {l:?}");
            Line {
                job: f[0].to_owned(),
                slot: f[1].parse().expect("slot"),
                daemon: f[2].parse().expect("daemon pid"),
                attempt: f[3].parse().expect("attempt"),
                group: f[4].parse().expect("process group"),
            }
        })
        .collect()
}

#[test]
fn four_processes_run_each_slot_once_and_take_over_a_killed_runner() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("runs.log");
    let config = d.join("anarchon.toml");
    let line = |job: &str| {
        format!(
            "echo \\\"{job} $ANARCHON_SLOT $PPID $ANARCHON_ATTEMPT $$\\\" >> {}",
            log.display()
        )
    };
    std::fs::write(
        &config,
        format!(
            r#"{head}
[[job]]
name = "tick"
every = "1s"
command = ["sh", "-c", "{tick}"]

[[job]]
name = "long"
every = "10s"
overlap = "skip"
command = ["sh", "-c", "{long}; exec sleep 60"]
"#,
            head = sqlite_crontab_head(&d.join("shared.db"), ["1s", "300ms", "500ms", "500ms"]),
            tick = line("tick"),
            long = line("long"),
        ),
    )
    .unwrap();

    let mut fleet = Fleet::default();
    for _ in 0..PROCESSES {
        fleet.start(&config, d);
    }
    let pids: Vec<u32> = fleet.daemons.iter().map(|d| d.pid()).collect();

    // The long job starts somewhere, and the per-second job runs its slots.
    let first_long = wait_for(
        Duration::from_secs(25),
        "the long job to start and 15 ticks",
        || {
            let lines = read_log(&log);
            let ticks = lines.iter().filter(|l| l.job == "tick").count();
            let long = lines.iter().find(|l| l.job == "long").cloned();
            long.filter(|_| ticks > TICKS + 1)
        },
        || fleet.logs(),
    );
    fleet.groups.push(first_long.group);
    assert_eq!(first_long.attempt, 1);
    let victim = fleet
        .daemons
        .iter()
        .position(|d| d.pid() == first_long.daemon)
        .expect("the long job's runner is one of ours");

    // Kill its runner outright: no hand-over, no release.
    let killed_at = now_ms();
    fleet.daemons[victim].signal(Signal::SIGKILL);
    let takeover = wait_for(
        Duration::from_secs(10),
        "a survivor to take the long run over",
        || {
            read_log(&log)
                .into_iter()
                .find(|l| l.job == "long" && l.slot == first_long.slot && l.attempt > 1)
        },
        || fleet.logs(),
    );
    let takeover_ms = now_ms() - killed_at;
    fleet.groups.push(takeover.group);

    // Stop the survivors gracefully.
    for (i, daemon) in fleet.daemons.iter().enumerate() {
        if i != victim {
            daemon.signal(Signal::SIGTERM);
        }
    }
    for i in 0..PROCESSES {
        if i != victim {
            let code = fleet.daemons[i].wait(Duration::from_secs(15));
            assert_eq!(
                code,
                Some(0),
                "survivor {i} exits cleanly\n{}",
                fleet.logs()
            );
        }
    }
    let lines = read_log(&log);
    for l in &lines {
        fleet.groups.push(l.group);
    }

    // The takeover.
    assert_eq!(takeover.attempt, 2, "{takeover:?}");
    assert_ne!(
        takeover.daemon, first_long.daemon,
        "a survivor ran attempt 2"
    );
    assert!(pids.contains(&takeover.daemon), "{takeover:?} {pids:?}");
    // The dead runner's lease ends at most one lease (1 s) after its last
    // heartbeat, itself at most one heartbeat (300 ms) before the kill. The
    // extra second covers starting the command and reading the log here.
    eprintln!("takeover seen {takeover_ms} ms after the kill");
    assert!(
        takeover_ms <= 1000 + 300 + 1000,
        "a survivor took over {takeover_ms} ms after the kill; the bound is lease + heartbeat (+1 s to start the command and see it)"
    );

    // No (job, slot, attempt) was ever run twice, before or after the kill.
    let mut runs: BTreeMap<(String, i64, u32), Vec<u32>> = BTreeMap::new();
    for l in &lines {
        runs.entry((l.job.clone(), l.slot, l.attempt))
            .or_default()
            .push(l.daemon);
    }
    for (run, daemons) in &runs {
        assert_eq!(daemons.len(), 1, "{run:?} ran on {daemons:?}");
    }

    // Every tick slot before the kill ran exactly once, with no gaps.
    let mut ticks: BTreeMap<i64, Vec<&Line>> = BTreeMap::new();
    for l in lines.iter().filter(|l| l.job == "tick") {
        ticks.entry(l.slot).or_default().push(l);
    }
    let first = *ticks.keys().next().expect("ticks ran");
    let settled: Vec<i64> = (0..)
        .map(|i| first + i * 1000)
        .take_while(|s| s + 2000 < killed_at)
        .collect();
    assert!(
        settled.len() >= TICKS,
        "at least {TICKS} slots before the kill, got {}",
        settled.len()
    );
    for slot in &settled {
        let ran = ticks.get(slot).map_or(0, Vec::len);
        assert_eq!(
            ran,
            1,
            "tick slot {slot} ran {ran} times: {:?}",
            ticks.get(slot)
        );
    }
}
