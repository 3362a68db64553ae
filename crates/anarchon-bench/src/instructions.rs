//! What Redis's `lease` scripts cost Redis itself, counted in instructions.
//!
//! The fleet's server CPU per execution is the figure issue 19 sets a
//! target for, but on a shared two-core machine the same build reads 0.08
//! one hour and 0.21 ms the next. Instructions do not move with the load:
//! a `redis-server` of our own, run under `valgrind --tool=callgrind`,
//! counts every instruction it executes, and the same script on the same
//! keys gives the same count to within a fraction of a percent. So a
//! change to a script is judged here first, and in the fleet after.
//!
//! `anarchon-bench redis-instructions [--runs N]` starts that server on a
//! free loopback port, opens a [`RedisLeaseStore`] on it and counts, with
//! callgrind's collection switched on around each phase only:
//!
//! * **win**: N claims of runs nobody claimed, sent as `claim_many`
//!   batches of 100 (one script call each, as a scheduler sends them);
//! * **lose**: the same N runs claimed again with other tokens, finding
//!   each run going (what seven of the eight claims of a fleet's run do);
//! * **finish**: the N runs finished, sent at once (grouped as a
//!   scheduler's finishes of one instant are).
//!
//! It prints instructions per call of each phase and what one execution of
//! a fleet of eight costs (one win, seven losses, one finish).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anarchon_core::{
    ClaimOutcome, ClaimRequest, InstanceId, JobName, LeaseClaim, LeaseStore, RunKey, RunOutcome,
    Slot, Token,
};
use anarchon_redis::{RedisLeaseStore, RedisOptions};
use anyhow::{Context, Result, bail};
use futures::future::join_all;

use crate::value_arg;

/// Claims per `claim_many` call: what one script carries on a single Redis.
const BATCH: usize = 100;

