//! Query plans.

use super::*;

/// With 20,000 runs of one job stored (and statistics gathered), every
/// lookup a claim, heartbeat, finish, release, peek or history makes is an
/// index scan — the primary key, or the partial indexes of live runs
/// (leases, pending retries) for the overlap check and for the runs a
/// `replace` start ends, or that of waiting slots for `buffer-one` — in its
/// generic (prepared) plan. So a claim costs
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
            r#"{finished}
               INSERT INTO "{t}" (job, slot, state, attempt, token, fence, lease_until)
                 SELECT 'busy', 30000000 + g * 1000, 'running', 1, gen_random_uuid(), 20000 + g, 0
                   FROM generate_series(1, 5) AS g;
               INSERT INTO "{t}" (job, slot, state, attempt, fence, finished_at)
                 SELECT 'other-' || (g % 50), g * 1000, 'succeeded', 1, g, 0 FROM generate_series(1, 5000) AS g;
               INSERT INTO "{t}" (job, slot, state, attempt, token, fence, finished_at, error, retry_at)
                 SELECT 'busy', 40000000 + g * 1000, 'failed', 1, gen_random_uuid(), 30000 + g, 0, 'flaky', 1
                   FROM generate_series(1, 5) AS g;
               INSERT INTO "{t}" (job, slot, state, lease_until)
                 SELECT 'busy', 50000000 + g * 1000, 'waiting', 50060000 + g * 1000
                   FROM generate_series(1, 5) AS g;
               ANALYZE "{t}";
               SET plan_cache_mode = force_generic_plan;"#,
            finished = twenty_thousand_finished_runs(&t)
        ),
    )
    .await;
    let template = |text: &str| text.replace("{{table}}", &t);
    // One of the statement files under `sql/`: its name, parameter types
    // and the arguments the plan is asked for.
    macro_rules! statement {
        ($name:literal, $types:literal, $args:literal) => {
            (
                $name,
                template(include_str!(concat!("../../sql/", $name, ".sql"))),
                $types,
                $args.to_owned(),
            )
        };
    }
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
            "claim: overlap check of pending retries",
            format!(
                r#"SELECT 1 FROM "{t}" AS o WHERE o.job = $1 AND o.state = 'failed'
                   AND o.retry_at >= $2 AND o.slot <> $3"#
            ),
            "text, bigint, bigint",
            "'busy', 0, 5000".into(),
        ),
        (
            "claim: buffer-one, another slot waiting",
            format!(
                r#"SELECT 1 FROM "{t}" AS o WHERE o.job = $1 AND o.state = 'waiting'
                   AND o.lease_until >= $2 AND o.slot <> $3"#
            ),
            "text, bigint, bigint",
            "'busy', 0, 5000".into(),
        ),
        (
            "claim: replace ends the overlapping leases",
            format!(
                r#"SELECT 1 FROM "{t}" AS o WHERE o.job = $1 AND o.state = 'running'
                   AND o.slot <> $2"#
            ),
            "text, bigint",
            "'busy', 5000".into(),
        ),
        (
            "claim: replace ends the pending retries",
            format!(
                r#"SELECT 1 FROM "{t}" AS o WHERE o.job = $1 AND o.state = 'failed'
                   AND o.retry_at IS NOT NULL AND o.slot <> $2"#
            ),
            "text, bigint",
            "'busy', 5000".into(),
        ),
        (
            "claim: the batch's runs, read together before any lock",
            format!(
                r#"SELECT u.i, t.state, t.token, t.lease_until,
                          (SELECT j.late_window >= u.max_late FROM "{t}_jobs" AS j
                            WHERE j.job = u.job)
                     FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                          WITH ORDINALITY AS u(job, slot, max_late, i)
                     LEFT JOIN "{t}" AS t ON t.job = u.job AND t.slot = u.slot
                    ORDER BY u.i"#
            ),
            "text[], bigint[], bigint[]",
            "ARRAY['busy', 'other-1'], ARRAY[5000, 6000]::bigint[], ARRAY[1000, 1000]::bigint[]"
                .into(),
        ),
        statement!("peek", "text, bigint", "'busy', 5000"),
        statement!("history", "text, bigint", "'busy', 10"),
        statement!(
            "heartbeat",
            "text, bigint, uuid, bigint",
            "'busy', 5000, gen_random_uuid(), 1000"
        ),
        statement!(
            "finish",
            "text[], bigint[], uuid[], text[], text[], bigint[], bigint[], text",
            "ARRAY['busy', 'busy'], ARRAY[5000, 6000]::bigint[], \
             ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['failed', 'succeeded'], \
             ARRAY['x', NULL], ARRAY[1000, NULL]::bigint[], ARRAY[9000, NULL]::bigint[], \
             ' (not retried)'"
        ),
        statement!(
            "release",
            "text, bigint, uuid",
            "'busy', 5000, gen_random_uuid()"
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
        // The overlap checks must read the live-run indexes, the
        // buffer-one check that of waiting slots; the others find the run
        // by its primary key, or (for statements that only touch running
        // runs) through the job's few live runs.
        let live = format!("using {t}_live ");
        let retries = format!("using {t}_retries ");
        let waiting = format!("using {t}_waiting ");
        let pkey = format!("using {t}_pkey ");
        let ok = if what.contains("waiting") {
            plan.contains(&waiting)
        } else if what.contains("pending retries") {
            plan.contains(&retries)
        } else if what.contains("overlap") {
            plan.contains(&live)
        } else {
            plan.contains(&pkey) || plan.contains(&live)
        };
        assert!(ok, "{what} must use the index it is meant to:\n{plan}");
    }
}

/// The claim function itself, run 200 times (first attempts, own retries,
/// live leases and overlap checks, under `skip`, `buffer-one` and
/// `replace`: slots that wait, runs replaced) on a job with 20,000 stored
/// runs, never
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
                r#"{finished}
                   ANALYZE "{t}";"#,
                finished = twenty_thousand_finished_runs(&t)
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
        .store_with(factory.options().with_application_name(&app))
        .await;
    let busy = job("busy");
    let base = future_base();
    for i in 0..50 {
        let run = RunKey::new(busy.clone(), Slot::from_millis(base + i * 1000));
        let token = Token::generate();
        let rule = [Overlap::Skip, Overlap::BufferOne, Overlap::Replace][i as usize % 3];
        let first = claim(run.clone(), token, "a", rule);
        let outcome = store.claim_lease(&first).await.expect("claim");
        assert!(
            matches!(
                outcome,
                ClaimOutcome::Won(_) | ClaimOutcome::Overlap | ClaimOutcome::Running { .. }
            ),
            "{outcome:?}"
        );
        store.claim_lease(&first).await.expect("retry");
        store
            .claim_lease(&claim(run.clone(), Token::generate(), "b", rule))
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

/// The statement that stores 20,000 finished runs of the job `busy` in
/// the runs table `t`: the history both plan tests look through.
fn twenty_thousand_finished_runs(t: &str) -> String {
    format!(
        r#"INSERT INTO "{t}" (job, slot, state, attempt, fence, finished_at)
             SELECT 'busy', g * 1000, 'succeeded', 1, g, g * 1000 FROM generate_series(1, 20000) AS g;"#
    )
}
