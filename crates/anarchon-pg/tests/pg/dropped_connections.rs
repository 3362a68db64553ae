//! Dropped connections.

use super::*;

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
        .store_with(
            factory
                .options()
                .with_application_name(&app)
                .with_pool_size(3),
        )
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
    common::heartbeat_renews(&store, &run, token, "heartbeat after the sessions ended").await;
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
                .store_with(
                    factory
                        .options()
                        .with_application_name(app)
                        .with_pool_size(3),
                )
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
