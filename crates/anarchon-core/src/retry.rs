//! Retries: a run whose handler failed is tried again after a backoff, by
//! whichever instance claims it first once the store's clock reaches the
//! retry's due time.
//!
//! The runner that failed decides only *whether* a retry is wanted (it has
//! retries left) and *how long* to wait ([`RetryPolicy::backoff`]); it hands
//! both to the store with its finish as a [`RetryPlan`]. The store turns the
//! wait into a due time on its own clock and keeps it with the `failed`
//! record, so no instance's clock decides when the retry may start, and the
//! instance that failed has no claim to it that the others lack. A retry is
//! the next attempt of the same run: a new token, a new fence, a new lease.
//!
//! A retry never piles up behind the schedule: a plan carries the job's next
//! slot, and a retry that would be due at or after it is not made — the run
//! ends `failed` for good with [`NOT_RETRIED`] added to its error.
//!
//! Earlier attempts of a run stay in its record as [`PastAttempts`], so the
//! history shows each attempt and how it ended (failed, or taken over when
//! its runner's lease ran out).

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::ids::{Attempt, Fence, InstanceId};
use crate::name::JobName;
use crate::store::Win;
use crate::stored::BadValue;
use crate::time::{Slot, Timestamp};

/// What a store adds to the error of a failed run whose retry it did not
/// make because the retry would have been due at or after the job's next
/// slot.
pub const NOT_RETRIED: &str = " (not retried: the retry would be due after the job's next slot)";

/// The longest backoff a policy may name: a retry is never due after the
/// job's next slot anyway.
const MAX_BACKOFF: Duration = Duration::from_secs(366 * 24 * 3600);

/// The default growth of the backoff from one retry to the next.
const DEFAULT_GROWTH: f64 = 2.0;

/// The share of a backoff that jitter may take off, so the retries of many
/// runs that failed together spread out.
const JITTER_SHARE: f64 = 0.1;

/// How a job retries a failed run: how many times, and how long it waits
/// before each retry.
///
/// The wait before retry `n` (1 for the first) is `backoff × growthⁿ⁻¹`,
/// capped at `cap`, less up to a tenth taken off by a jitter that is a
/// function of the job, the slot and `n`: every instance computes the same
/// wait, and runs that failed together do not all retry in the same
/// millisecond.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    retries: NonZeroU32,
    backoff: Duration,
    growth: f64,
    cap: Duration,
}

impl RetryPolicy {
    /// Up to `retries` retries, the first `backoff` after the failure; the
    /// wait doubles at each retry, and is capped at an hour (or at `backoff`
    /// if that is longer) unless [`Self::with_cap`] says otherwise.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming `retries` for 0, or
    /// `retry_backoff` for a zero or longer-than-a-year backoff.
    pub fn new(retries: u32, backoff: Duration) -> Result<Self, ConfigError> {
        let retries = NonZeroU32::new(retries).ok_or_else(|| ConfigError::OutOfRange {
            option: "retries",
            reason: "it must be at least 1 (leave retries out for none)".into(),
        })?;
        if backoff.is_zero() || backoff > MAX_BACKOFF {
            return Err(ConfigError::OutOfRange {
                option: "retry_backoff",
                reason: format!("{backoff:?} is not between 1 ms and 366 days"),
            });
        }
        let backoff = backoff.max(Duration::from_millis(1));
        Ok(Self {
            retries,
            backoff,
            growth: DEFAULT_GROWTH,
            cap: backoff.max(Duration::from_secs(3600)),
        })
    }

    /// The factor the wait grows by from one retry to the next (default 2;
    /// 1 keeps it constant).
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming `retry_growth` for a factor below
    /// 1, above 100, or not a number.
    pub fn with_growth(mut self, growth: f64) -> Result<Self, ConfigError> {
        if !(1.0..=100.0).contains(&growth) {
            return Err(ConfigError::OutOfRange {
                option: "retry_growth",
                reason: format!("{growth} is not between 1 and 100"),
            });
        }
        self.growth = growth;
        Ok(self)
    }

