//! Instants and slots.
//!
//! Every instant anarchon stores or compares is UTC milliseconds since the
//! Unix epoch. Two types keep their roles apart: a [`Timestamp`] is a moment
//! on some clock (usually the store's), a [`Slot`] is the nominal fire time of
//! a run, computed from the schedule and never from "now".
//!
//! A slot is also the run's key within its job. Manual runs (an operator's
//! "run now") need keys of their own that no schedule can produce, so they
//! live in the negative half of the same number line: the manual run
//! requested at store time `t` has the key `-t`. Every store keeps them in
//! the same table or keyspace as scheduled runs, with the same fences and
//! overlap rules, and measures a slot's age, order and lateness by
//! [`Slot::at`], which is `t` for both kinds.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};

/// A duration as whole milliseconds, saturating at `i64::MAX`.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An instant: UTC milliseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The instant `ms` milliseconds after the Unix epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(millis(d)))
    }

    /// `self - d`, saturating.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(millis(d)))
    }

    /// How long after `earlier` this instant is; zero if it is not later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// The instant as a chrono UTC date-time (clamped to chrono's range).
    pub fn to_datetime(self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.0)
            .single()
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// The instant of a chrono date-time.
    pub fn from_datetime<Tz: TimeZone>(dt: &DateTime<Tz>) -> Self {
        Self(dt.timestamp_millis())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            &self
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::Millis, true),
        )
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({self})")
    }
}

/// The nominal fire time of one run of a job, and the run's key within
/// the job.
///
/// A scheduled slot is computed from the job's schedule, so every instance
/// names the same run with the same slot whatever its own clock says. A
/// manual slot ([`Slot::manual`]) names a run an operator asked for; its
/// stored number is negative, so it never equals a scheduled slot.
///
/// Slots order by their instant ([`Slot::at`]), a scheduled slot before a
/// manual one of the same instant.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot(Timestamp);

impl Ord for Slot {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at(), self.is_manual()).cmp(&(other.at(), other.is_manual()))
    }
}

impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Slot {
    /// The slot stored as `ms`: a scheduled slot at `ms` UTC milliseconds
    /// since the Unix epoch, or, when `ms` is negative, the manual slot of
    /// a run requested at `-ms`.
    pub const fn from_millis(ms: i64) -> Self {
        Self(Timestamp(ms))
    }

    /// The key of the manual run requested at `requested_at` (store time;
    /// at least 1 ms after the epoch, as every real store time is).
    pub const fn manual(requested_at: Timestamp) -> Self {
        let ms = if requested_at.0 < 1 {
            1
        } else {
            requested_at.0
        };
        Self(Timestamp(-ms))
    }

    /// Whether this is a manual run's slot.
    pub const fn is_manual(self) -> bool {
        self.0.0 < 0
    }

    /// The number a store keeps for the slot: the fire time of a scheduled
    /// slot, the negated request time of a manual one.
    pub const fn as_millis(self) -> i64 {
        self.0.0
    }

    /// The slot's instant: the fire time of a scheduled slot, the request
    /// time of a manual one. Lateness, age and history order go by it.
    pub const fn at(self) -> Timestamp {
        Timestamp(self.0.0.saturating_abs())
    }
}

impl From<Timestamp> for Slot {
    fn from(t: Timestamp) -> Self {
        Self(t)
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.at(), f)?;
        if self.is_manual() {
            f.write_str(" (manual)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Slot({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_rfc3339_utc() {
        assert_eq!(
            Slot::from_millis(1_791_633_610_000).to_string(),
            "2026-10-10T12:00:10.000Z"
        );
    }

    #[test]
    fn a_manual_slot_is_never_a_scheduled_one_and_keeps_its_time() {
        let at = Timestamp::from_millis(1_791_633_610_000);
        let manual = Slot::manual(at);
        assert!(manual.is_manual());
        assert_ne!(manual, Slot::from(at));
        assert_eq!(manual.at(), at);
        assert_eq!(Slot::from_millis(manual.as_millis()), manual);
        assert!(!Slot::from(at).is_manual());
        assert_eq!(manual.to_string(), "2026-10-10T12:00:10.000Z (manual)");
        assert!(Slot::manual(Timestamp::from_millis(0)).is_manual());
        let before = Slot::from_millis(at.as_millis() - 1);
        let after = Slot::from_millis(at.as_millis() + 1);
        assert!(before < Slot::from(at) && Slot::from(at) < manual && manual < after);
    }

    #[test]
    fn since_is_zero_for_earlier() {
        let a = Timestamp::from_millis(1000);
        let b = Timestamp::from_millis(1500);
        assert_eq!(b.since(a), Duration::from_millis(500));
        assert_eq!(a.since(b), Duration::ZERO);
    }
}
