//! anarchon's benchmarks: `cargo xtask bench [--quick] [--backends ...]
//! [--fleet-only | --no-fleet] [--fleet-processes K] [--fleet-jobs M]
//! [--fleet-secs D] [--fleet-keep DIR] [--race-finish]`.
//!
//! For each backend, on this machine, in one run: claim throughput and
//! latency with 8 racing instances, round trips per claim (counted by the
//! store where it can), the store's own speed as a baseline (and, where
//! a claim's design makes it do more than that one write, as on Redis
//! `script` and NATS KV, the store's own best at that work), a batch of
//! 1,000 due jobs, firing precision, takeover time and the footprint of an
//! idle instance. Then the fleet ([`fleet`]): K processes of this binary
//! (8 by default), each a scheduler with M per-second jobs (200), for D
//! seconds (20; 5 with `--quick`), on every store a fleet can share.
//! Prints the tables with a verdict per target and writes
//! `target/bench/results.json`. Nothing here asserts a time: a benchmark
//! reports, tests decide.
//!
//! Two hidden subcommands are this binary re-executed by itself: `idle`
//! (the footprint) and `fleet-worker` (one process of a fleet).
//! `redis-instructions` ([`instructions`]) counts, with callgrind, what
//! the Redis `lease` scripts cost Redis in instructions.

mod fleet;
mod instructions;
mod targets;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon_core::{
    Attempt, ClaimOutcome, ClaimRequest, Clock, InstanceId, JobName, LeaseClaim, MaxAttempts,
    Overlap, RunKey, RunOutcome, RunState, Schedule, Scheduler, Slot, SystemClock, Token,
};
use anarchon_testkit::Faulty;
use anyhow::{Context, Result, bail};
use futures::future::join_all;

use crate::targets::{Goals, Target};

struct Settings {
    quick: bool,
    /// `--race-finish`: each winner of the racing claims finishes its run
    /// at once, as a handler that returns at once would, instead of
    /// leaving it running for its lease; the finish is not counted as a
    /// claim, its time is in the race's.
    race_finish: bool,
    racers: usize,
    slots: usize,
    batch_jobs: usize,
    precision_jobs: usize,
    precision_secs: u64,
    takeover_trials: usize,
    idle_jobs: usize,
    idle_secs: u64,
}

impl Settings {
    fn new(quick: bool) -> Self {
        Self {
            quick,
            race_finish: false,
            racers: 8,
            slots: if quick { 100 } else { 2000 },
            batch_jobs: 1000,
            precision_jobs: 1000,
            precision_secs: if quick { 2 } else { 30 },
            takeover_trials: if quick { 2 } else { 20 },
            idle_jobs: 10_000,
            idle_secs: if quick { 2 } else { 60 },
        }
    }
}

/// Every figure for one backend.
#[derive(Default)]
struct Figures {
    backend: String,
    /// What the figures are judged against ([`Target::goals`]).
    goals: Goals,
    counted_by: String,
    claims_per_sec: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    double_wins: usize,
    round_trips_per_claim: f64,
    server_commands_per_claim: Option<f64>,
    lease_store: bool,
    baseline: Option<(String, f64)>,
    /// The store's own best at this backend's claim work, where the
    /// baseline's single write is less than that ([`Target::same_work`]).
    same_work: Option<(String, f64)>,
    batch_jobs: usize,
    batch_round_trips: u64,
    batch_ms: f64,
    lateness_p50_ms: f64,
    lateness_p99_ms: f64,
    lateness_max_ms: f64,
    precision_runs: usize,
    /// Why firing precision was not measured, when the store refused it
    /// ([`Target::check_room`]); its lateness figures are then NaN.
    precision_refused: Option<String>,
    takeover_p50_ms: f64,
    takeover_max_ms: f64,
    takeover_from_cut_max_ms: f64,
    takeover_trials: usize,
    lease_ms: u64,
    heartbeat_ms: u64,
    idle_rss_mib: f64,
    idle_cpu_percent: f64,
    idle_round_trips_per_min: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

fn now_slot_base() -> i64 {
    let now = SystemClock.now().as_millis();
    now - now.rem_euclid(1000) + 3_600_000
}

fn lease_claim(job: &JobName, slot: Slot, who: &InstanceId) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(job.clone(), slot),
            token: Token::generate(),
            instance: who.clone(),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(30),
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    }
}

/// The job every racer of the throughput measurement claims. A store's
/// same-work measurement may read what the race left under it.
pub(crate) const RACE_JOB: &str = "bench-race";