    /// The longest wait before a retry.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming `retry_backoff_max` for a cap
    /// shorter than the first backoff or longer than a year.
    pub fn with_cap(mut self, cap: Duration) -> Result<Self, ConfigError> {
        if cap < self.backoff || cap > MAX_BACKOFF {
            return Err(ConfigError::OutOfRange {
                option: "retry_backoff_max",
                reason: format!(
                    "{cap:?} must be at least the first backoff ({:?}) and at most 366 days",
                    self.backoff
                ),
            });
        }
        self.cap = cap;
        Ok(self)
    }

    /// How many retries a failed run gets.
    pub fn retries(&self) -> u32 {
        self.retries.get()
    }

    /// The wait before the first retry.
    pub fn first_backoff(&self) -> Duration {
        self.backoff
    }

    /// The growth factor.
    pub fn growth(&self) -> f64 {
        self.growth
    }

    /// The longest wait.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The wait before retry `n` (1 for the first) of `job`'s run at
    /// `slot`: the same on every instance.
    pub fn backoff(&self, job: &JobName, slot: Slot, n: u32) -> Duration {
        let exponent = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
        let grown = self.backoff.as_secs_f64() * self.growth.powi(exponent);
        let capped = if grown.is_finite() {
            grown.min(self.cap.as_secs_f64())
        } else {
            self.cap.as_secs_f64()
        };
        let jitter = 1.0 - JITTER_SHARE * unit_hash(job, slot, n);
        Duration::from_secs_f64(capped * jitter).max(Duration::from_millis(1))
    }
}

/// A number in `[0, 1)` from the job, slot and retry number: FNV-1a, so it
/// is the same in every build and on every platform.
fn unit_hash(job: &JobName, slot: Slot, n: u32) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = job
        .as_str()
        .bytes()
        .chain(slot.as_millis().to_le_bytes())
        .chain(n.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // The top 53 bits make an exact f64 fraction.
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// What a runner whose handler failed asks of the store with its finish:
/// record the failure with a retry due `after` from the store's `now`,
/// unless that is not before `before` (the job's next slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPlan {
    /// How long after the failure the retry is due.
    pub after: Duration,
    /// The job's next slot: a retry due at or after it is not made.
    pub before: Timestamp,
}

impl RetryPlan {
    /// When the retry is due for a failure recorded at `now`, or `None`
    /// when it would not be before [`Self::before`].
    pub fn due(&self, now: Timestamp) -> Option<Timestamp> {
        let due = now.saturating_add(self.after);
        (due < self.before).then_some(due)
    }
}

/// How an attempt came to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptCause {
    /// The run's first attempt (or one given back before its handler
    /// started, run again).
    First,
    /// The previous attempt's runner lost its lease (it died, hung, or
    /// handed the run over at shutdown).
    Takeover,
    /// The previous attempt failed and the job retries failures.
    Retry,
}

impl AttemptCause {
    /// The cause's name: `first`, `takeover` or `retry`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptCause::First => "first",
            AttemptCause::Takeover => "takeover",
            AttemptCause::Retry => "retry",
        }
    }
}

impl fmt::Display for AttemptCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an earlier attempt of a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// Its handler failed; the next attempt was a retry.
    #[serde(rename = "failed")]
    Failed,
    /// Its lease ran out; the next attempt took the run over.
    #[serde(rename = "taken-over")]
    TakenOver,
}

impl AttemptEnd {
    /// The name stores write: `failed` or `taken-over`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptEnd::Failed => "failed",
            AttemptEnd::TakenOver => "taken-over",
        }
    }
}

/// An earlier attempt of a run, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastAttempt {
    /// Which attempt it was.
    pub attempt: Attempt,
    /// How it ended.
    pub ended: AttemptEnd,
    /// When it ended, on the store's clock: when it failed, or when its
    /// lease ran out.
    pub at: Option<Timestamp>,
    /// The instance that ran it.
    pub instance: Option<InstanceId>,
    /// Its error, for a failed attempt.
    pub error: Option<String>,
}

