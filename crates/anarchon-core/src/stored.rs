//! Columns read back from a table-shaped store, turned into the core's types.
//!
//! The SQL stores keep a run and a pause as rows of plain integers and text.
//! Reading them back is the same work for each of them — check that an
//! attempt is positive, a fence not negative, a state one of the stored
//! names — so it lives here once, and a store's `SELECT` only has to return
//! the columns in the order these types name.

use std::fmt;

use crate::control::{Pause, PauseEnd, PauseScope};
use crate::ids::{Attempt, Fence, InstanceId};
use crate::name::JobName;
use crate::request::Backfill;
use crate::retry::PastAttempts;
use crate::store::{RecordState, RunKey, RunRecord};
use crate::time::{Slot, Timestamp};

/// One run's columns, in this order: `slot`, `state`, `attempt`, `fence`,
/// `instance`, `started_at`, `finished_at`, `lease_until`, `error`,
/// `retry_at`, `earlier` (times in milliseconds since the Unix epoch; the
/// past attempts as [`PastAttempts::encode`] writes them).
pub type RunColumns = (
    i64,
    String,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// One pause's columns, in this order: `scope` (a job's name, or `*` for
/// every job), `since`, `until` (none: until resumed), `reason`, `by`.
pub type PauseColumns = (String, i64, Option<i64>, Option<String>, Option<String>);

/// A stored value the core's types cannot hold: the store was written by
/// something other than anarchon, or by a newer version of it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the store holds an invalid {what}: {value}")]
pub struct BadValue {
    /// What the value should have been, e.g. `attempt`.
    pub what: &'static str,
    /// The value as stored.
    pub value: String,
}

impl BadValue {
    /// A stored `value` that is no valid `what`.
    pub fn new(what: &'static str, value: impl fmt::Debug) -> Self {
        Self {
            what,
            value: format!("{value:?}"),
        }
    }
}

/// A stored attempt number: positive.
pub fn attempt(n: i64) -> Result<Attempt, BadValue> {
    u32::try_from(n)
        .ok()
        .and_then(Attempt::new)
        .ok_or_else(|| BadValue::new("attempt", n))
}

/// A stored fence: not negative.
pub fn fence(n: i64) -> Result<Fence, BadValue> {
    u64::try_from(n)
        .map(Fence::new)
        .map_err(|_| BadValue::new("fence", n))
}

/// A stored run state, by its stored name.
pub fn state(text: &str) -> Result<RecordState, BadValue> {
    RecordState::parse(text).ok_or_else(|| BadValue::new("run state", text))
}

/// A run of `job` from its [`RunColumns`].
pub fn run_record(job: &JobName, columns: RunColumns) -> Result<RunRecord, BadValue> {
    let (
        slot,
        state_name,
        attempt_n,
        fence_n,
        instance,
        started,
        finished,
        lease_until,
        error,
        retry_at,
        earlier,
    ) = columns;
    let at = |ms: Option<i64>| ms.map(Timestamp::from_millis);
    Ok(RunRecord {
        run: RunKey::new(job.clone(), Slot::from_millis(slot)),
        state: state(&state_name)?,
        attempt: attempt_n.map(attempt).transpose()?,
        fence: fence_n.map(fence).transpose()?,
        instance: instance
            .map(|i| InstanceId::new(&i).map_err(|_| BadValue::new("instance id", &i)))
            .transpose()?,
        started_at: at(started),
        finished_at: at(finished),
        lease_until: at(lease_until),
        error,
        retry_at: at(retry_at),
        earlier: earlier
            .as_deref()
            .map(PastAttempts::decode)
            .transpose()?
            .unwrap_or_default(),
    })
}

/// A backfill's range from its `range_from` and `range_to` columns: both
/// set for a backfill, both empty for a manual run.
pub fn backfill(from: Option<i64>, to: Option<i64>) -> Result<Option<Backfill>, BadValue> {
    match (from, to) {
        (None, None) => Ok(None),
        (Some(f), Some(t)) => Backfill::new(Timestamp::from_millis(f), Timestamp::from_millis(t))
            .map(Some)
            .map_err(|_| BadValue::new("backfill range", (f, t))),
        other => Err(BadValue::new("backfill range", other)),
    }
}

/// A pause from its [`PauseColumns`].
pub fn pause(columns: PauseColumns) -> Result<Pause, BadValue> {
    let (scope, since, until, reason, by) = columns;
    Ok(Pause {
        scope: PauseScope::from_key(&scope).ok_or_else(|| BadValue::new("pause scope", &scope))?,
        since: Timestamp::from_millis(since),
        end: PauseEnd::from_millis(until),
        reason,
        by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobName {
        JobName::new("report").unwrap()
    }

    #[test]
    fn a_run_reads_back_from_its_columns() {
        let columns: RunColumns = (
            60_000,
            "succeeded".into(),
            Some(2),
            Some(7),
            Some("host-a".into()),
            Some(60_010),
            Some(60_500),
            Some(90_010),
            None,
            None,
            Some(r#"[{"attempt":1,"ended":"taken-over","instance":"host-b"}]"#.into()),
        );
        let record = run_record(&job(), columns).unwrap();
        assert_eq!(record.run, RunKey::new(job(), Slot::from_millis(60_000)));
        assert_eq!(record.state.as_str(), "succeeded");
        assert_eq!(record.attempt, Attempt::new(2));
        assert_eq!(record.fence, Some(Fence::new(7)));
        assert_eq!(record.instance.as_ref().unwrap().as_str(), "host-a");
        assert_eq!(record.finished_at, Some(Timestamp::from_millis(60_500)));
        assert_eq!(
            record.cause(),
            Some(crate::retry::AttemptCause::Takeover),
            "attempt 2 after one taken over"
        );
    }

    #[test]
    fn values_anarchon_never_writes_are_refused_by_name() {
        assert_eq!(attempt(0).unwrap_err().what, "attempt");
        assert_eq!(fence(-1).unwrap_err().what, "fence");
        let err = state("sleeping").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the store holds an invalid run state: \"sleeping\""
        );
        let bad_instance = (
            1,
            "missed".into(),
            None,
            None,
            Some(String::new()),
            None,
            None,
            None,
            None,
            None,
            None,
        );
        assert_eq!(
            run_record(&job(), bad_instance).unwrap_err().what,
            "instance id"
        );
        let bad_scope = ("not a job!".into(), 0, None, None, None);
        assert_eq!(pause(bad_scope).unwrap_err().what, "pause scope");
    }

    #[test]
    fn a_backfill_range_has_both_ends_or_none() {
        assert_eq!(backfill(None, None), Ok(None));
        assert_eq!(
            backfill(Some(1), Some(2)).unwrap().unwrap().to(),
            Timestamp::from_millis(2)
        );
        assert!(backfill(Some(1), None).is_err());
        assert!(backfill(Some(2), Some(1)).is_err());
    }

    #[test]
    fn a_pause_reads_back_from_its_columns() {
        let p = pause(("*".into(), 5, Some(9), Some("deploy".into()), None)).unwrap();
        assert_eq!(p.scope, PauseScope::All);
        assert_eq!(p.end, PauseEnd::from_millis(Some(9)));
        assert_eq!(p.reason.as_deref(), Some("deploy"));
    }
}
