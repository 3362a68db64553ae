//! The fleet: K processes × M per-second jobs for D seconds on one store.
//!
//! The coordinator re-executes this binary K times as `fleet-worker`. Each
//! worker opens the backend's store with its default options (its own
//! connection pool), builds a real [`Scheduler`] with M jobs that fire every
//! second, says `ready`, and starts the scheduler at one agreed wall-clock
//! instant, half a second before a whole second, so the first slot is the
//! next whole second for every worker. It stops D seconds later.
//!
//! Each handler appends one line, `job slot instance fire_time_ms`, to one
//! file shared by all workers, opened with `O_APPEND` and written with one
//! `write` per line (short appends to a local file do not interleave).
//! The coordinator reads that file afterwards: executions, duplicates
//! (a job and slot run more than once), misses and lateness (handler start
//! minus slot, on the one machine's wall clock).
//!
//! The coordinator reads the server's own counters when the schedulers
//! start and again when they have all stopped, while the workers still hold
//! their connections (Redis `INFO commandstats` and `INFO cpu`; the CPU of
//! the PostgreSQL, NATS and RabbitMQ server processes from `/proc`), and
//! PostgreSQL's transactions (`pg_stat_database` of a database made for the
//! fleet) once the workers have exited, since an exiting backend publishes
//! its statistics. Each worker reports its own CPU over the window and the
//! store errors it saw.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, Read, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anarchon_core::{Schedule, Scheduler};
use anyhow::{Context, Result, bail};
use tokio::sync::mpsc;

use crate::targets::{Goals, Target};
use crate::{cpu_seconds, make_target, percentile, sorted, value_arg, verdict};

/// The size of a fleet.
pub(crate) struct FleetSettings {
    /// K: worker processes.
    pub(crate) processes: usize,
    /// M: per-second jobs in every worker.
    pub(crate) jobs: usize,
    /// D: seconds the fleet runs.
    pub(crate) secs: u64,
    /// `--fleet-keep DIR`: where each backend's executions file is kept
    /// (as `DIR/<backend>.txt`) for a closer look; dropped when `None`.
    pub(crate) keep: Option<std::path::PathBuf>,
}

impl FleetSettings {
    /// The fleet: 8 processes × 200 per-second jobs for 20 s (5 s
    /// with `--quick`).
    pub(crate) fn new(quick: bool) -> Self {
        Self {
            processes: 8,
            jobs: 200,
            secs: if quick { 5 } else { 20 },
            keep: None,
        }
    }
}

/// The backends a fleet measures when `--backends` does not say: every
/// store a fleet of processes can share (MemoryStore lives in one process).
/// `floor` first: the same fleet with no store, whose lateness the lease
/// stores' verdicts quote.
pub(crate) const FLEET_BACKENDS: &str =
    "floor, sqlite, postgres, redis-lease, redis-stream-id, rabbitmq, nats, nats-kv";

/// The server's counters at one moment; `None` where the server cannot
/// tell (or is not on this machine).
#[derive(Clone, Default)]
pub(crate) struct ServerLoad {
    /// Commands the server ran (Redis: all of `INFO commandstats`, those
    /// run inside scripts included).
    pub(crate) commands: Option<u64>,
    /// Of those, `EVALSHA` calls.
    pub(crate) evalsha: Option<u64>,
    /// The same commands by name (Redis).
    pub(crate) by_command: BTreeMap<String, u64>,
    /// Transactions of the database (PostgreSQL: commits plus rollbacks).
    pub(crate) transactions: Option<u64>,
    /// CPU seconds used so far, per server process (Redis reports its own
    /// total, filed under 0).
    pub(crate) cpu: Option<BTreeMap<u32, f64>>,
}

