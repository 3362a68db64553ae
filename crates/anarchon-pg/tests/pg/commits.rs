//! Which claims wait for their commit to reach the disk.

use super::*;

/// Calls the claim function of table `t` for one run inside a transaction
/// of `conn` and returns the claim's outcome; the transaction stays open.
async fn claim_in(
    tx: &mut PgConnection,
    t: &str,
    job: &str,
    slot: i64,
    max_late_ms: i64,
) -> String {
    sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT r_outcome FROM "{t}_claim"(
               ARRAY[$1], ARRAY[$2::bigint], ARRAY[gen_random_uuid()], ARRAY['test'],
               ARRAY[$3::bigint], ARRAY[30000::bigint], ARRAY['allow'], ARRAY[1], ARRAY[false])"#
    )))
    .bind(job)
    .bind(slot)
    .bind(max_late_ms)
    .fetch_one(&mut *tx)
    .await
    .expect("claim function")
}

/// `synchronous_commit` as the transaction on `conn` has it now.
async fn commit_mode(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
        .fetch_one(&mut *conn)
        .await
        .expect("setting")
}

/// The instances that lose the race for a fresh slot having read it before
/// the winner committed wait on the job's lock, then only read the winner's
/// run: their transactions change nothing, and commit without waiting for
/// the flush. The winner's commit, and a loser's that recorded a longer late
/// window, keep the server's setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_claim_that_changed_nothing_skips_the_commit_flush() {
    let factory = PgFactory::new().await;
    factory.instance().await;
    let t = factory.table().as_str().to_owned();
    let slot = future_base();
    let mut winner = admin(factory.url()).await;
    assert_eq!(
        commit_mode(&mut winner).await,
        "on",
        "this test needs a server whose synchronous_commit is on"
    );

    // The job has run before: its late window is recorded.
    assert_eq!(
        claim_in(&mut winner, &t, "race", slot - 1000, 60_000).await,
        "won"
    );
    // The winner claims, and holds the job's lock until it commits.
    exec(&mut winner, "BEGIN".into()).await;
    assert_eq!(claim_in(&mut winner, &t, "race", slot, 60_000).await, "won");
    assert_eq!(commit_mode(&mut winner).await, "on");

    // A loser that read the slot before that commit waits for it.
    let url = factory.url().to_owned();
    let table = t.clone();
    let loser = tokio::spawn(async move {
        let mut loser = admin(&url).await;
        exec(&mut loser, "BEGIN".into()).await;
        let outcome = claim_in(&mut loser, &table, "race", slot, 60_000).await;
        let mode = commit_mode(&mut loser).await;
        exec(&mut loser, "COMMIT".into()).await;
        (outcome, mode)
    });
    // Until it waits on the winner's lock (its read found no run). Only
    // this test's table counts: other tests claim on the same server.
    let mut watcher = admin(factory.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 IN query) > 0",
        )
        .bind(format!("\"{t}_claim\"("))
        .fetch_one(&mut watcher)
        .await
        .expect("activity");
        if waiting == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the losing claim never waited on the winner's lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    exec(&mut winner, "COMMIT".into()).await;
    let (outcome, mode) = loser.await.expect("loser");
    assert_eq!(
        outcome, "running",
        "the loser is told of the winner's lease"
    );
    assert_eq!(
        mode, "off",
        "the loser changed nothing: no flush to wait for"
    );

    // A claim that records a longer late window for the job writes, even
    // though it too only learns of the winner's lease.
    exec(&mut watcher, "BEGIN".into()).await;
    assert_eq!(
        claim_in(&mut watcher, &t, "race", slot, 120_000).await,
        "running"
    );
    assert_eq!(commit_mode(&mut watcher).await, "on");
    exec(&mut watcher, "COMMIT".into()).await;
    let window: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        r#"SELECT late_window FROM "{t}_jobs" WHERE job = 'race'"#
    )))
    .fetch_one(&mut watcher)
    .await
    .expect("late window");
    assert_eq!(window, 120_000);
}
