//! Migrations.

use super::*;

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

    let refused = PgStore::connect_with(factory.options().with_migrate(false))
        .await
        .expect_err("an old schema with migrations off");
    assert!(
        matches!(
            refused,
            Error::SchemaOutdated {
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
    PgStore::connect_with(factory.options().with_migrate(false))
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
        let err = PgStore::connect_with(factory.options().with_migrate(migrate))
            .await
            .expect_err("a newer schema");
        assert!(
            matches!(err, Error::SchemaTooNew { found: 99, .. }),
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

/// A store left at schema version 7 — its claim function answering
/// without past attempts, a failed run and a run whose lease ran out in
/// it — is brought to the current version when a store opens: the old
/// function (whose result type `CREATE OR REPLACE` could not change) is
/// replaced, the old rows read back with no retry pending and no past
/// attempts, and a takeover of the old running run records the attempt it
/// ended.
#[tokio::test]
async fn a_schema_from_version_7_gets_retries_and_past_attempts() {
    let factory = PgFactory::new().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    migrate_to(&mut conn, &table, 7).await.expect("v7");
    let base = future_base();
    // A stand-in with version 7's arguments and result: enough for the
    // migration to have to drop it.
    exec(
        &mut conn,
        format!(
            r#"CREATE FUNCTION "{table}_claim"(
                   text[], bigint[], uuid[], text[], bigint[], bigint[], boolean[], integer[], boolean[])
               RETURNS TABLE (r_idx integer, r_outcome text, r_attempt integer, r_fence bigint,
                              r_lease_until bigint, r_store_now bigint)
               LANGUAGE sql AS $$ SELECT 1, 'late', NULL::integer, NULL::bigint, NULL::bigint, 0::bigint $$;
               INSERT INTO "{table}" (job, slot, state, attempt, token, fence, instance, started_at, finished_at, error)
               VALUES ('legacy', {base}, 'failed', 1, gen_random_uuid(), 3, 'old-host', 900, 950, 'boom');
               INSERT INTO "{table}" (job, slot, state, attempt, token, fence, instance, started_at, lease_until)
               VALUES ('legacy', {base} + 1000, 'running', 1, gen_random_uuid(), 4, 'old-host', 900, 960);
               INSERT INTO "{table}_jobs" (job, last_fence) VALUES ('legacy', 4);"#
        ),
    )
    .await;
    let store = factory.store_with(factory.options()).await;
    assert_eq!(
        store.schema_version().await.expect("version"),
        SCHEMA_VERSION
    );
    let legacy = job("legacy");
    let failed = RunKey::new(legacy.clone(), Slot::from_millis(base));
    let running = RunKey::new(legacy.clone(), Slot::from_millis(base + 1000));
    assert_eq!(
        store.peek(&failed).await.expect("peek").state,
        RunState::Finished(FinalState::Failed),
        "no retry pending"
    );
    assert_eq!(
        store
            .claim_lease(&claim(failed, Token::generate(), "new", Overlap::Allow))
            .await
            .expect("claim"),
        ClaimOutcome::Done(FinalState::Failed)
    );
    let win = won(store
        .claim_lease(&claim(running, Token::generate(), "new", Overlap::Allow))
        .await
        .expect("claim"));
    assert_eq!((win.attempt.get(), win.cause), (2, AttemptCause::Takeover));
    assert_eq!(win.fence.map(|f| f.get()), Some(5), "fences continue");
    let history = store.history(&legacy, 10).await.expect("history");
    assert!(history.iter().all(|r| r.retry_at.is_none()), "{history:?}");
    let earlier: Vec<(u32, AttemptEnd, Option<i64>, Option<&str>)> = history[0]
        .earlier
        .iter()
        .map(|p| {
            (
                p.attempt.get(),
                p.ended,
                p.at.map(|at| at.as_millis()),
                p.instance.as_ref().map(|i| i.as_str()),
            )
        })
        .collect();
    assert_eq!(
        earlier,
        vec![(1, AttemptEnd::TakenOver, Some(960), Some("old-host"))]
    );
    assert!(history[1].earlier.is_empty(), "{history:?}");
}

/// A store left at schema version 8 — its claim function taking a "skip"
/// flag per claim, a run holding its lease in it — is brought to the
/// current version when a store opens: the old function (whose argument
/// types changed, so `CREATE OR REPLACE` would have added a second one
/// beside it) is gone, and the states `waiting` and `replaced` are
/// accepted: a `buffer-one` slot waits for the old run, and a `replace`
/// slot ends it, fencing its runner.
#[tokio::test]
async fn a_schema_from_version_8_gets_the_overlap_rules_replace_and_buffer_one() {
    let factory = PgFactory::new().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    migrate_to(&mut conn, &table, 8).await.expect("v8");
    let base = future_base();
    let holder = Token::generate();
    // A stand-in with version 8's arguments and result: enough for the
    // migration to have to drop it.
    exec(
        &mut conn,
        format!(
            r#"CREATE FUNCTION "{table}_claim"(
                   text[], bigint[], uuid[], text[], bigint[], bigint[], boolean[], integer[], boolean[])
               RETURNS TABLE (r_idx integer, r_outcome text, r_attempt integer, r_fence bigint,
                              r_lease_until bigint, r_store_now bigint, r_earlier text)
               LANGUAGE sql AS $$ SELECT 1, 'late', NULL::integer, NULL::bigint, NULL::bigint, 0::bigint, NULL::text $$;
               INSERT INTO "{table}" (job, slot, state, attempt, token, fence, instance, started_at, lease_until)
               VALUES ('legacy', {base}, 'running', 1, '{holder}', 4, 'old-host', 900, {base} + 3600000);
               INSERT INTO "{table}_jobs" (job, last_fence) VALUES ('legacy', 4);"#,
            holder = holder.as_uuid()
        ),
    )
    .await;
    let store = factory.store_with(factory.options()).await;
    assert_eq!(
        store.schema_version().await.expect("version"),
        SCHEMA_VERSION
    );
    let functions: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_proc WHERE proname = $1")
        .bind(format!("{table}_claim"))
        .fetch_one(&mut conn)
        .await
        .expect("functions");
    assert_eq!(functions, 1, "the old claim function is dropped");

    let legacy = job("legacy");
    let old = RunKey::new(legacy.clone(), Slot::from_millis(base));
    let buffered = RunKey::new(legacy.clone(), Slot::from_millis(base + 1000));
    let replacing = RunKey::new(legacy.clone(), Slot::from_millis(base + 2000));
    assert!(matches!(
        store
            .claim_lease(&claim(
                buffered.clone(),
                Token::generate(),
                "new",
                Overlap::BufferOne
            ))
            .await
            .expect("claim"),
        ClaimOutcome::Running { .. }
    ));
    assert!(matches!(
        store.peek(&buffered).await.expect("peek").state,
        RunState::Waiting { .. }
    ));
    let win = won(store
        .claim_lease(&claim(
            replacing,
            Token::generate(),
            "new",
            Overlap::Replace,
        ))
        .await
        .expect("claim"));
    assert_eq!(win.fence.map(|f| f.get()), Some(5), "fences continue");
    assert_eq!(
        store.peek(&old).await.expect("peek").state,
        RunState::Finished(FinalState::Replaced)
    );
    assert_eq!(
        store
            .heartbeat(&old, holder, Duration::from_secs(30))
            .await
            .expect("heartbeat"),
        Renewal::Fenced
    );
    let states: Vec<RecordState> = store
        .history(&legacy, 10)
        .await
        .expect("history")
        .iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(
        states,
        vec![
            RecordState::Running,
            RecordState::Waiting,
            RecordState::Finished(FinalState::Replaced)
        ]
    );
}

/// Version 10 changed only the claim function: a store that finds version
/// 9 (here with a stand-in function that answers every claim `late`)
/// reinstalls it, and the claim that records a slot `missed` is told so.
#[tokio::test]
async fn a_schema_from_version_9_gets_the_function_that_tells_who_recorded_a_miss() {
    let (_factory, store) = reopened_after_a_function_only_version(9).await;
    // A slot an hour old on the store's clock, far past the claim's minute
    // of max_late.
    let probe = RunKey::new(job("old"), Slot::from_millis(0));
    let now = store.peek(&probe).await.expect("peek").store_now;
    let old = RunKey::new(job("old"), Slot::from_millis(now.as_millis() - 3_600_000));
    let claim_old = || claim(old.clone(), Token::generate(), "new", Overlap::Allow);
    assert_eq!(
        store.claim_lease(&claim_old()).await.expect("claim"),
        ClaimOutcome::Missed
    );
    assert_eq!(
        store.claim_lease(&claim_old()).await.expect("claim"),
        ClaimOutcome::Late
    );
}

/// Version 11 changed only the claim function (claims the run's own row
/// answers take no lock): a store that finds version 10, here with a
/// stand-in function that answers every claim `late`, reinstalls it.
#[tokio::test]
async fn a_schema_from_version_10_gets_the_function_that_reads_without_the_lock() {
    let (_factory, store) = reopened_after_a_function_only_version(10).await;
    let run = RunKey::new(job("v10"), Slot::from_millis(future_base()));
    won(store
        .claim_lease(&claim(
            run.clone(),
            Token::generate(),
            "new",
            Overlap::Allow,
        ))
        .await
        .expect("claim"));
    assert!(matches!(
        store
            .claim_lease(&claim(run, Token::generate(), "other", Overlap::Allow))
            .await
            .expect("claim"),
        ClaimOutcome::Running { .. }
    ));
}

/// A table at schema `version` whose claim function is a stand-in that
/// answers every claim `late` (as a function of that version would not),
/// then a store opened on it: the store must have migrated the table to
/// [`SCHEMA_VERSION`], reinstalling the current function.
async fn reopened_after_a_function_only_version(version: u32) -> (PgFactory, PgStore) {
    let factory = PgFactory::new().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    migrate_to(&mut conn, &table, version)
        .await
        .unwrap_or_else(|e| panic!("v{version}: {e}"));
    exec(
        &mut conn,
        format!(
            r#"CREATE FUNCTION "{table}_claim"(
                   text[], bigint[], uuid[], text[], bigint[], bigint[], text[], integer[], boolean[])
               RETURNS TABLE (r_idx integer, r_outcome text, r_attempt integer, r_fence bigint,
                              r_lease_until bigint, r_store_now bigint, r_earlier text)
               LANGUAGE sql AS $$ SELECT 1, 'late', NULL::integer, NULL::bigint, NULL::bigint, 0::bigint, NULL::text $$;"#
        ),
    )
    .await;
    let store = factory.store_with(factory.options()).await;
    assert_eq!(
        store.schema_version().await.expect("version"),
        SCHEMA_VERSION
    );
    (factory, store)
}