/// 1–3: racing claims, round trips per claim, the store's own speed.
async fn throughput(target: &dyn Target, s: &Settings, f: &mut Figures) -> Result<()> {
    let job = JobName::new(RACE_JOB)?;
    let base = now_slot_base();
    let slots: Vec<Slot> = (0..s.slots as i64)
        .map(|i| Slot::from_millis(base + i * 1000))
        .collect();
    let mut stores = Vec::new();
    for _ in 0..s.racers {
        stores.push(target.instance().await?);
    }
    let before = target.round_trips().await?;
    let commands_before = target.server_commands().await?;
    let start = Instant::now();
    let racers = stores.iter().enumerate().map(|(i, store)| {
        let (job, slots) = (job.clone(), slots.clone());
        async move {
            let who = InstanceId::new(&format!("racer-{i}")).expect("valid id");
            let mut latencies = Vec::with_capacity(slots.len());
            let mut won = Vec::new();
            let lease = store.clone().as_lease_store();
            for slot in slots {
                let t = Instant::now();
                let claim = lease_claim(&job, slot, &who);
                let outcome = match &lease {
                    Some(lease) => lease.claim_lease(&claim).await?,
                    None => store.claim(&claim.claim).await?,
                };
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                if matches!(outcome, ClaimOutcome::Won(_)) {
                    won.push(slot);
                    if let (true, Some(lease)) = (s.race_finish, &lease) {
                        lease
                            .finish(claim.run(), claim.claim.token, RunOutcome::Succeeded)
                            .await?;
                    }
                }
            }
            Ok::<_, anarchon_core::StoreError>((latencies, won))
        }
    });
    let results = join_all(racers).await;
    let elapsed = start.elapsed().as_secs_f64();
    let after = target.round_trips().await?;
    if let (Some(b), Some(a)) = (commands_before, target.server_commands().await?) {
        f.server_commands_per_claim =
            Some(a.saturating_sub(b) as f64 / (s.racers * s.slots) as f64);
    }
    let mut latencies = Vec::new();
    let mut winners: HashMap<Slot, usize> = HashMap::new();
    for r in results {
        let (l, won) = r?;
        latencies.extend(l);
        for slot in won {
            *winners.entry(slot).or_default() += 1;
        }
    }
    let claims = s.racers * s.slots;
    let latencies = sorted(latencies);
    f.claims_per_sec = claims as f64 / elapsed;
    f.claim_p50_ms = percentile(&latencies, 0.5);
    f.claim_p99_ms = percentile(&latencies, 0.99);
    f.double_wins = slots
        .iter()
        .filter(|s| winners.get(s).copied().unwrap_or(0) != 1)
        .count();
    f.round_trips_per_claim = after.saturating_sub(before) as f64 / claims as f64;
    f.baseline = target.baseline(s.racers, claims).await?;
    f.same_work = target.same_work(s.racers, s.slots).await?;
    Ok(())
}

/// 4: one instance with 1,000 jobs due at one slot.
async fn batch(target: &dyn Target, s: &Settings, f: &mut Figures) -> Result<()> {
    let store = target.instance().await?;
    let who = InstanceId::new("batcher")?;
    let slot = Slot::from_millis(now_slot_base() + 7 * 24 * 3_600_000);
    let claims: Vec<LeaseClaim> = (0..s.batch_jobs)
        .map(|i| {
            lease_claim(
                &JobName::new(&format!("batch-{i}")).expect("valid"),
                slot,
                &who,
            )
        })
        .collect();
    let before = target.round_trips().await?;
    let start = Instant::now();
    let outcomes = match store.clone().as_lease_store() {
        Some(lease) => lease.claim_many(&claims).await?.all()?,
        // Claim-only stores have no batch form: the scheduler sends the
        // claims side by side.
        None => {
            let answers = join_all(claims.iter().map(|c| store.claim(&c.claim))).await;
            answers.into_iter().collect::<Result<Vec<_>, _>>()?
        }
    };
    f.batch_ms = start.elapsed().as_secs_f64() * 1000.0;
    let after = target.round_trips().await?;
    if outcomes.iter().any(|o| !matches!(o, ClaimOutcome::Won(_))) {
        bail!("a fresh batch must be won whole");
    }
    f.batch_jobs = s.batch_jobs;
    f.batch_round_trips = after.saturating_sub(before);
    Ok(())
}

/// 5: 1,000 jobs every second on one instance: handler start after the slot.
async fn precision(target: &dyn Target, s: &Settings, f: &mut Figures) -> Result<()> {
    if let Err(refused) = target.check_room(s.precision_jobs, s.precision_secs) {
        eprintln!("  firing precision not measured: {refused:#}");
        f.precision_refused = Some(format!("{refused:#}"));
        (f.lateness_p50_ms, f.lateness_p99_ms, f.lateness_max_ms) = (f64::NAN, f64::NAN, f64::NAN);
        return Ok(());
    }
    let store = target.instance().await?;
    let lateness: Arc<Mutex<Vec<f64>>> = Arc::default();
    let mut b = Scheduler::builder(store);
    for i in 0..s.precision_jobs {
        let lateness = lateness.clone();
        b.job(
            format!("tick-{i}"),
            Schedule::every(Duration::from_secs(1))?,
        )?
        .run(move |ctx| {
            // In microseconds, as the fleet reads it: whole milliseconds
            // would round every start down.
            let late = fleet::now_ms() - ctx.slot().as_millis() as f64;
            lateness.lock().expect("not poisoned").push(late);
            async { Ok::<_, String>(()) }
        })?;
    }
    let scheduler = b.start()?;
    tokio::time::sleep(Duration::from_secs(s.precision_secs)).await;
    scheduler.shutdown().await;
    let l = sorted(lateness.lock().expect("not poisoned").clone());
    f.precision_runs = l.len();
    f.lateness_p50_ms = percentile(&l, 0.5);
    f.lateness_p99_ms = percentile(&l, 0.99);
    f.lateness_max_ms = l.last().copied().unwrap_or(f64::NAN);
    Ok(())
}

