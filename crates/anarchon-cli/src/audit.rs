//! `anarchon audit`: the slots each job should have had, against what the
//! store recorded.
//!
//! The store records every slot an instance asked about, so a slot with no
//! record at all is one no instance was up to ask about. The audit walks
//! each job's schedule over the window, reads the job's history, and lists
//! the slots that have no record or ended badly. It exits 1 when it lists
//! any, so it can be a monitoring check of its own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anarchon::{FinalState, JobName, LeaseStore, RecordState, RunKey, RunRecord, Slot, Timestamp};
use chrono::SecondsFormat;

use crate::config::{Crontab, Job};
use crate::error::Error;

/// The most slots of one job the audit walks: a per-second job over a day.
const MAX_SLOTS: usize = 100_000;

/// How a slot of the window fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It ran and succeeded.
    Ran,
    /// It is running, or waits for its retry or for the run before it.
    Going,
    /// It was not run on purpose: skipped for overlap, paused, replaced.
    NotRun(FinalState),
    /// It failed, was interrupted, or was missed: a problem.
    Bad(RecordState),
    /// No instance recorded it: none was up to claim it. A problem.
    NoRecord,
}

impl Verdict {
    fn is_problem(self) -> bool {
        matches!(self, Verdict::Bad(_) | Verdict::NoRecord)
    }

    fn text(self) -> String {
        match self {
            Verdict::Ran => "ran".into(),
            Verdict::Going => "going".into(),
            Verdict::NotRun(state) => state.as_str().into(),
            Verdict::Bad(state) => state.as_str().into(),
            Verdict::NoRecord => "no record (no instance claimed it)".into(),
        }
    }
}

/// The verdict on a slot from its record, if any.
fn verdict(record: Option<&RunRecord>) -> Verdict {
    let Some(record) = record else {
        return Verdict::NoRecord;
    };
    match record.state {
        RecordState::Running | RecordState::Waiting => Verdict::Going,
        RecordState::Finished(FinalState::Succeeded) => Verdict::Ran,
        RecordState::Finished(FinalState::Failed) if record.retry_at.is_some() => Verdict::Going,
        RecordState::Finished(
            state @ (FinalState::Skipped | FinalState::Paused | FinalState::Replaced),
        ) => Verdict::NotRun(state),
        state => Verdict::Bad(state),
    }
}

/// One job's audit: each slot of the window with its verdict.
pub(crate) struct JobAudit {
    pub(crate) job: JobName,
    pub(crate) slots: Vec<(Slot, Verdict)>,
}

impl JobAudit {
    fn problems(&self) -> impl Iterator<Item = &(Slot, Verdict)> {
        self.slots.iter().filter(|(_, v)| v.is_problem())
    }
}

/// Audits `crontab`'s jobs over the `since` before the store's clock:
/// every slot old enough that its late window has passed.
pub(crate) async fn audit(
    store: &dyn LeaseStore,
    crontab: &Crontab,
    since: Duration,
) -> Result<(Timestamp, Vec<JobAudit>), Error> {
    let probe = RunKey::new(
        JobName::new("anarchon-audit").map_err(|source| Error::config(None, None, source))?,
        Slot::from_millis(0),
    );
    let now = store.peek(&probe).await?.store_now;
    let mut out = Vec::with_capacity(crontab.jobs.len());
    for job in &crontab.jobs {
        out.push(audit_job(store, job, now, since).await?);
    }
    Ok((now, out))
}

async fn audit_job(
    store: &dyn LeaseStore,
    job: &Job,
    now: Timestamp,
    since: Duration,
) -> Result<JobAudit, Error> {
    let name = JobName::new(&job.name).map_err(|source| Error::config(None, None, source))?;
    // A slot younger than its late window may still be claimed: not judged.
    let max_late = job
        .options
        .max_late
        .unwrap_or(anarchon::scheduler::DEFAULT_MAX_LATE);
    let settled = now.saturating_sub(max_late);
    let expected = job
        .schedule
        .slots_between(now.saturating_sub(since), settled, MAX_SLOTS);
    // Manual runs share the history: read enough for both.
    let records = store
        .history(&name, expected.len().saturating_mul(2).saturating_add(100))
        .await?;
    let by_slot: BTreeMap<Slot, &RunRecord> = records
        .iter()
        .filter(|r| !r.run.slot.is_manual())
        .map(|r| (r.run.slot, r))
        .collect();
    let slots = expected
        .into_iter()
        .map(|slot| (slot, verdict(by_slot.get(&slot).copied())))
        .collect();
    Ok(JobAudit { job: name, slots })
}

