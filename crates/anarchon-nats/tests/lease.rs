//! The NATS KV lease store against the real server, beyond the suites:
//! lease times are the server's, instance clocks 30 s off change nothing,
//! lost compare-and-swap races, fences, retention, round trips, and the
//! bucket it refuses.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anarchon_core::{
    Attempt, CancelReason, ClaimOutcome, ClaimStore, Clock, FinalState, JobName, LeaseClaim,
    LeaseStore, PauseRequest, PauseScope, RecordState, Renewal, RunKey, RunOutcome, RunState,
    Schedule, Scheduler, Slot, SystemClock, Timestamp, Token, Until,
};
use anarchon_nats::{
    CLOCK_KEY, Error, LEASE_BACKEND, NatsLeaseOptions, NatsLeaseStore, NatsOptions,
    is_wrong_last_sequence,
};
use anarchon_testkit::claim::{future_slot, job};
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::{FaultProxy, Faulty, SkewedClock, StoreFactory};
use async_nats::jetstream::{self, stream};
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::common::{NatsLeaseFactory, StreamGuard, connect_leases, create_stream, leases, url};

/// The raw bucket under a factory's stores, for looking behind the store.
struct Raw {
    stream: stream::Stream,
    bucket: String,
    jetstream: jetstream::Context,
}

impl Raw {
    async fn open(factory: &NatsLeaseFactory) -> Self {
        // Opening a store creates the bucket.
        let _ = factory.instance().await;
        let client = async_nats::connect(url().await).await.unwrap();
        let jetstream = jetstream::new(client);
        let stream = jetstream
            .get_stream(factory.leases.stream_name())
            .await
            .unwrap();
        Self {
            stream,
            bucket: factory.leases.bucket().to_owned(),
            jetstream,
        }
    }

    /// Writes `document` under `key` straight to the bucket, as someone
    /// else (or a broken writer) would, and waits for the server to store it.
    async fn plant(&self, key: &str, document: String) {
        self.jetstream
            .publish(format!("$KV.{}.{key}", self.bucket), document.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Deletes `key` as `nats kv del` does: a marker with no payload.
    async fn delete(&self, key: &str) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        self.jetstream
            .publish_with_headers(
                format!("$KV.{}.{key}", self.bucket),
                headers,
                Vec::new().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// The latest message of `key`: (revision, server time in ms, payload).
    async fn get(&self, key: &str) -> Option<(u64, i64, String)> {
        let subject = format!("$KV.{}.{key}", self.bucket);
        match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => {
                let at: SystemTime = m.time.into();
                let ms = at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_millis();
                Some((
                    m.sequence,
                    i64::try_from(ms).unwrap(),
                    String::from_utf8(m.payload.to_vec()).unwrap(),
                ))
            }
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => None,
            Err(e) => panic!("reading {subject}: {e}"),
        }
    }

    /// How many messages the bucket holds under `key` (markers included).
    async fn messages(&self, key: &str) -> usize {
        let subject = format!("$KV.{}.{key}", self.bucket);
        let mut info = self.stream.info_with_subjects(&subject).await.unwrap();
        let mut n = 0;
        while let Some((_, count)) = futures::TryStreamExt::try_next(&mut info).await.unwrap() {
            n += count;
        }
        n
    }
}

fn won(outcome: ClaimOutcome) -> anarchon_core::Win {
    match outcome {
        ClaimOutcome::Won(win) => win,
        other => panic!("expected Won, got {other:?}"),
    }
}

/// A slot in the past, on the whole second `ago` before now.
fn past_slot(ago: Duration) -> Slot {
    let now = SystemClock.now().as_millis();
    Slot::from_millis(now - now.rem_euclid(1000) - i64::try_from(ago.as_millis()).unwrap())
}

/// The lease end a claim reports is the server timestamp of the write that
/// started or renewed the lease, plus the lease; `store_now` is the server
/// timestamp of the store's own clock write. Read straight from the bucket.
#[tokio::test]
async fn lease_ends_and_now_are_server_timestamps() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let run = RunKey::new(job("server-time"), future_slot(&factory, 0));
    let token = Token::generate();
    let mut claim = lease_claim(run.clone(), token, "a");
    claim.lease = Duration::from_secs(20);
    won(a.claim_lease(&claim).await.unwrap());
    let job_key = NatsLeaseStore::job_key(&run.job);
    let (_, claimed_at, _) = raw.get(&job_key).await.unwrap();
    let outcome = b
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
        .await
        .unwrap();
    let (_, clock_at, _) = raw.get(CLOCK_KEY).await.unwrap();
    assert_eq!(
        outcome,
        ClaimOutcome::Running {
            lease_until: Timestamp::from_millis(claimed_at + 20_000),
            store_now: Timestamp::from_millis(clock_at),
        }
    );

    // A heartbeat moves the lease end to its own write's timestamp + lease.
    assert_eq!(
        a.heartbeat(&run, token, Duration::from_secs(7))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    let (_, renewed_at, _) = raw.get(&job_key).await.unwrap();
    let view = b.peek(&run).await.unwrap();
    let (_, clock_at, _) = raw.get(CLOCK_KEY).await.unwrap();
    assert_eq!(view.store_now, Timestamp::from_millis(clock_at));
    assert_eq!(
        view.state,
        RunState::Running {
            attempt: Attempt::FIRST,
            lease_until: Timestamp::from_millis(renewed_at + 7_000),
        }
    );

    // A release ends it 1 ms before its own write.
    assert_eq!(a.release(&run, token).await.unwrap(), Renewal::Renewed);
    let (_, released_at, _) = raw.get(&job_key).await.unwrap();
    assert_eq!(
        b.peek(&run).await.unwrap().state,
        RunState::Running {
            attempt: Attempt::FIRST,
            lease_until: Timestamp::from_millis(released_at - 1),
        }
    );
}

/// Shared record of what the handlers of a skew check did.
#[derive(Default)]
struct Seen {
    starts: Vec<(usize, Attempt, Option<anarchon_core::Fence>, Instant)>,
    cancelled: Option<(CancelReason, Instant)>,
}

fn skewed(skew: i64) -> Arc<dyn Clock> {
    let system = Arc::new(SystemClock);
    match skew {
        0 => system,
        s => SkewedClock::new(system, s > 0, Duration::from_secs(s.unsigned_abs())),
    }
}

/// One scheduler of a skew check over `store`, with a job that has one slot,
/// `slot`, claimed at start (catch-up) by every scheduler whatever its clock.
fn scheduler(
    store: Arc<Faulty<NatsLeaseStore>>,
    clock: Arc<dyn Clock>,
    index: usize,
    slot: Slot,
    seen: Arc<Mutex<Seen>>,
) -> Scheduler {
    let at = slot.at().to_datetime();
    let cron = at.format("%-S %-M %-H %-d %-m *").to_string();
    let mut builder = Scheduler::builder(store)
        .clock(clock)
        .lease(LEASE)
        .heartbeat(HEARTBEAT);
    builder
        .job("skewed", Schedule::cron(&cron).unwrap())
        .unwrap()
        .catch_up(Duration::from_secs(300))
        .run(move |ctx| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().starts.push((
                    index,
                    ctx.attempt(),
                    ctx.fence(),
                    Instant::now(),
                ));
                if ctx.attempt() == Attempt::FIRST {
                    // The first runner works until it is told to stop.
                    ctx.cancelled().await;
                    seen.lock().unwrap().cancelled =
                        Some((ctx.cancel_reason().unwrap(), Instant::now()));
                    return Err("stopped early".to_owned());
                }
                Ok::<_, String>(())
            }
        })
        .unwrap();
    builder.start().unwrap()
}

