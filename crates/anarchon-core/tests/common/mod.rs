//! What the metrics tests share: a test clock half-way through an hour,
//! and reading one metric out of a recorder's snapshot.
//! Each test binary installs the global recorder once, so each metrics
//! test lives in a file of its own and takes what it needs from here.

use std::sync::Arc;

use anarchon_core::{Clock, Timestamp};
use anarchon_testkit::TestClock;
use metrics::{SharedString, Unit};
use metrics_util::CompositeKey;
use metrics_util::debugging::DebugValue;

/// The metrics of one snapshot.
pub(crate) struct Taken(
    pub(crate) Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>,
);

/// The value of the metric `name` whose labels are exactly `labels`.
pub(crate) fn value<'a>(
    taken: &'a Taken,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    taken
        .0
        .iter()
        .find(|(key, _, _, _)| {
            let key = key.key();
            let mut have: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let mut want = labels.to_vec();
            have.sort();
            want.sort();
            key.name() == name && have == want
        })
        .map(|(_, _, _, value)| value)
}

/// A test clock half-way through the current hour (so a per-minute slot
/// is due at once and no hourly one is near), and that start in ms.
pub(crate) fn half_past() -> (Arc<TestClock>, i64) {
    let now = anarchon_core::SystemClock.now().as_millis();
    let start = now - now.rem_euclid(3_600_000) + 1_800_000;
    (TestClock::starting_at(Timestamp::from_millis(start)), start)
}
