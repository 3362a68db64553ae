//! PostgreSQL-specific checks beyond the shared suites: racing instances
//! under `Overlap::Skip`, migrations (concurrent, from an older schema,
//! from a newer one), refused input, unreachable and lying servers, query
//! plans, batch lock order, connections dropped under a running store, and
//! which claims commit without waiting for the flush.
//!
//! One module per topic; the helpers they share are here.

#[path = "../common/mod.rs"]
mod common;

mod commits;
mod dropped_connections;
mod migrations;
mod query_plans;
mod racing;
mod refused_input;
mod tls_and_retries;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon_core::{
    Attempt, AttemptCause, AttemptEnd, CancelReason, ClaimOutcome, ClaimRequest, FinalState,
    InstanceId, JobName, LeaseClaim, LeaseStore, MaxAttempts, Overlap, RecordState, Renewal,
    RunKey, RunOutcome, RunState, Schedule, Scheduler, Slot, StoreError, StoreErrorKind, Token,
    Win,
};
use anarchon_pg::migrate::{Migrated, migrate_to, schema_version};
use anarchon_pg::{Error, PgOptions, PgStore, SCHEMA_VERSION, TableName};
use anarchon_testkit::StoreFactory;
use anarchon_testkit::servers::unique_prefix;
use common::{PgFactory, admin, url};
use futures::future::join_all;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn job(name: &str) -> JobName {
    JobName::new(name).expect("valid job name")
}

/// Whole seconds, ten minutes ahead: no claim in these tests is late by accident.
fn future_base() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    now - now.rem_euclid(1000) + 600_000
}

fn claim(run: RunKey, token: Token, instance: &str, overlap: Overlap) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run,
            token,
            instance: InstanceId::new(instance).expect("instance id"),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(30),
        overlap,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    }
}

fn won(outcome: ClaimOutcome) -> Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// Runs `sql` (which names the validated test table) on `conn`.
async fn exec(conn: &mut PgConnection, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .expect("test SQL");
}

/// The host, port and user of the test server's URL.
async fn server_parts() -> (String, u16, String) {
    let url = url().await;
    let parsed: PgConnectOptions = url.parse().expect("test URL parses");
    (
        parsed.get_host().to_owned(),
        parsed.get_port(),
        parsed.get_username().to_owned(),
    )
}