/// A past attempt as stored: one JSON object with these names, which the
/// Lua script and the PostgreSQL function write too.
#[derive(Serialize, Deserialize)]
struct StoredAttempt {
    attempt: u32,
    ended: AttemptEnd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instance: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The earlier attempts of a run, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PastAttempts(Vec<PastAttempt>);

impl PastAttempts {
    /// None yet.
    pub const NONE: PastAttempts = PastAttempts(Vec::new());

    /// The attempts, oldest first.
    pub fn iter(&self) -> std::slice::Iter<'_, PastAttempt> {
        self.0.iter()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds the attempt that just ended.
    pub fn push(&mut self, past: PastAttempt) {
        self.0.push(past);
    }

    /// How many retries the run has had: its attempts that failed.
    pub fn retries(&self) -> u32 {
        let failed = self.0.iter().filter(|p| p.ended == AttemptEnd::Failed);
        u32::try_from(failed.count()).unwrap_or(u32::MAX)
    }

    /// How the run's current `attempt` came to run: after a failure it is
    /// a retry, after a lost lease a takeover.
    pub fn cause_of(&self, attempt: Attempt) -> AttemptCause {
        match self.0.last() {
            _ if attempt == Attempt::FIRST => AttemptCause::First,
            Some(p) if p.ended == AttemptEnd::Failed => AttemptCause::Retry,
            _ => AttemptCause::Takeover,
        }
    }

    /// The win of the run's current `attempt` under `fence`, told with how
    /// it came to run.
    pub fn win(&self, attempt: Attempt, fence: Option<Fence>) -> Win {
        Win {
            attempt,
            fence,
            cause: self.cause_of(attempt),
            retries: self.retries(),
        }
    }

    /// The attempts as stores keep them: a JSON array (`[]` for none).
    pub fn encode(&self) -> String {
        let stored: Vec<StoredAttempt> = self
            .0
            .iter()
            .map(|p| StoredAttempt {
                attempt: p.attempt.get(),
                ended: p.ended,
                at: p.at.map(Timestamp::as_millis),
                instance: p.instance.as_ref().map(|i| i.as_str().to_owned()),
                error: p.error.clone(),
            })
            .collect();
        serde_json::to_string(&stored).unwrap_or_else(|_| "[]".into())
    }

