//! The operator's commands: `pause`, `resume`, `trigger` and `status`.
//!
//! They act on the store, not on a daemon: a pause written here holds for
//! every instance at once, from the store's clock, and needs no daemon to
//! be reachable. The store must exist already (a daemon or the library
//! created it): a mistyped SQLite path or table name is an error, not a new
//! empty store. A claim-only store is refused before connecting, since it
//! keeps nothing to pause.

use std::fmt::Write as _;
use std::path::Path;

use anarchon::url::redact;
use anarchon::{
    Control, FinalState, FleetStatus, JobName, JobStatus, LeaseStore, Opened, Pause, PauseEnd,
    PauseRequest, PauseScope, RecordState, RequestId, RunState, StoreErrorKind, StoreUrl,
    Timestamp, TriggerRequest, Until,
};
use anyhow::Context as _;
use chrono::SecondsFormat;

use crate::config::Crontab;
use crate::error::Error;
use crate::printable::printable;
use crate::{backend, store_url, write_out};

/// What `pause` and `resume` act on, as typed.
pub(crate) struct Target {
    pub(crate) job: Option<String>,
    pub(crate) all: bool,
}

/// Where the store is, as typed.
pub(crate) struct Where<'a> {
    pub(crate) config: Option<&'a Path>,
    pub(crate) store: Option<String>,
}

/// The store's URL, the crontab if given, and the URL parsed; a claim-only
/// store is refused here, before anything connects.
fn locate(place: Where<'_>) -> anyhow::Result<(String, Option<Crontab>, StoreUrl)> {
    let crontab = place.config.map(Crontab::load).transpose()?;
    let url = store_url(place.store, crontab.as_ref());
    let parsed = StoreUrl::parse(&url).map_err(Error::from)?;
    if !parsed.is_lease() {
        return Err(Error::NoControl {
            backend: parsed.backend(),
        }
        .into());
    }
    Ok((url, crontab, parsed))
}

