//! The log of a whole test binary (every thread, the client library's
//! `log` records too) kept in memory, so a test that fails can print what
//! the stores and the Redis client said just before.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// How many lines the log keeps: the oldest go first.
const KEPT: usize = 5_000;

static LINES: OnceLock<Mutex<VecDeque<String>>> = OnceLock::new();

fn lines() -> &'static Mutex<VecDeque<String>> {
    LINES.get_or_init(|| Mutex::new(VecDeque::with_capacity(KEPT)))
}

/// A writer that appends what it is given to the kept lines.
struct Keeper;

impl Write for Keeper {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let mut lines = lines().lock().unwrap_or_else(|p| p.into_inner());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if lines.len() == KEPT {
                lines.pop_front();
            }
            lines.push_back(line.to_owned());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keeps the binary's log from now on, filtered by `directives` (as in
/// `RUST_LOG`). The first call wins; later ones change nothing.
pub fn capture(directives: &str) {
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(directives))
        .with_writer(|| Keeper)
        .with_ansi(false)
        .finish()
        .try_init();
}

/// The last `n` lines kept, one per line.
pub fn tail(n: usize) -> String {
    let lines = lines().lock().unwrap_or_else(|p| p.into_inner());
    let skip = lines.len().saturating_sub(n);
    lines
        .iter()
        .skip(skip)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}
