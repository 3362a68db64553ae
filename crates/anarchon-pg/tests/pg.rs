//! PostgreSQL-specific checks beyond the shared suites: racing instances
//! under `Overlap::Skip`, migrations (concurrent, from an older schema,
//! from a newer one), refused input, unreachable and lying servers, query
//! plans, batch lock order, and connections dropped under a running store.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon_core::{
    Attempt, CancelReason, ClaimOutcome, ClaimRequest, FinalState, InstanceId, JobName, LeaseClaim,
    LeaseStore, MaxAttempts, Overlap, RecordState, Renewal, RunKey, RunOutcome, RunState, Schedule,
    Scheduler, Slot, StoreError, StoreErrorKind, Token, Win,
};
use anarchon_pg::migrate::{Migrated, migrate_to, schema_version};
use anarchon_pg::{PgError, PgOptions, PgStore, SCHEMA_VERSION, TableName};
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

// ---------------------------------------------------------------------------
// Racing instances
// ---------------------------------------------------------------------------

/// Two instances, each with its own pool, race 1,000 slots of one job with
/// `Overlap::Skip`. A run counts as running from the moment its winner sees
/// `Won` until it sends `finish`; no two such intervals may overlap, no slot
/// has two winners, and every slot ends recorded as either run once
/// (succeeded) or skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_with_overlap_skip_never_both_run() {
    const SLOTS: i64 = 1000;
    let factory = PgFactory::new().await;
    let job = job("race-skip");
    let base = future_base();
    let slots: Vec<Slot> = (0..SLOTS)
        .map(|i| Slot::from_millis(base + i * 1000))
        .collect();
    // A logical clock shared by both instances: every event takes a tick.
    let ticks = Arc::new(AtomicU64::new(0));
    let mut racers = Vec::new();
    for (index, name) in ["a", "b"].into_iter().enumerate() {
        let store = factory.instance().await;
        let (job, slots, ticks) = (job.clone(), slots.clone(), ticks.clone());
        racers.push(tokio::spawn(async move {
            let mut runs = Vec::new();
            let mut outcomes = Vec::new();
            for (i, slot) in slots.into_iter().enumerate() {
                let run = RunKey::new(job.clone(), slot);
                let token = Token::generate();
                let outcome = store
                    .claim_lease(&claim(run.clone(), token, name, Overlap::Skip))
                    .await
                    .expect("claim");
                if let ClaimOutcome::Won(_) = outcome {
                    let won_at = ticks.fetch_add(1, Ordering::SeqCst);
                    // Hold some runs a little, so the other instance's
                    // claims meet a live run of the job.
                    if (i + index) % 3 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    let finish_sent = ticks.fetch_add(1, Ordering::SeqCst);
                    let answer = store
                        .finish(&run, token, RunOutcome::Succeeded)
                        .await
                        .expect("finish");
                    assert_eq!(answer, Renewal::Renewed, "the winner still holds {run}");
                    runs.push((slot, won_at, finish_sent));
                }
                outcomes.push((slot, outcome));
            }
            (runs, outcomes)
        }));
    }
    let mut runs = Vec::new();
    let mut by_slot: BTreeMap<Slot, Vec<ClaimOutcome>> = BTreeMap::new();
    for racer in racers {
        let (r, outcomes) = racer.await.expect("racer");
        runs.extend(r);
        for (slot, outcome) in outcomes {
            by_slot.entry(slot).or_default().push(outcome);
        }
    }

    runs.sort_by_key(|(_, won_at, _)| *won_at);
    for pair in runs.windows(2) {
        let ((s1, _, end1), (s2, start2, _)) = (pair[0], pair[1]);
        assert!(
            start2 > end1,
            "slot {s2} started running before slot {s1} finished: both were running"
        );
    }

    let mut skipped_slots = 0;
    for (slot, outcomes) in &by_slot {
        assert_eq!(outcomes.len(), 2, "both instances asked about {slot}");
        let wins = outcomes
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::Won(_)))
            .count();
        match wins {
            1 => {
                for o in outcomes {
                    assert!(
                        matches!(
                            o,
                            ClaimOutcome::Won(_)
                                | ClaimOutcome::Running { .. }
                                | ClaimOutcome::Done(FinalState::Succeeded)
                        ),
                        "slot {slot} was run, yet another instance was told {o:?}"
                    );
                }
            }
            0 => {
                skipped_slots += 1;
                for o in outcomes {
                    assert!(
                        matches!(
                            o,
                            ClaimOutcome::Overlap | ClaimOutcome::Done(FinalState::Skipped)
                        ),
                        "slot {slot} was not run, yet an instance was told {o:?}"
                    );
                }
            }
            n => panic!("slot {slot} had {n} winners"),
        }
    }
    let store = factory.instance().await;
    let history = store.history(&job, 5000).await.expect("history");
    assert_eq!(history.len(), SLOTS as usize, "one record per slot");
    let succeeded = history
        .iter()
        .filter(|r| r.state == RecordState::Finished(FinalState::Succeeded))
        .count();
    let skipped = history
        .iter()
        .filter(|r| r.state == RecordState::Finished(FinalState::Skipped))
        .count();
    assert_eq!(succeeded, runs.len(), "every win ran once and finished");
    assert_eq!(
        skipped, skipped_slots,
        "every other slot is recorded skipped"
    );
    assert_eq!(succeeded + skipped, SLOTS as usize);
    assert!(
        succeeded > 0 && skipped > 0,
        "the race must exercise both paths: {succeeded} ran, {skipped} skipped"
    );
}

