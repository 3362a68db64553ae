//! Running a won run's command as a child process.
//!
//! The child gets its own process group, so stopping it (timeout, fence,
//! shutdown) reaches everything it started: SIGTERM to the group, then
//! SIGKILL after the grace period. Its stderr is passed through to ours,
//! line by line, and its tail is kept for the run's recorded error.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon::RunContext;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command as Process};

use crate::config::Command;
use crate::printable::printable;

/// How many lines of stderr a failed run's error keeps.
const TAIL_LINES: usize = 5;
/// The longest stderr line kept, in characters.
const MAX_LINE: usize = 300;
/// How long to wait for the rest of stderr after the child exited (a
/// background process may hold the pipe open).
const STDERR_DRAIN: Duration = Duration::from_millis(500);
/// How often a stopping command's process group is looked at.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// One job's command and how to run it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// What to run.
    pub(crate) command: Command,
    /// Extra environment.
    pub(crate) env: BTreeMap<String, String>,
    /// Working directory.
    pub(crate) working_dir: Option<PathBuf>,
    /// Between SIGTERM and SIGKILL.
    pub(crate) kill_grace: Duration,
}

/// The commands of one daemon that outlive their handler.
///
/// At shutdown the scheduler aborts handlers still running after its grace
/// period; dropping a handler sends SIGTERM to its command's process group
/// and leaves the command here. [`Orphans::reap`] then gives them the kill
/// grace and sends SIGKILL to what is left, so the daemon never exits with
/// a command it started still running.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    children: Mutex<Vec<(String, Child, Option<Pid>)>>,
    /// Commands whose handler is still alive (running, or aborted and not
    /// dropped yet).
    live: AtomicUsize,
}

impl Orphans {
    fn adopt(&self, job: String, child: Child, group: Option<Pid>) {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((job, child, group));
    }

    /// Waits for aborted handlers to let go of their commands, then up to
    /// `grace` in all for those commands to exit, and kills the rest.
    pub(crate) async fn reap(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        while self.live.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|p| p.into_inner()));
        for (job, mut child, group) in children {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let _ = stop_group(&mut child, group, left, &job).await;
        }
    }
}

/// Holds the child while the handler runs; if the handler is dropped first,
/// the child gets SIGTERM and goes to the orphans.
struct Running {
    job: String,
    child: Option<Child>,
    group: Option<Pid>,
    orphans: Arc<Orphans>,
}