/// The CPU seconds the server used between two readings: a process that
/// appeared in between counts from zero, one that exited in between is
/// lost (the workers keep their connections open until after the second
/// reading, so their server processes are still there).
fn cpu_between(before: &ServerLoad, after: &ServerLoad) -> Option<f64> {
    let (b, a) = (before.cpu.as_ref()?, after.cpu.as_ref()?);
    Some(
        a.iter()
            .map(|(pid, t)| (t - b.get(pid).copied().unwrap_or(0.0)).max(0.0))
            .sum(),
    )
}

fn between(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

/// The CPU seconds (user + system) of every local process named `comm`
/// whose command line (its words joined by spaces; a server may have
/// replaced it with a title) `keep` accepts, by pid, from `/proc`; `None`
/// when there is none.
pub(crate) fn process_cpu(comm: &str, keep: impl Fn(&str) -> bool) -> Option<BTreeMap<u32, f64>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if head.split_once('(').map(|(_, name)| name) != Some(comm) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let command = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !keep(&command) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // utime and stime, in clock ticks of 1/100 s (Linux's USER_HZ).
        found.insert(pid, (ticks(11) + ticks(12)) / 100.0);
    }
    (!found.is_empty()).then_some(found)
}

/// Everything measured for one backend's fleet.
#[derive(Default)]
pub(crate) struct FleetFigures {
    backend: String,
    /// What the figures are judged against ([`Target::goals`]).
    goals: Goals,
    lease_store: bool,
    /// The floor (no store), which the stores' lateness is read against.
    floor: bool,
    /// Handler starts recorded in the file, all slots.
    executions: usize,
    /// Executions of the window's slots, per second of the window.
    executions_per_sec: f64,
    /// Runs beyond the first of a job and slot.
    duplicates: usize,
    /// Job and slot pairs expected in the inner window (first and last
    /// second left out).
    expected: usize,
    /// Of those, the ones that did not run anywhere.
    misses: usize,
    late_p50_ms: f64,
    late_p99_ms: f64,
    late_max_ms: f64,
    commands_per_exec: Option<f64>,
    evalsha_per_exec: Option<f64>,
    /// Redis: the commands that ran during the window, by name, per
    /// execution, most frequent first.
    commands_by_name: Vec<(String, f64)>,
    transactions_per_exec: Option<f64>,
    server_cpu_ms_per_exec: Option<f64>,
    client_cpu_ms_per_exec: f64,
    /// Scheduler counters summed over the workers.
    wins: u64,
    losses: u64,
    late: u64,
    store_errors: u64,
    /// Failed store calls seen by the workers' counting layer, and of
    /// those the ones that said `database is locked`.
    failed_calls: u64,
    locked: u64,
}

/// The wall clock, Unix milliseconds to the microsecond.
pub(crate) fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64 / 1000.0)
}

/// Sleeps until the wall clock reads `at_ms`.
async fn sleep_until_wall(at_ms: f64) {
    let wait = at_ms - now_ms();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_micros((wait * 1000.0) as u64)).await;
    }
}

/// A worker's report, `key=value` words after `report`.
#[derive(Default)]
struct Report {
    cpu_s: f64,
    wins: u64,
    losses: u64,
    late: u64,
    store_errors: u64,
    failed_calls: u64,
    locked: u64,
}

impl Report {
    fn parse(line: &str) -> Result<Self> {
        let field = |name: &str| -> Result<f64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .with_context(|| format!("a worker did not report {name}: {line}"))?
                .parse()
                .context("a number")
        };
        Ok(Self {
            cpu_s: field("cpu_s")?,
            wins: field("wins")? as u64,
            losses: field("losses")? as u64,
            late: field("late")? as u64,
            store_errors: field("store_errors")? as u64,
            failed_calls: field("failed_calls")? as u64,
            locked: field("locked")? as u64,
        })
    }
}

/// When a fleet runs and where it writes, as agreed with its workers.
struct Plan {
    /// The wall-clock instant the schedulers start, Unix ms: half a
    /// second before `first_slot`.
    start_at: f64,
    /// The instant they stop, D seconds later.
    stop_at: f64,
    /// The first slot of the window, Unix ms.
    first_slot: i64,
    /// The executions file they share.
    out: std::path::PathBuf,
    lease_store: bool,
}