/// Two instances claim overlapping batches of jobs, listed in opposite
/// orders, many times at once. Each call locks its jobs in one global order,
/// so no call fails with a deadlock, and every run has exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_in_opposite_orders_do_not_deadlock() {
    const JOBS: usize = 40;
    const ROUNDS: i64 = 25;
    let factory = PgFactory::new().await;
    let jobs: Vec<JobName> = (0..JOBS).map(|i| job(&format!("batch-{i:02}"))).collect();
    let base = future_base();
    let mut tasks = Vec::new();
    for (index, reversed) in [(0, false), (1, true), (2, false), (3, true)] {
        let store = factory.instance().await;
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            let mut wins = Vec::new();
            for round in 0..ROUNDS {
                let slot = Slot::from_millis(base + round * 1000);
                let mut order: Vec<&JobName> = jobs.iter().collect();
                if reversed {
                    order.reverse();
                }
                let claims: Vec<LeaseClaim> = order
                    .iter()
                    .map(|j| {
                        claim(
                            RunKey::new((*j).clone(), slot),
                            Token::generate(),
                            &format!("i{index}"),
                            Overlap::Allow,
                        )
                    })
                    .collect();
                let outcomes = store
                    .claim_many(&claims)
                    .await
                    .and_then(|answers| answers.all())
                    .unwrap_or_else(|e| panic!("batch claim failed: {e}"));
                assert_eq!(outcomes.len(), claims.len());
                for (c, o) in claims.iter().zip(outcomes) {
                    if matches!(o, ClaimOutcome::Won(_)) {
                        wins.push(c.run().clone());
                    }
                }
            }
            wins
        }));
    }
    let mut winners: HashMap<RunKey, usize> = HashMap::new();
    for task in tasks {
        for run in task.await.expect("task") {
            *winners.entry(run).or_default() += 1;
        }
    }
    assert_eq!(winners.len(), JOBS * ROUNDS as usize, "every run was won");
    assert!(winners.values().all(|n| *n == 1), "one winner per run");
}

// ---------------------------------------------------------------------------
// Migrations
// ---------------------------------------------------------------------------

/// Ten instances with ten pools open a store on a new table at the same
/// moment: all succeed, each migration ran exactly once, and the store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_instances_migrate_at_once() {
    let factory = PgFactory::new().await;
    let opened = join_all((0..10).map(|_| PgStore::connect_with(factory.options()))).await;
    let stores: Vec<PgStore> = opened
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("a concurrent start failed: {e}")))
        .collect();
    let mut conn = admin(factory.url()).await;
    let versions: Vec<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT version FROM "{}_migrations" ORDER BY version"#,
        factory.table()
    )))
    .fetch_all(&mut conn)
    .await
    .expect("versions");
    let expected: Vec<i32> = (1..=SCHEMA_VERSION as i32).collect();
    assert_eq!(versions, expected, "each migration applied once");
    for store in &stores {
        assert_eq!(
            store.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
    }
    let run = RunKey::new(job("after-start"), Slot::from_millis(future_base()));
    won(stores[9]
        .claim_lease(&claim(run, Token::generate(), "x", Overlap::Allow))
        .await
        .expect("claim"));
}

/// A schema built by the first migration only (as the first release left
/// it), with a finished run in it, is migrated when a store opens: the old
/// run is still there and fences continue from the job's counter. With
/// migrations off, the old schema is refused with a message that says why.
#[tokio::test]
async fn a_schema_from_an_older_version_is_migrated() {
    let factory = PgFactory::new().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    let done = migrate_to(&mut conn, &table, 1).await.expect("v1");
    assert_eq!(done, Migrated { from: 0, to: 1 });
    assert_eq!(schema_version(&mut conn, &table).await.expect("version"), 1);
    exec(
        &mut conn,
        format!(
            r#"INSERT INTO "{table}" (job, slot, state, attempt, fence, instance, started_at, finished_at)
               VALUES ('legacy', 1000, 'succeeded', 1, 7, 'old-host-1-abc', 900, 950);
               INSERT INTO "{table}_jobs" (job, last_fence) VALUES ('legacy', 7);"#
        ),
    )
    .await;

    let refused = PgStore::connect_with(factory.options().migrate(false))
        .await
        .expect_err("an old schema with migrations off");
    assert!(
        matches!(
            refused,
            PgError::SchemaOutdated {
                found: 1,
                latest: SCHEMA_VERSION,
                ..
            }
        ),
        "{refused}"
    );
    assert!(!refused.is_temporary());

    let store = factory.store_with(factory.options()).await;
    assert_eq!(
        store.schema_version().await.expect("version"),
        SCHEMA_VERSION
    );
    let legacy = job("legacy");
    let history = store.history(&legacy, 10).await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(
        history[0].state,
        RecordState::Finished(FinalState::Succeeded)
    );
    assert_eq!(history[0].fence.map(|f| f.get()), Some(7));
    let next = won(store
        .claim_lease(&claim(
            RunKey::new(legacy, Slot::from_millis(future_base())),
            Token::generate(),
            "new",
            Overlap::Allow,
        ))
        .await
        .expect("claim"));
    assert_eq!(next.fence.map(|f| f.get()), Some(8), "fences continue");
    // Migrated stores also open with migrations off.
    PgStore::connect_with(factory.options().migrate(false))
        .await
        .expect("the migrated schema is current");
}

