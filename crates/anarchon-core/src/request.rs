//! Manual runs: an operator's "run now", kept in the store.
//!
//! A trigger is a request the store keeps under the id the operator gave
//! it (or one made up for them): the same id sent twice — a button pressed
//! on two hosts, a script retried after a timeout — is one request and one
//! run. The store stamps the request with its own clock, and the stamp is
//! the manual run's key ([`Slot::manual`]): distinct for every request of a
//! job (a store moves a stamp that would repeat the job's latest one a
//! millisecond on) and never equal to a scheduled slot.
//!
//! The run itself is claimed like any other, by every instance that has
//! the job: one wins it and runs it, with a lease, a fence, takeovers and
//! the job's overlap rule. Instances hear of a request through the same
//! channel that carries hand-overs ([`crate::LeaseStore::announcements`]),
//! and read the store's requests when they start, so a request made while
//! no instance was up still runs once one is.

use crate::control::MAX_PAUSE_NOTE_LEN;
use crate::ids::Token;
use crate::name::JobName;
use crate::store::RunKey;
use crate::time::{Slot, Timestamp};

/// The longest request id, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// The id of a manual-run request: 1 to [`MAX_REQUEST_ID_LEN`] characters
/// of `[A-Za-z0-9._:-]`, so it fits every store's keys as it is.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(String);

impl RequestId {
    /// `id`, checked.
    ///
    /// # Errors
    ///
    /// [`RequestRefused::Id`] for an empty or too long id, or one with
    /// other characters.
    pub fn new(id: &str) -> Result<Self, RequestRefused> {
        let refuse = |reason: String| {
            Err(RequestRefused::Id {
                id: id.to_owned(),
                reason,
            })
        };
        if id.is_empty() {
            return refuse("it is empty".into());
        }
        if id.len() > MAX_REQUEST_ID_LEN {
            return refuse(format!(
                "it is {} bytes long; the limit is {MAX_REQUEST_ID_LEN}",
                id.len()
            ));
        }
        if let Some(c) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return refuse(format!(
                "{c:?} is not allowed; use letters, digits and . _ : -"
            ));
        }
        Ok(Self(id.to_owned()))
    }

    /// A fresh random id.
    pub fn generate() -> Self {
        Self(Token::generate().to_string())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

crate::ids::shown_as_text!(RequestId);

/// The range of a backfill: the job's scheduled slots from `from` to `to`,
/// both included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backfill {
    from: Timestamp,
    to: Timestamp,
}

impl Backfill {
    /// The slots from `from` to `to`, both included.
    ///
    /// # Errors
    ///
    /// [`RequestRefused::Range`] unless `from` is before `to`.
    pub fn new(from: Timestamp, to: Timestamp) -> Result<Self, RequestRefused> {
        if from >= to {
            return Err(RequestRefused::Range(format!(
                "it starts at {from} and ends at {to}; give a start before the end"
            )));
        }
        Ok(Self { from, to })
    }

    /// The first instant of the range.
    pub fn from(&self) -> Timestamp {
        self.from
    }

    /// The last instant of the range.
    pub fn to(&self) -> Timestamp {
        self.to
    }
}

/// An operator's request before the store stamps it: a manual run of a
/// job now ([`Self::new`]) or a backfill of a range of its slots
/// ([`Self::backfill`]), under an id, with who asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerRequest {
    job: JobName,
    id: RequestId,
    by: Option<String>,
    backfill: Option<Backfill>,
}

impl TriggerRequest {
    /// A request for a manual run of `job` under `id`, author unknown.
    pub fn new(job: JobName, id: RequestId) -> Self {
        Self {
            job,
            id,
            by: None,
            backfill: None,
        }
    }

    /// A request to backfill `job` over `range` under `id`: every slot of
    /// its schedule in the range that has no record, or a `missed` or
    /// `paused` one, runs once, oldest first, one at a time.
    pub fn backfill(job: JobName, id: RequestId, range: Backfill) -> Self {
        Self {
            backfill: Some(range),
            ..Self::new(job, id)
        }
    }

    /// Says who asks: one line of at most [`MAX_PAUSE_NOTE_LEN`]
    /// characters, as a pause's author.
    ///
    /// # Errors
    ///
    /// [`RequestRefused::By`] saying what is wrong with `by`.
    pub fn with_by(mut self, by: &str) -> Result<Self, RequestRefused> {
        self.by = Some(check_by(by)?.to_owned());
        Ok(self)
    }

    /// The job.
    pub fn job(&self) -> &JobName {
        &self.job
    }

    /// The request's id.
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// Who asks, if they said.
    pub fn by(&self) -> Option<&str> {
        self.by.as_deref()
    }

    /// The range, for a backfill.
    pub fn range(&self) -> Option<Backfill> {
        self.backfill
    }

    /// The request as a store answers it: stamped `requested_at`, with the
    /// author `by` and the range `backfill` it holds (this request's for a
    /// new one, the first request's for an id sent again).
    pub fn answer(
        &self,
        requested_at: Timestamp,
        by: Option<String>,
        backfill: Option<Backfill>,
    ) -> RunRequest {
        RunRequest {
            job: self.job.clone(),
            id: self.id.clone(),
            requested_at,
            by,
            backfill,
        }
    }

