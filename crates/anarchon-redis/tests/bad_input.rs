//! Bad input: wrong credentials, ACL denials, keys of the wrong type,
//! corrupt records, bad prefixes and URLs. Every one is a clear error,
//! never a panic, and never shows a password.

#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anarchon_core::{
    ClaimOutcome, ClaimStore, LeaseStore, Overlap, PauseRequest, PauseScope, RunKey, RunOutcome,
    Slot, StoreError, StoreErrorKind, Token,
};
use anarchon_redis::{
    Error, EvictionFinding, KeyPrefix, RedisIdmpStore, RedisLeaseStore, RedisOptions,
    RedisScriptStore, RedisStreamIdStore,
};
use anarchon_testkit::StoreFactory;
use anarchon_testkit::claim::{claim_request, future_slot, job};
use anarchon_testkit::lease::lease_claim;
use anarchon_testkit::servers::unique_prefix;
use common::proxy::host_port;
use common::{Cleanup, LeaseFactory, ScriptFactory, StreamIdFactory, raw, within};
use deadpool_redis::redis::{self, AsyncCommands};

const BOUND: Duration = Duration::from_secs(15);

/// An ACL user made for one test and deleted when the test ends, pass or fail.
struct AclUser {
    admin_url: String,
    name: String,
    password: String,
}

impl AclUser {
    async fn create(admin_url: &str, rules: &[&str]) -> Self {
        let name = unique_prefix("anarchon-test-user-");
        let password = unique_prefix("sentinel-password-");
        let mut conn = raw(admin_url).await;
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(&name)
            .arg("reset")
            .arg("on")
            .arg(format!(">{password}"));
        for rule in rules {
            cmd.arg(*rule);
        }
        let _: () = cmd.query_async(&mut conn).await.unwrap();
        Self {
            admin_url: admin_url.to_owned(),
            name,
            password,
        }
    }

    fn url(&self, password: &str) -> String {
        format!(
            "redis://{}:{password}@{}",
            self.name,
            host_port(&self.admin_url)
        )
    }
}

impl Drop for AclUser {
    fn drop(&mut self) {
        let deleted = common::query_blocking::<i64>(
            &self.admin_url,
            redis::cmd("ACL").arg("DELUSER").arg(&self.name),
        );
        if let Err(e) = deleted {
            eprintln!("could not delete test ACL user {}: {e}", self.name);
        }
    }
}

/// Options for `url` under a fresh prefix, cleaned up through `admin_url`.
fn options(url: String, admin_url: &str) -> (RedisOptions, Cleanup) {
    let prefix = unique_prefix("bad");
    let opts = RedisOptions::new(url).with_prefix(&prefix).unwrap();
    (opts, Cleanup::new(admin_url, &prefix))
}

/// Connects each strategy and returns the errors.
async fn connect_all(opts: &RedisOptions) -> Vec<(&'static str, Error)> {
    type Connecting<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;
    let strategies: [(&'static str, Connecting<'_>); 4] = [
        (
            "lease",
            Box::pin(async { RedisLeaseStore::connect(opts).await.map(drop) }),
        ),
        (
            "stream-id",
            Box::pin(async { RedisStreamIdStore::connect(opts).await.map(drop) }),
        ),
        (
            "script",
            Box::pin(async {
                RedisScriptStore::connect(opts, RedisScriptStore::DEFAULT_WINDOW)
                    .await
                    .map(drop)
            }),
        ),
        (
            "idmp",
            Box::pin(async {
                RedisIdmpStore::connect(opts, RedisIdmpStore::DEFAULT_DURATION)
                    .await
                    .map(drop)
            }),
        ),
    ];
    let mut errors = Vec::new();
    for (strategy, connecting) in strategies {
        if let Err(e) = within(BOUND, &format!("{strategy} connect"), connecting).await {
            errors.push((strategy, e));
        }
    }
    errors
}

/// A lease store on a fresh prefix, a raw connection to its server to
/// plant broken keys under that prefix, and a slot ahead.
async fn a_store_to_plant_keys_under() -> (
    LeaseFactory,
    std::sync::Arc<RedisLeaseStore>,
    redis::aio::MultiplexedConnection,
    anarchon_core::Slot,
) {
    let factory = LeaseFactory::new().await;
    let store = factory.instance().await;
    let conn = raw(&factory.url).await;
    let slot = future_slot(&factory, 0);
    (factory, store, conn, slot)
}