/// A schema a newer anarchon-pg migrated is refused, with or without
/// migrations, rather than used by code that does not know it.
#[tokio::test]
async fn a_schema_from_a_newer_version_is_refused() {
    let factory = PgFactory::new().await;
    factory.instance().await;
    let mut conn = admin(factory.url()).await;
    exec(
        &mut conn,
        format!(
            r#"INSERT INTO "{}_migrations" (version, description) VALUES (99, 'from the future')"#,
            factory.table()
        ),
    )
    .await;
    for migrate in [true, false] {
        let err = PgStore::connect_with(factory.options().migrate(migrate))
            .await
            .expect_err("a newer schema");
        assert!(
            matches!(err, PgError::SchemaTooNew { found: 99, .. }),
            "{err}"
        );
        assert_eq!(err.kind(), StoreErrorKind::Invalid);
    }
}

/// A table of the chosen name that some other program owns is not adopted:
/// opening fails as invalid configuration, and the table is left alone.
#[tokio::test]
async fn a_table_name_taken_by_something_else_is_refused() {
    let factory = PgFactory::new().await;
    let mut conn = admin(factory.url()).await;
    exec(
        &mut conn,
        format!(
            r#"CREATE TABLE "{}" (id integer); INSERT INTO "{}" VALUES (42);"#,
            factory.table(),
            factory.table()
        ),
    )
    .await;
    let err = PgStore::connect_with(factory.options())
        .await
        .expect_err("a foreign table");
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("already exists"), "{err}");
    let kept: i32 = sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT id FROM "{}""#,
        factory.table()
    )))
    .fetch_one(&mut conn)
    .await
    .expect("the foreign table is intact");
    assert_eq!(kept, 42);
}

// ---------------------------------------------------------------------------
// Refused input, unreachable and lying servers
// ---------------------------------------------------------------------------

/// Table names that are not plain identifiers (or are too long) and bad
/// options are refused before anything is sent: a listener standing in for
/// the server never sees a connection.
#[tokio::test]
async fn bad_table_names_are_refused_before_any_sql() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let url = format!("postgres://postgres:pw@127.0.0.1:{port}/test");
    let too_long = "a".repeat(anarchon_pg::MAX_TABLE_NAME_LEN + 1);
    for bad in [
        "",
        "Runs",
        "runs-table",
        "runs table",
        "1runs",
        r#"runs"; DROP TABLE anarchon; --"#,
        "public.runs",
        "rüns",
        too_long.as_str(),
    ] {
        match PgOptions::new(&url).table(bad) {
            Err(PgError::InvalidTableName { .. }) => {}
            other => panic!("{bad:?} must be refused, got {other:?}"),
        }
        assert!(TableName::new(bad).is_err());
    }
    for options in [
        PgOptions::new(&url).pool_size(0),
        PgOptions::new(&url).connect_timeout(Duration::ZERO),
    ] {
        let err = PgStore::connect_with(options)
            .await
            .expect_err("bad option");
        assert!(matches!(err, PgError::InvalidOption { .. }), "{err}");
    }
    let err = PgStore::connect_with(PgOptions::new("postgres://u@h:notaport/db"))
        .await
        .expect_err("bad URL");
    assert!(matches!(err, PgError::InvalidUrl { .. }), "{err}");
    let connected = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(
        connected.is_err(),
        "nothing may connect before the input is checked"
    );
}

/// A server that accepts the connection and never answers: opening fails as
/// unavailable (temporary) once the connect timeout has passed, not later.
#[tokio::test]
async fn an_unresponsive_server_is_unavailable_within_the_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    let server = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().expect("lock").push(socket);
        }
    });
    let timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = PgStore::connect_with(
        PgOptions::new(format!(
            "postgres://postgres@127.0.0.1:{port}/test?sslmode=disable"
        ))
        .connect_timeout(timeout),
    )
    .await
    .expect_err("no answer");
    let took = started.elapsed();
    server.abort();
    assert!(err.is_temporary(), "{err}");
    let store_err = StoreError::from(err);
    assert_eq!(store_err.kind(), StoreErrorKind::Unavailable);
    assert!(took >= timeout, "it waited the timeout: {took:?}");
    assert!(
        took < timeout + Duration::from_secs(3),
        "it gave up at the timeout, not much later: {took:?}"
    );
    assert!(
        !held.lock().expect("lock").is_empty(),
        "the client did reach the silent server"
    );
}

