//! Schedules: when a job's slots are.
//!
//! A schedule turns "the last slot" into "the next slot" and nothing else; it
//! never looks at the clock. Two instances with the same schedule therefore
//! name every run with the same slot.
//!
//! # Time zones and daylight saving
//!
//! Cron expressions are read in an IANA time zone (UTC unless one is given).
//! A slot is always the UTC instant of the local time. Where daylight saving
//! moves the local clock:
//!
//! * **Spring forward.** A fixed local time that falls in the gap does not
//!   exist that day; the job fires once, at the first valid instant after
//!   the gap (e.g. `30 3 * * *` in Europe/Athens on the last Sunday of March
//!   fires at 04:00 local time).
//! * **Fall back.** A fixed local time that occurs twice fires once, on the
//!   first pass. A pattern with a wildcard or a step in the hour field
//!   follows real time and fires on both passes (as Vixie cron does): an
//!   hourly job still runs every hour, so one local hour gets two runs.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use chrono::TimeZone;
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::error::ConfigError;
use crate::time::{Slot, Timestamp, millis};

const FIELDS_5: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];
const FIELDS_6: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day-of-month",
    "month",
    "day-of-week",
];

/// When a job runs: a cron expression in a time zone, or a fixed interval.
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Cron {
        cron: Arc<Cron>,
        zone: Tz,
        expr: String,
        /// The hour field is a fixed list of hours (no `*`, no step): such a
        /// time fires once in the fall-back hour.
        fixed_hour: bool,
    },
    Every {
        period_ms: i64,
    },
}

/// Parses `expr`, sharing one parsed pattern among every schedule with the
/// same expression: a parsed pattern holds a bitfield per field, years
/// included, several kilobytes that ten thousand hourly jobs need only once.
fn parse_shared(expr: &str) -> Result<Arc<Cron>, croner::errors::CronError> {
    static PARSED: OnceLock<Mutex<HashMap<String, Weak<Cron>>>> = OnceLock::new();
    let mut parsed = PARSED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(cron) = parsed.get(expr).and_then(Weak::upgrade) {
        return Ok(cron);
    }
    let cron = Arc::new(parser().parse(expr)?);
    if parsed.len() >= 256 {
        parsed.retain(|_, c| c.strong_count() > 0);
    }
    parsed.insert(expr.to_owned(), Arc::downgrade(&cron));
    Ok(cron)
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

impl Schedule {
    /// A cron expression read in UTC: 5 fields (`minute hour day-of-month
    /// month day-of-week`) or 6 with seconds first; `@hourly`-style
    /// nicknames are accepted too.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCron`] naming the field at fault, or saying the
    /// expression never fires (such as 30 February).
    pub fn cron(expr: &str) -> Result<Self, ConfigError> {
        Self::cron_in(expr, "UTC")
    }

    /// A cron expression read in the IANA time zone `zone`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownTimeZone`] or [`ConfigError::InvalidCron`].
    pub fn cron_in(expr: &str, zone: &str) -> Result<Self, ConfigError> {
        let zone = Tz::from_str(zone.trim()).map_err(|_| ConfigError::UnknownTimeZone {
            zone: zone.to_owned(),
        })?;
        let trimmed = expr.trim();
        let invalid = |field: Option<&'static str>, reason: String| ConfigError::InvalidCron {
            expr: expr.to_owned(),
            field,
            reason,
        };
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        let nickname = trimmed.starts_with('@');
        if !nickname && !matches!(fields.len(), 5 | 6) {
            return Err(invalid(
                None,
                format!(
                    "it has {} fields; write 5 (minute hour day-of-month month day-of-week) or 6 with seconds first",
                    fields.len()
                ),
            ));
        }
        let cron = parse_shared(trimmed).map_err(|whole| {
            let (field, reason) = blame_field(&fields).unwrap_or((None, whole.to_string()));
            invalid(field, reason)
        })?;
        let hour_field = match (nickname, fields.len()) {
            (true, _) => trimmed.to_ascii_lowercase(),
            (false, 5) => fields[1].to_owned(),
            (false, _) => fields[2].to_owned(),
        };
        let fixed_hour = if nickname {
            !matches!(hour_field.as_str(), "@hourly" | "@minutely" | "@secondly")
        } else {
            !hour_field.contains('*') && !hour_field.contains('/')
        };
        let schedule = Self {
            kind: Kind::Cron {
                cron,
                zone,
                expr: trimmed.to_owned(),
                fixed_hour,
            },
        };
        // An expression such as `0 0 30 2 *` parses but never fires: say so now,
        // not at fire time.
        let probe = Timestamp::from_millis(chrono::Utc::now().timestamp_millis());
        if schedule.try_next_after(probe).is_err() {
            return Err(invalid(None, "it never fires (no date matches it)".into()));
        }
        Ok(schedule)
    }

    /// Every `period`, aligned to the Unix epoch: slots are the multiples of
    /// `period` since 1970-01-01T00:00:00Z, so every instance agrees on them.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroDuration`] for a zero period,
    /// [`ConfigError::OutOfRange`] for a period that is not whole milliseconds.
    pub fn every(period: Duration) -> Result<Self, ConfigError> {
        if period.is_zero() {
            return Err(ConfigError::ZeroDuration { option: "interval" });
        }
        if !period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ConfigError::OutOfRange {
                option: "interval",
                reason: "it must be a whole number of milliseconds".into(),
            });
        }
        Ok(Self {
            kind: Kind::Every {
                period_ms: millis(period),
            },
        })
    }

    /// The first slot strictly after `after`, or `None` if there is none
    /// (the end of representable time).
    pub fn next_after(&self, after: Timestamp) -> Option<Slot> {
        self.try_next_after(after).ok()
    }

    fn try_next_after(&self, after: Timestamp) -> Result<Slot, ()> {
        match &self.kind {
            Kind::Every { period_ms } => {
                let n = after.as_millis().div_euclid(*period_ms);
                n.checked_add(1)
                    .and_then(|n| n.checked_mul(*period_ms))
                    .map(Slot::from_millis)
                    .ok_or(())
            }
            Kind::Cron {
                cron,
                zone,
                fixed_hour,
                ..
            } => {
                // croner works in whole seconds: start from the second that
                // holds `after`, exclusive.
                let secs = after.as_millis().div_euclid(1000);
                let mut from = zone.timestamp_opt(secs, 0).single().ok_or(())?;
                loop {
                    let next = cron.find_next_occurrence(&from, false).map_err(|_| ())?;
                    if *fixed_hour && is_second_pass(zone, &next) {
                        // A fixed local time fires once in the fall-back hour:
                        // the first pass has been, skip the repeat.
                        from = next;
                        continue;
                    }
                    return Ok(Slot::from(Timestamp::from_datetime(&next)));
                }
            }
        }
    }

    /// The slots in `(after, until]`, in order, at most `limit` of them.
    pub fn slots_between(&self, after: Timestamp, until: Timestamp, limit: usize) -> Vec<Slot> {
        let mut out = Vec::new();
        let mut cursor = after;
        while out.len() < limit {
            match self.next_after(cursor) {
                Some(slot) if slot.at() <= until => {
                    out.push(slot);
                    cursor = slot.at();
                }
                _ => break,
            }
        }
        out
    }

    /// The time zone a cron schedule is read in; `None` for intervals.
    pub fn time_zone(&self) -> Option<Tz> {
        match &self.kind {
            Kind::Cron { zone, .. } => Some(*zone),
            Kind::Every { .. } => None,
        }
    }
}

