//! A random history of faults between schedulers and one SQLite file,
//! checked for two runners. Run alone, after the suites, by
//! `cargo xtask test-all` (`cargo test -p anarchon-sqlite --test faults`).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_give_a_run_two_runners() {
    let factory = common::SqliteFactory::new();
    anarchon_testkit::faults::random_faults_never_give_a_run_two_runners(
        &factory,
        Duration::from_secs(15),
    )
    .await;
}
