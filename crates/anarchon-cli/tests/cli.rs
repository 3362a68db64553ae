//! The `anarchon` binary end to end: a daemon running real commands, the
//! read-only commands, and bad input.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    Fleet, anarchon, is_gone, run_in, sqlite_crontab_head, unknown_scheme_is_refused_masked,
    wait_for,
};
use nix::sys::signal::Signal;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write a test file");
}

/// Writes `text` as the crontab `anarchon.toml` in `dir`: its path.
fn write_crontab(dir: &Path, text: &str) -> std::path::PathBuf {
    let config = dir.join("anarchon.toml");
    write(&config, text);
    config
}

fn history(db: &Path, job: &str) -> String {
    let out = anarchon()
        .args(["history", job, "-n", "200", "--store"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .expect("run anarchon history");
    assert!(
        out.status.success(),
        "history failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// One daemon runs five jobs for a few seconds: the environment reaches the
/// command, exit statuses become states, stderr's tail is recorded, a
/// missing program is a failed run (and the scheduler keeps going), a
/// timeout stops the command's whole process group, and a command that
/// ignores SIGTERM is killed after the grace period. SIGTERM stops the
/// daemon with status 0.
#[test]
fn a_daemon_runs_commands_and_records_how_they_ended() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = d.join("cron.db");
    let config = write_crontab(
        d,
        &format!(
            r#"{head}
[[job]]
name = "env"
every = "1s"
command = ["sh", "-c", "echo \"$ANARCHON_JOB $ANARCHON_SLOT $ANARCHON_ATTEMPT $ANARCHON_FENCE $EXTRA $(pwd)\" >> {dir}/env.log"]
env = {{ EXTRA = "from-toml" }}
working_dir = "{dir}"

[[job]]
name = "fails"
every = "1s"
command = "echo 'first line' >&2; echo 'disk full' >&2; exit 3"

[[job]]
name = "missing"
every = "1s"
command = ["/nonexistent/anarchon-test-program", "--flag"]

[[job]]
name = "slow"
every = "2s"
timeout = "300ms"
command = "echo $$ >> {dir}/slow.pids; sleep 30; echo never >> {dir}/slow.pids"

[[job]]
name = "stubborn"
every = "2s"
timeout = "300ms"
command = "trap '' TERM; echo $$ >> {dir}/stubborn.pids; sleep 30 & wait"

# The leader dies of SIGTERM; the process it started ignores it.
[[job]]
name = "tree"
every = "2s"
timeout = "300ms"
command = "sh -c 'trap \"\" TERM; echo $$ >> {dir}/tree.pids; sleep 30' & wait"
"#,
            head = sqlite_crontab_head(&db, ["2s", "500ms", "1s", "700ms"]),
            dir = d.display()
        ),
    );
    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    let env_log = d.join("env.log");
    let lines = wait_for(
        Duration::from_secs(30),
        "three runs of every job",
        || {
            let env = std::fs::read_to_string(&env_log).ok()?;
            let runs = env.lines().count();
            let failed = history(&db, "missing").matches("failed").count();
            let stubborn = history(&db, "stubborn").matches("failed").count();
            let tree = history(&db, "tree").matches("failed").count();
            (runs >= 3 && failed >= 3 && stubborn >= 1 && tree >= 1).then_some(env)
        },
        || fleet.logs(),
    );
    fleet.daemons[0].signal(Signal::SIGTERM);
    let code = fleet.daemons[0].wait(Duration::from_secs(15));
    assert_eq!(
        code,
        Some(0),
        "SIGTERM stops the daemon cleanly\n{}",
        fleet.logs()
    );

    // The environment.
    for line in lines.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 6, "{line}");
        assert_eq!(fields[0], "env");
        let slot: i64 = fields[1]
            .parse()
            .expect("ANARCHON_SLOT is UTC milliseconds");
        assert_eq!(slot % 1000, 0, "slots of an every-1s job are whole seconds");
        assert_eq!(fields[2], "1", "ANARCHON_ATTEMPT");
        let _: u64 = fields[3].parse().expect("ANARCHON_FENCE is a number");
        assert_eq!(fields[4], "from-toml", "env from the crontab");
        assert_eq!(
            Path::new(fields[5]),
            d.canonicalize().unwrap(),
            "working_dir"
        );
    }

    let fails = history(&db, "fails");
    // The newest runs may still have been going when the daemon stopped
    // (on a busy machine, a second is short): the newest ended one.
    let row = fails
        .lines()
        .skip(1)
        .find(|row| !row.contains("running"))
        .expect("an ended run of `fails`");
    assert!(row.contains("failed"), "{fails}");
    assert!(
        row.contains("exit status 3; stderr: first line | disk full"),
        "the error keeps the status and the tail of stderr: {fails}"
    );

    let missing = history(&db, "missing");
    assert!(missing.contains("could not start"), "{missing}");
    assert!(missing.contains("No such file"), "{missing}");
    assert!(
        missing.matches("failed").count() >= 3,
        "the scheduler keeps going after a missing program: {missing}"
    );

    // Every process of a stopped command is gone, including one that
    // outlived its leader.
    for job in ["slow", "stubborn", "tree"] {
        let runs = history(&db, job);
        assert!(runs.contains("timed out after 300ms"), "{job}: {runs}");
        let pids = std::fs::read_to_string(d.join(format!("{job}.pids"))).unwrap();
        assert!(
            !pids.contains("never"),
            "{job}: the command was not stopped"
        );
        for pid in pids.lines() {
            let pid: i32 = pid.parse().unwrap();
            fleet.groups.push(pid);
            wait_for(
                Duration::from_secs(5),
                &format!("{job} command {pid} to be stopped"),
                || is_gone(pid).then_some(()),
                || runs.clone(),
            );
        }
    }
    let log = std::fs::read_to_string(&fleet.daemons[0].stderr).unwrap();
    assert!(
        log.contains("ignored SIGTERM: SIGKILL to its process group")
            && log.contains("job=stubborn"),
        "a command that ignores SIGTERM is killed after the grace:\n{log}"
    );
}

#[test]
fn the_example_crontab_checks_out() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/anarchon.toml");
    let out = anarchon()
        .arg("check")
        .arg("--config")
        .arg(&example)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("job(s) OK"), "{stdout}");
}