/// The error a new claim of `run` by instance `a` gets from `store`.
async fn claim_refused(store: &(impl ClaimStore + ?Sized), run: &RunKey) -> StoreError {
    store
        .claim(&claim_request(run.clone(), Token::generate(), "a"))
        .await
        .unwrap_err()
}

/// The error a new lease claim of `run` by instance `a` gets from `store`.
async fn lease_claim_refused(store: &(impl LeaseStore + ?Sized), run: &RunKey) -> StoreError {
    store
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .unwrap_err()
}

/// `err` refuses `what` for a key of the wrong type, naming `key`.
fn wrong_type(what: &str, err: StoreError, key: &str) {
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{what}: {err}");
    let message = err.to_string();
    assert!(message.contains("wrong type"), "{what}: {message}");
    assert!(message.contains("WRONGTYPE"), "{what}: {message}");
    assert!(message.contains(key), "{what}: the key is named: {message}");
}

fn assert_secret_hidden(secret: &str, shown: &str) {
    assert!(!shown.contains(secret), "the password leaked into: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_named_and_never_shown() {
    let url = common::url().await;
    let user = AclUser::create(&url, &["~*", "+@all"]).await;
    let wrong = unique_prefix("sentinel-wrong-password-");
    let (opts, _cleanup) = options(user.url(&wrong), &url);
    assert_secret_hidden(&wrong, &format!("{opts:?}"));
    let errors = connect_all(&opts).await;
    assert_eq!(errors.len(), 4, "every strategy refuses to start");
    for (strategy, err) in errors {
        assert!(
            matches!(err, Error::AccessDenied { .. }),
            "{strategy}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("refused access"), "{strategy}: {message}");
        assert!(
            message.contains("WRONGPASS") || message.contains("password"),
            "{strategy}: the message names the problem: {message}"
        );
        assert_secret_hidden(&wrong, &message);
        assert_secret_hidden(&wrong, &format!("{err:?}"));
        let store_error = err.into_store_error("redis-test");
        assert_eq!(store_error.kind(), StoreErrorKind::Invalid);
        assert!(!store_error.is_temporary());
        assert_secret_hidden(&wrong, &store_error.to_string());
        assert_secret_hidden(&user.password, &store_error.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_denial_on_the_keys_is_named() {
    let url = common::url().await;
    let user = AclUser::create(&url, &["~elsewhere:*", "+@all"]).await;
    let (opts, _cleanup) = options(user.url(&user.password), &url);
    let run = RunKey::new(
        job("denied"),
        anarchon_core::Slot::from_millis(4_000_000_000_000),
    );
    let check = |strategy: &str, err: StoreError| {
        assert_eq!(err.kind(), StoreErrorKind::Invalid, "{strategy}: {err}");
        let message = err.to_string();
        assert!(message.contains("refused access"), "{strategy}: {message}");
        assert!(message.contains("NOPERM"), "{strategy}: {message}");
        assert_secret_hidden(&user.password, &message);
        assert_secret_hidden(&user.password, &format!("{err:?}"));
    };
    let lease = RedisLeaseStore::connect(&opts).await.unwrap();
    let err = lease_claim_refused(&lease, &run).await;
    check("lease", err);
    let err = lease.peek(&run).await.unwrap_err();
    check("lease peek", err);
    let sid = RedisStreamIdStore::connect(&opts).await.unwrap();
    let err = claim_refused(&sid, &run).await;
    check("stream-id", err);
    let script = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap();
    let err = claim_refused(&script, &run).await;
    check("script", err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_config_get_is_tolerated_and_a_refused_info_is_not() {
    let url = common::url().await;
    let mut admin = raw(&url).await;
    let policy = common::config_get(&mut admin, "maxmemory-policy").await;

    // Managed services often refuse CONFIG: the policy comes from INFO instead.
    let no_config = AclUser::create(&url, &["~*", "+@all", "-config"]).await;
    let (opts, _cleanup) = options(no_config.url(&no_config.password), &url);
    let store = RedisLeaseStore::connect(&opts).await.unwrap();
    assert_eq!(
        store.server().eviction,
        EvictionFinding::from_policy(&policy)
    );
    let run = RunKey::new(
        job("no-config"),
        anarchon_core::Slot::from_millis(4_000_000_000_000),
    );
    assert!(matches!(
        store
            .claim_lease(&lease_claim(run, Token::generate(), "a"))
            .await
            .unwrap(),
        anarchon_core::ClaimOutcome::Won(_)
    ));

    // Without INFO the store cannot know the server or notice a restart.
    let no_info = AclUser::create(&url, &["~*", "+@all", "-info"]).await;
    let (opts, _cleanup) = options(no_info.url(&no_info.password), &url);
    let err = RedisLeaseStore::connect(&opts).await.unwrap_err();
    assert!(matches!(err, Error::AccessDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("INFO"), "{err}");
}

/// The ACL rules `docs/backends/redis.md` gives for a dedicated user, with
/// the key patterns for prefix `{prefix}` (the `idmp` strategy also needs
/// `+xcfgset`, which servers before 8.6 do not know).
fn documented_rules(prefix: &str) -> Vec<String> {
    let mut rules = vec![
        format!("~{{{prefix}:*"),
        format!("~{{{prefix}}}:*"),
        format!("&{{{prefix}}}:*"),
    ];
    rules.extend(
        [
            "+info",
            "+config|get",
            "+script|load",
            "+evalsha",
            "+time",
            "+type",
            "+hget",
            "+hmget",
            "+hset",
            "+hdel",
            "+zadd",
            "+zrem",
            "+zrangebyscore",
            "+zrevrange",
            "+incr",
            "+get",
            "+set",
            "+publish",
            "+subscribe",
            "+del",
            "+sadd",
            "+srem",
            "+sscan",
            "+xadd",
            "+xrange",
            "+xrevrange",
            "+xinfo|stream",
            "+hgetall",
        ]
        .map(String::from),
    );
    rules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_are_enough() {
    let url = common::url().await;
    let prefix = unique_prefix("acl");
    let rules = documented_rules(&prefix);
    let user = AclUser::create(&url, &rules.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let _cleanup = Cleanup::new(&url, &prefix);
    let opts = RedisOptions::new(user.url(&user.password))
        .with_prefix(&prefix)
        .unwrap();
    let slot = anarchon_core::Slot::from_millis(4_000_000_000_000);
    let run = RunKey::new(job("acl"), slot);
    let lease = RedisLeaseStore::connect(&opts).await.unwrap();
    let token = Token::generate();
    assert!(matches!(
        lease
            .claim_lease(&lease_claim(run.clone(), token, "a"))
            .await
            .unwrap(),
        anarchon_core::ClaimOutcome::Won(_)
    ));
    lease
        .heartbeat(&run, token, Duration::from_secs(30))
        .await
        .unwrap();
    lease.release(&run, token).await.unwrap();
    lease.peek(&run).await.unwrap();
    lease.history(&run.job, 5).await.unwrap();
    lease
        .collect_garbage(Duration::from_secs(60))
        .await
        .unwrap();
    // The operator's pauses, and a claim of a paused job.
    for scope in [PauseScope::Job(run.job.clone()), PauseScope::All] {
        lease.pause(&scope, &PauseRequest::new()).await.unwrap();
    }
    assert_eq!(lease.pauses().await.unwrap().pauses.len(), 2);
    let paused = RunKey::new(
        run.job.clone(),
        anarchon_core::Slot::from_millis(4_000_000_001_000),
    );
    assert_eq!(
        lease
            .claim_lease(&lease_claim(paused, Token::generate(), "a"))
            .await
            .unwrap(),
        anarchon_core::ClaimOutcome::Done(anarchon_core::FinalState::Paused)
    );
    for scope in [PauseScope::Job(run.job.clone()), PauseScope::All] {
        assert!(lease.resume(&scope).await.unwrap());
    }
    let sid = RedisStreamIdStore::connect(&opts).await.unwrap();
    sid.claim(&claim_request(run.clone(), Token::generate(), "a"))
        .await
        .unwrap();
    let script = RedisScriptStore::connect(&opts, RedisScriptStore::DEFAULT_WINDOW)
        .await
        .unwrap();
    script
        .claim(&claim_request(run, Token::generate(), "a"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_the_wrong_type_are_clear_errors() {
    let (factory, store, mut conn, slot) = a_store_to_plant_keys_under().await;
    let p = &factory.prefix;

    // The run records: a string where the hash should be.
    let runs = format!("{{{p}:strings}}:runs");
    let _: () = conn.set(&runs, "not a hash").await.unwrap();
    let run = RunKey::new(job("strings"), slot);
    let err = lease_claim_refused(&*store, &run).await;
    wrong_type("claim", err, &runs);
    let err = store
        .heartbeat(&run, Token::generate(), Duration::from_secs(1))
        .await
        .unwrap_err();
    wrong_type("heartbeat", err, &runs);
    let err = store.peek(&run).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let err = store.history(&run.job, 5).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");

    // The live set: a list where a sorted set should be. Nothing is written.
    let live = format!("{{{p}:lists}}:live");
    let _: () = conn.rpush(&live, "x").await.unwrap();
    let run = RunKey::new(job("lists"), slot);
    let err = lease_claim_refused(&*store, &run).await;
    wrong_type("claim", err, &live);
    let written: bool = conn.exists(format!("{{{p}:lists}}:runs")).await.unwrap();
    assert!(!written, "a refused claim writes nothing");

    // A live set broken under a running run: its heartbeat and finish are
    // refused by name, and the record keeps its lease.
    let run = RunKey::new(job("broken-later"), slot);
    let token = Token::generate();
    let claimed = store
        .claim_lease(&lease_claim(run.clone(), token, "a"))
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Won(_)), "{claimed:?}");
    let before = store.peek(&run).await.unwrap().state;
    let live = format!("{{{p}:broken-later}}:live");
    let _: () = conn.del(&live).await.unwrap();
    let _: () = conn.rpush(&live, "x").await.unwrap();
    let err = store
        .heartbeat(&run, token, Duration::from_secs(60))
        .await
        .unwrap_err();
    wrong_type("heartbeat", err, &live);
    let err = store
        .finish(&run, token, RunOutcome::Succeeded)
        .await
        .unwrap_err();
    wrong_type("finish", err, &live);
    assert_eq!(store.peek(&run).await.unwrap().state, before, "unchanged");

    // The waiting set, read by a `buffer-one` claim of a slot that has not
    // run yet: refused by name, nothing written. (A claim under another
    // overlap rule never touches it.)
    let waiting = format!("{{{p}:hashes}}:waiting");
    let _: () = conn.hset(&waiting, "x", "y").await.unwrap();
    let run = RunKey::new(job("hashes"), slot);
    let mut buffered = lease_claim(run.clone(), Token::generate(), "a");
    buffered.overlap = Overlap::BufferOne;
    let err = store.claim_lease(&buffered).await.unwrap_err();
    wrong_type("claim", err, &waiting);
    let written: bool = conn.exists(format!("{{{p}:hashes}}:runs")).await.unwrap();
    assert!(!written, "a refused claim writes nothing");

    // The job's pause and the namespace's, read by every claim that could
    // start a slot: refused by name before anything is written.
    let pause = format!("{{{p}:paused}}:pause");
    let _: () = conn.set(&pause, "not a hash").await.unwrap();
    let run = RunKey::new(job("paused"), slot);
    let err = store
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "a"))
        .await
        .unwrap_err();
    wrong_type("claim of a job whose pause is broken", err, &pause);
    let err = store
        .pause(&PauseScope::Job(run.job.clone()), &PauseRequest::new())
        .await
        .unwrap_err();
    wrong_type("pause", err, &pause);
    let written: bool = conn.exists(format!("{{{p}:paused}}:runs")).await.unwrap();
    assert!(!written, "a refused claim writes nothing");
    let _: () = conn.del(&pause).await.unwrap();
    let pauses = format!("{{{p}}}:pauses");
    let _: () = conn.set(&pauses, "not a set").await.unwrap();
    let err = store
        .pause(&PauseScope::All, &PauseRequest::new())
        .await
        .unwrap_err();
    wrong_type("pause with a broken pause list", err, &pauses);
    let err = store.pauses().await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let _: () = conn.del(&pauses).await.unwrap();

    // A corrupt record is a protocol error naming the slot, not a panic.
    let corrupt = format!("{{{p}:corrupt}}:runs");
    let _: () = conn
        .hset(&corrupt, slot.as_millis(), "{not json")
        .await
        .unwrap();
    let run = RunKey::new(job("corrupt"), slot);
    let err = lease_claim_refused(&*store, &run).await;
    assert_eq!(err.kind(), StoreErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");

    // The job list, read by garbage collection and written by a first
    // claim. Only collection needs it: the claim stands (and is logged).
    let other = LeaseFactory::new().await;
    let other_store = other.instance().await;
    let _: () = conn
        .set(format!("{{{}}}:jobs", other.prefix), "not a set")
        .await
        .unwrap();
    let outcome = other_store
        .claim_lease(&lease_claim(
            RunKey::new(job("first"), slot),
            Token::generate(),
            "a",
        ))
        .await
        .unwrap();
    assert!(
        matches!(outcome, anarchon_core::ClaimOutcome::Won(_)),
        "a broken job list costs a claim nothing: {outcome:?}"
    );
    let err = other_store
        .collect_garbage(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");

    // The claim-only streams.
    let sid = StreamIdFactory::new().await;
    let key = format!("{{{}:sid}}:stream-id", sid.prefix);
    let _: () = conn.set(&key, "not a stream").await.unwrap();
    let err = claim_refused(&*sid.instance().await, &RunKey::new(job("sid"), slot)).await;
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let script = ScriptFactory::new().await;
    let key = format!("{{{}:script}}:script", script.prefix);
    let _: () = conn.hset(&key, "f", "v").await.unwrap();
    let err = claim_refused(&*script.instance().await, &RunKey::new(job("script"), slot)).await;
    wrong_type("script claim", err, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_prefixes_and_urls_are_refused_without_showing_the_password() {
    for bad in ["", "a{b}", "a b", "a*", &"p".repeat(65)] {
        let err = RedisOptions::new("redis://127.0.0.1")
            .with_prefix(bad)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidPrefix { .. }), "{bad:?}: {err}");
        assert!(KeyPrefix::new(bad).is_err());
    }
    let secret = unique_prefix("sentinel-url-password-");
    for url in [
        format!("redis://user:{secret}@127.0.0.1:notaport"),
        format!("nosuchscheme://user:{secret}@127.0.0.1:6379"),
    ] {
        let opts = RedisOptions::new(url);
        assert_secret_hidden(&secret, &format!("{opts:?}"));
        let err = within(BOUND, "connect", RedisLeaseStore::connect(&opts))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
        assert_secret_hidden(&secret, &err.to_string());
        assert_secret_hidden(&secret, &format!("{err:?}"));
    }
}

/// The keys a claim only writes (the fence, the slot list, the live set)
/// are not asked their type: their first write is, and Redis's refusal is
/// reported naming the key. They are written before the run's record, so a
/// refused claim leaves no record, and under `replace` the runs it would
/// have replaced go on as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_claim_only_writes_is_checked_by_its_first_write() {
    let (factory, store, mut conn, slot) = a_store_to_plant_keys_under().await;
    let p = &factory.prefix;
    let runs = |name: &str| format!("{{{p}:{name}}}:runs");
    // A claim of `name`'s slot under `overlap` is refused naming `key`, and
    // leaves no record.
    let checker = conn.clone();
    let refused_unwritten = async |name: &str, overlap: Overlap, key: &str| {
        let mut claim = lease_claim(RunKey::new(job(name), slot), Token::generate(), "a");
        claim.overlap = overlap;
        let err = store.claim_lease(&claim).await.unwrap_err();
        wrong_type(&format!("claim of {name} under {overlap:?}"), err, key);
        let mut conn = checker.clone();
        let written: bool = conn.exists(runs(name)).await.unwrap();
        assert!(!written, "{name}: a refused claim writes no record");
    };

    // The fence: a hash where the counter should be.
    let fence = format!("{{{p}:hash-fence}}:fence");
    let _: () = conn.hset(&fence, "x", "y").await.unwrap();
    refused_unwritten("hash-fence", Overlap::Allow, &fence).await;

    // The slot list: a list where the sorted set should be.
    let slots = format!("{{{p}:list-slots}}:slots");
    let _: () = conn.rpush(&slots, "x").await.unwrap();
    refused_unwritten("list-slots", Overlap::Allow, &slots).await;

    // The live set, read first by `skip` (is another run going?).
    let live = format!("{{{p}:skip-live}}:live");
    let _: () = conn.set(&live, "not a sorted set").await.unwrap();
    refused_unwritten("skip-live", Overlap::Skip, &live).await;

    // `replace` with the slot list broken after a run started: the new
    // claim is refused by name and the running run is not replaced.
    let first = RunKey::new(job("replacing"), slot);
    let won = store
        .claim_lease(&lease_claim(first.clone(), Token::generate(), "a"))
        .await
        .unwrap();
    assert!(matches!(won, ClaimOutcome::Won(_)), "{won:?}");
    // (Peek checks the slot list too, so the records are read directly.)
    let reader = conn.clone();
    let record = |slot: Slot| {
        let mut conn = reader.clone();
        let key = runs("replacing");
        async move {
            let raw: Option<String> = conn.hget(key, slot.as_millis()).await.unwrap();
            raw
        }
    };
    let before = record(slot).await.expect("the first run's record");
    assert!(before.contains(r#""state":"running""#), "{before}");
    let slots = format!("{{{p}:replacing}}:slots");
    let _: () = conn.del(&slots).await.unwrap();
    let _: () = conn.rpush(&slots, "x").await.unwrap();
    let mut replacing = lease_claim(
        RunKey::new(job("replacing"), Slot::from_millis(slot.as_millis() + 1000)),
        Token::generate(),
        "b",
    );
    replacing.overlap = Overlap::Replace;
    let err = store.claim_lease(&replacing).await.unwrap_err();
    wrong_type("claim under replace", err, &slots);
    assert_eq!(
        record(slot).await.as_deref(),
        Some(before.as_str()),
        "the running run was not replaced"
    );
    assert_eq!(
        record(replacing.run().slot).await,
        None,
        "the refused claim left no record"
    );
}

/// One batch, five jobs: one with a key of the wrong type, one whose fence
/// counter is not a number (Redis refuses the `INCR`), one whose pause
/// ends at a time that is not a number (the claim raises a Lua error
/// halfway, which the batch script must catch so that the claims after it
/// are still answered), one with a corrupt record, one sound. The sound
/// job's claim is won and stands; each broken job gets its own error,
/// naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_jobs_broken_keys_cost_its_batch_nothing() {
    let (factory, store, mut conn, slot) = a_store_to_plant_keys_under().await;
    let p = &factory.prefix;
    let _: () = conn
        .set(format!("{{{p}:wrong-type}}:live"), "not a sorted set")
        .await
        .unwrap();
    let _: () = conn
        .hset(
            format!("{{{p}:corrupt}}:runs"),
            slot.as_millis(),
            "{not json",
        )
        .await
        .unwrap();
    let _: () = conn
        .set(format!("{{{p}:bad-fence}}:fence"), "not a number")
        .await
        .unwrap();
    let _: () = conn
        .hset_multiple(
            format!("{{{p}:bad-pause}}:pause"),
            &[("since", "0"), ("until", "soon")],
        )
        .await
        .unwrap();
    let batch: Vec<_> = ["wrong-type", "bad-fence", "bad-pause", "sound", "corrupt"]
        .iter()
        .map(|name| lease_claim(RunKey::new(job(name), slot), Token::generate(), "a"))
        .collect();
    let answers = anarchon_testkit::fleet::answers_to_a_batch(&*store, &batch).await;
    let [wrong, bad_fence, bad_pause, sound, corrupt]: [_; 5] = answers.try_into().unwrap();
    let live = format!("{{{p}:wrong-type}}:live");
    wrong_type("claim in a batch", wrong.unwrap_err(), &live);
    let written: bool = conn
        .exists(format!("{{{p}:wrong-type}}:runs"))
        .await
        .unwrap();
    assert!(!written, "a refused claim writes no record");
    let err = bad_fence.unwrap_err();
    assert!(err.to_string().contains("not an integer"), "{err}");
    let err = bad_pause.unwrap_err();
    assert!(err.to_string().contains("compare"), "{err}");
    assert!(
        matches!(sound, Ok(anarchon_core::ClaimOutcome::Won(_))),
        "the sound job's claim: {sound:?}"
    );
    let err = corrupt.unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    // The win was written and is the claimer's: a retry is recognised.
    assert!(matches!(
        store.claim_lease(&batch[3]).await.unwrap(),
        anarchon_core::ClaimOutcome::Won(_)
    ));
}
