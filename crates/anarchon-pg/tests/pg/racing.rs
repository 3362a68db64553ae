//! Racing instances.

use super::*;

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

/// A claim the run's own row answers — a run someone else holds, our own
/// claim sent again, a run that ended — takes no lock: it answers while
/// another session holds the job's row locked. A claim of a slot nobody
/// ran may start a run, so it waits for that lock, and wins once it is
/// released. (So the instances that lose a race, and backups watching a
/// run, do not queue behind the job's winners.)
#[tokio::test]
async fn a_claim_that_only_reads_does_not_wait_for_the_jobs_lock() {
    let factory = PgFactory::new().await;
    let t = factory.table().as_str().to_owned();
    let (winner, other) = (factory.instance().await, factory.instance().await);
    let job = job("lock-free-reads");
    let base = future_base();
    let held = RunKey::new(job.clone(), Slot::from_millis(base));
    let ended = RunKey::new(job.clone(), Slot::from_millis(base + 1000));
    let fresh = RunKey::new(job.clone(), Slot::from_millis(base + 2000));
    let holder = Token::generate();
    let win = won(winner
        .claim_lease(&claim(held.clone(), holder, "a", Overlap::Allow))
        .await
        .expect("claim"));
    let finisher = Token::generate();
    won(winner
        .claim_lease(&claim(ended.clone(), finisher, "a", Overlap::Allow))
        .await
        .expect("claim"));
    assert_eq!(
        winner
            .finish(&ended, finisher, RunOutcome::Succeeded)
            .await
            .expect("finish"),
        Renewal::Renewed
    );

    let mut locker = admin(factory.url()).await;
    exec(
        &mut locker,
        format!(r#"BEGIN; SELECT 1 FROM "{t}_jobs" WHERE job = 'lock-free-reads' FOR UPDATE;"#),
    )
    .await;
    let answer = |run: RunKey, token: Token| {
        let other = other.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                other.claim_lease(&claim(run, token, "b", Overlap::Allow)),
            )
            .await
            .expect("a claim that only reads answers while the job is locked")
            .expect("claim")
        }
    };
    assert!(
        matches!(
            answer(held.clone(), Token::generate()).await,
            ClaimOutcome::Running { .. }
        ),
        "someone else's live lease"
    );
    assert_eq!(
        answer(held.clone(), holder).await,
        ClaimOutcome::Won(win),
        "our own claim sent again"
    );
    assert_eq!(
        answer(ended.clone(), Token::generate()).await,
        ClaimOutcome::Done(FinalState::Succeeded)
    );

    let starting = tokio::spawn({
        let other = other.clone();
        let fresh = fresh.clone();
        async move {
            other
                .claim_lease(&claim(fresh, Token::generate(), "b", Overlap::Allow))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !starting.is_finished(),
        "a claim that may start a run waits for the job's lock"
    );
    exec(&mut locker, "ROLLBACK;".to_owned()).await;
    let outcome = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .expect("the claim goes on once the lock is released")
        .expect("task")
        .expect("claim");
    assert!(matches!(outcome, ClaimOutcome::Won(_)), "{outcome:?}");
}

/// A server, database or role whose default isolation is `serializable`
/// (here asked for on the connection URL) does not make racing claims
/// fail: the store pins its sessions to `read committed`, which its claim
/// is written for. Eight instances race 50 slots; every claim is answered,
/// and each slot has one winner.
///
/// Failed before the fix: claims that queued on the job's row behind a
/// winner failed with serialization errors (40001).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_are_answered_whatever_the_default_isolation() {
    const SLOTS: i64 = 50;
    let factory = PgFactory::new().await;
    let separator = if factory.url().contains('?') {
        '&'
    } else {
        '?'
    };
    let serializable = format!(
        "{}{separator}options=-c%20default_transaction_isolation%3Dserializable",
        factory.url()
    );
    let job = job("race-serializable");
    let base = future_base();
    let mut racers = Vec::new();
    for i in 0..8 {
        let store = factory
            .store_with(
                PgOptions::new(&serializable)
                    .with_table_name(factory.table().clone())
                    .with_pool_size(2),
            )
            .await;
        let job = job.clone();
        racers.push(tokio::spawn(async move {
            let mut wins = Vec::new();
            for n in 0..SLOTS {
                let run = RunKey::new(job.clone(), Slot::from_millis(base + n * 1000));
                let outcome = store
                    .claim_lease(&claim(
                        run,
                        Token::generate(),
                        &format!("r{i}"),
                        Overlap::Allow,
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("racer {i}, slot {n}: {e}"));
                if let ClaimOutcome::Won(_) = outcome {
                    wins.push(n);
                }
            }
            wins
        }));
    }
    let mut wins: Vec<i64> = Vec::new();
    for racer in racers {
        wins.extend(racer.await.expect("racer"));
    }
    wins.sort_unstable();
    assert_eq!(wins, (0..SLOTS).collect::<Vec<_>>(), "one winner per slot");
}