/// Whether `t` is on the second pass of a local time that occurs twice.
fn is_second_pass(zone: &Tz, t: &chrono::DateTime<Tz>) -> bool {
    match zone.from_local_datetime(&t.naive_local()) {
        chrono::LocalResult::Ambiguous(first, _) => first != *t,
        _ => false,
    }
}

/// Finds which field of a 5- or 6-field expression makes it fail, by parsing
/// each field on its own with wildcards elsewhere.
fn blame_field(fields: &[&str]) -> Option<(Option<&'static str>, String)> {
    let names: &[&'static str] = match fields.len() {
        5 => &FIELDS_5,
        6 => &FIELDS_6,
        _ => return None,
    };
    for (i, name) in names.iter().enumerate() {
        let probe: Vec<&str> = (0..fields.len())
            .map(|j| if i == j { fields[j] } else { "*" })
            .collect();
        if let Err(e) = parser().parse(&probe.join(" ")) {
            return Some((Some(name), e.to_string()));
        }
    }
    None
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Cron { expr, zone, .. } => write!(f, "cron {expr:?} in {zone}"),
            Kind::Every { period_ms } => write!(f, "every {period_ms} ms"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Timestamp {
        let dt = NaiveDate::from_ymd_opt(y, mo, d)
            .unwrap()
            .and_hms_opt(h, mi, s)
            .unwrap()
            .and_utc();
        Timestamp::from_datetime(&dt)
    }

    fn local(slots: &[Slot], zone: Tz) -> Vec<String> {
        slots
            .iter()
            .map(|s| {
                s.at()
                    .to_datetime()
                    .with_timezone(&zone)
                    .format("%H:%M %Z")
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn five_and_six_fields() {
        let s = Schedule::cron("*/5 * * * *").unwrap();
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 0, 0)).unwrap().at(),
            utc(2026, 1, 1, 0, 5, 0)
        );
        let s = Schedule::cron("*/10 * * * * *").unwrap();
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 0, 0)).unwrap().at(),
            utc(2026, 1, 1, 0, 0, 10)
        );
    }

    #[test]
    fn next_after_ignores_milliseconds_inside_the_second() {
        let s = Schedule::cron("* * * * * *").unwrap();
        let t = Timestamp::from_millis(utc(2026, 1, 1, 0, 0, 0).as_millis() + 500);
        assert_eq!(s.next_after(t).unwrap().at(), utc(2026, 1, 1, 0, 0, 1));
    }

    #[test]
    fn invalid_cron_names_the_field() {
        let err = Schedule::cron("61 * * * *").unwrap_err();
        match &err {
            ConfigError::InvalidCron { field, .. } => assert_eq!(*field, Some("minute")),
            other => panic!("{other:?}"),
        }
        let err = Schedule::cron("0 0 * 13 *").unwrap_err();
        assert!(err.to_string().contains("month field"), "{err}");
        let err = Schedule::cron("0 0 * *").unwrap_err();
        assert!(err.to_string().contains("it has 4 fields"), "{err}");
    }

    #[test]
    fn impossible_dates_are_refused_when_built() {
        let err = Schedule::cron("0 0 30 2 *").unwrap_err();
        assert!(err.to_string().contains("never fires"), "{err}");
    }

    #[test]
    fn unknown_zone_is_refused() {
        let err = Schedule::cron_in("0 * * * *", "Mars/Olympus").unwrap_err();
        assert!(matches!(err, ConfigError::UnknownTimeZone { .. }), "{err}");
    }

    #[test]
    fn intervals_align_to_the_epoch() {
        let s = Schedule::every(Duration::from_secs(300)).unwrap();
        let t = utc(2026, 1, 1, 0, 7, 13);
        assert_eq!(s.next_after(t).unwrap().at(), utc(2026, 1, 1, 0, 10, 0));
        assert!(Schedule::every(Duration::ZERO).is_err());
        assert!(Schedule::every(Duration::from_micros(1500)).is_err());
    }

    #[test]
    fn slots_between_is_half_open() {
        let s = Schedule::every(Duration::from_secs(1)).unwrap();
        let a = utc(2026, 1, 1, 0, 0, 0);
        let slots = s.slots_between(a, a.saturating_add(Duration::from_secs(3)), 10);
        assert_eq!(slots.len(), 3);
        assert_eq!(slots[0].at(), a.saturating_add(Duration::from_secs(1)));
    }

    const ATHENS: Tz = chrono_tz::Europe::Athens;

    #[test]
    fn spring_forward_fixed_time_fires_once_after_the_gap() {
        // 2027-03-28: 03:00 EET jumps to 04:00 EEST.
        let s = Schedule::cron_in("30 3 * * *", "Europe/Athens").unwrap();
        let slots = s.slots_between(utc(2027, 3, 27, 12, 0, 0), utc(2027, 3, 29, 12, 0, 0), 10);
        assert_eq!(local(&slots, ATHENS), ["04:00 EEST", "03:30 EEST"]);
    }

    #[test]
    fn spring_forward_wildcard_hour_skips_the_gap() {
        let s = Schedule::cron_in("*/30 * * * *", "Europe/Athens").unwrap();
        let slots = s.slots_between(utc(2027, 3, 28, 0, 15, 0), utc(2027, 3, 28, 1, 45, 0), 10);
        assert_eq!(
            local(&slots, ATHENS),
            ["02:30 EET", "04:00 EEST", "04:30 EEST"]
        );
    }

    #[test]
    fn fall_back_fixed_time_fires_once() {
        // 2027-10-31: 04:00 EEST falls back to 03:00 EET.
        let s = Schedule::cron_in("30 3 * * *", "Europe/Athens").unwrap();
        let slots = s.slots_between(utc(2027, 10, 30, 12, 0, 0), utc(2027, 10, 31, 12, 0, 0), 10);
        assert_eq!(local(&slots, ATHENS), ["03:30 EEST"]);
    }

    #[test]
    fn fall_back_wildcard_hour_fires_on_both_passes() {
        let s = Schedule::cron_in("0 * * * *", "Europe/Athens").unwrap();
        let slots = s.slots_between(
            utc(2027, 10, 30, 23, 30, 0),
            utc(2027, 10, 31, 2, 30, 0),
            10,
        );
        assert_eq!(
            local(&slots, ATHENS),
            ["03:00 EEST", "03:00 EET", "04:00 EET"]
        );
    }
}