/// Nothing listens on the port: unavailable, and the message never shows
/// the password of the URL, through any of the ways an error is printed.
#[tokio::test]
async fn a_refused_connection_is_unavailable_without_the_password() {
    const SENTINEL: &str = "Sentinel-Secret-4242";
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let options = PgOptions::new(format!(
        "postgres://postgres:{SENTINEL}@127.0.0.1:{port}/test"
    ))
    .connect_timeout(Duration::from_secs(2));
    assert!(!format!("{options:?}").contains(SENTINEL));
    let err = PgStore::connect_with(options).await.expect_err("refused");
    assert!(err.is_temporary(), "{err}");
    assert_no_secret(err, SENTINEL);
}

/// A server that asks for the password and refuses it (as PostgreSQL does
/// for a wrong one): the error is invalid configuration, says that
/// authentication failed, and never contains the password — which the
/// server did receive.
#[tokio::test]
async fn a_wrong_password_is_refused_without_showing_it() {
    const SENTINEL: &str = "Sentinel-Secret-4343";
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        // Startup message: length, then the rest.
        let len = socket.read_i32().await.expect("startup length");
        let mut startup = vec![0; usize::try_from(len - 4).expect("length")];
        socket.read_exact(&mut startup).await.expect("startup");
        // AuthenticationCleartextPassword.
        socket
            .write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3])
            .await
            .expect("auth request");
        let tag = socket.read_u8().await.expect("password tag");
        assert_eq!(tag, b'p');
        let len = socket.read_i32().await.expect("password length");
        let mut password = vec![0; usize::try_from(len - 4).expect("length")];
        socket.read_exact(&mut password).await.expect("password");
        // ErrorResponse, as PostgreSQL sends it for a wrong password.
        let mut fields = Vec::new();
        for (code, value) in [
            (b'S', "FATAL"),
            (b'V', "FATAL"),
            (b'C', "28P01"),
            (b'M', "password authentication failed for user \"postgres\""),
        ] {
            fields.push(code);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut msg = vec![b'E'];
        msg.extend_from_slice(&(i32::try_from(fields.len() + 4).expect("len")).to_be_bytes());
        msg.extend_from_slice(&fields);
        socket.write_all(&msg).await.expect("error response");
        socket.flush().await.expect("flush");
        String::from_utf8_lossy(&password).into_owned()
    });
    let err = PgStore::connect_with(
        PgOptions::new(format!(
            "postgres://postgres:{SENTINEL}@127.0.0.1:{port}/test?sslmode=disable"
        ))
        .connect_timeout(Duration::from_secs(5)),
    )
    .await
    .expect_err("wrong password");
    let received = server.await.expect("fake server");
    assert!(
        received.contains(SENTINEL),
        "the password was sent to the server"
    );
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let shown = err.to_string();
    assert!(shown.contains("password authentication failed"), "{shown}");
    assert!(shown.contains("28P01"), "{shown}");
    assert_no_secret(err, SENTINEL);
}

/// A database that does not exist on the real server: invalid
/// configuration, and the URL's password appears nowhere.
#[tokio::test]
async fn a_missing_database_is_refused_without_the_password() {
    const SENTINEL: &str = "Sentinel-Secret-4444";
    let (host, port, user) = server_parts().await;
    let database = unique_prefix("anarchon_no_such_db_");
    let err = PgStore::connect_with(PgOptions::new(format!(
        "postgres://{user}:{SENTINEL}@{host}:{port}/{database}"
    )))
    .await
    .expect_err("missing database");
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let shown = err.to_string();
    // A trust-auth server answers "no such database"; one that checks
    // passwords refuses the sentinel first. Either way: invalid.
    assert!(
        shown.contains("3D000") || shown.contains("28P01"),
        "{shown}"
    );
    assert_no_secret(err, SENTINEL);
}

fn assert_no_secret(err: PgError, secret: &str) {
    let mut shown = vec![format!("{err}"), format!("{err:?}")];
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        shown.push(format!("{s} {s:?}"));
        source = s.source();
    }
    let store = StoreError::from(err);
    shown.push(format!("{store}"));
    shown.push(format!("{store:?}"));
    for text in shown {
        assert!(!text.contains(secret), "the password leaked: {text}");
    }
}

// ---------------------------------------------------------------------------
// Query plans
// ---------------------------------------------------------------------------