    /// Reads what [`Self::encode`] (or a store script) wrote; an empty text
    /// is none. Lua's JSON encoder writes an empty array as `{}`, which
    /// reads as none too.
    ///
    /// # Errors
    ///
    /// A [`BadValue`] naming the past attempts when the text is no such
    /// array.
    pub fn decode(text: &str) -> Result<Self, BadValue> {
        let text = text.trim();
        if text.is_empty() || text == "{}" {
            return Ok(Self::NONE);
        }
        let bad = || BadValue::new("list of past attempts", text);
        let stored: Vec<StoredAttempt> = serde_json::from_str(text).map_err(|_| bad())?;
        stored
            .into_iter()
            .map(|s| {
                Ok(PastAttempt {
                    attempt: Attempt::new(s.attempt).ok_or_else(bad)?,
                    ended: s.ended,
                    at: s.at.map(Timestamp::from_millis),
                    instance: s
                        .instance
                        .map(|i| InstanceId::new(&i).map_err(|_| bad()))
                        .transpose()?,
                    error: s.error,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }
}

impl FromIterator<PastAttempt> for PastAttempts {
    fn from_iter<I: IntoIterator<Item = PastAttempt>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a PastAttempts {
    type Item = &'a PastAttempt;
    type IntoIter = std::slice::Iter<'a, PastAttempt>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobName {
        JobName::new("report").unwrap()
    }

    #[test]
    fn the_backoff_grows_is_capped_and_is_the_same_everywhere() {
        let policy = RetryPolicy::new(5, Duration::from_secs(10))
            .unwrap()
            .with_cap(Duration::from_secs(30))
            .unwrap();
        let slot = Slot::from_millis(60_000);
        let waits: Vec<Duration> = (1..=4).map(|n| policy.backoff(&job(), slot, n)).collect();
        for (n, (wait, full)) in waits.iter().zip([10.0, 20.0, 30.0, 30.0]).enumerate() {
            let secs = wait.as_secs_f64();
            assert!(
                secs <= full && secs >= full * 0.9,
                "retry {}: {secs} s is not within a tenth below {full} s",
                n + 1
            );
        }
        assert_eq!(waits[0], policy.backoff(&job(), slot, 1), "deterministic");
        let other = Slot::from_millis(120_000);
        assert_ne!(
            policy.backoff(&job(), other, 1),
            waits[0],
            "another slot gets another jitter"
        );
        let huge = policy.backoff(&job(), slot, u32::MAX);
        assert!(huge <= Duration::from_secs(30));
    }

    #[test]
    fn a_policy_refuses_what_cannot_work_by_name() {
        let option = |e: ConfigError| match e {
            ConfigError::OutOfRange { option, .. } => option,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            option(RetryPolicy::new(0, Duration::from_secs(1)).unwrap_err()),
            "retries"
        );
        assert_eq!(
            option(RetryPolicy::new(1, Duration::ZERO).unwrap_err()),
            "retry_backoff"
        );
        let p = RetryPolicy::new(1, Duration::from_secs(10)).unwrap();
        assert_eq!(
            option(p.with_cap(Duration::from_secs(5)).unwrap_err()),
            "retry_backoff_max"
        );
        assert_eq!(option(p.with_growth(0.5).unwrap_err()), "retry_growth");
        assert_eq!(option(p.with_growth(f64::NAN).unwrap_err()), "retry_growth");
        assert_eq!(
            RetryPolicy::new(1, Duration::from_secs(7200))
                .unwrap()
                .cap(),
            Duration::from_secs(7200)
        );
    }

    #[test]
    fn a_retry_is_due_only_before_the_next_slot() {
        let plan = RetryPlan {
            after: Duration::from_millis(500),
            before: Timestamp::from_millis(2_000),
        };
        assert_eq!(
            plan.due(Timestamp::from_millis(1_000)),
            Some(Timestamp::from_millis(1_500))
        );
        assert_eq!(plan.due(Timestamp::from_millis(1_500)), None);
    }

    #[test]
    fn past_attempts_read_back_and_tell_the_cause() {
        let mut past = PastAttempts::NONE;
        assert_eq!(past.cause_of(Attempt::FIRST), AttemptCause::First);
        past.push(PastAttempt {
            attempt: Attempt::FIRST,
            ended: AttemptEnd::TakenOver,
            at: Some(Timestamp::from_millis(5)),
            instance: Some(InstanceId::new("a").unwrap()),
            error: None,
        });
        let two = Attempt::new(2).unwrap();
        assert_eq!(past.cause_of(two), AttemptCause::Takeover);
        past.push(PastAttempt {
            attempt: two,
            ended: AttemptEnd::Failed,
            at: Some(Timestamp::from_millis(9)),
            instance: Some(InstanceId::new("b").unwrap()),
            error: Some("disk \"full\"\nagain".into()),
        });
        let three = Attempt::new(3).unwrap();
        let win = past.win(three, Some(Fence::new(4)));
        assert_eq!((win.cause, win.retries), (AttemptCause::Retry, 1));
        let text = past.encode();
        assert_eq!(PastAttempts::decode(&text).unwrap(), past);
        assert_eq!(PastAttempts::decode("").unwrap(), PastAttempts::NONE);
        assert_eq!(PastAttempts::decode("{}").unwrap(), PastAttempts::NONE);
        assert_eq!(
            PastAttempts::decode("[{\"attempt\":0,\"ended\":\"failed\"}]")
                .unwrap_err()
                .what,
            "list of past attempts"
        );
        // What a Lua script writes: no `at`, keys in another order.
        let lua = r#"[{"instance":"c","ended":"failed","attempt":1,"error":"x"}]"#;
        assert_eq!(
            PastAttempts::decode(lua).unwrap().retries(),
            1,
            "a script's encoding reads back"
        );
    }
}