/// The audit as text: a line per job, then its problem slots.
pub(crate) fn report(audits: &[JobAudit], since: Duration) -> String {
    let mut out = String::new();
    let span = humantime::format_duration(since);
    for a in audits {
        let count = |f: fn(&Verdict) -> bool| a.slots.iter().filter(|(_, v)| f(v)).count();
        let ran = count(|v| *v == Verdict::Ran);
        let not_run = count(|v| matches!(v, Verdict::NotRun(_)));
        let going = count(|v| *v == Verdict::Going);
        let problems = a.problems().count();
        let _ = writeln!(
            out,
            "{}: {} slots in the last {span}: {ran} ran, {going} going, {not_run} not run on purpose, {problems} missing or failed",
            a.job,
            a.slots.len()
        );
        for (slot, verdict) in a.problems() {
            let at = slot
                .at()
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::Secs, true);
            let _ = writeln!(out, "  {at}  {}", verdict.text());
        }
    }
    out
}

/// The audit as JSON: per job, its counts and its problem slots.
pub(crate) fn report_json(audits: &[JobAudit], now: Timestamp) -> String {
    let utc = |t: Timestamp| t.to_datetime().to_rfc3339_opts(SecondsFormat::Millis, true);
    let jobs: Vec<serde_json::Value> = audits
        .iter()
        .map(|a| {
            serde_json::json!({
                "job": a.job.as_str(),
                "slots": a.slots.len(),
                "problems": a.problems().map(|(slot, verdict)| serde_json::json!({
                    "slot": utc(slot.at()),
                    "verdict": verdict.text(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    format!(
        "{:#}\n",
        serde_json::json!({ "store_now": utc(now), "jobs": jobs })
    )
}

/// How many slots were missing or failed.
pub(crate) fn problems(audits: &[JobAudit]) -> usize {
    audits.iter().map(|a| a.problems().count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon::{Attempt, PastAttempts};

    fn record(state: RecordState, retry_at: Option<Timestamp>) -> RunRecord {
        RunRecord {
            run: RunKey::new(JobName::new("j").unwrap(), Slot::from_millis(60_000)),
            state,
            attempt: Some(Attempt::FIRST),
            fence: None,
            instance: None,
            started_at: None,
            finished_at: None,
            lease_until: None,
            error: None,
            retry_at,
            earlier: PastAttempts::NONE,
        }
    }

    #[test]
    fn every_state_has_a_verdict_and_only_bad_ones_are_problems() {
        let done = |s| record(RecordState::Finished(s), None);
        assert_eq!(verdict(None), Verdict::NoRecord);
        assert_eq!(verdict(Some(&done(FinalState::Succeeded))), Verdict::Ran);
        assert_eq!(
            verdict(Some(&done(FinalState::Failed))),
            Verdict::Bad(RecordState::Finished(FinalState::Failed))
        );
        let pending = record(
            RecordState::Finished(FinalState::Failed),
            Some(Timestamp::from_millis(1)),
        );
        assert_eq!(verdict(Some(&pending)), Verdict::Going);
        assert!(verdict(Some(&record(RecordState::Missed, None))).is_problem());
        assert!(verdict(Some(&done(FinalState::Interrupted))).is_problem());
        for fine in [
            FinalState::Skipped,
            FinalState::Paused,
            FinalState::Replaced,
        ] {
            assert!(!verdict(Some(&done(fine))).is_problem(), "{fine:?}");
        }
        assert!(!verdict(Some(&record(RecordState::Running, None))).is_problem());
    }
}