/// One worker process, and the lines it prints.
struct Worker {
    child: Child,
    /// Closing it tells the worker to exit (after the last reading).
    stdin: Option<ChildStdin>,
}

/// The fleet of `s` on `backend`, measured.
pub(crate) async fn measure(backend: &str, s: &FleetSettings) -> Result<FleetFigures> {
    let mut target = make_target(backend, None).await?;
    target.check_room(s.jobs, s.secs)?;
    let isolated = target.isolate().await;
    let measured = match isolated {
        Ok(()) => {
            // One store opened here first, so that the schema, stream or
            // bucket exists before K processes race to create it.
            match target.fleet_instance().await {
                Ok(first) => {
                    let lease_store = first.clone().as_lease_store().is_some();
                    drop(first);
                    run(target.as_ref(), backend, s, lease_store).await
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    // What the fleet stored goes, even when the measurement failed.
    target.cleanup().await;
    measured
}

async fn run(
    target: &dyn Target,
    backend: &str,
    s: &FleetSettings,
    lease_store: bool,
) -> Result<FleetFigures> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("executions.txt");
    std::fs::File::create(&out)?;
    // Time for K processes to start, connect and build their jobs on a
    // busy machine; then half a second before a whole second.
    let lead_ms = 3000.0 + 500.0 * s.processes as f64;
    let start_at = ((now_ms() + lead_ms) / 1000.0).ceil() * 1000.0 - 500.0;
    let plan = Plan {
        start_at,
        stop_at: start_at + s.secs as f64 * 1000.0,
        first_slot: start_at as i64 + 500,
        out,
        lease_store,
    };

    let (lines_tx, mut lines_rx) = mpsc::unbounded_channel::<(usize, String)>();
    let mut workers = Vec::new();
    for index in 0..s.processes {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "fleet-worker",
                "--backend",
                backend,
                "--worker",
                &index.to_string(),
                "--workers",
                &s.processes.to_string(),
                "--namespace",
                &target.namespace(),
                "--jobs",
                &s.jobs.to_string(),
                "--secs",
                &s.secs.to_string(),
                "--start-at",
                &format!("{start_at:.0}"),
                "--out",
                &plan.out.to_string_lossy(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a fleet worker")?;
        let stdout = child.stdout.take().context("the worker's stdout")?;
        let tx = lines_tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((index, line)).is_err() {
                    break;
                }
            }
            let _ = tx.send((index, "exited".into()));
        });
        let stdin = child.stdin.take();
        workers.push(Worker { child, stdin });
    }
    drop(lines_tx);

    let result = drive(target, s, &mut lines_rx, &plan).await;
    // Let the workers go (closing their stdin), or stop them if the run
    // failed; either way wait for them.
    for w in &mut workers {
        w.stdin.take();
        if result.is_err() {
            let _ = w.child.kill();
        }
    }
    let mut children: Vec<Child> = workers.into_iter().map(|w| w.child).collect();
    tokio::task::spawn_blocking(move || {
        for c in &mut children {
            let _ = c.wait();
        }
    })
    .await?;
    if let Some(keep) = &s.keep {
        std::fs::create_dir_all(keep)?;
        let kept = keep.join(format!("{backend}.txt"));
        std::fs::copy(&plan.out, &kept)
            .with_context(|| format!("keeping the executions file as {}", kept.display()))?;
    }
    let (mut f, before) = result?;
    // A PostgreSQL backend may hold back its statistics for up to ten
    // seconds while its connection idles, but publishes them when it
    // exits: the transactions are read once the workers are gone.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let gone = target.server_load().await?;
    let executions = f.executions.max(1) as f64;
    f.transactions_per_exec =
        between(before.transactions, gone.transactions).map(|d| d as f64 / executions);
    f.backend = backend.to_owned();
    Ok(f)
}

async fn drive(
    target: &dyn Target,
    s: &FleetSettings,
    lines: &mut mpsc::UnboundedReceiver<(usize, String)>,
    plan: &Plan,
) -> Result<(FleetFigures, ServerLoad)> {
    let Plan {
        start_at, stop_at, ..
    } = *plan;
    // Every worker ready before the start, or the run is void.
    let mut ready = 0;
    while ready < s.processes {
        let left = start_at - now_ms();
        if left <= 0.0 {
            bail!(
                "only {ready} of {} fleet workers were ready at the agreed start; the machine is too busy to start them in time",
                s.processes
            );
        }
        let wait = Duration::from_micros((left * 1000.0) as u64);
        match tokio::time::timeout(wait, lines.recv()).await {
            Ok(Some((_, line))) if line == "ready" => ready += 1,
            Ok(Some((i, line))) if line == "exited" => bail!("fleet worker {i} exited early"),
            Ok(Some(_)) => {}
            Ok(None) => bail!("every fleet worker exited early"),
            Err(_) => {}
        }
    }
    sleep_until_wall(start_at).await;
    let before = target.server_load().await?;

    // Wait for every report: the workers stop at `stop_at`, and a store
    // that has fallen behind may need a while to finish.
    let mut reports = Vec::new();
    let deadline = Duration::from_secs_f64((stop_at - now_ms()).max(0.0) / 1000.0 + 120.0);
    let collect = async {
        while reports.len() < s.processes {
            match lines.recv().await {
                Some((_, line)) if line.starts_with("report ") => {
                    reports.push(Report::parse(&line)?)
                }
                Some((i, line)) if line == "exited" => {
                    bail!("fleet worker {i} exited without a report")
                }
                Some(_) => {}
                None => bail!("every fleet worker exited early"),
            }
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(deadline, collect)
        .await
        .context("the fleet workers did not stop in time")??;
    // The second reading while the workers' connections are still open
    // (a server process's CPU goes with it).
    let after = target.server_load().await?;

    let text = std::fs::read_to_string(&plan.out)?;
    let mut f = tally(&text, s, plan.first_slot)?;
    f.lease_store = plan.lease_store;
    f.floor = target.is_floor();
    f.goals = target.goals();
    let executions = f.executions.max(1) as f64;
    let per_exec = |d: Option<u64>| d.map(|d| d as f64 / executions);
    f.commands_per_exec = per_exec(between(before.commands, after.commands));
    f.evalsha_per_exec = per_exec(between(before.evalsha, after.evalsha));
    let mut by_name: Vec<(String, f64)> = after
        .by_command
        .iter()
        .map(|(name, n)| {
            let d = n.saturating_sub(before.by_command.get(name).copied().unwrap_or(0));
            (name.clone(), d as f64 / executions)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    by_name.sort_by(|a, b| b.1.total_cmp(&a.1));
    f.commands_by_name = by_name;
    f.server_cpu_ms_per_exec = cpu_between(&before, &after).map(|c| c * 1000.0 / executions);
    f.client_cpu_ms_per_exec = reports.iter().map(|r| r.cpu_s).sum::<f64>() * 1000.0 / executions;
    for r in &reports {
        f.wins += r.wins;
        f.losses += r.losses;
        f.late += r.late;
        f.store_errors += r.store_errors;
        f.failed_calls += r.failed_calls;
        f.locked += r.locked;
    }
    Ok((f, before))
}

/// Executions, duplicates, misses and lateness from the shared file.
fn tally(text: &str, s: &FleetSettings, first_slot: i64) -> Result<FleetFigures> {
    let window = first_slot..first_slot + s.secs as i64 * 1000;
    let mut runs: HashMap<(String, i64), usize> = HashMap::new();
    let mut lateness = Vec::new();
    let mut executions = 0;
    let mut in_window = 0;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [job, slot, _instance, fired] = words[..] else {
            bail!("a malformed line in the executions file: {line:?}");
        };
        let slot: i64 = slot.parse().context("a slot")?;
        let fired: f64 = fired.parse().context("a fire time")?;
        executions += 1;
        lateness.push(fired - slot as f64);
        if window.contains(&slot) {
            in_window += 1;
        }
        *runs.entry((job.to_owned(), slot)).or_default() += 1;
    }
    // The first and the last second are left out of the misses: a worker
    // that started a little late, or a slot whose claim was cut short by
    // the stop, is an edge of the measurement, not of the store.
    let inner: Vec<i64> = (1..s.secs as i64 - 1)
        .map(|i| first_slot + i * 1000)
        .collect();
    let mut misses = 0;
    for j in 0..s.jobs {
        let job = format!("fleet-{j}");
        for slot in &inner {
            if !runs.contains_key(&(job.clone(), *slot)) {
                misses += 1;
            }
        }
    }
    let lateness = sorted(lateness);
    Ok(FleetFigures {
        executions,
        executions_per_sec: in_window as f64 / s.secs as f64,
        duplicates: runs.values().map(|n| n - 1).sum(),
        expected: s.jobs * inner.len(),
        misses,
        late_p50_ms: percentile(&lateness, 0.5),
        late_p99_ms: percentile(&lateness, 0.99),
        late_max_ms: lateness.last().copied().unwrap_or(f64::NAN),
        ..FleetFigures::default()
    })
}

/// `anarchon-bench fleet-worker --backend B --worker I --workers K
/// --namespace N --jobs M --secs D --start-at UNIX_MS --out FILE`: worker I
/// (from 0) of a fleet of K processes.
pub(crate) async fn worker(args: &[String]) -> Result<()> {
    let arg = |name: &str| -> Result<&str> {
        value_arg(args, name)?.with_context(|| format!("fleet-worker needs {name}"))
    };
    let backend = arg("--backend")?;
    let jobs: usize = arg("--jobs")?.parse()?;
    let secs: u64 = arg("--secs")?.parse()?;
    let start_at: f64 = arg("--start-at")?.parse()?;
    let file = Arc::new(
        std::fs::OpenOptions::new()
            .append(true)
            .open(arg("--out")?)
            .context("opening the executions file")?,
    );
    let mut target = make_target(backend, Some(arg("--namespace")?)).await?;
    target.fleet_share(arg("--worker")?.parse()?, arg("--workers")?.parse()?);
    let store = target.fleet_instance().await?;
    // A handle of our own keeps the connection pool open after the
    // scheduler is gone (see the end).
    let mut b = Scheduler::builder(store.clone());
    let every_second = Schedule::cron("* * * * * *")?;
    for j in 0..jobs {
        let file = file.clone();
        b.job(format!("fleet-{j}"), every_second.clone())?
            .run(move |ctx| {
                let fired = now_ms();
                let line = format!(
                    "{} {} {} {fired:.3}\n",
                    ctx.job().as_str(),
                    ctx.slot().as_millis(),
                    ctx.instance().as_str()
                );
                // One write per line: appends of a few dozen bytes to a
                // local file land whole, whoever else appends.
                let written = (&*file).write(line.as_bytes());
                async move {
                    match written {
                        Ok(n) if n == line.len() => Ok(()),
                        Ok(n) => Err(format!("wrote {n} of {} bytes", line.len())),
                        Err(e) => Err(e.to_string()),
                    }
                }
            })?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    sleep_until_wall(start_at).await;
    let cpu0 = cpu_seconds();
    let scheduler = b.start()?;
    sleep_until_wall(start_at + secs as f64 * 1000.0).await;
    let m = scheduler.metrics();
    scheduler.shutdown().await;
    let cpu = cpu_seconds() - cpu0;
    let seen = target.tally();
    println!(
        "report cpu_s={cpu:.3} wins={} losses={} late={} store_errors={} failed_calls={} locked={}",
        m.wins, m.losses, m.late, m.store_errors, seen.errors, seen.locked
    );
    std::io::stdout().flush()?;
    // Keep the connections open until the coordinator has read the
    // server's counters: a PostgreSQL backend's CPU goes with its process,
    // and the pool would close with its last handle.
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    drop(store);
    drop(target);
    Ok(())
}

/// The fleet table and its verdicts.
pub(crate) fn table(all: &[FleetFigures], s: &FleetSettings) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nfleet: {} processes × {} per-second jobs for {} s per backend\n",
        s.processes, s.jobs, s.secs
    );
    let _ = writeln!(
        t,
        "{:<16} {:>7} {:>5} {:>13} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6}",
        "backend",
        "exec/s",
        "dup",
        "missed",
        "late p50",
        "late p99",
        "late max",
        "cmd/ex",
        "evalsha",
        "xact/ex",
        "srv CPU",
        "cli CPU",
        "errors",
        "locked"
    );
    let na = || "n/a".to_owned();
    let opt = |x: Option<f64>, digits: usize| x.map_or_else(na, |x| format!("{x:.digits$}"));
    for f in all {
        let _ = writeln!(
            t,
            "{:<16} {:>7.0} {:>5} {:>13} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>8} {:>8} {:>9} {:>9.3} {:>7} {:>6}",
            f.backend,
            f.executions_per_sec,
            f.duplicates,
            format!("{}/{}", f.misses, f.expected),
            f.late_p50_ms,
            f.late_p99_ms,
            f.late_max_ms,
            opt(f.commands_per_exec, 1),
            opt(f.evalsha_per_exec, 2),
            opt(f.transactions_per_exec, 2),
            opt(f.server_cpu_ms_per_exec, 3),
            f.client_cpu_ms_per_exec,
            f.store_errors,
            f.locked
        );
    }
    let _ = writeln!(
        t,
        "\nexec/s: runs of the window's slots per second; missed: job-slots of the window without a run (first and last second left out); late: handler start minus slot, ms; cmd/ex, evalsha: Redis commands per execution (all, EVALSHA); xact/ex: PostgreSQL transactions per execution; srv CPU, cli CPU: server and worker CPU ms per execution; errors: store calls that failed after the scheduler's retries; locked: store calls that failed with `database is locked`"
    );
    let _ = writeln!(t, "\nfleet targets:");
    let floor = all.iter().find(|f| f.floor);
    for f in all {
        let mut line = format!("  {:<16}", f.backend);
        if f.floor {
            let _ = write!(
                line,
                " | no store: what the machine and the scheduler cost alone, late p99 {:.1} ms",
                f.late_p99_ms
            );
        } else if f.lease_store {
            verdict(
                &mut line,
                "lateness p99 <= 5 ms",
                Some(f.late_p99_ms <= 5.0),
            );
            if let Some(floor) = floor {
                let _ = write!(
                    line,
                    " (floor {:.1} ms, {:+.1})",
                    floor.late_p99_ms,
                    f.late_p99_ms - floor.late_p99_ms
                );
            }
        }
        if let Some(cpu) = f.goals.fleet_server_cpu_ms {
            verdict(
                &mut line,
                &format!("server CPU <= {cpu:.2} ms/exec"),
                f.server_cpu_ms_per_exec.map(|c| c <= cpu),
            );
        }
        if let Some(commands) = f.goals.fleet_commands {
            verdict(
                &mut line,
                &format!("<= {commands:.0} commands/exec"),
                f.commands_per_exec.map(|c| c <= commands),
            );
        }
        if f.goals.fleet_misses_nothing {
            verdict(&mut line, "0 missed", Some(f.misses == 0));
            verdict(&mut line, "0 database is locked", Some(f.locked == 0));
        }
        if !f.lease_store && !f.floor {
            let _ = write!(line, " | claim-only: measured, no target");
        }
        let _ = writeln!(
            t,
            "{line} | duplicates: {} | wins {} losses {} late {}",
            f.duplicates, f.wins, f.losses, f.late
        );
    }
    t
}

/// The `"fleet"` member of `results.json`.
pub(crate) fn json(all: &[FleetFigures], s: &FleetSettings) -> String {
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.4}")
        } else {
            "null".into()
        }
    };
    let opt = |x: Option<f64>| x.map_or_else(|| "null".to_owned(), num);
    let mut out = format!(
        "{{\n    \"processes\": {}, \"jobs_per_process\": {}, \"secs\": {}, \"misses_leave_out\": \"the first and the last second\",\n    \"backends\": [\n",
        s.processes, s.jobs, s.secs
    );
    for (i, f) in all.iter().enumerate() {
        let _ = writeln!(
            out,
            "      {{\"backend\": {:?}, \"lease_store\": {}, \"executions\": {}, \"executions_per_sec\": {}, \"duplicates\": {}, \"expected\": {}, \"misses\": {}, \"lateness_ms\": {{\"p50\": {}, \"p99\": {}, \"max\": {}}}, \"per_execution\": {{\"server_commands\": {}, \"evalsha\": {}, \"server_commands_by_name\": {{{}}}, \"transactions\": {}, \"server_cpu_ms\": {}, \"client_cpu_ms\": {}}}, \"scheduler\": {{\"wins\": {}, \"losses\": {}, \"late\": {}, \"store_errors\": {}}}, \"failed_store_calls\": {}, \"database_is_locked\": {}}}{}",
            f.backend,
            f.lease_store,
            f.executions,
            num(f.executions_per_sec),
            f.duplicates,
            f.expected,
            f.misses,
            num(f.late_p50_ms),
            num(f.late_p99_ms),
            num(f.late_max_ms),
            opt(f.commands_per_exec),
            opt(f.evalsha_per_exec),
            f.commands_by_name
                .iter()
                .map(|(name, per)| format!("{name:?}: {}", num(*per)))
                .collect::<Vec<_>>()
                .join(", "),
            opt(f.transactions_per_exec),
            opt(f.server_cpu_ms_per_exec),
            num(f.client_cpu_ms_per_exec),
            f.wins,
            f.losses,
            f.late,
            f.store_errors,
            f.failed_calls,
            f.locked,
            if i + 1 < all.len() { "," } else { "" }
        );
    }
    out.push_str("    ]\n  }");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_duplicates_misses_and_lateness() {
        let s = FleetSettings {
            processes: 2,
            jobs: 2,
            secs: 4,
            keep: None,
        };
        // Slots 1000..4000; the inner window is 2000 and 3000.
        let text = "\
fleet-0 1000 a 1002.000
fleet-0 2000 a 2001.000
fleet-0 2000 b 2003.000
fleet-1 2000 b 2004.000
fleet-0 3000 a 3002.000
fleet-1 4000 a 4001.000
";
        let f = tally(text, &s, 1000).unwrap();
        assert_eq!(f.executions, 6);
        assert_eq!(f.duplicates, 1);
        assert_eq!(f.expected, 4);
        // fleet-1 at 3000 did not run; 1000 and 4000 are edges.
        assert_eq!(f.misses, 1);
        assert_eq!(f.late_max_ms, 4.0);
    }

    #[test]
    fn server_cpu_counts_new_processes_from_zero() {
        let before = ServerLoad {
            cpu: Some(BTreeMap::from([(1, 1.0), (2, 5.0)])),
            ..ServerLoad::default()
        };
        let after = ServerLoad {
            cpu: Some(BTreeMap::from([(1, 1.5), (3, 0.25)])),
            ..ServerLoad::default()
        };
        assert_eq!(cpu_between(&before, &after), Some(0.75));
    }
}
