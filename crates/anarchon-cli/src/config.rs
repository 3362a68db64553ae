//! The crontab: a TOML file of jobs, read strictly.
//!
//! Unknown keys are errors, not warnings: a misspelt `overlap` that was
//! silently ignored would let runs pile up. Every error names the file, the
//! line and the column.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anarchon::{AlertKind, JobOptions, Overlap, RetryPolicy, Schedule, SchedulerOptions};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

use crate::error::Error;

/// The store used when neither the crontab nor `--store` names one.
pub(crate) const DEFAULT_STORE: &str = "sqlite://anarchon.db";
/// How long a cancelled command has between SIGTERM and SIGKILL unless the
/// crontab says otherwise.
pub(crate) const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// How long an alert command may run before it is killed unless the
/// crontab says otherwise.
pub(crate) const DEFAULT_ALERT_TIMEOUT: Duration = Duration::from_secs(60);

/// A crontab as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The store's URL.
    store: Option<String>,
    #[serde(default)]
    scheduler: SchedulerSection,
    http: Option<Spanned<HttpSection>>,
    alerts: Option<Spanned<AlertsSection>>,
    #[serde(default, rename = "job")]
    jobs: Vec<JobSection>,
}

/// The `[http]` table: the daemon's metrics, health and status page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    /// Where to listen, e.g. `127.0.0.1:9464`.
    listen: String,
    /// Whether `listen` may be an address other hosts can reach.
    #[serde(default)]
    allow_remote: bool,
}

/// The `[alerts]` table: the command every job's alerts run, unless a job
/// names its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertsSection {
    /// The command to run.
    command: Option<Command>,
    /// Which ends raise an alert (default: all three).
    on: Option<Vec<AlertSetting>>,
    /// How long the command may run before it is killed.
    timeout: Option<Dur>,
}

/// A run end as the crontab names it.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum AlertSetting {
    Failed,
    Interrupted,
    Missed,
}

