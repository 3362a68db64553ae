//! Opening, migrating and locking: bad input gets a clear error, nothing
//! is lost, and the schema is created once however many pools race for it.

mod common;

use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimRequest, InstanceId, JobName, LeaseClaim, LeaseStore, MaxAttempts, Overlap,
    RunKey, RunOutcome, RunState, Slot, StoreErrorKind, Token,
};
use anarchon_sqlite::{Error, SqliteOptions, SqliteStore};
use anarchon_testkit::fleet;
use common::SqliteFactory;
use futures::future::join_all;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

fn claim(job: &str, slot: Slot, token: Token) -> LeaseClaim {
    LeaseClaim {
        claim: ClaimRequest {
            run: RunKey::new(JobName::new(job).expect("job name"), slot),
            token,
            instance: InstanceId::new("test").expect("instance id"),
            max_late: Duration::from_secs(60),
        },
        lease: Duration::from_secs(30),
        overlap: Overlap::Allow,
        max_attempts: MaxAttempts::DEFAULT,
        rerun_paused: false,
    }
}

fn next_minute() -> Slot {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    Slot::from_millis(now - now % 60_000 + 60_000)
}

#[tokio::test]
async fn a_bad_table_prefix_is_refused_before_any_sql_is_sent() {
    let factory = SqliteFactory::new();
    for prefix in [
        "x; DROP TABLE y",
        "a-b",
        "",
        "1st",
        "sqlite_master",
        "naïve",
    ] {
        let err = SqliteStore::open(factory.options().with_table_prefix(prefix))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidTablePrefix { .. }),
            "{prefix:?}: {err}"
        );
        assert!(err.to_string().contains("invalid table prefix"), "{err}");
    }
    assert!(
        !factory.path().exists(),
        "a refused prefix must not even create the file"
    );
    let err = SqliteStore::connect("sqlite://x.db?table_prefix=a%20b")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTablePrefix { .. }), "{err}");
}