/// With 20,000 runs of one job stored (and statistics gathered), every
/// lookup a claim, heartbeat, finish, release, peek or history makes is an
/// index scan — the primary key, or the partial index of live runs for the
/// overlap check — in its generic (prepared) plan. So a claim costs
/// O(log n) in the stored runs, never a scan of the job's history.
#[tokio::test]
async fn lookups_use_the_primary_key_and_the_live_run_index() {
    let factory = PgFactory::new().await;
    factory.instance().await;
    let t = factory.table().as_str().to_owned();
    let mut conn = admin(factory.url()).await;
    exec(
        &mut conn,
        format!(
            r#"INSERT INTO "{t}" (job, slot, state, attempt, fence, finished_at)
                 SELECT 'busy', g * 1000, 'succeeded', 1, g, g * 1000 FROM generate_series(1, 20000) AS g;
               INSERT INTO "{t}" (job, slot, state, attempt, token, fence, lease_until)
                 SELECT 'busy', 30000000 + g * 1000, 'running', 1, gen_random_uuid(), 20000 + g, 0
                   FROM generate_series(1, 5) AS g;
               INSERT INTO "{t}" (job, slot, state, attempt, fence, finished_at)
                 SELECT 'other-' || (g % 50), g * 1000, 'succeeded', 1, g, 0 FROM generate_series(1, 5000) AS g;
               ANALYZE "{t}";
               SET plan_cache_mode = force_generic_plan;"#
        ),
    )
    .await;
    let template = |text: &str| text.replace("{{table}}", &t);
    let checks: Vec<(&str, String, &str, String)> = vec![
        (
            "claim: the run under lock",
            format!(
                r#"SELECT t.state, t.attempt, t.token, t.fence, t.lease_until FROM "{t}" AS t
                   WHERE t.job = $1 AND t.slot = $2 FOR UPDATE"#
            ),
            "text, bigint",
            "'busy', 5000".into(),
        ),
        (
            "claim: overlap check",
            format!(
                r#"SELECT 1 FROM "{t}" AS o WHERE o.job = $1 AND o.state = 'running'
                   AND o.lease_until >= $2 AND o.slot <> $3"#
            ),
            "text, bigint, bigint",
            "'busy', 0, 5000".into(),
        ),
        (
            "peek",
            template(include_str!("../sql/peek.sql")),
            "text, bigint",
            "'busy', 5000".into(),
        ),
        (
            "history",
            template(include_str!("../sql/history.sql")),
            "text, bigint",
            "'busy', 10".into(),
        ),
        (
            "heartbeat",
            template(include_str!("../sql/heartbeat.sql")),
            "text, bigint, uuid, bigint",
            "'busy', 5000, gen_random_uuid(), 1000".into(),
        ),
        (
            "finish",
            template(include_str!("../sql/finish.sql")),
            "text, bigint, uuid, text, text",
            "'busy', 5000, gen_random_uuid(), 'succeeded', NULL".into(),
        ),
        (
            "release",
            template(include_str!("../sql/release.sql")),
            "text, bigint, uuid",
            "'busy', 5000, gen_random_uuid()".into(),
        ),
    ];
    for (i, (what, sql, types, args)) in checks.iter().enumerate() {
        // Strip the leading comment lines of the .sql files.
        let body: String = sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        exec(&mut conn, format!("PREPARE p{i} ({types}) AS {body}")).await;
        let plan: Vec<String> =
            sqlx::query(AssertSqlSafe(format!("EXPLAIN EXECUTE p{i} ({args})")))
                .fetch_all(&mut conn)
                .await
                .expect("explain")
                .iter()
                .map(|r| r.get::<String, _>(0))
                .collect();
        let plan = plan.join("\n");
        assert!(
            !plan.contains("Seq Scan"),
            "{what} scans the table:\n{plan}"
        );
        // The overlap check must read the live-run index; the others find
        // the run by its primary key, or (for statements that only touch
        // running runs) through the job's few live runs.
        let live = format!("using {t}_live ");
        let pkey = format!("using {t}_pkey ");
        let ok = if what.contains("overlap") {
            plan.contains(&live)
        } else {
            plan.contains(&pkey) || plan.contains(&live)
        };
        assert!(
            ok,
            "{what} must use the primary key or the live-run index:\n{plan}"
        );
    }
}