/// 6: a runner's connection dies; time from its lease end to the backup's start.
async fn takeover(target: &dyn Target, s: &Settings, f: &mut Figures) -> Result<()> {
    if target.instance().await?.as_lease_store().is_none() {
        return Ok(());
    }
    let lease = Duration::from_millis(1000);
    let heartbeat = Duration::from_millis(250);
    f.lease_ms = lease.as_millis() as u64;
    f.heartbeat_ms = heartbeat.as_millis() as u64;
    let mut delays = Vec::new();
    let mut from_cut = Vec::new();
    for trial in 0..s.takeover_trials {
        type Starts = Vec<(usize, Slot, Attempt, Instant)>;
        let started: Arc<Mutex<Starts>> = Arc::default();
        let mut handles = Vec::new();
        let mut schedulers = Vec::new();
        let job = format!(
            "takeover-{trial}-{:x}",
            Token::generate().as_u128() & 0xffff
        );
        for index in 0..2 {
            let store = Faulty::new(
                target
                    .instance()
                    .await?
                    .as_lease_store()
                    .context("a lease store")?,
            );
            handles.push(store.clone());
            let mut b = Scheduler::builder(store).lease(lease).heartbeat(heartbeat);
            let started = started.clone();
            b.job(&job, Schedule::every(Duration::from_secs(3600))?)?
                .catch_up(Duration::from_secs(3600))
                .run(move |ctx| {
                    started.lock().expect("not poisoned").push((
                        index,
                        ctx.slot(),
                        ctx.attempt(),
                        Instant::now(),
                    ));
                    async move {
                        // Runs until told to stop, and then says so: the
                        // run was not done, so it is handed over.
                        ctx.cancelled().await;
                        Err::<(), _>("stopped early".to_owned())
                    }
                })?;
            schedulers.push(b.start()?);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            if let Some(first) = started.lock().expect("not poisoned").first().cloned() {
                break first;
            }
            if Instant::now() > deadline {
                bail!("no run started");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // Let a heartbeat or two renew the lease, then cut the runner off.
        tokio::time::sleep(heartbeat * 2).await;
        handles[first.0].set_down(true);
        let cut = Instant::now();
        let view = target
            .instance()
            .await?
            .as_lease_store()
            .context("a lease store")?
            .peek(&RunKey::new(JobName::new(&job)?, first.1))
            .await?;
        let asked = Instant::now();
        let RunState::Running { lease_until, .. } = view.state else {
            bail!("the run is not running: {:?}", view.state);
        };
        let lease_end = asked + lease_until.since(view.store_now);
        let taken = loop {
            if let Some(t) = started
                .lock()
                .expect("not poisoned")
                .iter()
                .find(|(_, _, attempt, _)| attempt.get() > 1)
                .map(|(_, _, _, at)| *at)
            {
                break t;
            }
            if Instant::now() > deadline {
                bail!("no takeover");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        delays.push(taken.saturating_duration_since(lease_end).as_secs_f64() * 1000.0);
        from_cut.push(taken.saturating_duration_since(cut).as_secs_f64() * 1000.0);
        for s in schedulers {
            drop(s);
        }
    }
    let d = sorted(delays);
    f.takeover_trials = d.len();
    f.takeover_p50_ms = percentile(&d, 0.5);
    f.takeover_max_ms = d.last().copied().unwrap_or(f64::NAN);
    let c = sorted(from_cut);
    f.takeover_from_cut_max_ms = c.last().copied().unwrap_or(f64::NAN);
    Ok(())
}

/// 7: an idle instance with 10,000 hourly jobs, in a process of its own.
fn footprint(backend: &str, s: &Settings, f: &mut Figures) -> Result<()> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([
            "idle",
            backend,
            &s.idle_jobs.to_string(),
            &s.idle_secs.to_string(),
        ])
        .output()
        .context("running the idle instance")?;
    if !out.status.success() {
        bail!(
            "idle instance failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Result<f64> {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .with_context(|| format!("idle instance did not report {name}: {text}"))?
            .parse()
            .context("a number")
    };
    f.idle_rss_mib = field("rss_mib")?;
    f.idle_cpu_percent = field("cpu_percent")?;
    f.idle_round_trips_per_min = field("round_trips_per_min")?;
    Ok(())
}

fn read_proc(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

async fn idle(backend: &str, jobs: usize, secs: u64) -> Result<()> {
    let target = make_target(backend, None).await?;
    let store = target.instance().await?;
    let mut b = Scheduler::builder(store);
    for i in 0..jobs {
        b.job(format!("idle-{i}"), Schedule::cron("0 * * * *")?)?
            .run(|_| async { Ok::<_, String>(()) })?;
    }
    // Keep the top of the hour out of the window, so nothing is due in it.
    let into_hour = SystemClock.now().as_millis().rem_euclid(3_600_000) as u64;
    if into_hour + (secs + 5) * 1000 > 3_600_000 {
        tokio::time::sleep(Duration::from_millis(3_600_000 - into_hour + 2000)).await;
    }
    let scheduler = b.start()?;
    // Let start-up settle before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rt0 = target.round_trips().await?;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let cpu = cpu_seconds() - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let rt = target.round_trips().await?.saturating_sub(rt0);
    let rss_kib = read_proc("VmRSS:").unwrap_or(f64::NAN);
    println!(
        "rss_mib={:.1} cpu_percent={:.2} round_trips_per_min={:.1}",
        rss_kib / 1024.0,
        100.0 * cpu / wall,
        rt as f64 * 60.0 / wall
    );
    scheduler.shutdown().await;
    target.cleanup().await;
    Ok(())
}

fn env_url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| default.into())
}

fn redis_url() -> String {
    env_url("ANARCHON_REDIS_URL", "redis://127.0.0.1:6379")
}

/// The backends [`make_target`] knows, in the order a full run measures
/// them (`--backends` picks some).
const BACKENDS: &str =
    "memory, sqlite, postgres, redis-lease, redis-stream-id, redis-script, rabbitmq, nats, nats-kv";

/// The backend `name`, in a namespace of its own, or in `namespace` (the
/// one [`Target::namespace`] of another handle named: a fleet process joins
/// its coordinator's).
async fn make_target(name: &str, namespace: Option<&str>) -> Result<Box<dyn Target>> {
    Ok(match name {
        "memory" => Box::new(targets::Memory::new()),
        "floor" => Box::new(targets::Floor::new()),
        "sqlite" => Box::new(targets::Sqlite::new(namespace)?),
        "postgres" | "pg" => Box::new(
            targets::Postgres::new(
                std::env::var("ANARCHON_PG_URL")
                    .ok()
                    .filter(|u| !u.trim().is_empty())
                    .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into()),
                namespace,
            )
            .await?,
        ),
        "redis-lease" => Box::new(targets::Redis::new(
            redis_url(),
            targets::RedisStrategy::Lease,
            namespace,
        )),
        "redis-stream-id" => Box::new(targets::Redis::new(
            redis_url(),
            targets::RedisStrategy::StreamId,
            namespace,
        )),
        "redis-script" => Box::new(targets::Redis::new(
            redis_url(),
            targets::RedisStrategy::Script,
            namespace,
        )),
        "rabbitmq" | "amqp" => Box::new(targets::Amqp::new(
            env_url("ANARCHON_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
            namespace,
        )),
        "nats" => Box::new(targets::Nats::new(
            env_url("ANARCHON_NATS_URL", "nats://127.0.0.1:4222"),
            namespace,
        )),
        "nats-kv" => Box::new(targets::NatsKv::new(
            env_url("ANARCHON_NATS_URL", "nats://127.0.0.1:4222"),
            namespace,
        )),
        other => bail!("unknown backend {other:?}: {BACKENDS}"),
    })
}

fn table(all: &[Figures], s: &Settings) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nanarchon benchmarks ({}; {} racing instances, {} slots{}; {} jobs for precision over {} s; {} takeover trials)\n",
        if s.quick { "quick" } else { "full" },
        s.racers,
        s.slots,
        if s.race_finish {
            ", each win finished at once"
        } else {
            ""
        },
        s.precision_jobs,
        s.precision_secs,
        s.takeover_trials
    );
    let _ = writeln!(
        t,
        "{:<16} {:>9} {:>7} {:>7} {:>8} {:>9} {:>10} {:>6} {:>12} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7} {:>5} {:>9}",
        "backend",
        "claims/s",
        "p50 ms",
        "p99 ms",
        "rt/claim",
        "cmd/claim",
        "baseline/s",
        "ratio",
        "batch rt/ms",
        "late p50",
        "late p99",
        "late max",
        "takeover",
        "tk max",
        "RSS MiB",
        "CPU%",
        "idle rt/m"
    );
    let na = || "n/a".to_owned();
    for f in all {
        let (base, ratio) = match &f.baseline {
            Some((_, b)) => (format!("{b:.0}"), format!("{:.2}", f.claims_per_sec / b)),
            None => (na(), na()),
        };
        let (tk, tk_max) = if f.lease_store {
            (
                format!("{:.0}", f.takeover_p50_ms),
                format!("{:.0}", f.takeover_max_ms),
            )
        } else {
            (na(), na())
        };
        let _ = writeln!(
            t,
            "{:<16} {:>9.0} {:>7.2} {:>7.2} {:>8.2} {:>9} {:>10} {:>6} {:>12} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>8} {:>7.1} {:>5.2} {:>9.1}",
            f.backend,
            f.claims_per_sec,
            f.claim_p50_ms,
            f.claim_p99_ms,
            f.round_trips_per_claim,
            f.server_commands_per_claim
                .map_or_else(na, |c| format!("{c:.2}")),
            base,
            ratio,
            format!("{}/{:.0}", f.batch_round_trips, f.batch_ms),
            f.lateness_p50_ms,
            f.lateness_p99_ms,
            f.lateness_max_ms,
            tk,
            tk_max,
            f.idle_rss_mib,
            f.idle_cpu_percent,
            f.idle_round_trips_per_min
        );
    }
    let _ = writeln!(
        t,
        "\nrt/claim: round trips per claim; cmd/claim: commands the server ran for the client per claim; takeover: ms from the lease end to the backup's handler start (p50, max)"
    );
    let _ = writeln!(t, "\ntargets:");
    // MemoryStore's lateness is the scheduler's own on this machine: shown
    // beside a store's lateness that misses its target.
    let floor = all
        .iter()
        .find(|f| f.backend == "memory")
        .map(|f| f.lateness_p99_ms)
        .filter(|p99| p99.is_finite());
    for f in all {
        let mut line = format!("  {:<16}", f.backend);
        let mut target = |name: &str, met: Option<bool>| verdict(&mut line, name, met);
        target(
            "one round trip per claim",
            f.goals
                .one_round_trip
                .then_some(f.round_trips_per_claim <= 1.05),
        );
        let batch_rt = f.goals.batch_round_trips;
        target(
            &format!(
                "batch in {batch_rt} round trip{}",
                if batch_rt == 1 { "" } else { "s" }
            ),
            f.lease_store.then_some(f.batch_round_trips <= batch_rt),
        );
        target(
            "claims/s >= half the store's own",
            f.baseline
                .as_ref()
                .map(|(_, b)| f.claims_per_sec >= 0.5 * b),
        );
        if let Some(rate) = f.goals.claim_rate {
            target(
                &format!("claims/s >= {rate}"),
                Some(f.claims_per_sec >= f64::from(rate)),
            );
        }
        let lateness = f.goals.lateness_p99_ms;
        target(
            &format!("lateness p99 <= {lateness} ms"),
            f.precision_refused
                .is_none()
                .then_some(f.lateness_p99_ms <= lateness),
        );
        target(
            "takeover <= lease + heartbeat + 100 ms",
            f.lease_store.then_some(
                f.takeover_from_cut_max_ms <= (f.lease_ms + f.heartbeat_ms + 100) as f64,
            ),
        );
        target("idle <= 64 MiB", Some(f.idle_rss_mib <= 64.0));
        target(
            "no idle store traffic",
            Some(f.idle_round_trips_per_min < 0.5),
        );
        let _ = writeln!(t, "{line} | double wins: {}", f.double_wins);
        if let Some((what, rate)) = &f.same_work {
            let _ = writeln!(
                t,
                "{:<18} the store's own best at this claim's work ({what}): {rate:.0}/s; claims reach {:.2} of it",
                "",
                f.claims_per_sec / rate
            );
        }
        if let Some(floor) = floor.filter(|_| f.backend != "memory" && f.lateness_p99_ms > lateness)
        {
            let _ = writeln!(
                t,
                "{:<18} lateness p99 of the scheduler alone (memory, this run): {floor:.1} ms",
                ""
            );
        }
        let _ = writeln!(t, "{:<18} round trips counted by {}", "", f.counted_by);
    }
    t
}

/// Appends one target's verdict to a line of the targets list: met, NOT
/// MET, or n/a (the target does not apply, or the figure is missing).
fn verdict(line: &mut String, name: &str, met: Option<bool>) {
    let verdict = match met {
        Some(true) => "met",
        Some(false) => "NOT MET",
        None => "n/a",
    };
    let _ = write!(line, " | {name}: {verdict}");
}

/// `text` as a JSON string: quoted, with quotes, backslashes and control
/// characters escaped.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The results file: the single-process figures of `all`, the fleet's
/// (`fleet_part`, already JSON) and the measurements that failed, each
/// with what was measured and why it failed, so that a file read on its
/// own says what it lacks.
fn json(
    all: &[Figures],
    s: &Settings,
    fleet_part: Option<String>,
    failed: &[(String, String)],
) -> String {
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "null".into()
        }
    };
    let mut out = format!(
        "{{\n  \"quick\": {},\n  \"machine\": {{\"cores\": {}}},\n  \"backends\": [\n",
        s.quick,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (i, f) in all.iter().enumerate() {
        let baseline = match &f.baseline {
            Some((what, rate)) => {
                format!(
                    "{{\"what\": {}, \"ops_per_sec\": {}}}",
                    json_string(what),
                    num(*rate)
                )
            }
            None => "null".into(),
        };
        let same_work = match &f.same_work {
            Some((what, rate)) => {
                format!(
                    "{{\"what\": {}, \"claims_per_sec\": {}}}",
                    json_string(what),
                    num(*rate)
                )
            }
            None => "null".into(),
        };
        let _ = writeln!(
            out,
            "    {{\"backend\": {}, \"round_trips_counted_by\": {}, \"claims_per_sec\": {}, \"claim_p50_ms\": {}, \"claim_p99_ms\": {}, \"double_wins\": {}, \"round_trips_per_claim\": {}, \"server_commands_per_claim\": {}, \"lease_store\": {}, \"baseline\": {}, \"same_work\": {}, \"batch\": {{\"jobs\": {}, \"round_trips\": {}, \"ms\": {}}}, \"lateness_ms\": {{\"runs\": {}, \"p50\": {}, \"p99\": {}, \"max\": {}}}, \"takeover_after_lease_end_ms\": {{\"trials\": {}, \"lease_ms\": {}, \"heartbeat_ms\": {}, \"p50\": {}, \"max\": {}, \"max_after_the_runner_was_cut_off\": {}}}, \"idle\": {{\"rss_mib\": {}, \"cpu_percent\": {}, \"round_trips_per_min\": {}}}}}{}",
            json_string(&f.backend),
            json_string(&f.counted_by),
            num(f.claims_per_sec),
            num(f.claim_p50_ms),
            num(f.claim_p99_ms),
            f.double_wins,
            num(f.round_trips_per_claim),
            f.server_commands_per_claim
                .map_or_else(|| "null".to_owned(), num),
            f.lease_store,
            baseline,
            same_work,
            f.batch_jobs,
            f.batch_round_trips,
            num(f.batch_ms),
            f.precision_runs,
            num(f.lateness_p50_ms),
            num(f.lateness_p99_ms),
            num(f.lateness_max_ms),
            f.takeover_trials,
            f.lease_ms,
            f.heartbeat_ms,
            num(f.takeover_p50_ms),
            num(f.takeover_max_ms),
            num(f.takeover_from_cut_max_ms),
            num(f.idle_rss_mib),
            num(f.idle_cpu_percent),
            num(f.idle_round_trips_per_min),
            if i + 1 < all.len() { "," } else { "" }
        );
    }
    out.push_str("  ],\n  \"fleet\": ");
    out.push_str(fleet_part.as_deref().unwrap_or("null"));
    out.push_str(",\n  \"failed\": [");
    for (i, (what, why)) in failed.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"what\": {}, \"error\": {}}}",
            if i == 0 { "" } else { "," },
            json_string(what),
            json_string(why)
        );
    }
    out.push_str(if failed.is_empty() {
        "]\n}\n"
    } else {
        "\n  ]\n}\n"
    });
    out
}

