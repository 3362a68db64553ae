//! What the read-only commands print: `history` and `next`.

use std::fmt::Write as _;

use anarchon::{AttemptEnd, JobName, LeaseStore, RecordState, RunRecord, Schedule, Timestamp};
use chrono::{Local, SecondsFormat};

use crate::error::Error;
use crate::printable::printable;

/// The runs of `jobs`, newest slot first, at most `limit` in all.
pub(crate) async fn history(
    store: &dyn LeaseStore,
    jobs: &[JobName],
    limit: usize,
) -> Result<Vec<RunRecord>, Error> {
    let mut runs = Vec::new();
    for job in jobs {
        runs.extend(store.history(job, limit).await?);
    }
    runs.sort_by(|a, b| b.run.slot.cmp(&a.run.slot).then(a.run.job.cmp(&b.run.job)));
    runs.truncate(limit);
    Ok(runs)
}

/// Where a run came from: its job's schedule, or an operator's trigger.
fn origin(r: &RunRecord) -> &'static str {
    if r.run.slot.is_manual() {
        "manual"
    } else {
        "schedule"
    }
}

/// A table of runs: slot (local and UTC; a manual run's request time),
/// job, origin, state, attempt, instance, duration, error. A run's
/// earlier attempts follow it, newest first, each on its own row with how
/// it ended (`failed, retried` or `taken over`).
pub(crate) fn history_table(runs: &[RunRecord]) -> String {
    let header = [
        "SLOT (LOCAL)",
        "SLOT (UTC)",
        "JOB",
        "ORIGIN",
        "STATE",
        "ATTEMPT",
        "INSTANCE",
        "DURATION",
        "ERROR",
    ];
    let rows: Vec<[String; 9]> = runs
        .iter()
        .flat_map(|r| {
            let at = r.run.slot.at().to_datetime();
            let slot = [
                at.with_timezone(&Local)
                    .format("%Y-%m-%d %H:%M:%S %:z")
                    .to_string(),
                at.to_rfc3339_opts(SecondsFormat::Secs, true),
                r.run.job.to_string(),
                origin(r).to_owned(),
            ];
            let instance = |i: Option<&anarchon::InstanceId>| {
                i.map_or_else(|| "-".into(), |i| printable(i.as_str()))
            };
            let [local, utc, job, origin] = slot;
            let latest = [
                local.clone(),
                utc.clone(),
                job.clone(),
                origin.clone(),
                state(r),
                r.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
                instance(r.instance.as_ref()),
                duration(r.started_at, r.finished_at, r.state),
                // Stored text may carry terminal escapes: never print it raw.
                r.error.as_deref().map(printable).unwrap_or_default(),
            ];
            let earlier = r.earlier.iter().rev().map(move |p| {
                [
                    local.clone(),
                    utc.clone(),
                    job.clone(),
                    origin.clone(),
                    match p.ended {
                        AttemptEnd::Failed => "failed, retried".into(),
                        AttemptEnd::TakenOver => "taken over".into(),
                    },
                    p.attempt.to_string(),
                    instance(p.instance.as_ref()),
                    "-".into(),
                    p.error.as_deref().map(printable).unwrap_or_default(),
                ]
            });
            std::iter::once(latest).chain(earlier)
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// The runs as a JSON array, newest first: each with its job, slot,
/// origin (`schedule` or `manual`), state, attempt, fence, instance, times (RFC 3339, UTC) and error. Times
/// and numbers a run does not have are `null`.
pub(crate) fn history_json(runs: &[RunRecord]) -> String {
    let at = |t: Option<Timestamp>| {
        t.map(|t| t.to_datetime().to_rfc3339_opts(SecondsFormat::Millis, true))
    };
    let rows: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            serde_json::json!({
                "job": r.run.job.as_str(),
                "slot": at(Some(r.run.slot.at())),
                "origin": origin(r),
                "state": r.state.as_str(),
                "attempt": r.attempt.map(|a| a.get()),
                "fence": r.fence.map(|f| f.get()),
                "instance": r.instance.as_ref().map(|i| i.as_str()),
                "started_at": at(r.started_at),
                "finished_at": at(r.finished_at),
                "lease_until": at(r.lease_until),
                "error": r.error,
                "cause": r.cause().map(|c| c.as_str()),
                "retry_at": at(r.retry_at),
                "earlier": r.earlier.iter().map(|p| serde_json::json!({
                    "attempt": p.attempt.get(),
                    "ended": p.ended.as_str(),
                    "at": at(p.at),
                    "instance": p.instance.as_ref().map(|i| i.as_str()),
                    "error": p.error,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    format!("{:#}\n", serde_json::Value::Array(rows))
}

fn state(r: &RunRecord) -> String {
    match (r.state, r.retry_at) {
        (RecordState::Running, _) => "running".into(),
        (_, Some(due)) => format!(
            "failed, retry due {}",
            due.to_datetime().to_rfc3339_opts(SecondsFormat::Secs, true)
        ),
        (other, None) => other.as_str().into(),
    }
}

fn duration(start: Option<Timestamp>, end: Option<Timestamp>, state: RecordState) -> String {
    match (start, end) {
        (Some(s), Some(e)) => humantime::format_duration(round(e.since(s))).to_string(),
        (Some(_), None) if state == RecordState::Running => "(running)".into(),
        _ => "-".into(),
    }
}

/// Milliseconds are enough for a table.
fn round(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The next `count` slots of `schedule` after `now`, one per line: the
/// local time in the schedule's zone and the UTC instant.
pub(crate) fn next_slots(schedule: &Schedule, now: Timestamp, count: usize) -> String {
    let mut out = String::new();
    let mut after = now;
    for _ in 0..count {
        let Some(slot) = schedule.next_after(after) else {
            break;
        };
        let at = slot.at().to_datetime();
        let utc = at.to_rfc3339_opts(SecondsFormat::Secs, true);
        match schedule.time_zone() {
            Some(zone) => {
                let local = at.with_timezone(&zone).format("%Y-%m-%d %H:%M:%S %Z (%a)");
                let _ = writeln!(out, "{local}  =  {utc}");
            }
            None => {
                let _ = writeln!(out, "{utc}");
            }
        }
        after = slot.at();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use anarchon::{Attempt, FinalState, InstanceId, RunKey, Slot};

    use super::*;

    #[test]
    fn next_slots_are_local_and_utc() {
        let s = Schedule::cron_in("30 3 * * *", "Europe/Athens").unwrap();
        // 2027-03-27 12:00 UTC: the next day is the spring-forward day.
        let text = next_slots(&s, Timestamp::from_millis(1_806_148_800_000), 2);
        assert_eq!(
            text,
            "2027-03-28 04:00:00 EEST (Sun)  =  2027-03-28T01:00:00Z\n\
             2027-03-29 03:30:00 EEST (Mon)  =  2027-03-29T00:30:00Z\n"
        );
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        assert_eq!(
            next_slots(&every, Timestamp::from_millis(30_000), 1),
            "1970-01-01T00:01:00Z\n"
        );
    }

    /// A failed first attempt of `backup` at 2027-01-15T08:00:00Z on
    /// `host-1-abc`, with `error`, no times and no fence.
    fn failed_backup(error: &str) -> RunRecord {
        RunRecord {
            run: RunKey::new(
                JobName::new("backup").unwrap(),
                Slot::from_millis(1_800_000_000_000),
            ),
            state: RecordState::Finished(FinalState::Failed),
            attempt: Some(Attempt::FIRST),
            fence: None,
            instance: Some(InstanceId::new("host-1-abc").unwrap()),
            started_at: None,
            finished_at: None,
            lease_until: None,
            error: Some(error.into()),
            retry_at: None,
            earlier: anarchon::PastAttempts::NONE,
        }
    }

    #[test]
    fn history_json_has_an_object_per_run() {
        let run = RunRecord {
            started_at: Some(Timestamp::from_millis(1_800_000_000_010)),
            ..failed_backup("exit status 3\u{1b}[2K")
        };
        let text = history_json(&[run]);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc[0]["job"], "backup");
        assert_eq!(doc[0]["slot"], "2027-01-15T08:00:00.000Z");
        assert_eq!(doc[0]["state"], "failed");
        assert_eq!(doc[0]["attempt"], 1);
        assert_eq!(doc[0]["fence"], serde_json::Value::Null);
        assert_eq!(doc[0]["started_at"], "2027-01-15T08:00:00.010Z");
        // JSON escapes control characters: the text cannot drive a terminal.
        assert!(!text.contains('\u{1b}'), "{text}");
        assert_eq!(doc[0]["error"], "exit status 3\u{1b}[2K");
    }

    #[test]
    fn the_history_table_has_a_row_per_run() {
        let job = JobName::new("backup").unwrap();
        let runs = vec![
            RunRecord {
                attempt: Some(Attempt::FIRST.next()),
                started_at: Some(Timestamp::from_millis(1_800_000_000_010)),
                finished_at: Some(Timestamp::from_millis(1_800_000_001_510)),
                ..failed_backup("exit status 3")
            },
            RunRecord {
                run: RunKey::new(job, Slot::from_millis(1_799_999_940_000)),
                state: RecordState::Missed,
                attempt: None,
                fence: None,
                instance: None,
                started_at: None,
                finished_at: Some(Timestamp::from_millis(1_800_000_000_000)),
                lease_until: None,
                error: None,
                retry_at: None,
                earlier: anarchon::PastAttempts::NONE,
            },
        ];
        let table = history_table(&runs);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("SLOT (LOCAL)"), "{table}");
        assert!(lines[1].contains("2027-01-15T08:00:00Z"), "{table}");
        assert!(lines[1].contains("failed"), "{table}");
        assert!(lines[1].contains("1s 500ms"), "{table}");
        assert!(lines[1].ends_with("exit status 3"), "{table}");
        assert!(lines[2].contains("missed"), "{table}");
    }

    #[test]
    fn a_retried_run_shows_each_attempt_and_how_it_ended() {
        let past: anarchon::PastAttempts = [anarchon::PastAttempt {
            attempt: Attempt::FIRST,
            ended: AttemptEnd::Failed,
            at: Some(Timestamp::from_millis(1_800_000_000_500)),
            instance: Some(InstanceId::new("host-2-def").unwrap()),
            error: Some("exit status 1".into()),
        }]
        .into_iter()
        .collect();
        let run = RunRecord {
            state: RecordState::Finished(FinalState::Succeeded),
            attempt: Some(Attempt::FIRST.next()),
            error: None,
            earlier: past,
            ..failed_backup("")
        };
        let table = history_table(std::slice::from_ref(&run));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "the run, then its earlier attempt: {table}");
        assert!(lines[1].contains("succeeded"), "{table}");
        assert!(lines[2].contains("failed, retried"), "{table}");
        assert!(lines[2].contains("host-2-def"), "{table}");
        assert!(lines[2].ends_with("exit status 1"), "{table}");
        let doc: serde_json::Value = serde_json::from_str(&history_json(&[run])).unwrap();
        assert_eq!(doc[0]["cause"], "retry");
        assert_eq!(doc[0]["earlier"][0]["ended"], "failed");
        assert_eq!(doc[0]["earlier"][0]["error"], "exit status 1");
        let pending = RunRecord {
            retry_at: Some(Timestamp::from_millis(1_800_000_060_000)),
            ..failed_backup("exit status 1")
        };
        assert!(
            history_table(&[pending]).contains("failed, retry due 2027-01-15T08:01:00Z"),
            "a pending retry says when it is due"
        );
    }

    /// A record planted in the store with terminal escapes (a clipboard
    /// write, a line erase and a fake state) and a bidi override prints as
    /// one inert row.
    #[test]
    fn the_history_table_prints_no_escape_sequence() {
        let planted = failed_backup(
            "\u{1b}]52;c;ZXZpbA==\u{7}\r\u{1b}[2Kbackup succeeded\u{202e}txt.exe\nfake row",
        );
        let table = history_table(&[planted]);
        assert!(
            !table
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{table:?}"
        );
        assert_eq!(table.lines().count(), 2, "one header, one row: {table}");
        assert!(table.contains("\\u{1b}]52;c;"), "{table}");
    }
}