/// The claim function itself, run 200 times (first attempts, own retries,
/// live leases and overlap checks) on a job with 20,000 stored runs, never
/// scans the runs table sequentially: the statistics collector's own count
/// of sequential scans stays put while its index-scan count grows.
#[tokio::test]
async fn the_claim_function_never_scans_the_runs_table() {
    let factory = PgFactory::new().await;
    let t = factory.table().as_str().to_owned();
    factory.instance().await;
    {
        let mut conn = admin(factory.url()).await;
        exec(
            &mut conn,
            format!(
                r#"INSERT INTO "{t}" (job, slot, state, attempt, fence, finished_at)
                     SELECT 'busy', g * 1000, 'succeeded', 1, g, g * 1000 FROM generate_series(1, 20000) AS g;
                   ANALYZE "{t}";"#
            ),
        )
        .await;
        conn.close().await.expect("close");
    }
    // Statistics reach the shared counters when a session ends or idles;
    // wait for the insert to show, then take the baseline.
    let (url, name) = (factory.url(), t.as_str());
    let scans = || async move {
        let mut conn = admin(url).await;
        let row = sqlx::query(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0), n_tup_ins FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("stats");
        let _ = conn.close().await;
        (
            row.get::<i64, _>(0),
            row.get::<i64, _>(1),
            row.get::<i64, _>(2),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = loop {
        let s = scans().await;
        if s.2 >= 20_000 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "statistics never showed the insert"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let app = unique_prefix("anarchon_scan_");
    let store = factory
        .store_with(factory.options().application_name(&app))
        .await;
    let busy = job("busy");
    let base = future_base();
    for i in 0..50 {
        let run = RunKey::new(busy.clone(), Slot::from_millis(base + i * 1000));
        let token = Token::generate();
        let first = claim(run.clone(), token, "a", Overlap::Skip);
        let outcome = store.claim_lease(&first).await.expect("claim");
        assert!(
            matches!(outcome, ClaimOutcome::Won(_) | ClaimOutcome::Overlap),
            "{outcome:?}"
        );
        store.claim_lease(&first).await.expect("retry");
        store
            .claim_lease(&claim(run.clone(), Token::generate(), "b", Overlap::Skip))
            .await
            .expect("other");
        if matches!(outcome, ClaimOutcome::Won(_)) && i % 2 == 1 {
            store
                .finish(&run, token, RunOutcome::Succeeded)
                .await
                .expect("finish");
        }
        store.peek(&run).await.expect("peek");
    }
    store.close().await;
    drop(store);
    // Wait until the store's sessions are gone, so their counts are in.
    let mut admin_conn = admin(factory.url()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let live: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&app)
                .fetch_one(&mut admin_conn)
                .await
                .expect("activity");
        let s = scans().await;
        if live == 0 && s.1 > before.1 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "statistics never showed the claims"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        after.0, before.0,
        "the claims scanned the runs table sequentially ({} -> {})",
        before.0, after.0
    );
    assert!(
        after.1 >= before.1 + 150,
        "index scans: {before:?} -> {after:?}"
    );
}

// ---------------------------------------------------------------------------
// Dropped connections
// ---------------------------------------------------------------------------

/// Terminates every server session of `app` and waits until those sessions
/// are gone; returns how many there were.
async fn terminate_sessions(conn: &mut PgConnection, app: &str) -> i64 {
    let pids: Vec<i32> = sqlx::query_scalar(
        "WITH s AS MATERIALIZED (
             SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()
         )
         SELECT pid FROM s WHERE pg_terminate_backend(pid)",
    )
    .bind(app)
    .fetch_all(&mut *conn)
    .await
    .expect("terminate");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(&mut *conn)
                .await
                .expect("activity");
        if left == 0 {
            return pids.len() as i64;
        }
        assert!(Instant::now() < deadline, "sessions of {app} did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server ends every session of a store (as a restart or failover
/// does) while its pool holds them idle. The next heartbeat, claim,
/// finish, peek and history succeed: the dead connections are found by the
/// statements themselves, closed, and replaced.
#[tokio::test]
async fn calls_succeed_after_the_server_drops_the_connections() {
    let factory = PgFactory::new().await;
    let app = unique_prefix("anarchon_kill_");
    let store = factory
        .store_with(factory.options().application_name(&app).pool_size(3))
        .await;
    let base = future_base();
    let run = RunKey::new(job("reconnect"), Slot::from_millis(base));
    let token = Token::generate();
    won(store
        .claim_lease(&claim(run.clone(), token, "a", Overlap::Allow))
        .await
        .expect("claim"));
    let mut admin_conn = admin(factory.url()).await;

    // Fill the pool, then kill every session in it.
    let _ = join_all((0..6).map(|_| store.peek(&run))).await;
    let killed = terminate_sessions(&mut admin_conn, &app).await;
    assert!(killed >= 1, "the store had sessions to kill");
    let sent = store.statements_sent();
    assert_eq!(
        store
            .heartbeat(&run, token, Duration::from_secs(30))
            .await
            .expect("heartbeat after the sessions ended"),
        Renewal::Renewed
    );
    assert!(
        store.statements_sent() - sent >= 2,
        "the heartbeat met a dead connection and was sent again"
    );

    let _ = join_all((0..6).map(|_| store.peek(&run))).await;
    terminate_sessions(&mut admin_conn, &app).await;
    let next = RunKey::new(job("reconnect"), Slot::from_millis(base + 1000));
    let next_token = Token::generate();
    won(store
        .claim_lease(&claim(next.clone(), next_token, "a", Overlap::Allow))
        .await
        .expect("claim after the sessions ended"));

    let _ = join_all((0..6).map(|_| store.peek(&run))).await;
    terminate_sessions(&mut admin_conn, &app).await;
    assert_eq!(
        store
            .finish(&run, token, RunOutcome::Succeeded)
            .await
            .expect("finish after the sessions ended"),
        Renewal::Renewed
    );

    terminate_sessions(&mut admin_conn, &app).await;
    assert_eq!(
        store.peek(&run).await.expect("peek").state,
        RunState::Finished(FinalState::Succeeded)
    );
    let history = store.history(&run.job, 10).await.expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].attempt, Some(Attempt::FIRST));
}

/// Two schedulers run a job every second whose runs outlast the second,
/// with a short lease. Every 250 ms the server ends all their sessions.
/// Heartbeats keep reaching the store (no runner loses contact or is
/// fenced), no run is taken over, and no slot runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedulers_ride_out_dropped_connections_without_double_runs() {
    let factory = PgFactory::new().await;
    let apps: Vec<String> = (0..2).map(|_| unique_prefix("anarchon_sched_")).collect();
    type Log = Arc<Mutex<Vec<(Slot, Attempt, usize)>>>;
    let starts: Log = Arc::default();
    let cancels: Arc<Mutex<Vec<CancelReason>>> = Arc::default();
    let mut schedulers = Vec::new();
    for (index, app) in apps.iter().enumerate() {
        let store = Arc::new(
            factory
                .store_with(factory.options().application_name(app).pool_size(3))
                .await,
        );
        let mut builder = Scheduler::builder(store)
            .lease(Duration::from_millis(1500))
            .heartbeat(Duration::from_millis(300))
            .shutdown_grace(Duration::from_secs(5));
        let (starts, cancels) = (starts.clone(), cancels.clone());
        builder
            .job(
                "steady",
                Schedule::every(Duration::from_secs(1)).expect("1 s"),
            )
            .expect("job")
            .run(move |ctx| {
                let (starts, cancels) = (starts.clone(), cancels.clone());
                async move {
                    starts
                        .lock()
                        .expect("lock")
                        .push((ctx.slot(), ctx.attempt(), index));
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(1800)) => {}
                        () = ctx.cancelled() => {
                            if let Some(reason) = ctx.cancel_reason() {
                                cancels.lock().expect("lock").push(reason);
                            }
                        }
                    }
                    Ok::<_, String>(())
                }
            })
            .expect("handler");
        schedulers.push(builder.start().expect("start"));
    }
    let mut admin_conn = admin(factory.url()).await;
    let mut killed = 0;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for app in &apps {
            killed += terminate_sessions(&mut admin_conn, app).await;
        }
    }
    // Let the runs in flight finish normally.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for s in schedulers {
        s.shutdown().await;
    }
    let starts = starts.lock().expect("lock").clone();
    let cancels = cancels.lock().expect("lock").clone();
    assert!(
        killed >= 10,
        "sessions were ended during the runs: {killed}"
    );
    assert!(starts.len() >= 3, "runs started: {starts:?}");
    assert!(
        !cancels
            .iter()
            .any(|r| matches!(r, CancelReason::LostContact | CancelReason::Fenced)),
        "a runner lost its lease: {cancels:?}"
    );
    let mut seen = HashMap::new();
    for (slot, attempt, index) in &starts {
        assert_eq!(
            *attempt,
            Attempt::FIRST,
            "slot {slot} was taken over: {starts:?}"
        );
        assert!(
            seen.insert(*slot, *index).is_none(),
            "slot {slot} ran twice: {starts:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// TLS and batch retries
// ---------------------------------------------------------------------------

/// With the `tls` feature, `sslmode=require` in the URL encrypts every
/// connection of the store (the server's own view in `pg_stat_ssl`).
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_connections_are_encrypted() {
    let factory = PgFactory::new().await;
    let sep = if factory.url().contains('?') {
        '&'
    } else {
        '?'
    };
    let app = unique_prefix("anarchon_tls_");
    let store = factory
        .store_with(
            PgOptions::new(format!("{}{sep}sslmode=require", factory.url()))
                .table_name(factory.table().clone())
                .application_name(&app),
        )
        .await;
    let run = RunKey::new(job("tls"), Slot::from_millis(future_base()));
    won(store
        .claim_lease(&claim(run, Token::generate(), "a", Overlap::Allow))
        .await
        .expect("claim over TLS"));
    let mut conn = admin(factory.url()).await;
    let ssl: Vec<bool> = sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl AS s JOIN pg_stat_activity AS a USING (pid) WHERE a.application_name = $1",
    )
    .bind(&app)
    .fetch_all(&mut conn)
    .await
    .expect("pg_stat_ssl");
    assert!(!ssl.is_empty(), "the store has a session");
    assert!(
        ssl.iter().all(|s| *s),
        "every session is encrypted: {ssl:?}"
    );
}

/// The PostgreSQL server behind a TLS terminator with its own authority,
/// and a URL to it without `sslmode`.
#[cfg(feature = "tls")]
async fn behind_tls(factory: &PgFactory) -> (anarchon_testkit::TlsTerminator, String) {
    let parsed: PgConnectOptions = factory.url().parse().expect("test URL");
    let upstream = format!("{}:{}", parsed.get_host(), parsed.get_port());
    let terminator =
        anarchon_testkit::TlsTerminator::start(upstream, anarchon_testkit::Handshake::Postgres)
            .await
            .expect("TLS terminator");
    let user = parsed.get_username();
    let database = parsed.get_database().unwrap_or("test");
    let url = format!(
        "postgres://{user}@localhost:{}/{database}",
        terminator.port()
    );
    (terminator, url)
}

/// `sslmode=verify-full` with `sslrootcert` naming the authority that
/// signed the server's certificate: the store connects over TLS and claims.
#[cfg(feature = "tls")]
#[tokio::test]
async fn verify_full_connects_with_the_servers_authority() {
    let factory = PgFactory::new().await;
    let (terminator, url) = behind_tls(&factory).await;
    let store = factory
        .store_with(
            PgOptions::new(format!(
                "{url}?sslmode=verify-full&sslrootcert={}",
                terminator.ca_file().display()
            ))
            .table_name(factory.table().clone()),
        )
        .await;
    let run = RunKey::new(job("verified"), Slot::from_millis(future_base()));
    won(store
        .claim_lease(&claim(run, Token::generate(), "a", Overlap::Allow))
        .await
        .expect("claim over verified TLS"));
    assert!(terminator.handshakes() >= 1);
    assert_eq!(terminator.refused_handshakes(), 0);
}

/// A server certificate signed by an authority the client was not told
/// about is refused under `verify-full` (and `verify-ca`): the store does
/// not open, and the error says it was the certificate.
#[cfg(feature = "tls")]
#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let factory = PgFactory::new().await;
    let (terminator, url) = behind_tls(&factory).await;
    for mode in ["verify-full", "verify-ca"] {
        let error = PgStore::connect_with(
            PgOptions::new(format!("{url}?sslmode={mode}"))
                .table_name(factory.table().clone())
                .connect_timeout(Duration::from_secs(5)),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("sslmode={mode} must refuse an unknown authority"));
        let message = error.to_string();
        assert!(
            message.to_lowercase().contains("certificate"),
            "sslmode={mode}: the error names the certificate: {message}"
        );
    }
    assert_eq!(terminator.handshakes(), 0, "no handshake may complete");
    // The terminator notices the client's alert a moment after the client
    // gave up.
    let start = Instant::now();
    while terminator.refused_handshakes() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the terminator saw {} refused handshakes",
            terminator.refused_handshakes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A batch sent again with the same tokens (after a lost reply) gets the
/// same answers: the same wins with the same attempts and fences, and the
/// same lease ends for runs others hold. Only the store's clock in a
/// `Running` answer moves on.
#[tokio::test]
async fn a_retried_batch_gets_the_same_answers() {
    let factory = PgFactory::new().await;
    let a = factory.instance().await;
    let b = factory.instance().await;
    let slot = Slot::from_millis(future_base());
    let claims: Vec<LeaseClaim> = (0..30)
        .map(|i| {
            claim(
                RunKey::new(job(&format!("retry-{i}")), slot),
                Token::generate(),
                "a",
                Overlap::Allow,
            )
        })
        .collect();
    for c in claims.iter().step_by(3) {
        won(b
            .claim_lease(&claim(
                c.run().clone(),
                Token::generate(),
                "b",
                Overlap::Allow,
            ))
            .await
            .expect("claim"));
    }
    let first = a
        .claim_many(&claims)
        .await
        .expect("batch")
        .all()
        .expect("every claim answered");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = a
        .claim_many(&claims)
        .await
        .expect("batch again")
        .all()
        .expect("every claim answered");
    let without_clock = |o: &ClaimOutcome| match o {
        ClaimOutcome::Running { lease_until, .. } => format!("running until {lease_until}"),
        other => format!("{other:?}"),
    };
    assert_eq!(
        first.iter().map(without_clock).collect::<Vec<_>>(),
        again.iter().map(without_clock).collect::<Vec<_>>()
    );
    assert_eq!(
        first
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::Running { .. }))
            .count(),
        10
    );
}

