//! What the CLI's tests share: running the binary, and killing what it
//! started even when a test fails.

#![allow(dead_code, unreachable_pub)]

pub mod servers;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The `anarchon` binary, with info logs.
pub fn anarchon() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_anarchon"));
    cmd.env("ANARCHON_LOG", "info");
    cmd
}

/// Daemons started by a test, and the process groups of commands they
/// ran: all killed with SIGKILL when the test ends, passed or failed.
#[derive(Default)]
pub struct Fleet {
    pub daemons: Vec<Daemon>,
    pub groups: Vec<i32>,
}

/// One `anarchon run`, its output going to files.
pub struct Daemon {
    pub child: Child,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Daemon {
    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its stderr, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid fits in i32");
        kill(Pid::from_raw(pid), signal).expect("signal the daemon");
    }

    /// Waits up to `limit` for the daemon to exit; its exit code.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("wait for the daemon") {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Fleet {
    /// Starts `anarchon run --config config`, logging into `dir`.
    pub fn start(&mut self, config: &Path, dir: &Path) -> usize {
        self.start_with_env(config, dir, &[])
    }

    /// [`Self::start`], with `env` added to the daemon's environment.
    pub fn start_with_env(&mut self, config: &Path, dir: &Path, env: &[(&str, &str)]) -> usize {
        let n = self.daemons.len();
        let stdout = dir.join(format!("daemon-{n}.out"));
        let stderr = dir.join(format!("daemon-{n}.err"));
        let child = anarchon()
            .envs(env.iter().copied())
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("daemon stdout file"))
            .stderr(File::create(&stderr).expect("daemon stderr file"))
            .spawn()
            .expect("start anarchon");
        self.daemons.push(Daemon {
            child,
            stdout,
            stderr,
        });
        n
    }

    /// Sends daemon `i` SIGTERM and asserts that it exits with 0 within
    /// 15 s (a clean shutdown), showing every daemon's log if not.
    pub fn stop_cleanly(&mut self, i: usize) {
        self.daemons[i].signal(Signal::SIGTERM);
        let code = self.daemons[i].wait(Duration::from_secs(15));
        assert_eq!(
            code,
            Some(0),
            "daemon {i} did not stop cleanly\n{}",
            self.logs()
        );
    }

    /// Every daemon's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.daemons
            .iter()
            .map(|d| format!("--- daemon {} ---\n{}", d.pid(), d.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for daemon in &mut self.daemons {
            let _ = daemon.child.kill();
            let _ = daemon.child.wait();
        }
        for group in &self.groups {
            let _ = killpg(Pid::from_raw(*group), Signal::SIGKILL);
        }
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after
/// `limit` with `what` and `context()`.
pub fn wait_for<T>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Runs `anarchon args…` in `dir` and returns (exit code, stdout, stderr).
pub fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
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

/// The head of a test crontab on the SQLite file `db`: the `store` line
/// and the `[scheduler]` table's `lease`, `heartbeat`, `shutdown_grace`
/// and `kill_grace`, in that order, as `timings`. The jobs follow it.
pub fn sqlite_crontab_head(db: &Path, timings: [&str; 4]) -> String {
    crontab_head(&format!("sqlite://{}", db.display()), timings)
}

/// [`sqlite_crontab_head`] for any store URL.
pub fn crontab_head(store: &str, timings: [&str; 4]) -> String {
    let [lease, heartbeat, shutdown_grace, kill_grace] = timings;
    format!(
        r#"
store = "{store}"

[scheduler]
lease = "{lease}"
heartbeat = "{heartbeat}"
shutdown_grace = "{shutdown_grace}"
kill_grace = "{kill_grace}"
"#
    )
}

/// `anarchon check` with the crontab `config` and a MySQL store URL whose
/// password is `password`: refused with status 2, the URL shown masked and
/// `never_shown` (the password or a part of it) nowhere. Its stderr.
pub fn unknown_scheme_is_refused_masked(
    dir: &Path,
    config: &str,
    password: &str,
    never_shown: &str,
) -> String {
    let url = format!("mysql://app:{password}@db/cron");
    let (code, _, stderr) = run_in(dir, &["check", "--config", config, "--store", &url]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("mysql://app:***@db/cron"), "{stderr}");
    assert!(!stderr.contains(never_shown), "{stderr}");
    stderr
}

/// The wall clock in milliseconds since the Unix epoch, as slots are.
pub fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}