const LEASE: Duration = Duration::from_millis(600);
const HEARTBEAT: Duration = Duration::from_millis(200);

/// Waits until `done` holds for what the handlers saw, for at most 30 s.
async fn wait_for(seen: &Mutex<Seen>, what: &str, done: impl Fn(&Seen) -> bool) {
    let start = Instant::now();
    loop {
        if done(&seen.lock().unwrap()) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A runner and a backup whose clocks are `runner_skew` and `backup_skew`
/// seconds off the real time (and so off the NATS server's): while the
/// runner renews, the backup watches and never takes over; once the
/// runner's store goes away, the backup takes over as soon as the lease
/// ends on the server's clock — not 30 s early or late.
async fn skew_check(runner_skew: i64, backup_skew: i64) {
    let factory = NatsLeaseFactory::new().await;
    // A slot 31 s ago: in the past, inside the catch-up window, for clocks
    // up to 30 s behind or ahead.
    let slot = past_slot(Duration::from_secs(31));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let runner_store = Faulty::new(factory.instance().await);
    let backup_store = Faulty::new(factory.instance().await);
    let runner = scheduler(
        runner_store.clone(),
        skewed(runner_skew),
        0,
        slot,
        seen.clone(),
    );
    wait_for(&seen, "the runner to start", |s| !s.starts.is_empty()).await;
    let backup = scheduler(
        backup_store.clone(),
        skewed(backup_skew),
        1,
        slot,
        seen.clone(),
    );

    // Five leases long the runner renews: the backup watches (it reads the
    // run each time the lease it was told ends) and never takes over.
    tokio::time::sleep(LEASE * 5).await;
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.starts.len(), 1, "nobody may take over a live lease");
        assert_eq!(s.starts[0].0, 0);
        assert!(s.cancelled.is_none());
    }
    assert!(
        backup_store.peeks() >= 3,
        "the backup must be watching the run, {} peeks",
        backup_store.peeks()
    );
    assert!(runner_store.heartbeats() >= 10);

    // The runner loses the store: its lease runs out on the server's clock.
    runner_store.set_down(true);
    let cut = Instant::now();
    wait_for(&seen, "the backup to take over", |s| s.starts.len() > 1).await;
    let (first, second, cancelled) = {
        let s = seen.lock().unwrap();
        (s.starts[0], s.starts[1], s.cancelled)
    };
    backup.shutdown().await;
    runner.shutdown().await;
    assert_eq!(second.0, 1, "the backup takes over");
    assert_eq!(second.1, first.1.next());
    assert!(
        second.2 > first.2,
        "fence must grow: {first:?} -> {second:?}"
    );
    let (reason, cancelled_at) = cancelled.expect("the runner stopped");
    assert_eq!(reason, CancelReason::LostContact);
    assert!(
        cancelled_at <= second.3,
        "the runner stops before the backup starts"
    );
    let delay = second.3.duration_since(cut);
    let bound = LEASE + HEARTBEAT + Duration::from_millis(500);
    assert!(
        delay <= bound,
        "the backup took over {delay:?} after the runner's last chance to renew; a lease is {LEASE:?}, so within {bound:?} (the clocks are 30 s off)"
    );
    let history = factory
        .instance()
        .await
        .history(&job("skewed"), 1)
        .await
        .unwrap();
    assert_eq!(history[0].run.slot, slot);
    assert_eq!(history[0].attempt, Some(Attempt::FIRST.next()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_30s_ahead_neither_takes_over_early_nor_late() {
    skew_check(0, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_30s_behind_neither_takes_over_early_nor_late() {
    skew_check(0, -30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_30s_ahead_and_a_backup_30s_behind_agree() {
    skew_check(30, -30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_30s_behind_and_a_backup_30s_ahead_agree() {
    skew_check(-30, 30).await;
}

/// 8 instances, each with its own connection, start together and claim the
/// same 40 slots of one job: their compare-and-swap writes collide, the
/// losers read again and decide again, and each slot has one winner. The
/// winners' fences grow with the slot: each win is one swap on the job's
/// counter, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_instances_lose_swaps_and_decide_again() {
    const RACERS: usize = 8;
    const SLOTS: i64 = 40;
    let factory = NatsLeaseFactory::new().await;
    let job = job("race");
    let base = future_slot(&factory, 0).as_millis();
    let mut stores = Vec::new();
    for _ in 0..RACERS {
        stores.push(factory.instance().await);
    }
    let start = Arc::new(Barrier::new(RACERS));
    let racers = stores.iter().cloned().enumerate().map(|(i, store)| {
        let (job, start) = (job.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            let mut wins = Vec::new();
            for k in 0..SLOTS {
                let run = RunKey::new(job.clone(), Slot::from_millis(base + k * 1000));
                let claim = lease_claim(run, Token::generate(), &format!("racer-{i}"));
                match store.claim_lease(&claim).await.unwrap() {
                    ClaimOutcome::Won(win) => wins.push((k, win.fence.unwrap())),
                    ClaimOutcome::Running { .. } => {}
                    other => panic!("{other:?}"),
                }
            }
            wins
        })
    });
    let mut fences: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for racer in futures::future::join_all(racers).await {
        for (k, fence) in racer.unwrap() {
            fences.entry(k).or_default().push(fence.get());
        }
    }
    let conflicts: u64 = stores.iter().map(|s| s.stats().conflicts).sum();
    let round_trips: u64 = stores.iter().map(|s| s.stats().round_trips).sum();
    let claims = (RACERS as u64) * (SLOTS as u64);
    println!(
        "{claims} claims by {RACERS} racers: {conflicts} lost swaps, {:.2} round trips per claim",
        round_trips as f64 / claims as f64
    );
    assert!(
        conflicts > 0,
        "8 instances racing for one job must lose some swaps"
    );
    assert_eq!(fences.len(), SLOTS as usize, "every slot has a winner");
    let mut last = 0;
    for (k, won) in &fences {
        assert_eq!(won.len(), 1, "slot {k} has {} winners", won.len());
        assert!(won[0] > last, "fences grow with the slot: {fences:?}");
        last = won[0];
    }
    assert_eq!(last, SLOTS as u64, "one fence per win, none lost");
}

/// A write that loses the race costs two more round trips and is decided
/// again on what the winner wrote. The race is made sure by a slow proxy
/// between one store and the server.
#[tokio::test]
async fn a_lost_race_is_read_again_and_decided_again() {
    let factory = NatsLeaseFactory::new().await;
    let server = url().await;
    let upstream = server.trim_start_matches("nats://").to_owned();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let slow = Arc::new(
        connect_leases(
            &NatsOptions::new(format!("nats://{}", proxy.address())),
            factory.leases.clone(),
        )
        .await,
    );
    let fast = factory.instance().await;
    let job = job("lost-race");
    let base = future_slot(&factory, 0).as_millis();
    // Both slots exist before the race, so both claims are plain wins.
    let mine = RunKey::new(job.clone(), Slot::from_millis(base + 60_000));
    let theirs = RunKey::new(job.clone(), Slot::from_millis(base));
    // 500 ms each way: a second per round trip for the slow store, so the
    // fast claim below has a second on either side to land in.
    proxy.set_latency(Duration::from_millis(500));
    let before = slow.stats();
    let claim = lease_claim(mine.clone(), Token::generate(), "slow");
    let racing = tokio::spawn({
        let slow = slow.clone();
        async move { slow.claim_lease(&claim).await }
    });
    // The slow claim's read reached the server at ~0.5 s and its swap
    // reaches it at ~2.5 s (after the read of the server's time); the
    // fast one changes the document at ~1.5 s, between the two.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let first = won(fast
        .claim_lease(&lease_claim(theirs, Token::generate(), "fast"))
        .await
        .unwrap());
    let second = won(racing.await.unwrap().unwrap());
    let after = slow.stats();
    assert_eq!(after.conflicts - before.conflicts, 1, "one lost swap");
    assert_eq!(
        after.round_trips - before.round_trips,
        5,
        "read + clock + swap, then read + swap again"
    );
    assert!(second.fence > first.fence, "{first:?} then {second:?}");
}

/// A "wrong last sequence" answer from the real server (error 10071 on a
/// single NATS 2.9) is what the store treats as a lost race.
#[tokio::test]
async fn the_servers_wrong_last_sequence_is_a_conflict() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let subject = format!("$KV.{}.job.probe", raw.bucket);
    let first = raw
        .jetstream
        .publish(subject.clone(), "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        (first.sequence + 1000).to_string().as_str(),
    );
    let refused = raw
        .jetstream
        .publish_with_headers(subject.clone(), headers, "{}".into())
        .await
        .unwrap()
        .await
        .expect_err("a stale revision is refused");
    assert!(is_wrong_last_sequence(&refused), "{refused:?}");
    // Another refusal is not a conflict.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Stream", "not-this-one");
    let other = raw
        .jetstream
        .publish_with_headers(subject, headers, "{}".into())
        .await
        .unwrap()
        .await
        .expect_err("a wrong stream is refused");
    assert!(!is_wrong_last_sequence(&other), "{other:?}");
}

/// Fence numbers grow across the runs of a job, across takeovers after an
/// expiry and after a release, and through `claim_many`; another job
/// counts on its own; the history keeps each run's last fence.
#[tokio::test]
async fn fences_grow_across_runs_and_takeovers() {
    let factory = NatsLeaseFactory::new().await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let job_a = job("fences");
    let base = future_slot(&factory, 0).as_millis();
    let run = |k: i64| RunKey::new(job_a.clone(), Slot::from_millis(base + k * 60_000));
    let mut fences = Vec::new();

    // Run 0: won, expires, taken over, released, taken over again, finished.
    let mut short = lease_claim(run(0), Token::generate(), "a");
    short.lease = Duration::from_millis(300);
    fences.push(won(a.claim_lease(&short).await.unwrap()).fence.unwrap());
    tokio::time::sleep(Duration::from_millis(550)).await;
    let t1 = Token::generate();
    let w = won(b.claim_lease(&lease_claim(run(0), t1, "b")).await.unwrap());
    assert_eq!(w.attempt.get(), 2);
    fences.push(w.fence.unwrap());
    assert_eq!(b.release(&run(0), t1).await.unwrap(), Renewal::Renewed);
    let t2 = Token::generate();
    let w = won(a.claim_lease(&lease_claim(run(0), t2, "a")).await.unwrap());
    assert_eq!(w.attempt.get(), 3);
    fences.push(w.fence.unwrap());
    a.finish(&run(0), t2, RunOutcome::Succeeded).await.unwrap();

    // Runs 1..=3 in one batch, run 4 alone.
    let batch: Vec<LeaseClaim> = (1..=3)
        .map(|k| lease_claim(run(k), Token::generate(), "b"))
        .collect();
    for outcome in b.claim_many(&batch).await.unwrap().all().unwrap() {
        fences.push(won(outcome).fence.unwrap());
    }
    fences.push(
        won(a
            .claim_lease(&lease_claim(run(4), Token::generate(), "a"))
            .await
            .unwrap())
        .fence
        .unwrap(),
    );
    let numbers: Vec<u64> = fences.iter().map(|f| f.get()).collect();
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7]);

    let other = won(a
        .claim_lease(&lease_claim(
            RunKey::new(job("fences-other"), Slot::from_millis(base)),
            Token::generate(),
            "a",
        ))
        .await
        .unwrap());
    assert_eq!(other.fence.unwrap().get(), 1, "each job counts on its own");

    let history = b.history(&job_a, 10).await.unwrap();
    let recorded: Vec<u64> = history.iter().map(|r| r.fence.unwrap().get()).collect();
    assert_eq!(recorded, [7, 6, 5, 4, 3], "newest slot first, last fence");
    assert_eq!(history[4].attempt.unwrap().get(), 3);
    assert_eq!(
        history[4].state,
        RecordState::Finished(FinalState::Succeeded)
    );
}

/// A job's document deleted by hand (a delete marker) does not make the
/// job forget its runs that ended: those were moved to their own keys, and
/// a claim after the deletion reads the key, finds the run done and does
/// not start it again.
///
/// Failed before the fix: the deleted document read as a new job's, whose
/// slots have no record, so the claim started the finished slot again.
#[tokio::test]
async fn a_job_document_deleted_by_hand_does_not_forget_ended_runs() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let job = job("deleted-by-hand");
    let claim = |slot: Slot| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.claim.max_late = Duration::from_secs(3600);
        c
    };
    let ended = claim(past_slot(Duration::from_secs(120)));
    won(store.claim_lease(&ended).await.unwrap());
    store
        .finish(ended.run(), ended.claim.token, RunOutcome::Succeeded)
        .await
        .unwrap();
    // A claim that starts a run moves the ended record to its own key.
    won(store
        .claim_lease(&claim(past_slot(Duration::from_secs(60))))
        .await
        .unwrap());
    let run_key = NatsLeaseStore::run_key(ended.run());
    let (_, _, record) = raw.get(&run_key).await.expect("moved to its key");
    assert!(record.contains("succeeded"), "{record}");
    raw.delete(&NatsLeaseStore::job_key(&job)).await;
    assert_eq!(
        store.claim_lease(&claim(ended.run().slot)).await.unwrap(),
        ClaimOutcome::Done(FinalState::Succeeded),
        "a finished run started again after its job's document was deleted"
    );
}

/// A manual-run request nobody can read (written by hand, or by something
/// else) is passed over: the other requests are still read by every
/// instance, and collection purges the unreadable ones.
///
/// Failed before the fix: one such key failed every read of the requests,
/// so no instance learnt of any manual run or backfill.
#[tokio::test]
async fn an_unreadable_request_is_passed_over() {
    use anarchon_core::{RequestId, TriggerRequest};
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let job = job("requested");
    let request = TriggerRequest::new(job.clone(), RequestId::new("good").unwrap());
    store.request_run(&request).await.expect("request_run");
    let broken = NatsLeaseStore::request_key(&job, &RequestId::new("broken").unwrap());
    raw.plant(&broken, "not json".to_owned()).await;
    let backwards = NatsLeaseStore::request_key(&job, &RequestId::new("backwards").unwrap());
    raw.plant(&backwards, r#"{"at":5,"range":[9,1]}"#.to_owned())
        .await;
    let read = store
        .run_requests()
        .await
        .expect("the good request is read");
    let ids: Vec<&str> = read.requests.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["good"]);
    store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .expect("a collection passes over what it cannot read");
    for key in [&broken, &backwards] {
        assert!(
            raw.get(key).await.is_none(),
            "{key}, which nobody can read, is collected"
        );
    }
    let good = NatsLeaseStore::request_key(&job, &RequestId::new("good").unwrap());
    assert!(
        raw.get(&good).await.is_some(),
        "a young readable request stays"
    );
}

/// Ended runs leave the job's document at the next claim (to their own
/// keys), so the document holds only live runs; garbage collection purges
/// old records without leaving markers, drops runs whose lease died long
/// ago, keeps the fence counter, and late claims still find what they need.
#[tokio::test]
async fn retention_keeps_the_job_document_small_and_purges_old_records() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let job = job("retention");
    let job_key = NatsLeaseStore::job_key(&job);
    // Ten old runs (3 h ago, 100 ms apart), each finished.
    let old: Vec<Slot> = (0..10)
        .map(|i| Slot::from_millis(past_slot(Duration::from_secs(3 * 3600)).as_millis() + i * 100))
        .collect();
    // The job's late window covers the oldest run (a second before the
    // ten) for two to three seconds more, and the newest of the ten for at
    // most five: after that the first collection's `keep` alone decides.
    let window_set = tokio::time::Instant::now();
    let window = Duration::from_secs(3 * 3600 + 1 + 3);
    let catch_up = |slot: Slot, lease: Duration| {
        let mut c = lease_claim(RunKey::new(job.clone(), slot), Token::generate(), "a");
        c.claim.max_late = window;
        c.lease = lease;
        c
    };
    for slot in &old {
        let c = catch_up(*slot, Duration::from_secs(30));
        won(store.claim_lease(&c).await.unwrap());
        let finished = store
            .finish(c.run(), c.claim.token, RunOutcome::Succeeded)
            .await
            .unwrap();
        assert_eq!(finished, Renewal::Renewed);
    }
    // A late claim of a slot older than the job's window records it missed.
    let missed = past_slot(Duration::from_secs(3 * 3600 + 10));
    let late = lease_claim(RunKey::new(job.clone(), missed), Token::generate(), "a");
    assert_eq!(
        store.claim_lease(&late).await.unwrap(),
        ClaimOutcome::Missed
    );
    // An old run whose short lease dies, and a recent live one.
    let dead = Slot::from_millis(old[0].as_millis() - 1500);
    let dying = catch_up(dead, Duration::from_millis(200));
    won(store.claim_lease(&dying).await.unwrap());
    let recent = past_slot(Duration::from_secs(60));
    won(store
        .claim_lease(&catch_up(recent, Duration::from_secs(30)))
        .await
        .unwrap());

    // The document holds the two live runs only; the ended ones have keys.
    let (_, _, document) = raw.get(&job_key).await.unwrap();
    assert!(!document.contains("ended"), "{document}");
    assert!(
        document.len() < 1024,
        "{} bytes: {document}",
        document.len()
    );
    for slot in &old {
        let key = NatsLeaseStore::run_key(&RunKey::new(job.clone(), *slot));
        let (_, _, record) = raw.get(&key).await.unwrap();
        assert!(record.contains("succeeded"), "{record}");
    }
    // One more old run ends, and no claim follows to move it out.
    let older = Slot::from_millis(old[0].as_millis() - 1000);
    let c = catch_up(older, Duration::from_secs(30));
    let last = won(store.claim_lease(&c).await.unwrap());
    store
        .finish(c.run(), c.claim.token, RunOutcome::Succeeded)
        .await
        .unwrap();
    let older_key = NatsLeaseStore::run_key(c.run());
    assert!(raw.get(&older_key).await.is_none());

    let history = store.history(&job, 100).await.unwrap();
    let slots: Vec<Slot> = history.iter().map(|r| r.run.slot).collect();
    let mut expected = vec![recent];
    expected.extend(old.iter().rev());
    expected.extend([older, dead, missed]);
    assert_eq!(
        slots, expected,
        "newest first, from the document and the keys"
    );
    assert_eq!(history[13].state, RecordState::Missed);
    assert_eq!(history[12].state, RecordState::Running);
    assert_eq!(
        history[11].state,
        RecordState::Finished(FinalState::Succeeded)
    );
    assert_eq!(store.history(&job, 4).await.unwrap().len(), 4);

    // Keep 1 h: the old runs (ten under their keys, one still in the
    // document) and the missed one go; the dead run stays, its lease ended
    // less than an hour ago; so does the live one.
    tokio::time::sleep_until(window_set + Duration::from_millis(5300)).await;
    let deleted = store
        .collect_garbage(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(deleted, 12);
    for slot in old.iter().chain([&missed, &older]) {
        let key = NatsLeaseStore::run_key(&RunKey::new(job.clone(), *slot));
        assert_eq!(
            raw.messages(&key).await,
            0,
            "{key} is purged, no marker left"
        );
    }
    let left = history_slots(&store, &job).await;
    assert_eq!(left, [recent, dead]);
    // What a late claim inside the kept hour asks about is still there.
    assert!(matches!(
        store
            .claim_lease(&catch_up(recent, Duration::from_secs(30)))
            .await
            .unwrap(),
        ClaimOutcome::Running { .. }
    ));
    let (_, _, document) = raw.get(&job_key).await.unwrap();
    assert!(!document.contains("ended"), "{document}");

    // Fences go on from where they were.
    let next = Slot::from_millis(recent.as_millis() + 1000);
    let after = won(store
        .claim_lease(&catch_up(next, Duration::from_secs(30)))
        .await
        .unwrap());
    assert!(after.fence > last.fence, "{last:?} then {after:?}");

    // Keep 100 ms: now the dead run's lease ended longer ago than that.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let deleted = store
        .collect_garbage(Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(deleted, 1, "only the run whose lease died");
    let left = history_slots(&store, &job).await;
    assert_eq!(left, [next, recent]);
}

/// The slots `store` has in `job`'s history (up to 100), newest first.
async fn history_slots(store: &NatsLeaseStore, job: &JobName) -> Vec<Slot> {
    let history = store.history(job, 100).await.unwrap();
    history.iter().map(|r| r.run.slot).collect()
}

/// The round trips and requests `store` made since its stats read
/// `before`.
fn cost_since(store: &NatsLeaseStore, before: anarchon_nats::LeaseStats) -> (u64, u64) {
    let after = store.stats();
    (
        after.round_trips - before.round_trips,
        after.requests - before.requests,
    )
}

/// What each call costs, in round trips and requests, as the docs say.
#[tokio::test]
async fn round_trips_per_call() {
    let factory = NatsLeaseFactory::new().await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let run = RunKey::new(job("costs"), future_slot(&factory, 0));
    let token = Token::generate();
    let claim = lease_claim(run.clone(), token, "a");

    let before = a.stats();
    won(a.claim_lease(&claim).await.unwrap());
    assert_eq!(
        cost_since(&a, before),
        (3, 6),
        "claim that wins: the pauses are read with the clock"
    );

    let before = a.stats();
    won(a.claim_lease(&claim).await.unwrap());
    assert_eq!(cost_since(&a, before), (1, 2), "own retry");

    let before = b.stats();
    let other = lease_claim(run.clone(), Token::generate(), "b");
    assert!(matches!(
        b.claim_lease(&other).await.unwrap(),
        ClaimOutcome::Running { .. }
    ));
    assert_eq!(cost_since(&b, before), (2, 3), "claim of a live lease");

    let before = b.stats();
    b.peek(&run).await.unwrap();
    assert_eq!(cost_since(&b, before), (2, 3), "peek");

    let before = a.stats();
    a.heartbeat(&run, token, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(cost_since(&a, before), (2, 2), "heartbeat");

    let before = a.stats();
    a.finish(&run, token, RunOutcome::Succeeded).await.unwrap();
    assert_eq!(cost_since(&a, before), (2, 2), "finish");

    let before = b.stats();
    assert_eq!(
        b.claim_lease(&other).await.unwrap(),
        ClaimOutcome::Done(FinalState::Succeeded)
    );
    assert_eq!(cost_since(&b, before), (1, 2), "claim of a run that ended");

    let before = b.stats();
    let batch: Vec<LeaseClaim> = (0..20)
        .map(|i| {
            lease_claim(
                RunKey::new(job(&format!("costs-{i}")), run.slot),
                Token::generate(),
                "b",
            )
        })
        .collect();
    for outcome in b.claim_many(&batch).await.unwrap().all().unwrap() {
        won(outcome);
    }
    assert_eq!(
        cost_since(&b, before),
        (3, 1 + 20 + 1 + 20 + 1 + 20),
        "20 jobs in one batch: the round trips of one claim; pause.all read once"
    );

    let before = b.stats();
    let late = lease_claim(
        RunKey::new(job("costs-late"), past_slot(Duration::from_secs(3600))),
        Token::generate(),
        "b",
    );
    assert_eq!(b.claim_lease(&late).await.unwrap(), ClaimOutcome::Missed);
    assert_eq!(
        cost_since(&b, before),
        (3, 6),
        "late claim recording missed"
    );
}

/// Ended runs move from the job's document to their run keys only with a
/// claim that may start a run: a claim that finds its slot held (as seven
/// of a fleet's eight do) costs what it costs with nothing ended and
/// writes no record; the next claim of a new slot moves them.
#[tokio::test]
async fn only_a_claim_that_may_start_moves_ended_runs() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let (a, b) = (factory.instance().await, factory.instance().await);
    let job = job("moves");
    let first = future_slot(&factory, 0).as_millis();
    let run = |k: i64| RunKey::new(job.clone(), Slot::from_millis(first + k * 1000));
    let ended = lease_claim(run(0), Token::generate(), "a");
    won(a.claim_lease(&ended).await.unwrap());
    won(a
        .claim_lease(&lease_claim(run(1), Token::generate(), "a"))
        .await
        .unwrap());
    a.finish(ended.run(), ended.claim.token, RunOutcome::Succeeded)
        .await
        .unwrap();
    let ended_key = NatsLeaseStore::run_key(ended.run());
    let job_key = NatsLeaseStore::job_key(&job);

    let before = b.stats();
    assert!(matches!(
        b.claim_lease(&lease_claim(run(1), Token::generate(), "b"))
            .await
            .unwrap(),
        ClaimOutcome::Running { .. }
    ));
    assert_eq!(
        cost_since(&b, before),
        (2, 3),
        "a claim of a live lease costs the same with an ended run in the document"
    );
    assert!(
        raw.get(&ended_key).await.is_none(),
        "a claim that found its slot held wrote the ended run's record"
    );
    let (_, _, document) = raw.get(&job_key).await.unwrap();
    assert!(document.contains("ended"), "{document}");

    won(b
        .claim_lease(&lease_claim(run(2), Token::generate(), "b"))
        .await
        .unwrap());
    let (_, _, record) = raw
        .get(&ended_key)
        .await
        .expect("the claim that started a run moved the ended one to its key");
    assert!(record.contains("succeeded"), "{record}");
    let (_, _, document) = raw.get(&job_key).await.unwrap();
    assert!(!document.contains("ended"), "{document}");
}

/// Pauses are KV keys of the bucket — `pause.job.<job>` and `pause.all` —
/// holding server times; a resume purges the key. What each pause call
/// costs, and a claim of a paused job: one round trip more for a slot the
/// job's document never held (its run key tells a fresh slot from a
/// missed one), none for the same slot again.
#[tokio::test]
async fn pauses_are_keys_of_the_bucket_on_the_servers_clock() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let cost = |before| cost_since(&store, before);
    let quiet = job("quiet");
    let scope = PauseScope::Job(quiet.clone());

    let before = store.stats();
    let pause = store
        .pause(
            &scope,
            &PauseRequest::new()
                .with_until(Until::For(Duration::from_secs(3600)))
                .with_reason("migration")
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(cost(before), (3, 3), "pause: clock write, clock read, put");
    let (_, written_at, payload) = raw.get("pause.job.quiet").await.unwrap();
    assert!(
        (0..1000).contains(&(written_at - pause.since.as_millis())),
        "the pause starts on the server's clock, just before its write: {pause:?} written at {written_at}"
    );
    assert_eq!(
        payload,
        format!(
            r#"{{"since":{},"until":{},"reason":"migration"}}"#,
            pause.since.as_millis(),
            pause.since.as_millis() + 3_600_000
        )
    );
    let all = store
        .pause(&PauseScope::All, &PauseRequest::new())
        .await
        .unwrap();
    assert!(raw.get("pause.all").await.is_some());

    let before = store.stats();
    let listed = store.pauses().await.unwrap();
    assert_eq!(listed.pauses, vec![all, pause]);
    assert_eq!(
        cost(before),
        (2, 2 + 2 + 1),
        "pauses: list + clock write, then the clock and each pause"
    );

    let slot = future_slot(&factory, 0);
    let run = RunKey::new(quiet.clone(), slot);
    let before = store.stats();
    assert_eq!(
        store
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
            .await
            .unwrap(),
        ClaimOutcome::Done(FinalState::Paused)
    );
    assert_eq!(
        cost(before),
        (4, 2 + 3 + 1 + 1),
        "a paused slot the document never held: its run key, then the swap"
    );
    let before = store.stats();
    assert_eq!(
        store
            .claim_lease(&lease_claim(run.clone(), Token::generate(), "b"))
            .await
            .unwrap(),
        ClaimOutcome::Done(FinalState::Paused)
    );
    assert_eq!(cost(before), (1, 2), "the same slot again: in the document");

    let before = store.stats();
    assert!(store.resume(&PauseScope::All).await.unwrap());
    assert_eq!(cost(before), (1, 1), "resume: one purge");
    assert!(store.resume(&scope).await.unwrap());
    assert!(
        !store.resume(&scope).await.unwrap(),
        "nothing left to resume"
    );
    assert!(raw.get("pause.all").await.is_none(), "purged, no marker");
    assert_eq!(raw.messages("pause.job.quiet").await, 0);
    assert!(store.pauses().await.unwrap().pauses.is_empty());
    won(store
        .claim_lease(&lease_claim(
            RunKey::new(quiet, Slot::from_millis(slot.as_millis() + 1000)),
            Token::generate(),
            "a",
        ))
        .await
        .unwrap());
}

/// An existing bucket that would lose records is refused, naming it; one
/// made with more history (as `nats kv add --history 5` would) is used.
#[tokio::test]
async fn buckets_that_do_not_fit_are_refused() {
    let url = url().await;
    let client = async_nats::connect(url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let connection = NatsOptions::new(url.as_str());

    let aging = leases();
    let _guard = StreamGuard::new(&url, aging.stream_name());
    create_stream(
        &js,
        stream::Config {
            name: aging.stream_name(),
            subjects: vec![aging.subject_filter()],
            max_messages_per_subject: 1,
            max_age: Duration::from_secs(3600),
            allow_direct: true,
            ..Default::default()
        },
    )
    .await;
    match NatsLeaseStore::connect(&connection, aging.clone()).await {
        Err(e @ Error::BucketMismatch { .. }) => {
            let message = e.to_string();
            assert!(message.contains(aging.bucket()), "{message}");
            assert!(message.contains("expire"), "{message}");
        }
        other => panic!("expected BucketMismatch, got {other:?}"),
    }

    let kv_add = leases();
    let _guard2 = StreamGuard::new(&url, kv_add.stream_name());
    create_stream(
        &js,
        stream::Config {
            name: kv_add.stream_name(),
            subjects: vec![kv_add.subject_filter()],
            max_messages_per_subject: 5,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        },
    )
    .await;
    let store = connect_leases(&connection, kv_add).await;
    assert_eq!(store.info().name, LEASE_BACKEND);
    assert_eq!(store.info().memory, anarchon_core::Memory::UntilCollected);
    let run = RunKey::new(
        JobName::new("kv-add").unwrap(),
        Slot::from_millis(SystemClock.now().as_millis() + 600_000),
    );
    won(store
        .claim_lease(&lease_claim(run, Token::generate(), "a"))
        .await
        .unwrap());

    let bad = NatsLeaseOptions::new().with_bucket("a.b");
    assert!(matches!(
        NatsLeaseStore::connect(&connection, bad).await,
        Err(Error::InvalidBucketName { .. })
    ));
}

/// One batch, two jobs, one of them with a job document that cannot be
/// read. The sound job's claim is won and stands; the broken job's claim
/// gets its own error, naming the document.
#[tokio::test]
async fn one_jobs_unreadable_document_costs_its_batch_nothing() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let broken = job("broken-doc");
    let key = NatsLeaseStore::job_key(&broken);
    raw.plant(&key, "{not json".to_owned()).await;
    let slot = future_slot(&factory, 0);
    let batch = [
        lease_claim(RunKey::new(broken, slot), Token::generate(), "a"),
        lease_claim(RunKey::new(job("sound"), slot), Token::generate(), "a"),
    ];
    let answers = anarchon_testkit::fleet::answers_to_a_batch(&*store, &batch).await;
    let err = answers[0].as_ref().unwrap_err();
    assert!(
        err.to_string().contains(&key),
        "the document is named: {err}"
    );
    assert!(
        matches!(answers[1], Ok(ClaimOutcome::Won(_))),
        "the sound job's claim: {:?}",
        answers[1]
    );
    assert!(matches!(
        store.claim_lease(&batch[1]).await.unwrap(),
        ClaimOutcome::Won(_)
    ));
}

/// A job document whose fence counter someone set to its maximum: the
/// next win would get no new fence, so the claim is refused with an error
/// naming the counter, instead of handing two winners the same fence.
#[tokio::test]
async fn a_fence_counter_at_its_maximum_is_refused() {
    let factory = NatsLeaseFactory::new().await;
    let raw = Raw::open(&factory).await;
    let store = factory.instance().await;
    let planted = job("planted-fence");
    let key = NatsLeaseStore::job_key(&planted);
    raw.plant(&key, format!("{{\"fence\":{}}}", u64::MAX)).await;
    let run = RunKey::new(planted, future_slot(&factory, 0));
    let err = store
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .expect_err("no fence is left to hand out");
    assert!(err.to_string().contains("fence counter"), "{err}");
    assert_eq!(
        store.peek(&run).await.unwrap().state,
        anarchon_core::RunState::Absent,
        "nothing was won"
    );
}