impl From<AlertSetting> for AlertKind {
    fn from(setting: AlertSetting) -> Self {
        match setting {
            AlertSetting::Failed => AlertKind::Failed,
            AlertSetting::Interrupted => AlertKind::Interrupted,
            AlertSetting::Missed => AlertKind::Missed,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerSection {
    lease: Option<Dur>,
    heartbeat: Option<Dur>,
    shutdown_grace: Option<Dur>,
    kill_grace: Option<Dur>,
    history_retention: Option<Dur>,
    catch_up_concurrency: Option<u32>,
    instance_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobSection {
    name: Spanned<String>,
    schedule: Option<String>,
    every: Option<Dur>,
    time_zone: Option<String>,
    command: Command,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    clean_env: bool,
    working_dir: Option<PathBuf>,
    overlap: Option<OverlapSetting>,
    max_attempts: Option<u32>,
    catch_up: Option<Dur>,
    catch_up_limit: Option<u32>,
    retries: Option<u32>,
    retry_backoff: Option<Dur>,
    retry_backoff_max: Option<Dur>,
    retry_growth: Option<f64>,
    max_late: Option<Dur>,
    jitter: Option<Dur>,
    timeout: Option<Dur>,
    alert: Option<Command>,
    alert_on: Option<Vec<AlertSetting>>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum OverlapSetting {
    Allow,
    Skip,
    Replace,
    #[serde(rename = "buffer-one")]
    BufferOne,
}

/// A duration written the human way: `"30s"`, `"5m"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30s\", \"5m\" or \"1h 30m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                humantime::parse_duration(v).map(Dur).map_err(|e| {
                    E::custom(format!(
                        "invalid duration {v:?}: {e}; write e.g. \"30s\", \"5m\" or \"1h 30m\""
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// What a job runs: an argv array, run as it is, or a string, run by
/// `sh -c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// The program and its arguments.
    Argv(Vec<String>),
    /// A shell command line.
    Shell(String),
}

impl Command {
    /// The program and arguments to execute.
    pub(crate) fn argv(&self) -> Vec<String> {
        match self {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(line) => vec!["sh".into(), "-c".into(), line.clone()],
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Argv(argv) => write!(f, "{argv:?}"),
            Command::Shell(line) => write!(f, "sh -c {line:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Command;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a command: an array of strings (program and arguments) or a string (run with sh -c)",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Command, E> {
                if v.trim().is_empty() {
                    return Err(E::custom("the command is empty"));
                }
                Ok(Command::Shell(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Command, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                match argv.first() {
                    None => Err(de::Error::custom("the command array is empty")),
                    Some(program) if program.is_empty() => {
                        Err(de::Error::custom("the program (first element) is empty"))
                    }
                    Some(_) => Ok(Command::Argv(argv)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A crontab, read and checked: ready to build a scheduler from.
#[derive(Debug)]
pub(crate) struct Crontab {
    /// Where it was read from.
    pub(crate) path: PathBuf,
    /// The store URL it names, if any.
    pub(crate) store: Option<String>,
    /// Scheduler options (the run-time path of the core).
    pub(crate) scheduler: SchedulerOptions,
    /// How long a cancelled command has between SIGTERM and SIGKILL.
    pub(crate) kill_grace: Duration,
    /// How long the store keeps run records.
    pub(crate) history_retention: Option<Duration>,
    /// Where the daemon serves `/metrics`, `/healthz`, `/api/…` and its
    /// status page (`[http] listen`); off when `None`.
    pub(crate) http: Option<std::net::SocketAddr>,
    /// How long an alert command may run before it is killed.
    pub(crate) alert_timeout: Duration,
    /// The jobs, in file order.
    pub(crate) jobs: Vec<Job>,
}

/// Where a job's alerts go: the command, and the ends that run it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AlertRoute {
    /// The command an alert runs.
    pub(crate) command: Command,
    /// The ends that raise an alert; empty silences the job.
    pub(crate) on: Vec<AlertKind>,
}

impl AlertRoute {
    /// Whether an end of `kind` runs the command.
    pub(crate) fn wants(&self, kind: AlertKind) -> bool {
        self.on.contains(&kind)
    }
}

/// One job of a crontab.
#[derive(Debug)]
pub(crate) struct Job {
    /// The name as written (the core validates it).
    pub(crate) name: String,
    /// Where the job's name is in the file.
    pub(crate) line: usize,
    /// When it runs.
    pub(crate) schedule: Schedule,
    /// What it runs.
    pub(crate) command: Command,
    /// Extra environment for the command.
    pub(crate) env: BTreeMap<String, String>,
    /// Whether the command gets only `env` and the `ANARCHON_*` variables,
    /// none of the daemon's own.
    pub(crate) clean_env: bool,
    /// The command's working directory.
    pub(crate) working_dir: Option<PathBuf>,
    /// Job options (the run-time path of the core).
    pub(crate) options: JobOptions,
    /// Where its alerts go (`alert`, `alert_on`, or the `[alerts]` table);
    /// `None` when no alert command applies.
    pub(crate) alert: Option<AlertRoute>,
}

impl Crontab {
    /// Reads and checks the crontab at `path`.
    pub(crate) fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        refuse_writable_by_others(path)?;
        Self::parse(path, &text)
    }

    /// Reads and checks crontab text; `path` is only for messages.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, Error> {
        let file: File = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map_or((1, 1), |span| line_column(text, span.start));
            Error::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_owned(),
            }
        })?;
        let mut scheduler = SchedulerOptions::default();
        scheduler.lease = file.scheduler.lease.map(|d| d.0);
        scheduler.heartbeat = file.scheduler.heartbeat.map(|d| d.0);
        scheduler.shutdown_grace = file.scheduler.shutdown_grace.map(|d| d.0);
        scheduler.catch_up_concurrency = file.scheduler.catch_up_concurrency;
        scheduler.instance_id = file.scheduler.instance_id;
        let http = file
            .http
            .map(|section| {
                let (line, column) = line_column(text, section.span().start);
                http_address(section.into_inner()).map_err(|message| Error::Parse {
                    path: path.to_path_buf(),
                    line,
                    column,
                    message,
                })
            })
            .transpose()?;
        let (alerts, alert_timeout) = match file.alerts {
            Some(section) => {
                let (line, column) = line_column(text, section.span().start);
                let section = section.into_inner();
                let on = section
                    .on
                    .map(|on| on.into_iter().map(AlertKind::from).collect());
                if section.command.is_none() && on.is_some() {
                    return Err(Error::Parse {
                        path: path.to_path_buf(),
                        line,
                        column,
                        message: "[alerts] `on` chooses the ends that run the alert command, but there is none: add `command = \"notify-ops\"` to [alerts] (or `alert` to the jobs)".into(),
                    });
                }
                let timeout = section.timeout.map_or(DEFAULT_ALERT_TIMEOUT, |d| d.0);
                if timeout.is_zero() {
                    return Err(Error::Parse {
                        path: path.to_path_buf(),
                        line,
                        column,
                        message:
                            "[alerts] `timeout` must be above zero: write e.g. `timeout = \"30s\"`"
                                .into(),
                    });
                }
                (
                    Alerts {
                        command: section.command,
                        on,
                    },
                    timeout,
                )
            }
            None => (Alerts::default(), DEFAULT_ALERT_TIMEOUT),
        };
        let mut jobs = Vec::with_capacity(file.jobs.len());
        for section in file.jobs {
            jobs.push(job(path, text, section, &alerts)?);
        }
        Ok(Self {
            path: path.to_path_buf(),
            store: file.store,
            scheduler,
            kill_grace: file
                .scheduler
                .kill_grace
                .map_or(DEFAULT_KILL_GRACE, |d| d.0),
            history_retention: file.scheduler.history_retention.map(|d| d.0),
            http,
            alert_timeout,
            jobs,
        })
    }
}

/// The `[http]` table's address: a loopback one, unless `allow_remote`
/// says other hosts may reach the page.
fn http_address(section: HttpSection) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = section.listen.parse().map_err(|_| {
        format!(
            "[http] listen = {:?} is not an address and port: write e.g. \"127.0.0.1:9464\"",
            section.listen
        )
    })?;
    if !addr.ip().is_loopback() && !section.allow_remote {
        return Err(format!(
            "[http] listen = \"{addr}\" is not a loopback address: the page and /api show every job's runs to whoever reaches it; put it behind your own proxy on 127.0.0.1, or set `allow_remote = true` in [http] to serve it on {addr}"
        ));
    }
    Ok(addr)
}

/// The `[alerts]` table, read: what every job's alerts fall back to.
#[derive(Debug, Default)]
struct Alerts {
    command: Option<Command>,
    on: Option<Vec<AlertKind>>,
}

/// A job's alert route from its own `alert` and `alert_on`, falling back
/// to `[alerts]`; `alert_on` without any command is an error.
fn alert_route(
    command: Option<Command>,
    on: Option<Vec<AlertSetting>>,
    alerts: &Alerts,
) -> Result<Option<AlertRoute>, String> {
    let on: Option<Vec<AlertKind>> = on.map(|on| on.into_iter().map(AlertKind::from).collect());
    let Some(command) = command.or_else(|| alerts.command.clone()) else {
        if on.is_some() {
            return Err("`alert_on` chooses the ends that run the alert command, but there is none: add `alert = \"notify-ops\"` to the job, or `command` to an [alerts] table".into());
        }
        return Ok(None);
    };
    let on = on
        .or_else(|| alerts.on.clone())
        .unwrap_or_else(|| AlertKind::ALL.to_vec());
    Ok(Some(AlertRoute { command, on }))
}

fn job(path: &Path, text: &str, s: JobSection, alerts: &Alerts) -> Result<Job, Error> {
    let (line, column) = line_column(text, s.name.span().start);
    let retry = retry_policy(&s);
    let name = s.name.into_inner();
    let fail = |message: String| Error::Job {
        path: path.to_path_buf(),
        line,
        column,
        job: name.clone(),
        message,
    };
    let schedule = match (&s.schedule, s.every, &s.time_zone) {
        (Some(_), Some(_), _) => {
            return Err(fail(
                "give either `schedule` (a cron expression) or `every` (an interval), not both"
                    .into(),
            ));
        }
        (None, None, _) => {
            return Err(fail(
                "no schedule: add `schedule = \"*/5 * * * *\"` (cron) or `every = \"5m\"`".into(),
            ));
        }
        (None, Some(_), Some(_)) => {
            return Err(fail(
                "`time_zone` applies to a cron `schedule`; an `every` interval is aligned to UTC"
                    .into(),
            ));
        }
        (Some(expr), None, zone) => Schedule::cron_in(expr, zone.as_deref().unwrap_or("UTC"))
            .map_err(|e| fail(e.to_string()))?,
        (None, Some(every), None) => Schedule::every(every.0).map_err(|e| fail(e.to_string()))?,
    };
    if let Some(bad) = s
        .env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(fail(format!("invalid environment variable name {bad:?}")));
    }
    let mut options = JobOptions::default();
    options.max_late = s.max_late.map(|d| d.0);
    options.jitter = s.jitter.map(|d| d.0);
    options.timeout = s.timeout.map(|d| d.0);
    options.overlap = s.overlap.map(|o| match o {
        OverlapSetting::Allow => Overlap::Allow,
        OverlapSetting::Skip => Overlap::Skip,
        OverlapSetting::Replace => Overlap::Replace,
        OverlapSetting::BufferOne => Overlap::BufferOne,
    });
    options.max_attempts = s.max_attempts;
    options.catch_up = s.catch_up.map(|d| d.0);
    options.catch_up_limit = s.catch_up_limit;
    options.retry = retry.map_err(fail)?;
    let alert = alert_route(s.alert, s.alert_on, alerts).map_err(fail)?;
    Ok(Job {
        name,
        line,
        schedule,
        command: s.command,
        env: s.env,
        clean_env: s.clean_env,
        working_dir: s.working_dir,
        options,
        alert,
    })
}

/// How long the first retry waits when a job sets `retries` alone.
const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(10);

/// The job's retry policy from `retries`, `retry_backoff`,
/// `retry_backoff_max` and `retry_growth`; `None` without `retries`.
fn retry_policy(s: &JobSection) -> Result<Option<RetryPolicy>, String> {
    let Some(retries) = s.retries else {
        let stray = [
            (s.retry_backoff.is_some(), "retry_backoff"),
            (s.retry_backoff_max.is_some(), "retry_backoff_max"),
            (s.retry_growth.is_some(), "retry_growth"),
        ];
        if let Some((_, key)) = stray.iter().find(|(set, _)| *set) {
            return Err(format!(
                "`{key}` shapes retries, but the job has none: add `retries = 3` (how many times a failed run is tried again)"
            ));
        }
        return Ok(None);
    };
    let backoff = s.retry_backoff.map_or(DEFAULT_RETRY_BACKOFF, |d| d.0);
    let mut policy = RetryPolicy::new(retries, backoff).map_err(|e| e.to_string())?;
    if let Some(growth) = s.retry_growth {
        policy = policy.with_growth(growth).map_err(|e| e.to_string())?;
    }
    if let Some(cap) = s.retry_backoff_max {
        policy = policy.with_cap(cap.0).map_err(|e| e.to_string())?;
    }
    Ok(Some(policy))
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// Refuses a crontab (after following symbolic links) that users other
/// than its owner may write: they would decide what the daemon runs.
fn refuse_writable_by_others(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?
        .permissions()
        .mode();
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "group",
        (false, true) => "others",
        (true, true) => "group and others",
    };
    Err(Error::WritableByOthers {
        path: path.to_path_buf(),
        who,
        mode: mode & 0o7777,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Crontab, Error> {
        Crontab::parse(Path::new("test.toml"), text)
    }

    #[test]
    fn reads_every_setting() {
        let tab = parse(
            r#"
store = "sqlite://cron.db"

[scheduler]
lease = "20s"
heartbeat = "5s"
shutdown_grace = "3s"
kill_grace = "2s"
history_retention = "2days"
instance_id = "web-1"

[[job]]
name = "report"
schedule = "0 3 * * *"
time_zone = "Europe/Athens"
command = ["/usr/bin/report", "--daily"]
env = { REPORT_DIR = "/tmp" }
working_dir = "/tmp"
overlap = "skip"
max_attempts = 2
catch_up = "1h"
max_late = "90s"
jitter = "10s"
timeout = "30m"

[[job]]
name = "ping"
every = "30s"
command = "echo ping | cat"
"#,
        )
        .unwrap();
        assert_eq!(tab.store.as_deref(), Some("sqlite://cron.db"));
        assert_eq!(tab.scheduler.lease, Some(Duration::from_secs(20)));
        assert_eq!(tab.scheduler.heartbeat, Some(Duration::from_secs(5)));
        assert_eq!(tab.scheduler.instance_id.as_deref(), Some("web-1"));
        assert_eq!(tab.kill_grace, Duration::from_secs(2));
        assert_eq!(tab.history_retention, Some(Duration::from_secs(2 * 86400)));
        let report = &tab.jobs[0];
        assert_eq!(report.name, "report");
        assert_eq!(report.line, 13);
        assert_eq!(
            report.command,
            Command::Argv(vec!["/usr/bin/report".into(), "--daily".into()])
        );
        assert_eq!(report.options.overlap, Some(Overlap::Skip));
        assert_eq!(report.options.max_attempts, Some(2));
        assert_eq!(report.options.catch_up, Some(Duration::from_secs(3600)));
        assert_eq!(report.options.max_late, Some(Duration::from_secs(90)));
        assert_eq!(report.options.timeout, Some(Duration::from_secs(1800)));
        assert_eq!(report.env["REPORT_DIR"], "/tmp");
        assert_eq!(
            report.schedule.time_zone().map(|z| z.name()),
            Some("Europe/Athens")
        );
        let ping = &tab.jobs[1];
        assert_eq!(
            ping.command.argv(),
            ["sh", "-c", "echo ping | cat"].map(String::from)
        );
        assert!(ping.schedule.time_zone().is_none());
        assert_eq!(ping.options.overlap, None);
    }

    #[test]
    fn malformed_toml_gives_line_and_column() {
        let err =
            parse("[[job]]\nname = \"a\"\nschedule = \"* * * * *\ncommand = \"x\"\n").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Parse { line: 3, .. }), "{text}");
        assert!(text.starts_with("test.toml:3:"), "{text}");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_place() {
        let err =
            parse("[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\noverlapp = \"skip\"\n")
                .unwrap_err();
        let text = err.to_string();
        match &err {
            Error::Parse {
                line,
                column,
                message,
                ..
            } => {
                assert_eq!((*line, *column), (5, 1), "{text}");
                assert!(message.contains("unknown field `overlapp`"), "{text}");
                assert!(message.contains("overlap"), "lists the known keys: {text}");
            }
            other => panic!("{other:?}"),
        }
        let err = parse("colour = \"red\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `colour`"), "{err}");
        let err = parse("[scheduler]\nleese = \"1s\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `leese`"), "{err}");
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        for (text, says) in [
            (
                "[[job]]\nname = \"a\"\nevery = \"soon\"\ncommand = \"x\"\n",
                "invalid duration \"soon\"",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = 5\ncommand = \"x\"\n",
                "a duration such as",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = []\n",
                "the command array is empty",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"  \"\n",
                "the command is empty",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = 3\n",
                "an array of strings",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\noverlap = \"sometimes\"\n",
                "unknown variant `sometimes`",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\n",
                "missing field `command`",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
            assert!(err.starts_with("test.toml:"), "{err}");
        }
    }

    #[test]
    fn retries_are_read_and_checked_by_name() {
        let config = parse(
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\nretries = 3\nretry_backoff = \"5s\"\nretry_backoff_max = \"1m\"\nretry_growth = 3.0\n",
        )
        .unwrap();
        let policy = config.jobs[0].options.retry.expect("a retry policy");
        assert_eq!(policy.retries(), 3);
        assert_eq!(policy.first_backoff(), Duration::from_secs(5));
        assert_eq!(policy.cap(), Duration::from_secs(60));
        assert_eq!(policy.growth(), 3.0);
        let plain =
            parse("[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\nretries = 1\n").unwrap();
        assert_eq!(
            plain.jobs[0].options.retry.map(|p| p.first_backoff()),
            Some(DEFAULT_RETRY_BACKOFF)
        );
        for (keys, says) in [
            (
                "retries = 0",
                "retries is out of range: it must be at least 1",
            ),
            ("retries = -1", "invalid value"),
            (
                "retries = 2\nretry_backoff = \"0s\"",
                "retry_backoff is out of range",
            ),
            ("retries = 2\nretry_backoff = \"-5s\"", "invalid duration"),
            (
                "retries = 2\nretry_backoff = \"1m\"\nretry_backoff_max = \"10s\"",
                "retry_backoff_max is out of range: 10s must be at least the first backoff (60s)",
            ),
            (
                "retries = 2\nretry_growth = 0.5",
                "retry_growth is out of range",
            ),
            (
                "retry_backoff = \"5s\"",
                "`retry_backoff` shapes retries, but the job has none",
            ),
        ] {
            let text = format!("[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\n{keys}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(says), "{keys:?}: {err}");
            assert!(err.starts_with("test.toml:"), "{err}");
        }
    }

    #[test]
    fn alerts_go_to_the_jobs_own_command_or_the_alerts_table() {
        let tab = parse(concat!(
            "[alerts]\ncommand = \"notify-ops\"\non = [\"failed\", \"missed\"]\ntimeout = \"10s\"\n",
            "[[job]]\nname = \"plain\"\nevery = \"1m\"\ncommand = \"x\"\n",
            "[[job]]\nname = \"own\"\nevery = \"1m\"\ncommand = \"x\"\nalert = [\"page\", \"--now\"]\nalert_on = [\"interrupted\"]\n",
            "[[job]]\nname = \"quiet\"\nevery = \"1m\"\ncommand = \"x\"\nalert_on = []\n",
        ))
        .unwrap();
        assert_eq!(tab.alert_timeout, Duration::from_secs(10));
        let plain = tab.jobs[0].alert.clone().expect("the table's command");
        assert_eq!(plain.command, Command::Shell("notify-ops".into()));
        assert_eq!(plain.on, vec![AlertKind::Failed, AlertKind::Missed]);
        assert!(!plain.wants(AlertKind::Interrupted));
        let own = tab.jobs[1].alert.clone().expect("its own command");
        assert_eq!(
            own.command,
            Command::Argv(vec!["page".into(), "--now".into()])
        );
        assert_eq!(own.on, vec![AlertKind::Interrupted]);
        let quiet = tab.jobs[2].alert.clone().expect("the table's command");
        assert!(AlertKind::ALL.iter().all(|k| !quiet.wants(*k)), "silenced");

        let bare = parse("[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\nalert = \"n\"\n")
            .unwrap();
        assert_eq!(
            bare.jobs[0].alert.clone().unwrap().on,
            AlertKind::ALL.to_vec()
        );
        assert_eq!(bare.alert_timeout, DEFAULT_ALERT_TIMEOUT);
        let none = parse("[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\n").unwrap();
        assert!(none.jobs[0].alert.is_none());
    }

    #[test]
    fn alert_settings_are_checked_by_name() {
        let job = "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"x\"\n";
        for (text, says) in [
            (
                format!("{job}alert_on = [\"failed\"]\n"),
                "`alert_on` chooses the ends that run the alert command, but there is none",
            ),
            (
                format!("{job}alert = \"n\"\nalert_on = [\"late\"]\n"),
                "unknown variant `late`, expected one of `failed`, `interrupted`, `missed`",
            ),
            (
                format!("[alerts]\non = [\"failed\"]\n{job}"),
                "[alerts] `on` chooses the ends that run the alert command, but there is none",
            ),
            (
                format!("[alerts]\ncommand = \"n\"\ntimeout = \"0s\"\n{job}"),
                "[alerts] `timeout` must be above zero",
            ),
            (
                format!("[alerts]\ncommand = \"n\"\nwhen = \"always\"\n{job}"),
                "unknown field `when`",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
            assert!(err.starts_with("test.toml:"), "{err}");
        }
    }

    #[test]
    fn schedules_must_be_one_and_valid() {
        for (text, says) in [
            ("[[job]]\nname = \"a\"\ncommand = \"x\"\n", "no schedule"),
            (
                "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nevery = \"1m\"\ncommand = \"x\"\n",
                "not both",
            ),
            (
                "[[job]]\nname = \"a\"\nevery = \"1m\"\ntime_zone = \"UTC\"\ncommand = \"x\"\n",
                "`time_zone` applies to a cron",
            ),
            (
                "[[job]]\nname = \"a\"\nschedule = \"61 * * * *\"\ncommand = \"x\"\n",
                "minute field",
            ),
            (
                "[[job]]\nname = \"a\"\nschedule = \"0 3 * * *\"\ntime_zone = \"Mars/Base\"\ncommand = \"x\"\n",
                "unknown time zone",
            ),
        ] {
            let err = parse(text).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Job { line: 2, .. }), "{msg}");
            assert!(msg.contains(says), "{text:?}: {msg}");
            assert!(msg.starts_with("test.toml:2:8: job \"a\""), "{msg}");
        }
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column("abc", 0), (1, 1));
        assert_eq!(line_column("a\nbc", 3), (2, 2));
        assert_eq!(line_column("é\né", 4), (2, 2));
        assert_eq!(line_column("x", 99), (1, 2));
    }
}