impl Running {
    fn new(job: String, child: Child, orphans: Arc<Orphans>) -> Self {
        orphans.live.fetch_add(1, Ordering::SeqCst);
        Self {
            job,
            group: group_of(&child),
            child: Some(child),
            orphans,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            // The leader may have exited and left the rest of its group.
            signal_group(self.group, Signal::SIGTERM);
            self.orphans
                .adopt(std::mem::take(&mut self.job), child, self.group);
        }
        self.orphans.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The child's process group: its own id, since it leads one. Kept from
/// the start, because the id is gone from the `Child` once it is reaped,
/// while the group lives on as long as any process in it does.
fn group_of(child: &Child) -> Option<Pid> {
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
}

/// Sends `signal` to the process group `group`.
fn signal_group(group: Option<Pid>, signal: Signal) {
    let Some(group) = group else {
        return;
    };
    if let Err(e) = killpg(group, signal) {
        tracing::debug!(pid = group.as_raw(), ?signal, error = %e, "could not signal the command's process group");
    }
}

/// Whether any process of `group` is still alive. (While one is, the
/// system does not hand the group's id to another process.)
fn group_alive(group: Option<Pid>) -> bool {
    group.is_some_and(|g| !matches!(killpg(g, None), Err(nix::errno::Errno::ESRCH)))
}

/// After SIGTERM went to the group: waits until the leader exited and the
/// whole group is gone, for at most `grace`; then SIGKILLs what is left of
/// the group, whether or not the leader exited. Returns the leader's exit.
async fn stop_group(
    child: &mut Child,
    group: Option<Pid>,
    grace: Duration,
    job: &str,
) -> std::io::Result<ExitStatus> {
    let deadline = tokio::time::Instant::now() + grace;
    let mut status = None;
    loop {
        if status.is_none() {
            status = child.try_wait()?;
        }
        if status.is_some() && !group_alive(group) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(%job, ?grace, "the command (or a process it started) ignored SIGTERM: SIGKILL to its process group");
            signal_group(group, Signal::SIGKILL);
            break;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
    match status {
        Some(status) => Ok(status),
        None => child.wait().await,
    }
}

/// Runs the command for `ctx`: `Ok` when it exits with status 0, otherwise
/// an error with the status and the tail of its stderr. A cancelled context
/// (timeout, fence, lost contact) stops it: SIGTERM, then SIGKILL after the
/// grace period.
pub(crate) async fn run(
    ctx: RunContext,
    spec: Arc<Spec>,
    orphans: Arc<Orphans>,
) -> Result<(), String> {
    let argv = spec.command.argv();
    let Some((program, args)) = argv.split_first() else {
        return Err("the command is empty".into());
    };
    let mut process = Process::new(program);
    process
        .args(args)
        .envs(&spec.env)
        .env("ANARCHON_JOB", ctx.job().as_str())
        .env("ANARCHON_SLOT", ctx.slot().as_millis().to_string())
        .env("ANARCHON_SLOT_TIME", ctx.slot().to_string())
        .env("ANARCHON_ATTEMPT", ctx.attempt().to_string())
        .env("ANARCHON_INSTANCE", ctx.instance().as_str())
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .process_group(0);
    match ctx.fence() {
        Some(fence) => process.env("ANARCHON_FENCE", fence.to_string()),
        None => process.env_remove("ANARCHON_FENCE"),
    };
    if let Some(dir) = &spec.working_dir {
        process.current_dir(dir);
    }
    let child = process
        .spawn()
        .map_err(|e| format!("could not start {program:?}: {e}"))?;
    let mut running = Running::new(ctx.job().to_string(), child, orphans);
    let group = running.group;
    let Some(child) = running.child.as_mut() else {
        return Err("the command vanished".into());
    };
    let tail = Arc::new(Mutex::new(Tail::default()));
    let stderr = child.stderr.take().map(|stderr| {
        let (tail, job) = (tail.clone(), ctx.job().to_string());
        tokio::spawn(pass_through(stderr, job, tail))
    });

    let status = tokio::select! {
        status = child.wait() => status,
        () = ctx.cancelled() => {
            let reason = ctx.cancel_reason().map(|r| r.to_string()).unwrap_or_default();
            tracing::warn!(job = %ctx.job(), slot = %ctx.slot(), %reason, "stopping the command: SIGTERM");
            signal_group(group, Signal::SIGTERM);
            stop_group(child, group, spec.kill_grace, ctx.job().as_str()).await
        }
    };
    // Reaped: nothing left for the drop guard to do.
    running.child = None;
    let status = status.map_err(|e| format!("could not wait for {program:?}: {e}"))?;
    if let Some(mut reader) = stderr
        && tokio::time::timeout(STDERR_DRAIN, &mut reader)
            .await
            .is_err()
    {
        // Something the command left behind still holds its stderr open.
        reader.abort();
    }
    let tail = tail.lock().unwrap_or_else(|p| p.into_inner()).joined();
    if let Some(reason) = ctx.cancel_reason() {
        return Err(with_tail(
            format!("stopped ({reason}); {}", describe(status)),
            &tail,
        ));
    }
    if status.success() {
        Ok(())
    } else {
        Err(with_tail(describe(status), &tail))
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => format!("ended with {status}"),
    }
}

fn with_tail(head: String, tail: &str) -> String {
    if tail.is_empty() {
        head
    } else {
        format!("{head}; stderr: {tail}")
    }
}

/// The last lines of a command's stderr.
#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
}

impl Tail {
    /// Keeps `line`, cleaned: the tail is stored with the run and printed
    /// by `history`, so no control character or bidi control goes in.
    fn push(&mut self, line: &str) {
        let line = printable(line.trim_end());
        let line = line.as_str();
        if line.is_empty() {
            return;
        }
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        let mut kept: String = line.chars().take(MAX_LINE).collect();
        if kept.len() < line.len() {
            kept.push('…');
        }
        self.lines.push_back(kept);
    }

    /// One line: the kept lines joined with ` | `.
    fn joined(&self) -> String {
        self.lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// Copies the child's stderr to ours, prefixed with the job, keeping a tail.
async fn pass_through(stderr: impl AsyncRead + Unpin, job: String, tail: Arc<Mutex<Tail>>) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                // The daemon's stderr may be gone; the tail is kept anyway.
                let _ = writeln!(std::io::stderr().lock(), "[{job}] {}", line.trim_end());
                tail.lock().unwrap_or_else(|p| p.into_inner()).push(&line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_stored_without_control_characters() {
        let mut tail = Tail::default();
        tail.push("\u{1b}[31mred\u{1b}[0m \u{202e}reversed\r\n");
        let kept = tail.joined();
        assert!(
            !kept.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{kept:?}"
        );
        assert_eq!(kept, "\\u{1b}[31mred\\u{1b}[0m \\u{202e}reversed");
    }

    #[test]
    fn the_tail_keeps_the_last_lines_short() {
        let mut tail = Tail::default();
        for i in 0..10 {
            tail.push(&format!("line {i}\n"));
        }
        tail.push("\n");
        assert_eq!(tail.joined(), "line 5 | line 6 | line 7 | line 8 | line 9");
        let mut tail = Tail::default();
        tail.push(&"x".repeat(1000));
        assert_eq!(tail.joined().chars().count(), MAX_LINE + 1);
    }

    #[test]
    fn exit_statuses_are_described() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exit status 3");
        assert_eq!(describe(ExitStatus::from_raw(9)), "killed by SIGKILL");
    }
}
