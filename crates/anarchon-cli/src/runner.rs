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
    children: Mutex<Vec<(String, Child)>>,
    /// Commands whose handler is still alive (running, or aborted and not
    /// dropped yet).
    live: AtomicUsize,
}

impl Orphans {
    fn adopt(&self, job: String, child: Child) {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((job, child));
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
        for (job, mut child) in children {
            if tokio::time::timeout_at(deadline, child.wait())
                .await
                .is_err()
            {
                tracing::warn!(%job, ?grace, "command still running after SIGTERM; sending SIGKILL");
                signal_group(&child, Signal::SIGKILL);
                let _ = child.wait().await;
            }
        }
    }
}

/// Holds the child while the handler runs; if the handler is dropped first,
/// the child gets SIGTERM and goes to the orphans.
struct Running {
    job: String,
    child: Option<Child>,
    orphans: Arc<Orphans>,
}

impl Running {
    fn new(job: String, child: Child, orphans: Arc<Orphans>) -> Self {
        orphans.live.fetch_add(1, Ordering::SeqCst);
        Self {
            job,
            child: Some(child),
            orphans,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take()
            && !matches!(child.try_wait(), Ok(Some(_)))
        {
            signal_group(&child, Signal::SIGTERM);
            self.orphans.adopt(std::mem::take(&mut self.job), child);
        }
        self.orphans.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends `signal` to the child's process group (its id, since it leads one).
fn signal_group(child: &Child, signal: Signal) {
    let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        return;
    };
    if let Err(e) = killpg(Pid::from_raw(pid), signal) {
        tracing::debug!(pid, ?signal, error = %e, "could not signal the command's process group");
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
            signal_group(child, Signal::SIGTERM);
            match tokio::time::timeout(spec.kill_grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    tracing::warn!(job = %ctx.job(), grace = ?spec.kill_grace, "the command ignored SIGTERM: SIGKILL");
                    signal_group(child, Signal::SIGKILL);
                    child.wait().await
                }
            }
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