    /// This request as a store answers it when it writes it at
    /// `requested_at`.
    pub fn stamped(&self, requested_at: Timestamp) -> RunRequest {
        self.answer(requested_at, self.by.clone(), self.backfill)
    }
}

/// A manual-run request as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRequest {
    /// The job to run.
    pub job: JobName,
    /// The request's id.
    pub id: RequestId,
    /// When the store wrote the request, on its clock; unique among the
    /// job's requests.
    pub requested_at: Timestamp,
    /// Who asked, if they said.
    pub by: Option<String>,
    /// For a backfill, its range; `None` for a manual run.
    pub backfill: Option<Backfill>,
}

impl RunRequest {
    /// The manual run a trigger asks for; `None` for a backfill, whose
    /// runs are the slots of its range.
    pub fn run(&self) -> Option<RunKey> {
        self.backfill.is_none().then(|| self.news())
    }

    /// The key a store announces a new request under: the manual slot of
    /// its stamp (for a backfill, no run is ever made under it).
    pub fn news(&self) -> RunKey {
        RunKey::new(self.job.clone(), Slot::manual(self.requested_at))
    }
}

/// The requests a store holds, read with its clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRequests {
    /// The store's clock at the read.
    pub store_now: Timestamp,
    /// Every request not yet collected, oldest first.
    pub requests: Vec<RunRequest>,
}

/// Why a request was not written. Nothing is written in any case.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestRefused {
    /// An id that cannot be kept.
    #[error("invalid request id {id:?}: {reason}")]
    Id {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An author that cannot be kept.
    #[error("the request's author cannot be kept: {0}")]
    By(String),
    /// A backfill range that cannot be run.
    #[error("the backfill range cannot be run: {0}")]
    Range(String),
}

/// `by`, checked as a pause's author is: one line of at most
/// [`MAX_PAUSE_NOTE_LEN`] characters.
fn check_by(by: &str) -> Result<&str, RequestRefused> {
    let len = by.chars().count();
    if len > MAX_PAUSE_NOTE_LEN {
        return Err(RequestRefused::By(format!(
            "it is {len} characters long; the limit is {MAX_PAUSE_NOTE_LEN}"
        )));
    }
    if by.chars().any(char::is_control) {
        return Err(RequestRefused::By(
            "it contains a control character; write it on one line".into(),
        ));
    }
    Ok(by)
}

/// The stamp a store gives a new request of a job at `now`, its clock,
/// when the job's latest request was stamped `latest`: `now`, or a
/// millisecond after `latest` when `now` is not later, so every request of
/// a job has a run of its own.
pub fn stamp(now: Timestamp, latest: Option<Timestamp>) -> Timestamp {
    match latest {
        Some(latest) if latest >= now => Timestamp::from_millis(latest.as_millis() + 1),
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_fit_every_store_key() {
        for good in ["a", "deploy-2026-12-01T10:00", "x.y_z", &"9".repeat(64)] {
            assert_eq!(RequestId::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "has space", "slash/no", "star*", &"9".repeat(65)] {
            let err = RequestId::new(bad).unwrap_err();
            assert!(err.to_string().contains("invalid request id"), "{err}");
        }
        let fresh = RequestId::generate();
        assert_eq!(RequestId::new(fresh.as_str()).unwrap(), fresh);
        assert_ne!(fresh, RequestId::generate());
    }

    #[test]
    fn each_request_of_a_job_gets_a_stamp_of_its_own() {
        let t = Timestamp::from_millis;
        assert_eq!(stamp(t(100), None), t(100));
        assert_eq!(stamp(t(100), Some(t(40))), t(100));
        assert_eq!(stamp(t(100), Some(t(100))), t(101));
        assert_eq!(stamp(t(100), Some(t(250))), t(251));
    }

    #[test]
    fn a_request_names_a_manual_run() {
        let req = TriggerRequest::new(
            JobName::new("report").unwrap(),
            RequestId::new("r1").unwrap(),
        )
        .stamped(Timestamp::from_millis(5_000));
        let run = req.run().unwrap();
        assert!(run.slot.is_manual());
        assert_eq!(run.slot.at(), req.requested_at);
    }

    #[test]
    fn a_backfill_names_no_run_of_its_own_and_needs_a_forward_range() {
        let t = Timestamp::from_millis;
        assert!(Backfill::new(t(5), t(5)).is_err());
        assert!(Backfill::new(t(6), t(5)).is_err());
        let range = Backfill::new(t(1_000), t(9_000)).unwrap();
        let req = TriggerRequest::backfill(
            JobName::new("report").unwrap(),
            RequestId::new("b1").unwrap(),
            range,
        )
        .stamped(t(20_000));
        assert_eq!(req.run(), None);
        assert_eq!(req.backfill, Some(range));
        assert!(req.news().slot.is_manual());
    }

    #[test]
    fn authors_are_one_bounded_line() {
        let req = || TriggerRequest::new(JobName::new("j").unwrap(), RequestId::new("r").unwrap());
        assert_eq!(req().with_by("alice@ops").unwrap().by(), Some("alice@ops"));
        assert!(req().with_by("a\nb").is_err());
        assert!(req().with_by(&"x".repeat(MAX_PAUSE_NOTE_LEN + 1)).is_err());
        assert_eq!(req().by(), None);
    }
}