#[tokio::test]
async fn a_missing_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no").join("such");
    let path = missing.join("anarchon.db");
    let err = SqliteStore::open(SqliteOptions::new(&path))
        .await
        .unwrap_err();
    match &err {
        Error::MissingDirectory { directory, .. } => assert_eq!(directory, &missing),
        other => panic!("expected MissingDirectory, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(!missing.exists(), "the store must not create directories");
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_named_and_left_alone() {
    let factory = SqliteFactory::new();
    let content = "this is a shopping list, not a database\n".repeat(200);
    std::fs::write(factory.path(), &content).unwrap();
    let err = SqliteStore::open(factory.options()).await.unwrap_err();
    match &err {
        Error::NotADatabase { path, .. } => assert_eq!(path, &factory.path()),
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&factory.path().display().to_string()),
        "{text}"
    );
    assert!(text.contains("is not a SQLite database"), "{text}");
    assert_eq!(
        std::fs::read_to_string(factory.path()).unwrap(),
        content,
        "the file must be left as it was"
    );
}

#[tokio::test]
async fn opening_again_keeps_the_runs_and_the_schema() {
    let factory = SqliteFactory::new();
    let slot = next_minute();
    let token = Token::generate();
    {
        let store = SqliteStore::open(factory.options()).await.unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            anarchon_sqlite::schema_version()
        );
        assert!(matches!(
            store
                .claim_lease(&claim("kept", slot, token))
                .await
                .unwrap(),
            ClaimOutcome::Won(_)
        ));
        store.close().await;
    }
    let store = SqliteStore::open(factory.options()).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        anarchon_sqlite::schema_version()
    );
    let run = RunKey::new(JobName::new("kept").unwrap(), slot);
    assert!(
        matches!(
            store.peek(&run).await.unwrap().state,
            RunState::Running { .. }
        ),
        "the run claimed before must still be there"
    );
    assert_eq!(
        store
            .finish(&run, token, RunOutcome::Succeeded)
            .await
            .unwrap(),
        anarchon_core::Renewal::Renewed,
        "the token of the first opening still holds the run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_pools_opening_a_new_file_at_once_migrate_it_once() {
    let factory = SqliteFactory::new();
    let opened = join_all((0..8).map(|_| SqliteStore::open(factory.options()))).await;
    let stores: Vec<SqliteStore> = opened
        .into_iter()
        .map(|r| r.expect("every concurrent open succeeds"))
        .collect();
    let raw = factory.raw_pool().await;
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT id, version FROM anarchon_schema")
        .fetch_all(&raw)
        .await
        .unwrap();
    assert_eq!(rows, [(1, anarchon_sqlite::schema_version())]);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    // And they work together: one winner.
    let slot = next_minute();
    let outcomes = join_all(
        stores
            .iter()
            .map(|s| async move { s.claim_lease(&claim("race", slot, Token::generate())).await }),
    )
    .await;
    let won = outcomes
        .into_iter()
        .filter(|o| matches!(o.as_ref().unwrap(), ClaimOutcome::Won(_)))
        .count();
    assert_eq!(won, 1);
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let factory = SqliteFactory::new();
    SqliteStore::open(factory.options())
        .await
        .unwrap()
        .close()
        .await;
    let raw = factory.raw_pool().await;
    sqlx::query("UPDATE anarchon_schema SET version = 99")
        .execute(&raw)
        .await
        .unwrap();
    let err = SqliteStore::open(factory.options()).await.unwrap_err();
    match err {
        Error::SchemaTooNew {
            found, supported, ..
        } => {
            assert_eq!(found, 99);
            assert_eq!(supported, anarchon_sqlite::schema_version());
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[tokio::test]
async fn two_prefixes_in_one_file_are_two_stores() {
    let factory = SqliteFactory::new();
    let a = SqliteStore::open(factory.options().with_table_prefix("team_a"))
        .await
        .unwrap();
    let b = SqliteStore::open(factory.options().with_table_prefix("team_b"))
        .await
        .unwrap();
    let slot = next_minute();
    for store in [&a, &b] {
        let outcome = store
            .claim_lease(&claim("same-job", slot, Token::generate()))
            .await
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
    }
}

#[tokio::test]
async fn a_url_opens_the_file() {
    let factory = SqliteFactory::new();
    let url = format!(
        "sqlite://{}?table_prefix=from_url&busy_timeout_ms=1500",
        factory.path().display()
    );
    let store = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(store.path(), factory.path());
    assert_eq!(store.options().table_prefix(), "from_url");
    assert_eq!(store.options().busy_timeout(), Duration::from_millis(1500));
    let raw = factory.raw_pool().await;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE name IN ('from_url_runs', 'from_url_jobs', 'from_url_schema')",
    )
    .fetch_one(&raw)
    .await
    .unwrap();
    assert_eq!(n, 3);
}

/// Another program holds the write lock longer than the busy timeout:
/// writes fail with a temporary error naming the busy timeout, the plain
/// read still answers (WAL), and the same claim succeeds once the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_past_the_busy_timeout_is_a_temporary_error() {
    let factory = SqliteFactory::new();
    let busy = Duration::from_millis(200);
    let store = SqliteStore::open(factory.options().with_busy_timeout(busy))
        .await
        .unwrap();
    let slot = next_minute();
    let mine = claim("locked", slot, Token::generate());

    let raw = factory.raw_pool().await;
    let mut holder = raw.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query(AssertSqlSafe(
        "INSERT INTO anarchon_jobs (job, last_fence) VALUES ('holder', 0)",
    ))
    .execute(&mut *holder)
    .await
    .unwrap();

    let err = store.claim_lease(&mine).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(err.is_temporary());
    assert!(err.to_string().contains("busy timeout"), "{err}");
    let err = store
        .heartbeat(mine.run(), mine.claim.token, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    let view = store
        .peek(mine.run())
        .await
        .expect("a plain read does not wait for the writer");
    assert_eq!(view.state, RunState::Absent);

    // Opening a store whose tables do not exist yet needs the lock too.
    let err = SqliteStore::open(
        factory
            .options()
            .with_table_prefix("other")
            .with_busy_timeout(busy),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert!(err.is_temporary());
    assert!(
        err.to_string()
            .contains(&factory.path().display().to_string()),
        "{err}"
    );

    holder.rollback().await.unwrap();
    let outcome = store.claim_lease(&mine).await.unwrap();
    assert!(
        matches!(outcome, ClaimOutcome::Won(_)),
        "the retried claim wins once the lock is gone: {outcome:?}"
    );
}

/// A retried batch with the same tokens gets the same answers (the lease
/// ends and wins; `store_now` is the clock at each answer, so it moves).
#[tokio::test]
async fn a_retried_batch_gets_the_same_answers() {
    let factory = SqliteFactory::new();
    let a = SqliteStore::open(factory.options()).await.unwrap();
    let b = SqliteStore::open(factory.options()).await.unwrap();
    let slot = next_minute();
    let batch: Vec<LeaseClaim> = (0..20)
        .map(|i| claim(&format!("batch-{i}"), slot, Token::generate()))
        .collect();
    for c in batch.iter().step_by(2) {
        let theirs = claim(c.run().job.as_str(), slot, Token::generate());
        assert!(matches!(
            b.claim_lease(&theirs).await.unwrap(),
            ClaimOutcome::Won(_)
        ));
    }
    let first = fleet::outcomes_of_a_batch(&a, &batch).await;
    let again = fleet::outcomes_of_a_batch(&a, &batch).await;
    fleet::assert_same_outcomes_but_for_the_store_clock(&first, &again);
    for (i, o) in first.iter().enumerate() {
        match (i % 2, o) {
            (0, ClaimOutcome::Running { .. }) | (1, ClaimOutcome::Won(_)) => {}
            _ => panic!("claim {i}: {o:?}"),
        }
    }
    // One transaction, one clock reading: every answer names the same now.
    let nows: std::collections::HashSet<_> = first
        .iter()
        .filter_map(|o| match o {
            ClaimOutcome::Running { store_now, .. } => Some(*store_now),
            _ => None,
        })
        .collect();
    assert_eq!(nows.len(), 1, "{nows:?}");
}

/// One batch, three jobs; the middle one has a record the store cannot read
/// (attempt 0, a hand edit). Each claim runs under its own savepoint: the
/// broken claim gets its own error and is undone alone, and the two sound
/// claims are won and committed.
#[tokio::test]
async fn one_jobs_unreadable_record_costs_its_batch_nothing() {
    let factory = SqliteFactory::new();
    let store = SqliteStore::open(factory.options()).await.unwrap();
    let slot = next_minute();
    let raw = factory.raw_pool().await;
    sqlx::query(
        "INSERT INTO anarchon_runs (job, slot, state, attempt, token, fence, lease_until)
         VALUES ('zero-attempt', ?1, 'running', 0, 'not-a-token', 1, ?1)",
    )
    .bind(slot.as_millis())
    .execute(&raw)
    .await
    .unwrap();
    let batch = [
        claim("sound-1", slot, Token::generate()),
        claim("zero-attempt", slot, Token::generate()),
        claim("sound-2", slot, Token::generate()),
    ];
    let answers = anarchon_testkit::fleet::answers_to_a_batch(&store, &batch).await;
    let err = answers[1].as_ref().expect_err("an unreadable attempt");
    assert!(err.to_string().contains("attempt"), "{err}");
    for i in [0, 2] {
        assert!(
            matches!(answers[i], Ok(ClaimOutcome::Won(_))),
            "claim {i}: {:?}",
            answers[i]
        );
        assert!(
            matches!(
                store.peek(batch[i].run()).await.unwrap().state,
                RunState::Running { .. }
            ),
            "claim {i}'s win was committed"
        );
    }
}

/// A new database file, and the `-wal` and `-shm` files SQLite makes beside
/// it, are readable and writable by their owner only; a symbolic link to
/// nothing is not created through.
#[tokio::test]
async fn a_new_database_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let factory = SqliteFactory::new();
    let store = SqliteStore::open(factory.options()).await.unwrap();
    assert!(matches!(
        store
            .claim_lease(&claim("private", next_minute(), Token::generate()))
            .await
            .unwrap(),
        ClaimOutcome::Won(_)
    ));
    let path = factory.path();
    for suffix in ["", "-wal", "-shm"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", path.display()));
        let mode = std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("{file:?}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file:?} has mode {:o}", mode & 0o777);
    }
    let dir = path.parent().unwrap();
    let link = dir.join("link.db");
    std::os::unix::fs::symlink(dir.join("nowhere.db"), &link).unwrap();
    let err = SqliteStore::open(anarchon_sqlite::SqliteOptions::new(&link))
        .await
        .expect_err("a dangling link");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(
        !dir.join("nowhere.db").exists(),
        "nothing was created through the link"
    );
}

/// `open_read_only` reads an existing database and changes nothing: the
/// history is there, a claim is refused, and the file is byte for byte as
/// it was; a database an older release made (or none) is not migrated.
#[tokio::test]
async fn a_read_only_store_reads_the_history_and_changes_nothing() {
    let factory = SqliteFactory::new();
    let writer = SqliteStore::open(factory.options()).await.unwrap();
    let slot = next_minute();
    let claim = claim("read-me", slot, Token::generate());
    assert!(matches!(
        writer.claim_lease(&claim).await.unwrap(),
        ClaimOutcome::Won(_)
    ));
    writer
        .finish(claim.run(), claim.claim.token, RunOutcome::Succeeded)
        .await
        .unwrap();
    writer.close().await;
    let path = factory.path();
    let before = std::fs::read(&path).unwrap();

    let reader = SqliteStore::open_read_only(factory.options())
        .await
        .unwrap();
    let history = reader.history(&claim.run().job, 10).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert!(
        reader
            .claim_lease(&self::claim("read-me", slot_after(slot), Token::generate()))
            .await
            .is_err(),
        "a read-only store cannot claim"
    );
    reader.close().await;
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the file did not change"
    );

    let empty = SqliteFactory::new();
    std::fs::write(empty.path(), b"").unwrap();
    let err = SqliteStore::open_read_only(empty.options())
        .await
        .expect_err("no tables");
    assert!(
        matches!(err, Error::SchemaOutdated { found: 0, .. }),
        "{err}"
    );
}

fn slot_after(slot: Slot) -> Slot {
    Slot::from_millis(slot.as_millis() + 60_000)
}

/// A database left by version 2 (before pauses), with a finished run in it,
/// is migrated when a store opens: the run is still there, and the rebuilt
/// runs table takes the new `paused` state.
#[tokio::test]
async fn a_database_from_before_pauses_is_migrated_with_its_runs() {
    let factory = SqliteFactory::new();
    let raw = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(factory.path())
                .create_if_missing(true),
        )
        .await
        .expect("a plain pool on a new file");
    let old = [
        include_str!("../sql/schema_table.sql"),
        include_str!("../sql/migrations/0001_runs_and_jobs.sql"),
        include_str!("../sql/migrations/0002_job_late_window.sql"),
        "INSERT INTO {prefix}_schema (id, version) VALUES (1, 2);
         INSERT INTO {prefix}_jobs (job, last_fence) VALUES ('legacy', 7);
         INSERT INTO {prefix}_runs (job, slot, state, attempt, fence, instance, started_at, finished_at)
         VALUES ('legacy', 60000, 'succeeded', 1, 7, 'old-host', 60001, 60002);",
    ];
    for sql in old {
        sqlx::raw_sql(AssertSqlSafe(sql.replace("{prefix}", "anarchon")))
            .execute(&raw)
            .await
            .expect("building the version 2 schema");
    }
    raw.close().await;

    let store = SqliteStore::open(factory.options()).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        anarchon_sqlite::schema_version()
    );
    let legacy = JobName::new("legacy").unwrap();
    let history = store.history(&legacy, 10).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(
        history[0].state,
        anarchon_core::RecordState::Finished(anarchon_core::FinalState::Succeeded)
    );
    assert_eq!(history[0].fence, Some(anarchon_core::Fence::new(7)));

    store
        .pause(
            &anarchon_core::PauseScope::Job(legacy.clone()),
            &anarchon_core::PauseRequest::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_lease(&claim("legacy", next_minute(), Token::generate()))
            .await
            .unwrap(),
        ClaimOutcome::Done(anarchon_core::FinalState::Paused)
    );
}