/// One batch, two jobs; one job's row holds a fence the store cannot read
/// back (a hand edit made it negative). The function commits both claims;
/// the sound job's answer is a win that stands, and the broken one's claim
/// alone gets an error naming the run (the scheduler then releases it).
#[tokio::test]
async fn one_jobs_unreadable_answer_costs_its_batch_nothing() {
    let factory = PgFactory::new().await;
    let store = factory.instance().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    exec(
        &mut conn,
        format!(r#"INSERT INTO "{table}_jobs" (job, last_fence) VALUES ('negative-fence', -5)"#),
    )
    .await;
    let slot = Slot::from_millis(future_base());
    let broken = RunKey::new(job("negative-fence"), slot);
    let batch = [
        claim(broken.clone(), Token::generate(), "a", Overlap::Allow),
        claim(
            RunKey::new(job("sound"), slot),
            Token::generate(),
            "a",
            Overlap::Allow,
        ),
    ];
    let answers: Vec<_> = store
        .claim_many(&batch)
        .await
        .expect("the batch is answered")
        .into_iter()
        .collect();
    assert_eq!(answers.len(), 2);
    let err = answers[0].as_ref().expect_err("an unreadable fence");
    assert!(
        err.to_string().contains(&broken.to_string()) && err.to_string().contains("negative"),
        "the run and the problem are named: {err}"
    );
    assert!(
        matches!(answers[1], Ok(ClaimOutcome::Won(_))),
        "the sound job's claim: {:?}",
        answers[1]
    );
    // The broken claim was committed under its token: a release hands it on.
    assert_eq!(
        store.release(&broken, batch[0].claim.token).await.unwrap(),
        Renewal::Renewed
    );
}
