#![doc = include_str!("../README.md")]

mod alerts;
mod app;
mod audit;
mod backend;
mod config;
mod control;
mod error;
mod http;
mod printable;
mod runner;
mod show;

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anarchon::url::redact;
use anarchon::{JobName, Opened, Schedule, StoreUrl, Timestamp, Until};
use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::config::{Crontab, DEFAULT_STORE};
use crate::error::Error;
use crate::runner::Orphans;

/// Leaderless distributed cron: every instance runs the same crontab, and
/// for each run exactly one of them wins it.
#[derive(Debug, Parser)]
#[command(name = "anarchon", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the crontab's jobs until Ctrl-C, SIGTERM or SIGHUP.
    Run {
        /// The crontab (TOML).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The store URL; overrides the crontab's `store` (default
        /// sqlite://anarchon.db). Schemes: sqlite, postgres, redis, amqp,
        /// nats, nats-kv (an unknown one is refused with the full list).
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Show recent runs: slot, state, attempt, instance, duration, error.
    History {
        /// Only this job (default: every job in the store).
        job: Option<String>,
        /// Read the store URL from this crontab.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The store URL (default sqlite://anarchon.db): a lease store;
        /// claim-only stores keep no history.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// How many runs to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        /// Print JSON (an array of runs, newest first) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pause a job (or every job) for the whole fleet: its slots are
    /// recorded `paused` and run nowhere until it is resumed or the pause
    /// ends. Runs already going are not stopped.
    Pause {
        /// The job (or --all).
        job: Option<String>,
        /// Pause every job of the store.
        #[arg(long)]
        all: bool,
        /// End the pause after this long, on the store's clock (e.g. `2h`).
        #[arg(long = "for", value_name = "DURATION", conflicts_with = "until")]
        length: Option<humantime::Duration>,
        /// End the pause at this time (RFC 3339, e.g.
        /// `2026-12-24T06:00:00Z`), on the store's clock.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Why, shown by `status`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Who (default: $USER@host).
        #[arg(long, value_name = "WHO")]
        by: Option<String>,
        #[command(flatten)]
        place: Place,
    },
    /// Remove the pause of a job (or of every job). Slots recorded
    /// `paused` are not run afterwards.
    Resume {
        /// The job (or --all).
        job: Option<String>,
        /// Remove the pause of every job.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        place: Place,
    },
    /// Run a job now, once, on one instance of the fleet that has it: a
    /// manual run, beside the schedule. The same --id twice is one run.
    Trigger {
        /// The job.
        job: String,
        /// The request's id (letters, digits, `.` `_` `:` `-`; default: a
        /// new random one). Send the same id again and no second run
        /// starts.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Who asked (default: $USER@host).
        #[arg(long, value_name = "WHO")]
        by: Option<String>,
        /// Wait for the run to end; exit 0 if it succeeded, 1 otherwise.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        place: Place,
    },
    /// Run the slots of a past range that never ran (no record, or
    /// missed), once each, oldest first, one at a time, on the fleet.
    Backfill {
        /// The job.
        job: String,
        /// The range's start (RFC 3339), included.
        #[arg(long, value_name = "TIME")]
        from: String,
        /// The range's end (RFC 3339), included; not after the store's
        /// clock.
        #[arg(long, value_name = "TIME")]
        to: String,
        /// The request's id (default: a new random one). The same id again
        /// is the same backfill.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Who asked (default: $USER@host).
        #[arg(long, value_name = "WHO")]
        by: Option<String>,
        /// Backfill a range that starts before the history retention: the
        /// records of those slots may be gone, and slots that ran would run
        /// again.
        #[arg(long)]
        force: bool,
        /// Wait until every slot of the range has ended; exit 0 if none
        /// failed, 1 otherwise. Needs --config, for the job's schedule.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        place: Place,
    },
    /// Show each job's pause, last finished run, the run holding a lease
    /// now, pending manual runs and (with --config) the next slot.
    Status {
        /// Only this job (default: the crontab's jobs, or the store's).
        job: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// How many of each job's latest runs to read.
        #[arg(short = 'n', long, default_value_t = 20)]
        recent: usize,
        #[command(flatten)]
        place: Place,
    },
    /// Compare the slots each job of the crontab should have had in the
    /// window with what the store recorded; list the slots that have no
    /// record (no instance was up) or ended failed, interrupted or missed.
    /// Exit status 1 when it lists any.
    Audit {
        /// How far back to look (e.g. `24h`, `7d`).
        #[arg(long, value_name = "DURATION", default_value = "24h")]
        since: humantime::Duration,
        /// The crontab: the jobs and their schedules.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The store URL (default: the crontab's, or $ANARCHON_STORE).
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the next slots of a cron expression, to check it before
    /// deploying it.
    Next {
        /// The cron expression: 5 fields, or 6 with seconds first.
        cron: String,
        /// The IANA time zone it is read in.
        #[arg(long, value_name = "ZONE", default_value = "UTC")]
        tz: String,
        /// How many slots.
        #[arg(short = 'n', long, default_value_t = 5)]
        count: usize,
    },
    /// Check a crontab, and the store URL's form, without running anything
    /// or opening the store.
    Check {
        /// The crontab (TOML).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The store URL to check the options against.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
}

/// Where the store of `pause`, `resume` and `status` is.
#[derive(Debug, clap::Args)]
struct Place {
    /// Read the store URL (and the job names) from this crontab.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The store URL (default sqlite://anarchon.db, or $ANARCHON_STORE):
    /// a lease store.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

impl Place {
    fn as_where(&self) -> control::Where<'_> {
        control::Where {
            config: self.config.as_deref(),
            store: self.store.clone(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "anarchon: error: cannot start the async runtime: {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "anarchon: error: {}", error_text(&e));
            let configuration = e
                .downcast_ref::<Error>()
                .is_some_and(Error::is_configuration);
            ExitCode::from(if configuration { 2 } else { 1 })
        }
    }
}

/// The error and its causes on one line, like `{:#}`, but without a cause
/// whose text the line already has: most errors here show their source in
/// their own message.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if message.is_empty() || text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// The log filter for `ANARCHON_LOG` (`info` when unset). RabbitMQ's
/// client logs a warning, with the whole message, for every publish the
/// broker returns unroutable; the RabbitMQ store publishes such probes on
/// purpose (a losing claim asks whether its token left the winner's mark),
/// so those warnings are off unless the setting names `lapin` itself.
fn log_filter(setting: Option<&str>) -> String {
    let setting = setting.map(str::trim).filter(|s| !s.is_empty());
    match setting {
        Some(s) if s.contains("lapin") => s.to_owned(),
        Some(s) => format!("{s},lapin::returned_messages=error"),
        None => "info,lapin::returned_messages=error".to_owned(),
    }
}

fn init_logging() {
    let setting = std::env::var("ANARCHON_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(setting.as_deref()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_filter(None)));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn dispatch(command: Cmd) -> anyhow::Result<()> {
    match command {
        Cmd::Run { config, store } => run(&config, store).await,
        Cmd::History {
            job,
            config,
            store,
            limit,
            json,
        } => history(job, config.as_deref(), store, limit, json).await,
        Cmd::Next { cron, tz, count } => {
            let schedule = Schedule::cron_in(&cron, &tz)
                .map_err(|source| Error::config(None, None, source))?;
            write_out(&show::next_slots(&schedule, now(), count))
        }
        Cmd::Check { config, store } => check(&config, store),
        Cmd::Audit {
            since,
            config,
            store,
            json,
        } => audit(&config, store, since.into(), json).await,
        Cmd::Pause {
            job,
            all,
            length,
            until,
            reason,
            by,
            place,
        } => {
            let until = match (length, until) {
                (Some(d), _) => Until::For(d.into()),
                (None, Some(text)) => Until::At(parse_time(&text)?),
                (None, None) => Until::Resumed,
            };
            control::pause(
                control::Target { job, all },
                until,
                reason,
                by,
                place.as_where(),
            )
            .await
        }
        Cmd::Resume { job, all, place } => {
            control::resume(control::Target { job, all }, place.as_where()).await
        }
        Cmd::Trigger {
            job,
            id,
            by,
            wait,
            place,
        } => control::trigger(control::Ask { job, id, by }, wait, place.as_where()).await,
        Cmd::Backfill {
            job,
            from,
            to,
            id,
            by,
            force,
            wait,
            place,
        } => {
            let range = anarchon::Backfill::new(parse_time(&from)?, parse_time(&to)?)
                .map_err(|e| Error::RequestRefused(e.to_string()))?;
            let ask = control::Ask { job, id, by };
            control::backfill(ask, range, force, wait, place.as_where()).await
        }
        Cmd::Status {
            job,
            json,
            recent,
            place,
        } => control::status(job, json, recent, place.as_where()).await,
    }
}

/// An RFC 3339 time from the command line.
fn parse_time(text: &str) -> Result<Timestamp, Error> {
    let at = chrono::DateTime::parse_from_rfc3339(text).map_err(|_| Error::BadTime {
        text: text.to_owned(),
    })?;
    Ok(Timestamp::from_datetime(&at))
}

fn now() -> Timestamp {
    Timestamp::from_datetime(&chrono::Utc::now())
}

/// The store URL: `--store`, else the crontab's, else the default.
/// The environment variable that may hold the store URL, so that a URL
/// with a password need not be on the command line (where `ps` shows it)
/// nor in the crontab.
const STORE_ENV: &str = "ANARCHON_STORE";

fn store_url(flag: Option<String>, crontab: Option<&Crontab>) -> String {
    flag.or_else(|| std::env::var(STORE_ENV).ok().filter(|v| !v.is_empty()))
        .or_else(|| crontab.and_then(|c| c.store.clone()))
        .unwrap_or_else(|| DEFAULT_STORE.to_owned())
}

async fn run(path: &Path, store: Option<String>) -> anyhow::Result<()> {
    let crontab = Crontab::load(path)?;
    let url = store_url(store, Some(&crontab));
    let parsed = StoreUrl::parse(&url).map_err(Error::from)?;
    // Everything the core would refuse — lease-only options on a
    // claim-only store included — is found before the store is opened (or
    // a SQLite file created, or a server contacted).
    validate(&crontab, &parsed)?;
    if crontab.jobs.is_empty() {
        tracing::warn!(config = %path.display(), "the crontab has no [[job]]: nothing to run");
    }
    let opened = parsed
        .open()
        .await
        .map_err(Error::from)
        .with_context(|| format!("cannot open the store {}", redact(&url)))?;
    // The recorder goes in before the scheduler starts, so that no event
    // of its is lost.
    let server = match crontab.http {
        Some(addr) => {
            let served = match http::install_recorder() {
                Ok(recorder) => {
                    http::serve(
                        addr,
                        recorder,
                        opened.claim_store(),
                        opened.lease_store(),
                        &crontab,
                        parsed.backend(),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match served {
                Ok(server) => Some(server),
                Err(e) => {
                    opened.close().await;
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    let orphans = Arc::new(Orphans::default());
    let alerts = alerts::Alerts::of(&crontab);
    let scheduler = match app::start(&crontab, opened.claim_store(), &orphans, alerts.clone()) {
        Ok(scheduler) => scheduler,
        Err(e) => {
            if let Some(server) = server {
                server.stop().await;
            }
            opened.close().await;
            return Err(e.into());
        }
    };
    tracing::info!(
        store = %redact(&url),
        backend = parsed.backend(),
        instance = %scheduler.instance_id(),
        jobs = crontab.jobs.len(),
        "anarchon running; Ctrl-C, SIGTERM or SIGHUP stops it and hands running jobs over"
    );
    if !parsed.is_lease() {
        tracing::info!(
            backend = parsed.backend(),
            "claim-only store: each run goes to the first instance to claim it; no backups, no takeover, no history"
        );
    }
    let signal = shutdown_signal().await?;
    tracing::info!(
        signal,
        "shutting down: no new runs; waiting for running commands"
    );
    let report = scheduler.shutdown().await;
    if let Some(server) = server {
        server.stop().await;
    }
    orphans.reap(crontab.kill_grace).await;
    if let Some(alerts) = &alerts {
        alerts.finish().await;
    }
    opened.close().await;
    tracing::info!(handed_over = report.handed_over, "stopped");
    Ok(())
}

/// Waits for Ctrl-C (SIGINT), SIGTERM or SIGHUP and says which. SIGHUP
/// (the terminal or session went away) stops the daemon like SIGTERM, with
/// the same hand-over; it does not reload the crontab.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
    })
}

async fn audit(
    path: &Path,
    store: Option<String>,
    since: std::time::Duration,
    json: bool,
) -> anyhow::Result<()> {
    let crontab = Crontab::load(path)?;
    let url = store_url(store, Some(&crontab));
    let parsed = StoreUrl::parse(&url).map_err(Error::from)?;
    if !parsed.is_lease() {
        return Err(Error::NoHistory {
            backend: parsed.backend(),
        }
        .into());
    }
    let opened = backend::open_for_history(&parsed)
        .await
        .with_context(|| format!("cannot read the store {}", redact(&url)))?;
    let Some(lease) = opened.lease_store() else {
        opened.close().await;
        return Err(Error::NoHistory {
            backend: parsed.backend(),
        }
        .into());
    };
    let result = audit::audit(lease.as_ref(), &crontab, since).await;
    opened.close().await;
    let (now, audits) = result?;
    write_out(&if json {
        audit::report_json(&audits, now)
    } else {
        audit::report(&audits, since)
    })?;
    match audit::problems(&audits) {
        0 => Ok(()),
        problems => Err(Error::AuditFound { problems }.into()),
    }
}

async fn history(
    job: Option<String>,
    config: Option<&Path>,
    store: Option<String>,
    limit: usize,
    json: bool,
) -> anyhow::Result<()> {
    let crontab = config.map(Crontab::load).transpose()?;
    let url = store_url(store, crontab.as_ref());
    let parsed = StoreUrl::parse(&url).map_err(Error::from)?;
    let job = job
        .map(|name| JobName::new(&name).map_err(|source| Error::config(None, None, source)))
        .transpose()?;
    if !parsed.is_lease() {
        return Err(Error::NoHistory {
            backend: parsed.backend(),
        }
        .into());
    }
    let opened = backend::open_for_history(&parsed)
        .await
        .with_context(|| format!("cannot read the store {}", redact(&url)))?;
    let result = history_of(&opened, &parsed, job, crontab.as_ref(), limit, json).await;
    opened.close().await;
    write_out(&result?)
}

/// The history table (or "no runs recorded") of an open lease store.
async fn history_of(
    opened: &Opened,
    parsed: &StoreUrl,
    job: Option<JobName>,
    crontab: Option<&Crontab>,
    limit: usize,
    json: bool,
) -> Result<String, Error> {
    let Some(store) = opened.lease_store() else {
        return Err(Error::NoHistory {
            backend: parsed.backend(),
        });
    };
    let jobs = backend::jobs_to_show(job, crontab, opened).await?;
    let runs = show::history(store.as_ref(), &jobs, limit).await?;
    if json {
        return Ok(show::history_json(&runs));
    }
    Ok(if runs.is_empty() {
        let which = match jobs.as_slice() {
            [one] => format!(" for job {one:?}"),
            _ => String::new(),
        };
        format!("no runs recorded{which}\n")
    } else {
        show::history_table(&runs)
    })
}

/// Checks the crontab against the backend's kind without opening it: the
/// jobs and the scheduler options through the core's own checks.
fn validate(crontab: &Crontab, parsed: &StoreUrl) -> Result<(), Error> {
    app::check(crontab, backend::stand_in(parsed))
}

fn check(path: &Path, store: Option<String>) -> anyhow::Result<()> {
    let crontab = Crontab::load(path)?;
    let url = store_url(store, Some(&crontab));
    let parsed = StoreUrl::parse(&url).map_err(Error::from)?;
    validate(&crontab, &parsed)?;
    let mut text = format!(
        "{}: {} job(s) OK; store {} = {}\n",
        path.display(),
        crontab.jobs.len(),
        redact(&url),
        parsed.describe()
    );
    let now = now();
    for job in &crontab.jobs {
        let next = job
            .schedule
            .next_after(now)
            .map_or_else(|| "never".to_owned(), |s| s.to_string());
        text.push_str(&format!(
            "  {:<24} {}  next {}  runs {}\n",
            job.name, job.schedule, next, job.command
        ));
        if let Some(window) = job.options.catch_up {
            let limit = job
                .options
                .catch_up_limit
                .map_or(anarchon::scheduler::DEFAULT_CATCH_UP_LIMIT, |n| n as usize);
            if job
                .schedule
                .slots_between(
                    now.saturating_sub(window),
                    anarchon::Timestamp::from_millis(now.as_millis() - 1),
                    limit + 1,
                )
                .len()
                > limit
            {
                text.push_str(&format!(
                    "    warning: catch_up {window:?} holds more than {limit} slots of this schedule: after an outage only the newest {limit} run (catch_up_limit), the older ones are skipped\n"
                ));
            }
        }
    }
    write_out(&text)
}

/// Writes to stdout; a reader that went away (`anarchon history | head`)
/// is not an error.
fn write_out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write to stdout"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn the_rabbitmq_clients_returned_message_warnings_are_off_unless_asked_for() {
        assert_eq!(log_filter(None), "info,lapin::returned_messages=error");
        assert_eq!(log_filter(Some(" ")), "info,lapin::returned_messages=error");
        assert_eq!(
            log_filter(Some("debug")),
            "debug,lapin::returned_messages=error"
        );
        assert_eq!(log_filter(Some("warn,lapin=debug")), "warn,lapin=debug");
    }
}
