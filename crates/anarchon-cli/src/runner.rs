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
use tokio::io::AsyncRead;
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
    /// Start from an empty environment rather than the daemon's.
    pub(crate) clean_env: bool,
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
    if spec.clean_env {
        // Only what the crontab gives and the run's own variables: none of
        // the daemon's (its store URL, credentials, tokens).
        process.env_clear();
    }
    process
        .args(args)
        .envs(&spec.env)
        .env("ANARCHON_JOB", ctx.job().as_str())
        .env("ANARCHON_SLOT", ctx.slot().at().as_millis().to_string())
        .env("ANARCHON_SLOT_TIME", ctx.slot().at().to_string())
        .env(
            "ANARCHON_ORIGIN",
            if ctx.slot().is_manual() {
                "manual"
            } else {
                "schedule"
            },
        )
        .env("ANARCHON_ATTEMPT", ctx.attempt().to_string())
        .env("ANARCHON_ATTEMPT_CAUSE", ctx.cause().as_str())
        .env("ANARCHON_RETRIES", ctx.retries().to_string())
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

/// The longest stderr line passed through, in bytes; the rest of a longer
/// line is dropped (and the line marked `…`), so a command that writes
/// without newlines cannot grow the daemon's memory.
const MAX_FORWARDED_LINE: usize = 16 * 1024;
/// How many stderr lines may wait for the daemon's stderr; beyond that,
/// lines are dropped and counted rather than let a slow reader of the
/// daemon's stderr hold up the commands (or the daemon's own work).
const FORWARD_BACKLOG: usize = 4096;

/// Writes commands' stderr lines to the daemon's stderr on a thread of its
/// own, so a slow or blocked reader never blocks the runtime's workers.
struct Forwarder {
    lines: std::sync::mpsc::SyncSender<String>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Forwarder {
    fn get() -> &'static Forwarder {
        static FORWARDER: std::sync::OnceLock<Forwarder> = std::sync::OnceLock::new();
        FORWARDER.get_or_init(|| {
            let (forwarder, incoming) = Forwarder::with_backlog(FORWARD_BACKLOG);
            let _ = std::thread::Builder::new()
                .name("anarchon-stderr".into())
                .spawn(move || {
                    for line in incoming {
                        // The daemon's stderr may be gone: nothing to do.
                        let _ = writeln!(std::io::stderr().lock(), "{line}");
                    }
                });
            forwarder
        })
    }

    /// A forwarder holding at most `backlog` lines, and the end its writer
    /// reads from.
    fn with_backlog(backlog: usize) -> (Forwarder, std::sync::mpsc::Receiver<String>) {
        let (lines, incoming) = std::sync::mpsc::sync_channel::<String>(backlog);
        let forwarder = Forwarder {
            lines,
            dropped: std::sync::atomic::AtomicU64::new(0),
        };
        (forwarder, incoming)
    }

    /// Queues `line`, or drops and counts it when the backlog is full.
    fn send(&self, line: String) {
        if self.lines.try_send(line).is_err() {
            let before = self.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_power_of_two() || before == 0 {
                tracing::warn!(
                    dropped = before + 1,
                    "the daemon's stderr is not read fast enough: commands' stderr lines are dropped (their tails are still kept)"
                );
            }
        }
    }
}

/// Splits a byte stream into lines of at most `max` bytes, reading in
/// bounded chunks: a line longer than `max` keeps its first `max` bytes and
/// is marked cut; the rest of it is skipped up to its newline.
struct Lines<R> {
    reader: R,
    pending: Vec<u8>,
    chunk: Box<[u8]>,
    skipping: bool,
    done: bool,
    max: usize,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(reader: R, max: usize) -> Self {
        Self {
            reader,
            pending: Vec::new(),
            chunk: vec![0; 8192].into_boxed_slice(),
            skipping: false,
            done: false,
            max,
        }
    }

    /// The next line (without its newline) and whether it was cut; `None`
    /// at the end of the stream.
    async fn next(&mut self) -> Option<(String, bool)> {
        use tokio::io::AsyncReadExt as _;
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                return Some((text, false));
            }
            if self.pending.len() >= self.max && !self.skipping {
                let line: Vec<u8> = self.pending.drain(..self.max).collect();
                self.pending.clear();
                self.skipping = true;
                return Some((String::from_utf8_lossy(&line).into_owned(), true));
            }
            if self.skipping {
                self.pending.clear();
            }
            if self.done {
                if self.pending.is_empty() || self.skipping {
                    return None;
                }
                let rest = std::mem::take(&mut self.pending);
                return Some((String::from_utf8_lossy(&rest).into_owned(), false));
            }
            match self.reader.read(&mut self.chunk).await {
                Ok(0) | Err(_) => self.done = true,
                Ok(n) => self.pending.extend_from_slice(&self.chunk[..n]),
            }
        }
    }
}

/// Copies the child's stderr to ours, prefixed with the job, keeping a tail.
async fn pass_through(stderr: impl AsyncRead + Unpin, job: String, tail: Arc<Mutex<Tail>>) {
    pass_lines(stderr, &job, &tail, |line| Forwarder::get().send(line)).await;
}

/// [`pass_through`] with the forwarding given: each line (cut lines marked
/// `…`) goes to `forward` and to the tail.
async fn pass_lines(
    stderr: impl AsyncRead + Unpin,
    job: &str,
    tail: &Mutex<Tail>,
    forward: impl Fn(String),
) {
    let mut lines = Lines::new(stderr, MAX_FORWARDED_LINE);
    while let Some((line, cut)) = lines.next().await {
        let line = if cut { format!("{line}…") } else { line };
        tail.lock().unwrap_or_else(|p| p.into_inner()).push(&line);
        forward(format!("[{job}] {}", line.trim_end()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that writes megabytes without a newline: the line is cut
    /// at the limit, the rest skipped up to its newline, and the next line
    /// comes through whole; nothing holds more than a line and a chunk.
    #[tokio::test]
    async fn a_line_without_end_is_cut_and_the_next_one_kept() {
        use tokio::io::AsyncReadExt as _;
        let endless = tokio::io::repeat(b'x').take(20 * 1024 * 1024);
        let stream = endless.chain(&b"\nsecond line\nno newline at the end"[..]);
        let mut lines = Lines::new(stream, 1024);
        let (first, cut) = lines.next().await.expect("a first line");
        assert!(cut);
        assert_eq!(first.len(), 1024);
        assert!(
            lines.pending.capacity() <= 1024 + 8192 * 2,
            "bounded buffer"
        );
        assert_eq!(lines.next().await, Some(("second line".to_owned(), false)));
        assert_eq!(
            lines.next().await,
            Some(("no newline at the end".to_owned(), false))
        );
        assert_eq!(lines.next().await, None);
    }

    /// Nobody reads the daemon's stderr: lines beyond the backlog are
    /// dropped and counted, and passing a command's stderr never waits for
    /// that reader; the tail keeps the last lines.
    #[tokio::test]
    async fn a_stalled_daemon_stderr_drops_lines_and_never_blocks() {
        let (forwarder, _unread) = Forwarder::with_backlog(4);
        let output: Vec<u8> = (0..1000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let tail = Mutex::new(Tail::default());
        tokio::time::timeout(
            Duration::from_secs(10),
            pass_lines(&output[..], "job", &tail, |line| forwarder.send(line)),
        )
        .await
        .expect("passing stderr does not wait for a reader");
        assert_eq!(forwarder.dropped.load(Ordering::Relaxed), 996);
        assert!(tail.lock().unwrap().joined().ends_with("line 999"));
    }

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