/// A `redis-server` under callgrind, stopped (and its files removed) when
/// dropped.
struct UnderCallgrind {
    server: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl UnderCallgrind {
    /// Starts the server on a free loopback port with collection off, and
    /// waits until it answers (valgrind takes seconds to start it).
    fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let server = Command::new("valgrind")
            .args([
                "--tool=callgrind",
                "--instr-atstart=no",
                &format!(
                    "--callgrind-out-file={}/callgrind.out.%p",
                    dir.path().display()
                ),
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.path().to_string_lossy(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting valgrind (Debian's package `valgrind`) with redis-server")?;
        let counted = Self { server, dir, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(60) {
                bail!(
                    "redis-server under callgrind did not listen on 127.0.0.1:{port} within 60 s"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(counted)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `callgrind_control` with `args` against the server.
    fn control(&self, args: &[&str]) -> Result<()> {
        let ran = Command::new("callgrind_control")
            .args(args)
            .arg(self.server.id().to_string())
            .output()
            .context("running callgrind_control")?;
        if !ran.status.success() {
            bail!(
                "callgrind_control {args:?} failed ({}): {}",
                ran.status,
                String::from_utf8_lossy(&ran.stderr).trim()
            );
        }
        Ok(())
    }

    /// The instructions the server executes while `phase` runs.
    async fn count<F: Future<Output = Result<()>>>(&self, name: &str, phase: F) -> Result<u64> {
        self.control(&["--zero"])?;
        self.control(&["--instr=on"])?;
        let ran = phase.await;
        self.control(&["--instr=off"])?;
        ran?;
        self.control(&[&format!("--dump={name}")])?;
        newest_total(self.dir.path())
    }
}

impl Drop for UnderCallgrind {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The instruction total of the newest callgrind dump in `dir`: its
/// `totals:` line (or `summary:`), whose first number is instructions.
fn newest_total(dir: &Path) -> Result<u64> {
    let newest: PathBuf = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out"))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .context("callgrind wrote no dump")?;
    let text = std::fs::read_to_string(&newest)?;
    total_of(&text).with_context(|| format!("no totals in {}", newest.display()))
}

/// The first number of a dump's `totals:` (or else `summary:`) line.
fn total_of(dump: &str) -> Option<u64> {
    let line = |key: &str| {
        dump.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

/// N claims of one run each, 100 jobs wide, at whole seconds from the
/// next one after `later` from now.
fn claims(runs: usize, instance: &InstanceId, later: Duration) -> Result<Vec<LeaseClaim>> {
    let now = anarchon_core::Clock::now(&anarchon_core::SystemClock).as_millis();
    let first = (now / 1000 + 1) * 1000 + anarchon_core::time::millis(later);
    (0..runs)
        .map(|i| {
            let job = JobName::new(&format!("counted-{}", i % BATCH))?;
            let slot = Slot::from_millis(first + (i / BATCH) as i64 * 1000);
            let mut claim = LeaseClaim::from_plain(&ClaimRequest {
                run: RunKey::new(job, slot),
                token: Token::generate(),
                instance: instance.clone(),
                max_late: Duration::from_secs(600),
            });
            claim.lease = Duration::from_secs(600);
            Ok(claim)
        })
        .collect()
}

/// Sends `claims` in batches and checks every answer is `want`.
async fn claim_all(
    store: &RedisLeaseStore,
    claims: &[LeaseClaim],
    want: fn(&ClaimOutcome) -> bool,
) -> Result<()> {
    for batch in claims.chunks(BATCH) {
        for answer in store.claim_many(batch).await? {
            let outcome = answer?;
            if !want(&outcome) {
                bail!("a counted claim was answered {outcome:?}");
            }
        }
    }
    Ok(())
}

/// `anarchon-bench redis-instructions [--runs N]`.
pub(crate) async fn run(args: &[String]) -> Result<()> {
    let runs: usize = value_arg(args, "--runs")?.map_or(Ok(1000), str::parse)?;
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let server = UnderCallgrind::start()?;
    let store =
        RedisLeaseStore::connect(&RedisOptions::new(server.url()).with_prefix("counted")?).await?;
    // Load the scripts and register the jobs before anything is counted.
    let warm = claims(BATCH, &InstanceId::generate(), Duration::ZERO)?;
    claim_all(&store, &warm, |o| matches!(o, ClaimOutcome::Won(_))).await?;

    let winner = InstanceId::generate();
    // An hour on: past the warm-up's slots.
    let won = claims(runs, &winner, Duration::from_secs(3600))?;
    let win = server
        .count(
            "win",
            claim_all(&store, &won, |o| matches!(o, ClaimOutcome::Won(_))),
        )
        .await?;
    let loser = InstanceId::generate();
    let lost: Vec<LeaseClaim> = won
        .iter()
        .map(|c| {
            let mut again = c.clone();
            again.claim.token = Token::generate();
            again.claim.instance = loser.clone();
            again
        })
        .collect();
    let lose = server
        .count(
            "lose",
            claim_all(&store, &lost, |o| matches!(o, ClaimOutcome::Running { .. })),
        )
        .await?;
    let finish = server
        .count("finish", async {
            let answers = join_all(
                won.iter()
                    .map(|c| store.finish(&c.claim.run, c.claim.token, RunOutcome::Succeeded)),
            )
            .await;
            for answer in answers {
                let renewal = answer?;
                if renewal != anarchon_core::Renewal::Renewed {
                    bail!("a counted finish was answered {renewal:?}");
                }
            }
            Ok(())
        })
        .await?;
    let per = |total: u64| total as f64 / runs as f64;
    let execution = per(win) + 7.0 * per(lose) + per(finish);
    println!(
        "Redis `lease` scripts, instructions Redis executed (callgrind), {runs} runs in batches of {BATCH}:\n\
         \n\
         phase        per call\n\
         win         {:>9.0}\n\
         lose        {:>9.0}\n\
         finish      {:>9.0}\n\
         \n\
         one execution of a fleet of 8 (1 win, 7 losses, 1 finish): {execution:.0}",
        per(win),
        per(lose),
        per(finish)
    );
    drop(store);
    drop(server);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::total_of;

    #[test]
    fn reads_the_instruction_total_of_a_dump() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1234\nfn=main\n5 6\ntotals: 98765\n";
        assert_eq!(total_of(dump), Some(98765));
        assert_eq!(total_of("events: Ir\nsummary: 42 7\n"), Some(42));
        assert_eq!(total_of("events: Ir\n"), None);
    }
}
