//! The guide's example (`docs/writing-a-backend.md`, "A store on a paused
//! clock"), compiled and run as a third party would write it, and the
//! guide's list of checks held to what the macros generate.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use anarchon_core::{Clock, MemoryStore};
use anarchon_testkit::{StoreFactory, TestClock};

/// One store per test; every instance is a handle onto it.
struct InProcess {
    store: Arc<MemoryStore>,
    clock: Arc<TestClock>,
}

impl InProcess {
    fn new() -> Self {
        let clock = TestClock::new();
        Self {
            store: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
        }
    }
}

#[async_trait::async_trait]
impl StoreFactory for InProcess {
    type Store = MemoryStore;

    // Everything is decided inside the store, on the store's clock: an
    // instance's own clock has nothing to reach.
    async fn instance_with_clock(&self, _clock: Arc<dyn Clock>) -> Arc<MemoryStore> {
        self.store.clone()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }
}

mod claims {
    anarchon_testkit::claim_suite!(super::InProcess::new(), tokio::test(start_paused = true));
}

mod leases {
    anarchon_testkit::lease_suite!(super::InProcess::new(), tokio::test(start_paused = true));
}

/// The example above, between the markers, is the guide's code block.
#[test]
fn the_guide_shows_this_file() {
    let guide = include_str!("../../../docs/writing-a-backend.md");
    let this = include_str!("guide.rs");
    let block = guide
        .split("### A store on a paused clock")
        .nth(1)
        .and_then(|rest| rest.split("```rust\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the guide has the example's code block");
    let start = this.find("#![allow(clippy::unwrap_used)]").unwrap()
        + "#![allow(clippy::unwrap_used)]".len();
    let end = this.find("/// The example above, between").unwrap();
    assert_eq!(
        this[start..end].trim(),
        block.trim(),
        "docs/writing-a-backend.md and tests/guide.rs must show the same example"
    );
}

/// The check names each macro generates, read from the kit's sources.
fn generated(source: &str, macro_name: &str) -> Vec<String> {
    let start = source
        .find(&format!("macro_rules! {macro_name} {{"))
        .unwrap_or_else(|| panic!("macro {macro_name} not found"));
    let body = &source[start..];
    let body = &body[..body[1..].find("macro_rules!").map_or(body.len(), |e| e + 1)];
    let mut names = Vec::new();
    for call in body.split("__suite_tests!(").skip(1) {
        let call = &call[..call.find(");").unwrap()];
        // `$factory, $attr, $crate::module,` and then the checks.
        for word in call.split(',').skip(3) {
            let word = word.trim();
            if !word.is_empty() {
                names.push(word.to_owned());
            }
        }
    }
    for line in body.lines() {
        let line = line.trim();
        for prefix in ["async fn ", "mod "] {
            if let Some(rest) = line.strip_prefix(prefix) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        }
    }
    names
}

/// The names the guide lists under `### \`name!\``.
fn listed(guide: &str, macro_name: &str) -> Vec<String> {
    let heading = format!("### `{macro_name}!`");
    let section = guide
        .split(&heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the guide has no section {heading}"));
    let section = section.split("\n#").next().unwrap();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("* `"))
        .map(|rest| rest[..rest.find('`').unwrap()].to_owned())
        .collect()
}

#[test]
fn the_guide_lists_every_check() {
    let guide = include_str!("../../../docs/writing-a-backend.md");
    let claim = include_str!("../src/claim.rs");
    let lease = include_str!("../src/lease.rs");
    let scheduler = include_str!("../src/scheduler.rs");
    let faults = include_str!("../src/faults.rs");
    let suites = [
        (
            "claim_suite",
            [
                generated(claim, "__claim_checks"),
                generated(scheduler, "__scheduler_claim_checks"),
            ]
            .concat(),
        ),
        (
            "lease_suite",
            [
                generated(lease, "__lease_checks"),
                generated(scheduler, "__scheduler_lease_checks"),
            ]
            .concat(),
        ),
        ("fault_suite", generated(faults, "fault_suite")),
    ];
    for (suite, mut checks) in suites {
        assert!(checks.len() >= 3, "{suite}: read {checks:?}");
        let mut documented = listed(guide, suite);
        checks.sort();
        checks.dedup();
        documented.sort();
        assert_eq!(
            documented, checks,
            "docs/writing-a-backend.md must list exactly the checks {suite}! generates"
        );
    }
}