async fn measure(target: &dyn Target, s: &Settings, f: &mut Figures) -> Result<()> {
    eprintln!("  racing claims");
    throughput(target, s, f).await?;
    eprintln!("  batch");
    batch(target, s, f).await?;
    eprintln!("  firing precision");
    precision(target, s, f).await?;
    eprintln!("  takeover");
    takeover(target, s, f).await?;
    eprintln!("  idle footprint");
    footprint(target.name(), s, f)
}

/// The value after `flag`; `None` when the flag is absent, an error when
/// it is the last argument.
pub(crate) fn value_arg<'a>(args: &'a [String], flag: &str) -> Result<Option<&'a str>> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .map(|v| Some(v.as_str()))
            .with_context(|| format!("{flag} needs a value")),
        None => Ok(None),
    }
}

/// The number after `flag`, or `default` when the flag is absent.
fn number_arg<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> Result<T> {
    match value_arg(args, flag)? {
        Some(v) => v
            .parse()
            .ok()
            .with_context(|| format!("{flag} needs a number")),
        None => Ok(default),
    }
}

async fn run_all(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let fleet_only = args.iter().any(|a| a == "--fleet-only");
    let no_fleet = args.iter().any(|a| a == "--no-fleet");
    if fleet_only && no_fleet {
        bail!("--fleet-only and --no-fleet exclude each other");
    }
    let chosen: Option<Vec<String>> = value_arg(args, "--backends")?.map(|list| {
        list.split(',')
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty())
            .collect()
    });
    let backends: Vec<String> = match (&chosen, fleet_only) {
        (_, true) => Vec::new(),
        (Some(list), false) => {
            if list.iter().any(|b| b == "floor") {
                eprintln!(
                    "the single-process part leaves floor out: it is a fleet without a store"
                );
            }
            list.iter().filter(|b| *b != "floor").cloned().collect()
        }
        (None, false) => BACKENDS.split(", ").map(String::from).collect(),
    };
    let fleet_backends: Vec<String> = if no_fleet {
        Vec::new()
    } else {
        match &chosen {
            // MemoryStore lives in one process: a fleet cannot share it.
            Some(list) => {
                if list.iter().any(|b| b == "memory") {
                    eprintln!("the fleet leaves memory out: a MemoryStore lives in one process");
                }
                list.iter().filter(|b| *b != "memory").cloned().collect()
            }
            None => fleet::FLEET_BACKENDS
                .split(", ")
                .map(String::from)
                .collect(),
        }
    };
    // A misspelt name is refused before anything is measured, not after
    // the other backends' half hour.
    if let Some(unknown) = backends
        .iter()
        .chain(&fleet_backends)
        .find(|b| !is_backend(b))
    {
        bail!("unknown backend {unknown:?}: {BACKENDS}, or floor (the fleet alone)");
    }
    let defaults = fleet::FleetSettings::new(quick);
    let fleet_settings = fleet::FleetSettings {
        processes: number_arg(args, "--fleet-processes", defaults.processes)?,
        jobs: number_arg(args, "--fleet-jobs", defaults.jobs)?,
        secs: number_arg(args, "--fleet-secs", defaults.secs)?,
        keep: value_arg(args, "--fleet-keep")?.map(std::path::PathBuf::from),
    };
    if fleet_settings.processes == 0 || fleet_settings.jobs == 0 || fleet_settings.secs < 3 {
        bail!("a fleet needs at least 1 process, 1 job and 3 seconds");
    }
    let out_path = value_arg(args, "--out")?
        .unwrap_or("target/bench/results.json")
        .to_owned();
    let s = Settings {
        race_finish: args.iter().any(|a| a == "--race-finish"),
        ..Settings::new(quick)
    };
    // A backend whose measurement fails is reported at the end; the others
    // are still measured, printed and written (a store that stops
    // answering halfway through a long run costs only its own figures).
    let mut failed: Vec<(String, String)> = Vec::new();
    let mut fail = |what: String, e: anyhow::Error| {
        eprintln!("== {what}: FAILED: {e:#} (going on with the next) ==");
        failed.push((what, format!("{e:#}")));
    };
    let mut all = Vec::new();
    for name in &backends {
        eprintln!("== {name} ==");
        match single_process(name, &s).await {
            Ok(f) => {
                // The other figures stand; the refused one is listed as failed.
                if let Some(why) = &f.precision_refused {
                    fail(
                        format!("{name}: firing precision"),
                        anyhow::anyhow!("{why}"),
                    );
                }
                all.push(f)
            }
            Err(e) => fail(name.clone(), e),
        }
    }
    let mut fleet_all = Vec::new();
    for name in &fleet_backends {
        eprintln!(
            "== fleet: {name} ({} processes × {} jobs, {} s) ==",
            fleet_settings.processes, fleet_settings.jobs, fleet_settings.secs
        );
        match fleet::measure(name, &fleet_settings).await {
            Ok(f) => fleet_all.push(f),
            Err(e) => fail(format!("fleet: {name}"), e),
        }
    }
    if !all.is_empty() {
        println!("{}", table(&all, &s));
    }
    if !fleet_all.is_empty() {
        println!("{}", fleet::table(&fleet_all, &fleet_settings));
    }
    if let Some(dir) = std::path::Path::new(&out_path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let fleet_part = (!fleet_all.is_empty()).then(|| fleet::json(&fleet_all, &fleet_settings));
    std::fs::write(&out_path, json(&all, &s, fleet_part, &failed))?;
    println!("results written to {out_path}");
    if !failed.is_empty() {
        bail!(
            "{} measurement(s) failed, so the results lack them (and list them under \"failed\"):\n  {}",
            failed.len(),
            failed
                .iter()
                .map(|(what, why)| format!("{what}: {why}"))
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    Ok(())
}

/// Whether `name` names a backend [`make_target`] knows: one of
/// [`BACKENDS`], or `pg` / `amqp` for PostgreSQL / RabbitMQ.
fn is_backend(name: &str) -> bool {
    matches!(name, "pg" | "amqp" | "floor") || BACKENDS.split(", ").any(|known| known == name)
}

/// The single-process figures of backend `name`; what the measurement
/// stored is cleaned up even when a figure failed.
async fn single_process(name: &str, s: &Settings) -> Result<Figures> {
    let target = make_target(name, None).await?;
    let mut f = Figures {
        backend: target.name().into(),
        goals: target.goals(),
        counted_by: target.counted_by().into(),
        lease_store: target.instance().await?.as_lease_store().is_some(),
        ..Figures::default()
    };
    let measured = measure(target.as_ref(), s, &mut f).await;
    target.cleanup().await;
    measured.map(|()| f)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("idle") {
        let backend = args.get(1).context("idle BACKEND JOBS SECS")?;
        let jobs = args.get(2).context("idle BACKEND JOBS SECS")?.parse()?;
        let secs = args.get(3).context("idle BACKEND JOBS SECS")?.parse()?;
        return idle(backend, jobs, secs).await;
    }
    if args.first().map(String::as_str) == Some("fleet-worker") {
        return fleet::worker(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("redis-instructions") {
        return instructions::run(&args[1..]).await;
    }
    run_all(&args).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The results file parses as JSON and names each failed measurement
    /// with its error, whatever characters the error holds.
    #[test]
    fn results_list_the_measurements_that_failed() {
        let s = Settings::new(true);
        let why = "connection refused: \"127.0.0.1:5672\"\n\tat C:\\path \u{1b}[0m";
        let failed = vec![
            ("fleet: rabbitmq".to_owned(), why.to_owned()),
            ("nats".to_owned(), "timed out".to_owned()),
        ];
        let written = json(&[], &s, None, &failed);
        let read: serde_json::Value = serde_json::from_str(&written).expect(&written);
        assert_eq!(read["failed"][0]["what"], "fleet: rabbitmq");
        assert_eq!(read["failed"][0]["error"], why);
        assert_eq!(read["failed"][1]["what"], "nats");
        assert_eq!(read["failed"].as_array().map(Vec::len), Some(2));
        let none: serde_json::Value =
            serde_json::from_str(&json(&[], &s, None, &[])).expect("valid JSON");
        assert_eq!(none["failed"], serde_json::json!([]));
    }

    fn figures(backend: &str, claims_per_sec: f64, late_p99: f64) -> Figures {
        Figures {
            backend: backend.to_owned(),
            claims_per_sec,
            lateness_p99_ms: late_p99,
            ..Figures::default()
        }
    }

    /// A lease store's batch is judged against the round trips its
    /// design takes for any number of jobs (its goal): one, or NATS KV's
    /// three.
    #[test]
    fn a_batch_is_judged_by_the_round_trips_of_its_store() {
        let s = Settings::new(true);
        let batch = |backend: &str, round_trips: u64, goal: u64| Figures {
            lease_store: true,
            batch_round_trips: round_trips,
            goals: Goals {
                batch_round_trips: goal,
                ..Goals::default()
            },
            ..figures(backend, 1000.0, 4.0)
        };
        let printed = table(
            &[
                batch("postgres", 1, 1),
                batch("sqlite", 2, 1),
                batch("nats-kv", 3, 3),
                batch("redis-lease", 4, 1),
            ],
            &s,
        );
        let verdict_of = |backend: &str| {
            printed
                .lines()
                .find(|l| l.starts_with(&format!("  {backend} ")))
                .and_then(|l| l.split(" | ").find(|v| v.starts_with("batch in ")))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no batch verdict for {backend}: {printed}"))
        };
        assert_eq!(verdict_of("postgres"), "batch in 1 round trip: met");
        assert_eq!(verdict_of("sqlite"), "batch in 1 round trip: NOT MET");
        assert_eq!(verdict_of("nats-kv"), "batch in 3 round trips: met");
        assert_eq!(verdict_of("redis-lease"), "batch in 1 round trip: NOT MET");
    }

    /// A strategy's own ceiling is printed beside its ratio and written
    /// to the results; the scheduler's own lateness (MemoryStore's) is
    /// printed beside a store that misses the lateness target, and only
    /// there. What each measured reaches the results file as written,
    /// whatever characters it holds.
    #[test]
    fn targets_show_the_ceiling_and_the_floor_beside_a_miss() {
        let s = Settings::new(true);
        let mut script = figures("redis-script", 3000.0, 4.2);
        let baseline_what = "EVALSHA of \"SET NX\"\t\u{1b}";
        script.baseline = Some((baseline_what.into(), 60_000.0));
        script.same_work = Some(("a bare script".into(), 4000.0));
        let all = [
            figures("memory", 1e6, 4.1),
            script,
            figures("nats", 15_000.0, 6.0),
            figures("postgres", 4000.0, 4.9),
        ];
        let printed = table(&all, &s);
        assert!(
            printed.contains(
                "own best at this claim's work (a bare script): 4000/s; claims reach 0.75 of it"
            ),
            "{printed}"
        );
        let floors: Vec<&str> = printed
            .lines()
            .filter(|l| l.contains("scheduler alone (memory, this run): 4.1 ms"))
            .collect();
        assert_eq!(floors.len(), 1, "{printed}");
        let nats_at = printed.find("  nats ").expect("nats has a targets line");
        let floor_at = printed.find(floors[0]).expect("printed");
        assert!(
            floor_at > nats_at,
            "the floor follows nats' line: {printed}"
        );
        let read: serde_json::Value =
            serde_json::from_str(&json(&all, &s, None, &[])).expect("valid JSON");
        assert_eq!(read["backends"][1]["same_work"]["claims_per_sec"], 4000.0);
        assert_eq!(read["backends"][0]["same_work"], serde_json::Value::Null);
        assert_eq!(read["backends"][1]["baseline"]["what"], baseline_what);
    }
}
