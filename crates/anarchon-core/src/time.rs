//! Instants and slots.
//!
//! Every instant anarchon stores or compares is UTC milliseconds since the
//! Unix epoch. Two types keep their roles apart: a [`Timestamp`] is a moment
//! on some clock (usually the store's), a [`Slot`] is the nominal fire time of
//! a run, computed from the schedule and never from "now".

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

/// The nominal fire time of one run of a job.
///
/// A slot is computed from the job's schedule, so every instance names the
/// same run with the same slot whatever its own clock says.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(Timestamp);

impl Slot {
    /// The slot at `ms` UTC milliseconds since the Unix epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Self(Timestamp(ms))
    }

    /// UTC milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0.0
    }

    /// The slot's instant.
    pub const fn at(self) -> Timestamp {
        self.0
    }
}

impl From<Timestamp> for Slot {
    fn from(t: Timestamp) -> Self {
        Self(t)
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Slot({})", self.0)
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
    fn since_is_zero_for_earlier() {
        let a = Timestamp::from_millis(1000);
        let b = Timestamp::from_millis(1500);
        assert_eq!(b.since(a), Duration::from_millis(500));
        assert_eq!(a.since(b), Duration::ZERO);
    }
}