/// A job name, checked, and when a crontab was given, one of its jobs.
fn job_name(name: &str, crontab: Option<&Crontab>) -> Result<JobName, Error> {
    let job = JobName::new(name).map_err(|source| Error::config(None, None, source))?;
    if let Some(crontab) = crontab
        && !crontab.jobs.iter().any(|j| j.name == name)
    {
        return Err(Error::UnknownJob {
            path: crontab.path.clone(),
            job: name.to_owned(),
            known: crontab
                .jobs
                .iter()
                .map(|j| j.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(job)
}

fn scope(target: &Target, crontab: Option<&Crontab>) -> Result<PauseScope, Error> {
    match (&target.job, target.all) {
        (Some(name), false) => Ok(PauseScope::Job(job_name(name, crontab)?)),
        (None, true) => Ok(PauseScope::All),
        _ => Err(Error::Scope),
    }
}

/// Opens the store, which must exist already. `status` reads it as
/// `history` does (a SQLite file read-only); `pause` and `resume` write,
/// so once the store is known to exist it is opened as a daemon opens it.
async fn open(url: &str, parsed: &StoreUrl, write: bool) -> anyhow::Result<Opened> {
    let context = || format!("cannot open the store {}", redact(url));
    let existing = backend::open_for_history(parsed)
        .await
        .with_context(context)?;
    if !write {
        return Ok(existing);
    }
    existing.close().await;
    parsed
        .open()
        .await
        .map_err(Error::from)
        .with_context(context)
}

fn control(opened: &Opened, parsed: &StoreUrl) -> Result<Control<dyn LeaseStore>, Error> {
    opened
        .lease_store()
        .map(Control::new)
        .ok_or(Error::NoControl {
            backend: parsed.backend(),
        })
}

/// The author a pause records when `--by` is not given: `user@host`.
fn default_author() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("{user}@{host}")
}

/// `anarchon pause`.
pub(crate) async fn pause(
    target: Target,
    until: Until,
    reason: Option<String>,
    by: Option<String>,
    place: Where<'_>,
) -> anyhow::Result<()> {
    let (url, crontab, parsed) = locate(place)?;
    let scope = scope(&target, crontab.as_ref())?;
    let refused = |e: anarchon::PauseRefused| Error::PauseRefused(e.into_store_error("anarchon"));
    let mut request = PauseRequest::new().with_until(until);
    if let Some(reason) = &reason {
        request = request.with_reason(reason).map_err(refused)?;
    }
    request = request
        .with_by(&by.unwrap_or_else(default_author))
        .map_err(refused)?;
    let opened = open(&url, &parsed, true).await?;
    let result = async {
        control(&opened, &parsed)?
            .pause(&scope, &request)
            .await
            .map_err(|e| match e.kind() {
                StoreErrorKind::Invalid => Error::PauseRefused(e),
                _ => Error::Store(e),
            })
    }
    .await;
    opened.close().await;
    write_out(&format!("paused {}\n", describe(&result?)))
}

/// `anarchon resume`.
pub(crate) async fn resume(target: Target, place: Where<'_>) -> anyhow::Result<()> {
    let (url, crontab, parsed) = locate(place)?;
    let scope = scope(&target, crontab.as_ref())?;
    let opened = open(&url, &parsed, true).await?;
    let result = async { Ok::<_, Error>(control(&opened, &parsed)?.resume(&scope).await?) }.await;
    opened.close().await;
    let text = if result? {
        format!("resumed {scope}; slots recorded paused stay so (backfill them if they must run)\n")
    } else {
        format!("{scope} was not paused: nothing to do\n")
    };
    write_out(&text)
}

/// A request as typed: the job, and optionally its id and author.
pub(crate) struct Ask {
    pub(crate) job: String,
    pub(crate) id: Option<String>,
    pub(crate) by: Option<String>,
}

impl Ask {
    /// The request for `job` (checked already): a manual run, or with
    /// `range` a backfill; its id as typed or a new one, its author as
    /// typed or `user@host`.
    fn request(
        self,
        job: JobName,
        range: Option<anarchon::Backfill>,
    ) -> Result<TriggerRequest, Error> {
        let refused = |e: anarchon::request::RequestRefused| Error::RequestRefused(e.to_string());
        let id = match self.id {
            Some(id) => RequestId::new(&id).map_err(refused)?,
            None => RequestId::generate(),
        };
        let request = match range {
            Some(range) => TriggerRequest::backfill(job, id, range),
            None => TriggerRequest::new(job, id),
        };
        request
            .with_by(&self.by.unwrap_or_else(default_author))
            .map_err(refused)
    }
}

/// `anarchon backfill`.
pub(crate) async fn backfill(
    ask: Ask,
    range: anarchon::Backfill,
    force: bool,
    wait: bool,
    place: Where<'_>,
) -> anyhow::Result<()> {
    let (url, crontab, parsed) = locate(place)?;
    let job = job_name(&ask.job, crontab.as_ref())?;
    // The range's slots, for --wait: the crontab knows the schedule.
    let slots = match (wait, &crontab) {
        (false, _) => Vec::new(),
        (true, None) => return Err(Error::WaitNeedsConfig.into()),
        (true, Some(c)) => c
            .jobs
            .iter()
            .find(|j| j.name == job.as_str())
            .map(|j| {
                let before = range
                    .from()
                    .saturating_sub(std::time::Duration::from_millis(1));
                j.schedule.slots_between(before, range.to(), usize::MAX)
            })
            .unwrap_or_default(),
    };
    let request = ask.request(job.clone(), Some(range))?;
    let retention = crontab
        .as_ref()
        .and_then(|c| c.history_retention)
        .unwrap_or(anarchon::scheduler::DEFAULT_HISTORY_RETENTION);
    let opened = open(&url, &parsed, true).await?;
    let result = async {
        let control = control(&opened, &parsed)?;
        let stored = control
            .backfill(&request, (!force).then_some(retention))
            .await
            .map_err(|e| match e.kind() {
                StoreErrorKind::Invalid => Error::RequestRefused(e.to_string()),
                _ => Error::Store(e),
            })?;
        write_out(&format!(
            "requested a backfill of job {job} from {} to {} at {} (store clock), {}; every instance with the job runs the slots that never ran, oldest first\n",
            utc(range.from()),
            utc(range.to()),
            utc(stored.requested_at),
            describe_request(&stored),
        ))?;
        if wait {
            wait_for_backfill(&control, &job, slots).await?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    opened.close().await;
    result
}

/// Waits until each of a backfill's `slots` has ended (or gave up being
/// started); an error when one failed or was interrupted, or when none
/// moved on within a manual run's window.
async fn wait_for_backfill(
    control: &Control<dyn LeaseStore>,
    job: &JobName,
    slots: Vec<anarchon::Slot>,
) -> anyhow::Result<()> {
    let total = slots.len();
    let mut waiting: std::collections::VecDeque<_> = slots.into();
    let mut failed = Vec::new();
    let mut last_progress = std::time::Instant::now();
    while let Some(&slot) = waiting.front() {
        let run = anarchon::RunKey::new(job.clone(), slot);
        match control.run_state(&run).await.map_err(Error::Store)?.state {
            RunState::Finished(done) => {
                if matches!(done, FinalState::Failed | FinalState::Interrupted) {
                    failed.push(format!("{slot} {}", done.as_str()));
                }
                waiting.pop_front();
                last_progress = std::time::Instant::now();
                continue;
            }
            _ if last_progress.elapsed() > anarchon::scheduler::MANUAL_RUN_WINDOW => {
                return Err(Error::NotStarted {
                    job: job.to_string(),
                    slot: slot.to_string(),
                    window: humantime::format_duration(anarchon::scheduler::MANUAL_RUN_WINDOW)
                        .to_string(),
                }
                .into());
            }
            _ => tokio::time::sleep(WAIT_POLL).await,
        }
    }
    if failed.is_empty() {
        write_out(&format!(
            "the backfill of job {job} is done: each of its {total} slots has ended\n"
        ))
    } else {
        Err(anyhow::anyhow!(
            "the backfill of job {job} is done, but slots failed: {}",
            failed.join(", ")
        ))
    }
}

/// How often `trigger --wait` reads the manual run.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// `anarchon trigger`.
pub(crate) async fn trigger(ask: Ask, wait: bool, place: Where<'_>) -> anyhow::Result<()> {
    let (url, crontab, parsed) = locate(place)?;
    let job = job_name(&ask.job, crontab.as_ref())?;
    let request = ask.request(job.clone(), None)?;
    let opened = open(&url, &parsed, true).await?;
    let result = async {
        let control = control(&opened, &parsed)?;
        let request = control.trigger(&request).await?;
        write_out(&format!(
            "requested a manual run of job {job} at {} (store clock), {}\n",
            utc(request.requested_at),
            describe_request(&request),
        ))?;
        if wait {
            wait_for_run(&control, &request).await?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    opened.close().await;
    result
}

/// Waits until the manual run of `request` ends; an error unless it
/// succeeded, or when no instance started it within its window.
async fn wait_for_run(
    control: &Control<dyn LeaseStore>,
    request: &anarchon::RunRequest,
) -> anyhow::Result<()> {
    let run = request
        .run()
        .ok_or_else(|| anyhow::anyhow!("request {} is a backfill, not a manual run", request.id))?;
    let mut started = false;
    loop {
        let view = control.run_state(&run).await.map_err(Error::Store)?;
        match view.state {
            RunState::Finished(FinalState::Succeeded) => {
                return write_out(&format!("the manual run of job {} succeeded\n", run.job));
            }
            RunState::Finished(done) => {
                let error = control
                    .status(std::slice::from_ref(&run.job), 100)
                    .await
                    .ok()
                    .and_then(|s| {
                        s.jobs
                            .into_iter()
                            .flat_map(|j| j.recent)
                            .find(|r| r.run == run)
                            .and_then(|r| r.error)
                    });
                return Err(Error::RunEnded {
                    job: run.job.to_string(),
                    slot: run.slot.to_string(),
                    state: done.as_str(),
                    error: error.map(|e| printable(&e)),
                }
                .into());
            }
            RunState::Missed => {
                return Err(Error::RunEnded {
                    job: run.job.to_string(),
                    slot: run.slot.to_string(),
                    state: "missed",
                    error: None,
                }
                .into());
            }
            RunState::Running { attempt, .. } => {
                if !started {
                    started = true;
                    write_out(&format!("the manual run started (attempt {attempt})\n"))?;
                }
            }
            RunState::Waiting { until } => {
                if !started {
                    started = true;
                    write_out(&format!(
                        "the manual run waits for the job's run still going (until {until} at the latest)\n"
                    ))?;
                }
            }
            RunState::RetryPending { attempt, retry_at } => {
                started = true;
                write_out(&format!(
                    "attempt {attempt} failed; its retry is due at {retry_at}\n"
                ))?;
                // Nothing to ask the store before the retry is due.
                let wait = retry_at.since(view.store_now);
                tokio::time::sleep(wait.saturating_sub(WAIT_POLL)).await;
            }
            RunState::Absent => {
                if view.store_now.since(request.requested_at)
                    > anarchon::scheduler::MANUAL_RUN_WINDOW
                {
                    return Err(Error::NotStarted {
                        job: run.job.to_string(),
                        slot: run.slot.to_string(),
                        window: humantime::format_duration(anarchon::scheduler::MANUAL_RUN_WINDOW)
                            .to_string(),
                    }
                    .into());
                }
            }
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// `anarchon status`.
pub(crate) async fn status(
    job: Option<String>,
    json: bool,
    recent: usize,
    place: Where<'_>,
) -> anyhow::Result<()> {
    let (url, crontab, parsed) = locate(place)?;
    let named = job
        .as_deref()
        .map(|name| job_name(name, crontab.as_ref()))
        .transpose()?;
    let opened = open(&url, &parsed, false).await?;
    let result = async {
        let jobs = backend::jobs_to_show(named, crontab.as_ref(), &opened).await?;
        let control = control(&opened, &parsed)?;
        Ok::<_, Error>(control.status(&jobs, recent.max(1)).await?)
    }
    .await;
    opened.close().await;
    let FleetStatus {
        store_now,
        jobs: statuses,
    } = result?;
    let next = |job: &JobName| {
        crontab
            .as_ref()
            .and_then(|c| c.jobs.iter().find(|j| j.name == job.as_str()))
            .and_then(|j| j.schedule.next_after(store_now))
            .map(|slot| slot.at())
    };
    let text = if json {
        status_json(&statuses, store_now, &next)
    } else {
        status_table(&statuses, store_now, &next)
    };
    write_out(&text)
}

fn utc(at: Timestamp) -> String {
    at.to_datetime().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// One line for a pause: what, until when, why, who.
fn describe(pause: &Pause) -> String {
    let mut text = format!("{} since {}", pause.scope, utc(pause.since));
    match pause.end {
        PauseEnd::OnResume => text.push_str(" until resumed"),
        PauseEnd::At(until) => {
            let _ = write!(text, " until {} (store clock)", utc(until));
        }
    }
    if let Some(reason) = &pause.reason {
        let _ = write!(text, ": {}", printable(reason));
    }
    if let Some(by) = &pause.by {
        let _ = write!(text, " (by {})", printable(by));
    }
    text
}

/// A request's id and author: `request <id>, by <who>`.
fn describe_request(request: &anarchon::RunRequest) -> String {
    let mut text = format!("request {}", request.id);
    if let Some(by) = &request.by {
        let _ = write!(text, ", by {}", printable(by));
    }
    text
}

/// The run holding a lease now, if the latest runs show one.
fn live(status: &JobStatus, now: Timestamp) -> Option<String> {
    status.recent.iter().find_map(|r| {
        (r.state == RecordState::Running).then(|| {
            let lease = match r.lease_until {
                Some(until) if until >= now => format!("lease until {}", utc(until)),
                _ => "lease ran out: a backup takes it over".to_owned(),
            };
            format!(
                "{} attempt {} on {}, {lease}",
                r.run.slot,
                r.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
                r.instance
                    .as_ref()
                    .map_or_else(|| "-".into(), |i| printable(i.as_str())),
            )
        })
    })
}

fn status_table(
    statuses: &[JobStatus],
    now: Timestamp,
    next: &dyn Fn(&JobName) -> Option<Timestamp>,
) -> String {
    let mut out = format!("store clock {}\n", utc(now));
    if statuses.is_empty() {
        out.push_str("no jobs\n");
    }
    for status in statuses {
        let _ = writeln!(out, "{}", status.job);
        if let Some(pause) = &status.pause {
            let _ = writeln!(out, "  paused   {}", describe(pause));
        }
        match status
            .recent
            .iter()
            .find(|r| r.state != RecordState::Running)
        {
            Some(last) => {
                let _ = writeln!(out, "  last     {} {}", last.run.slot, last.state.as_str());
            }
            None => out.push_str("  last     (no finished run recorded)\n"),
        }
        if let Some(live) = live(status, now) {
            let _ = writeln!(out, "  running  {live}");
        }
        for request in &status.pending {
            let _ = writeln!(
                out,
                "  pending  manual run requested at {} ({})",
                utc(request.requested_at),
                describe_request(request),
            );
        }
        for request in &status.backfills {
            if let Some(range) = request.backfill {
                let _ = writeln!(
                    out,
                    "  backfill {} to {}, requested at {} ({})",
                    utc(range.from()),
                    utc(range.to()),
                    utc(request.requested_at),
                    describe_request(request),
                );
            }
        }
        if let Some(at) = next(&status.job) {
            let _ = writeln!(out, "  next     {}", utc(at));
        }
    }
    out
}

pub(crate) fn status_json(
    statuses: &[JobStatus],
    now: Timestamp,
    next: &dyn Fn(&JobName) -> Option<Timestamp>,
) -> String {
    let jobs: Vec<serde_json::Value> = statuses
        .iter()
        .map(|s| {
            let pause = s.pause.as_ref().map(|p| {
                serde_json::json!({
                    "scope": p.scope.key(),
                    "since": utc(p.since),
                    "until": match p.end {
                        PauseEnd::OnResume => None,
                        PauseEnd::At(until) => Some(utc(until)),
                    },
                    "reason": p.reason,
                    "by": p.by,
                })
            });
            let last = s
                .recent
                .iter()
                .find(|r| r.state != RecordState::Running)
                .map(|r| serde_json::json!({"slot": utc(r.run.slot.at()), "state": r.state.as_str()}));
            serde_json::json!({
                "job": s.job.as_str(),
                "paused": pause,
                "last": last,
                "running": live(s, now),
                "pending": s.pending.iter().map(|r| serde_json::json!({
                    "request": r.id.as_str(),
                    "requested_at": utc(r.requested_at),
                    "by": r.by,
                })).collect::<Vec<_>>(),
                "backfills": s.backfills.iter().filter_map(|r| r.backfill.map(|range| serde_json::json!({
                    "request": r.id.as_str(),
                    "requested_at": utc(r.requested_at),
                    "by": r.by,
                    "from": utc(range.from()),
                    "to": utc(range.to()),
                }))).collect::<Vec<_>>(),
                "next": next(&s.job).map(utc),
            })
        })
        .collect();
    let doc = serde_json::json!({ "store_now": utc(now), "jobs": jobs });
    format!("{doc:#}\n")
}