#[test]
fn bad_crontabs_are_refused_with_their_place_and_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let p = path.to_str().unwrap();
    for (text, says) in [
        (
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\novrelap = \"skip\"\n",
            ":5:1: unknown field `ovrelap`",
        ),
        (
            "[[job]]\nname = \"a\"\nevery = \"1m\ncommand = \"true\"\n",
            ":3:",
        ),
        (
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\njitter = \"2m\"\n",
            "jitter",
        ),
        (
            "[scheduler]\nlease = \"10s\"\nheartbeat = \"10s\"\n[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
            "heartbeat (10s) must be shorter than lease (10s)",
        ),
    ] {
        write(&path, text);
        for command in ["check", "run"] {
            let (code, _, stderr) = run_in(dir.path(), &[command, "--config", p]);
            assert_eq!(code, 2, "{command} {text:?}: {stderr}");
            assert!(stderr.contains(says), "{command} {text:?}: {stderr}");
            assert!(stderr.contains("bad.toml"), "names the file: {stderr}");
        }
    }
    let (code, _, stderr) = run_in(
        dir.path(),
        &["check", "--config", "/nonexistent/anarchon.toml"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
    assert!(
        !dir.path().join("anarchon.db").exists(),
        "a refused crontab opens no store (the default is sqlite://anarchon.db)"
    );
}

#[test]
fn store_urls_are_checked_and_never_echo_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ok.toml");
    write(
        &config,
        "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    );
    let c = config.to_str().unwrap();
    unknown_scheme_is_refused_masked(dir.path(), c, "s3cret", "s3cret");

    let missing_dir = dir.path().join("no-such-dir");
    let url = format!("sqlite://{}/cron.db", missing_dir.display());
    let (code, _, stderr) = run_in(dir.path(), &["run", "--config", c, "--store", &url]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(
        stderr.contains(&missing_dir.display().to_string()),
        "{stderr}"
    );

    let not_db = dir.path().join("notes.txt");
    write(&not_db, &"not a database\n".repeat(300));
    let url = format!("sqlite://{}", not_db.display());
    let (code, _, stderr) = run_in(dir.path(), &["run", "--config", c, "--store", &url]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not a SQLite database"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&not_db).unwrap(),
        "not a database\n".repeat(300),
        "the file is left alone"
    );

    let url = format!("sqlite://{}/never.db", dir.path().display());
    let (code, _, stderr) = run_in(dir.path(), &["history", "--store", &url]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no database at"), "{stderr}");
    assert!(
        !dir.path().join("never.db").exists(),
        "history creates nothing"
    );
}

#[test]
fn next_prints_the_coming_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_in(
        dir.path(),
        &["next", "30 3 * * *", "--tz", "Europe/Athens", "-n", "3"],
    );
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for line in lines {
        assert!(line.contains(" EE"), "local time in Athens: {line}");
        assert!(line.contains("  =  ") && line.ends_with('Z'), "{line}");
    }
    let (code, stdout, _) = run_in(dir.path(), &["next", "*/15 * * * *", "-n", "2"]);
    assert_eq!(code, 0);
    for line in stdout.lines() {
        assert!(line.contains(" UTC ("), "{line}");
        let minute = &line[14..16];
        assert!(["00", "15", "30", "45"].contains(&minute), "{line}");
    }
    let (code, _, stderr) = run_in(dir.path(), &["next", "61 * * * *"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("minute field"), "{stderr}");
    let (code, _, stderr) = run_in(dir.path(), &["next", "0 * * * *", "--tz", "Mars/Base"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown time zone"), "{stderr}");
}

/// SIGTERM while a long command runs: after the shutdown grace the daemon
/// stops the command (SIGTERM to its process group, then SIGKILL since this
/// one ignores SIGTERM), releases the run's lease, reports the hand-over and
/// exits 0; the other daemon takes the run over as attempt 2.
#[test]
fn sigterm_stops_the_command_and_hands_the_run_over() {
    stops_the_command_and_hands_the_run_over(Signal::SIGTERM);
}

/// SIGHUP (a closed terminal, a session ending) is a stop like SIGTERM,
/// with the same hand-over, not a death that leaves the run to its lease.
#[test]
fn sighup_stops_the_daemon_like_sigterm() {
    stops_the_command_and_hands_the_run_over(Signal::SIGHUP);
}

/// The body of the two tests above, for the signal `stop`.
#[allow(clippy::unwrap_used)]
fn stops_the_command_and_hands_the_run_over(stop: Signal) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("long.log");
    let config = write_crontab(
        d,
        &format!(
            r#"{head}
[[job]]
name = "long"
every = "1h"
catch_up = "1h"
command = "trap '' TERM; echo \"$ANARCHON_SLOT $ANARCHON_ATTEMPT $PPID $$\" >> {log}; sleep 60 & wait"
"#,
            head = sqlite_crontab_head(&d.join("cron.db"), ["3s", "1s", "300ms", "1s"]),
            log = log.display()
        ),
    );
    let mut fleet = Fleet::default();
    fleet.start(&config, d);
    fleet.start(&config, d);
    let read = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let first = wait_for(
        Duration::from_secs(15),
        "the catch-up run to start",
        || read().into_iter().next(),
        || fleet.logs(),
    );
    fleet.groups.push(first[3].parse().unwrap());
    assert_eq!(first[1], "1", "{first:?}");
    let runner = fleet
        .daemons
        .iter()
        .position(|dm| dm.pid().to_string() == first[2])
        .expect("one of ours runs it");
    fleet.daemons[runner].signal(stop);
    let code = fleet.daemons[runner].wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", fleet.logs());
    let runner_log = std::fs::read_to_string(&fleet.daemons[runner].stderr).unwrap();
    assert!(
        runner_log.contains(&format!("signal=\"{}\"", stop.as_str())),
        "{runner_log}"
    );
    assert!(
        runner_log.contains("run handed over for a backup to take over"),
        "{runner_log}"
    );
    assert!(runner_log.contains("handed_over=1"), "{runner_log}");
    assert!(
        runner_log.contains("ignored SIGTERM: SIGKILL to its process group"),
        "a command that ignores SIGTERM is killed before the daemon exits: {runner_log}"
    );
    let group: i32 = first[3].parse().unwrap();
    wait_for(
        Duration::from_secs(5),
        "the runner's command to be stopped",
        || is_gone(group).then_some(()),
        || runner_log.clone(),
    );
    let second = wait_for(
        Duration::from_secs(15),
        "the other daemon to take the run over",
        || read().into_iter().find(|l| l[0] == first[0] && l[1] == "2"),
        || fleet.logs(),
    );
    fleet.groups.push(second[3].parse().unwrap());
    assert_ne!(second[2], first[2], "the other daemon runs attempt 2");
}

/// `anarchon next … | head -1`: a reader that goes away is not a crash.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::io::Read as _;
    use std::process::Stdio;
    let mut child = anarchon()
        .args(["next", "* * * * * *", "-n", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's read end is dropped here; the rest cannot be written.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// A crontab others may write is refused, as cron refuses one: whoever can
/// change it decides what the daemon runs. The owner's own file is fine.
#[test]
fn a_crontab_writable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("anarchon.toml");
    write(
        &config,
        "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    );
    for (mode, who) in [
        (0o664, "group"),
        (0o646, "others"),
        (0o666, "group and others"),
    ] {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
        let (code, _, stderr) = run_in(dir.path(), &["check", "--config", "anarchon.toml"]);
        assert_eq!(code, 2, "mode {mode:o}: {stderr}");
        assert!(
            stderr.contains(&format!("writable by {who}")) && stderr.contains("chmod go-w"),
            "mode {mode:o}: {stderr}"
        );
    }
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, stdout, stderr) = run_in(dir.path(), &["check", "--config", "anarchon.toml"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
}

/// The store URL may come from `ANARCHON_STORE`, so a password need not be
/// on the command line (where `ps` shows it); `--store` still wins.
#[test]
fn the_store_url_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("anarchon.toml"),
        "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
    );
    let check = |env: Option<&str>, flag: Option<&str>| {
        let mut cmd = anarchon();
        cmd.current_dir(dir.path())
            .args(["check", "--config", "anarchon.toml"]);
        if let Some(flag) = flag {
            cmd.args(["--store", flag]);
        }
        match env {
            Some(url) => cmd.env("ANARCHON_STORE", url),
            None => cmd.env_remove("ANARCHON_STORE"),
        };
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, said) = check(Some("redis://app:s3cret-from-env@127.0.0.1:6379"), None);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("redis"),
        "the environment's store is checked: {said}"
    );
    assert!(!said.contains("s3cret-from-env"), "{said}");
    let (code, said) = check(
        Some("redis://127.0.0.1:6379"),
        Some("sqlite://from-flag.db"),
    );
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("sqlite"), "--store wins: {said}");
}

/// `clean_env = true`: the command sees only the crontab's `env` and the
/// run's `ANARCHON_*` variables, none of the daemon's own (where store
/// credentials and tokens live); without it, the daemon's environment is
/// inherited as before.
#[test]
fn a_clean_environment_holds_only_env_and_the_runs_variables() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = write_crontab(
        d,
        &format!(
            r#"
store = "sqlite://{db}"

[[job]]
name = "clean"
every = "1s"
clean_env = true
env = {{ EXTRA = "from-toml" }}
command = ["/usr/bin/env"]

[[job]]
name = "inherited"
every = "1s"
command = "env > {dir}/inherited.env"
"#,
            db = d.join("cron.db").display(),
            dir = d.display()
        ),
    );
    let mut fleet = Fleet::default();
    fleet.start_with_env(&config, d, &[("DAEMON_ONLY_SECRET", "do-not-pass")]);
    let clean = wait_for(
        Duration::from_secs(15),
        "both jobs to run",
        || {
            let out = std::fs::read_to_string(&fleet.daemons[0].stdout).ok()?;
            let inherited = std::fs::read_to_string(d.join("inherited.env")).ok()?;
            (out.contains("ANARCHON_JOB=clean") && !inherited.is_empty())
                .then_some((out, inherited))
        },
        || fleet.logs(),
    );
    fleet.daemons[0].signal(Signal::SIGTERM);
    assert_eq!(fleet.daemons[0].wait(Duration::from_secs(10)), Some(0));
    let (out, inherited) = clean;
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    assert!(
        names
            .iter()
            .all(|n| *n == "EXTRA" || n.starts_with("ANARCHON_")),
        "only env and ANARCHON_*: {names:?}"
    );
    assert!(out.contains("EXTRA=from-toml"), "{out}");
    assert!(!out.contains("do-not-pass"), "{out}");
    assert!(
        inherited.contains("DAEMON_ONLY_SECRET=do-not-pass"),
        "without clean_env the daemon's environment is inherited: {inherited}"
    );
}

/// `check` warns when a catch-up window holds more slots than are caught
/// up, and says which run; a window within the limit gets no warning.
#[test]
fn check_warns_when_a_catch_up_window_holds_too_many_slots() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("anarchon.toml"),
        "[[job]]\nname = \"busy\"\nevery = \"1m\"\ncatch_up = \"1d\"\ncommand = \"true\"\n\n\
         [[job]]\nname = \"calm\"\nevery = \"1m\"\ncatch_up = \"1h\"\ncatch_up_limit = 100\ncommand = \"true\"\n",
    );
    let (code, stdout, stderr) = run_in(dir.path(), &["check", "--config", "anarchon.toml"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let warnings: Vec<&str> = stdout.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{stdout}");
    assert!(
        warnings[0].contains("more than 10 slots") && warnings[0].contains("newest 10"),
        "{stdout}"
    );
    let busy = stdout.find("busy").unwrap();
    let calm = stdout.find("calm").unwrap();
    let warning = stdout.find("warning:").unwrap();
    assert!(
        busy < warning && warning < calm,
        "the warning follows its job: {stdout}"
    );
}
