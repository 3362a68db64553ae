//! The `lease` strategy: a full lease store, each step one Lua script.

use anarchon_core::hand_over::{announced, news_of, run_in_news};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::retry::NOT_RETRIED;
use anarchon_core::time::millis;
use anarchon_core::{
    Attempt, ClaimAnswers, ClaimOutcome, Fence, HandOvers, InstanceId, JobName, LeaseClaim,
    LeaseStore, Listener, PastAttempts, Pause, PauseRequest, PauseScope, Pauses, RecordState,
    Renewal, RunKey, RunOutcome, RunRecord, RunRequest, RunRequests, RunState, RunView, Slot,
    StoreError, Timestamp, Token, TriggerRequest,
};
use async_trait::async_trait;
use deadpool_redis::redis::{self, Value};
use futures::StreamExt as _;

use crate::connection::{Call, Durable, Link, Lua, check, int, text};
use crate::error::Error;
use crate::keys::{LeaseKeys, hand_over_channel, jobs_key, pause_key};
use crate::options::{KeyPrefix, RedisOptions};
use crate::server::ServerInfo;
use crate::tls::{connection_info, seed_infos};

use self::finishes::{Finish, FinishGroup, Finishes};

mod finishes;
mod gc;
mod pauses;
mod requests;

const BACKEND: &str = "redis-lease";

/// A lease script: `lua/lease_prelude.lua` (the type check, `int`, the
/// store's `now`) followed by the script's own file.
macro_rules! lease_script {
    ($name:literal) => {
        Lua::new(
            $name,
            concat!(
                include_str!("../lua/lease_prelude.lua"),
                include_str!(concat!("../lua/", $name, ".lua"))
            ),
        )
    };
}

/// Claims, one or many in one script: `lua/lease_claim.lua` is the body of
/// a function that `lua/lease_claim_batch.lua` calls once per claim.
static CLAIM: Lua = Lua::new(
    "lease_claim",
    concat!(
        include_str!("../lua/lease_prelude.lua"),
        "local function claim(K, k, A, a, namespace_paused)\n",
        include_str!("../lua/lease_claim.lua"),
        "\nend\n",
        include_str!("../lua/lease_claim_batch.lua")
    ),
);
static STEP: Lua = lease_script!("lease_heartbeat");
/// Runner steps, one or many in one script: `lua/lease_heartbeat.lua` is the
/// body of a function that `lua/lease_step_batch.lua` calls once per step.
/// Finishes go through it.
static STEPS: Lua = Lua::new(
    "lease_step_batch",
    concat!(
        include_str!("../lua/lease_prelude.lua"),
        "local function step(KEYS, ARGV)\n",
        include_str!("../lua/lease_heartbeat.lua"),
        "\nend\n",
        include_str!("../lua/lease_step_batch.lua")
    ),
);
static READ: Lua = lease_script!("lease_read");
static GC: Lua = lease_script!("lease_gc");
static PAUSE: Lua = lease_script!("lease_pause");
static REQUEST: Lua = lease_script!("lease_request");
static SCRIPTS: [&Lua; 7] = [&CLAIM, &STEP, &STEPS, &READ, &GC, &PAUSE, &REQUEST];

/// The most claims one batch script carries. Redis runs nothing else while
/// a script runs, so a long batch is cut into scripts of this many (all
/// still sent in one round trip).
const CLAIMS_PER_SCRIPT: usize = 100;

/// The Redis `lease` strategy: a [`LeaseStore`].
///
/// Every step — claim, heartbeat, finish, release, peek, history — is one
/// Lua script run by EVALSHA, so it is atomic and uses Redis's clock
/// (`TIME`); [`claim_many`](LeaseStore::claim_many) sends all its claims in
/// one round trip. On a single Redis a batch's claims share one script call
/// (up to a hundred claims each, every claim answered on its own), so the
/// claims that lose in a fleet add one field read each, not an `EVALSHA`
/// and a `TIME`; on a Redis Cluster each claim is its own script. On a
/// single Redis, finishes that arrive while one is in flight go together
/// in the next script call the same way; on a cluster each finish is sent
/// alone, as it comes. The claim
/// follows the flowchart of [`MemoryStore`](anarchon_core::MemoryStore)
/// step by step.
///
/// Keys of job `j` under prefix `p` (all with the hash tag `{p:j}`):
/// `{p:j}:runs` (hash: slot → run record), `{p:j}:slots` (sorted set of
/// recorded slots), `{p:j}:live` (sorted set of live slots: running ones
/// by lease end, failed ones whose retry is pending by its due time; the
/// overlap check reads only live runs), `{p:j}:waiting` (sorted set of
/// the slots recorded `waiting` by `Overlap::BufferOne`, by the end of
/// their wait), `{p:j}:fence` (the fence counter, never deleted),
/// `{p:j}:pause` (the job's pause). `{p}:jobs`
/// lists the jobs for [`collect_garbage`](LeaseStore::collect_garbage);
/// `{p}:pause` holds the pause of every job and `{p}:pauses` lists the
/// scopes that have a pause.
///
/// # Pauses
///
/// [`pause`](LeaseStore::pause) and [`resume`](LeaseStore::resume) are one
/// script each, on Redis's clock: a pause's start and end are Redis times,
/// and an end that is not after Redis's now is refused with nothing
/// written. The claim script reads the job's pause and the namespace's in
/// the same atomic step as the run's record (two `HMGET`s), so a claim that
/// runs after a pause was written never starts a slot it covers. On a
/// Redis Cluster (`cluster=true`) the namespace's pause lies in another hash
/// slot: it is read one round trip before the claim script, which gets it
/// as arguments, so a claim can race a namespace-wide pause by that round
/// trip (a job's own pause still holds exactly).
///
/// Records are kept until [`collect_garbage`](LeaseStore::collect_garbage)
/// removes them, which the scheduler calls with its history retention.
///
/// # Cancel safety
///
/// Each call is one script, which Redis runs whole or not at all. If the
/// future is dropped after sending, the step may have happened; sending the
/// same claim again (same token) answers `Won` for the caller's own claim.
/// On a single Redis a finish is sent by the store's own task (finishes
/// that arrive together go in one script), so a finish whose future is
/// dropped may still be recorded, even if it had not been sent yet; sent
/// again with the same token and end, it gets the same answer.
pub struct RedisLeaseStore {
    link: Arc<Link>,
    /// Finishes: those that arrive together share one script call.
    /// Finishes, on a single Redis: those that arrive together share one
    /// script call. `None` on a cluster, where each finish goes alone.
    finishes: Option<Arc<Finishes>>,
    prefix: KeyPrefix,
    /// Jobs known to be in `{p}:jobs`, for the connection generation.
    registered: Mutex<(u64, HashSet<JobName>)>,
    /// Per job, the longest late window the store is known to hold (a
    /// claim carrying it was answered), for the connection generation. A
    /// claim with a longer one asks its script to raise the job's window
    /// first (see `lua/lease_claim.lua`), so that even a claim that
    /// writes nothing keeps the job's runs from collection.
    windows: Mutex<(u64, HashMap<JobName, Duration>)>,
    /// Hand-overs heard: this handle's own, and (through a subscription to
    /// `{p}:hand-over`) those of every other store on the prefix.
    hand_overs: Arc<HandOvers>,
    _listener: Listener,
}

/// Listens on `channel` for hand-over news on one connection until it is
/// lost.
async fn listen(
    client: redis::Client,
    channel: String,
    board: Arc<HandOvers>,
) -> redis::RedisResult<()> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(&channel).await?;
    // Subscribed again after a loss: what was sent meanwhile is lost.
    board.reconnected();
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        if let Some(run) = run_in_news(&String::from_utf8_lossy(message.get_payload_bytes())) {
            board.announce(&run);
        }
    }
    Ok(())
}

impl fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field("prefix", &self.prefix)
            .field("server", &self.link.server().describe())
            .finish_non_exhaustive()
    }
}

fn store_err(e: Error) -> StoreError {
    e.into_store_error(BACKEND)
}

impl RedisLeaseStore {
    /// Connects, checks the server (eviction policy, persistence) and loads
    /// the scripts.
    ///
    /// # Errors
    ///
    /// [`Error`]: unreachable, access denied, a bad URL, or an
    /// eviction policy the options refuse.
    pub async fn connect(opts: &RedisOptions) -> Result<Self, Error> {
        let link = Arc::new(Link::connect(opts, BACKEND, &SCRIPTS).await?);
        // On a cluster the runs of different jobs lie on different nodes:
        // a group would wait for its slowest node, and a script there
        // carries one finish anyway.
        let finishes = (!link.is_cluster())
            .then(|| Finishes::new(FinishGroup::new(link.clone(), opts.prefix.clone())));
        // On a cluster, a `PUBLISH` on any node reaches the subscribers of
        // every node: the subscription takes the seeds in turn, the next one
        // each time it is lost (its node may be the one that failed).
        let infos = if opts.cluster {
            seed_infos(opts)?
        } else {
            vec![connection_info(opts)?]
        };
        let clients = infos
            .into_iter()
            .map(redis::Client::open)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::protocol("opening the hand-over subscription", e.to_string()))?;
        let hand_overs = Arc::new(HandOvers::new());
        let listener = {
            let (channel, board) = (hand_over_channel(&opts.prefix), hand_overs.clone());
            let turn = std::sync::atomic::AtomicUsize::new(0);
            Listener::reconnecting("the hand-over subscription", move || {
                let next = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let client = clients[next % clients.len()].clone();
                listen(client, channel.clone(), board.clone())
            })
        };
        // Hand out the store once it hears news (or a second has passed).
        if !hand_overs.listening(Duration::from_secs(1)).await {
            tracing::debug!(
                backend = BACKEND,
                "the hand-over subscription is not up yet; news before it is missed"
            );
        }
        Ok(Self {
            link,
            finishes,
            prefix: opts.prefix.clone(),
            registered: Mutex::new((0, HashSet::new())),
            windows: Mutex::new((0, HashMap::new())),
            hand_overs,
            _listener: listener,
        })
    }

    /// Tells the backups of every store on the prefix (this one at once)
    /// that `run` was handed over: one `PUBLISH`. Best effort: a backup that
    /// misses it reads the run when the lease would have ended.
    async fn announce_hand_over(&self, run: &RunKey) {
        self.hand_overs.announce(run);
        let mut pipe = redis::pipe();
        pipe.cmd("PUBLISH")
            .arg(hand_over_channel(&self.prefix))
            .arg(news_of(run));
        let sent = self.link.query(&pipe, "announcing a hand-over").await;
        if let Err(error) = sent.and_then(|replies| {
            replies
                .into_iter()
                .try_for_each(|r| check(r, "announcing a hand-over").map(drop))
        }) {
            tracing::debug!(backend = BACKEND, %error, %run, "could not announce a hand-over; backups learn of it at their next read");
        }
    }

    /// The server as the store found it at start-up.
    pub fn server(&self) -> &ServerInfo {
        self.link.server()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// How many times the store found a different server `run_id` on a new
    /// connection (a restart or a failover: see the crate docs).
    pub fn server_changes(&self) -> u64 {
        self.link.server_changes()
    }

    /// Reads the server's `run_id` now; `true` (and a loud log) if it
    /// changed since the store last looked.
    ///
    /// # Errors
    ///
    /// [`Error`] if Redis cannot be read.
    pub async fn check_server(&self) -> Result<bool, Error> {
        self.link.check_server().await
    }

    /// The claim's seven keys and three arguments in a batch (see
    /// `lua/lease_claim.lua`), appended to `keys` and `args`: the slot, the
    /// token, and the claim's terms in one argument, which a losing claim
    /// never reads (each argument costs Redis the same to pass, read or
    /// not) unless they begin with `+`: `widen`, the job's stored window
    /// may be shorter than this claim's `max_late`, so the script raises
    /// it first.
    fn push_claim(
        &self,
        req: &LeaseClaim,
        widen: bool,
        keys: &mut Vec<String>,
        args: &mut Vec<String>,
    ) {
        let run = req.run();
        let job = LeaseKeys::new(&self.prefix, &run.job);
        // Typed as arrays of the lengths the script expects, so that a key
        // or an argument added here and not there does not compile.
        let claim_keys: [String; CLAIM_KEYS] = [
            job.runs,
            job.slots,
            job.live,
            job.fence,
            job.window,
            job.pause,
            job.waiting,
        ];
        keys.extend(claim_keys);
        let claim_args: [String; CLAIM_ARGS] = [
            run.slot.as_millis().to_string(),
            req.claim.token.to_string(),
            format!(
                "{}{} {} {} {} {} {}",
                if widen { "+" } else { "" },
                millis(req.claim.max_late),
                millis(req.lease),
                req.max_attempts.get(),
                u8::from(req.rerun_paused),
                req.overlap.as_str(),
                req.claim.instance.as_str(),
            ),
        ];
        args.extend(claim_args);
    }

    /// Cluster mode: the namespace's pause (since, until; `""` for what it
    /// does not have), read with one `HMGET` before a batch of claims.
    async fn namespace_pause(&self, during: &'static str) -> Result<(String, String), Error> {
        let key = pause_key(&self.prefix, &PauseScope::All);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("HMGET").arg(&key).arg("since").arg("until");
        let reply = self.link.query_one(&pipe, during).await?;
        let Value::Array(fields) = reply else {
            return Err(Error::protocol(during, "HMGET did not answer an array"));
        };
        let field = |i: usize| fields.get(i).and_then(text).unwrap_or_default();
        Ok((field(0), field(1)))
    }

    /// An SADD of the jobs not yet in `{p}:jobs` on this connection.
    fn registration<'a>(
        &self,
        jobs: impl Iterator<Item = &'a JobName>,
    ) -> (u64, Vec<JobName>, Vec<redis::Cmd>) {
        let generation = self.link.generation();
        let mut registered = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        if registered.0 != generation {
            *registered = (generation, HashSet::new());
        }
        let mut seen = HashSet::new();
        let new: Vec<JobName> = jobs
            .filter(|job| !registered.1.contains(*job) && seen.insert(*job))
            .cloned()
            .collect();
        let mut prelude = Vec::new();
        if !new.is_empty() {
            let mut sadd = redis::cmd("SADD");
            sadd.arg(jobs_key(&self.prefix));
            for job in &new {
                sadd.arg(job.as_str());
            }
            prelude.push(sadd);
        }
        (generation, new, prelude)
    }

    /// For each claim, whether its `max_late` is longer than the window
    /// this handle knows the store holds for its job.
    fn windows_to_widen(&self, generation: u64, reqs: &[LeaseClaim]) -> Vec<bool> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.0 != generation {
            *windows = (generation, HashMap::new());
        }
        reqs.iter()
            .map(|req| {
                windows
                    .1
                    .get(&req.run().job)
                    .is_none_or(|known| req.claim.max_late > *known)
            })
            .collect()
    }

    /// Notes the windows the store took: those of the claims that asked to
    /// widen and were answered.
    fn widened<T>(
        &self,
        generation: u64,
        reqs: &[LeaseClaim],
        widen: &[bool],
        answers: &[Result<T, Error>],
    ) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.0 != generation {
            return;
        }
        for ((req, widen), answer) in reqs.iter().zip(widen).zip(answers) {
            if *widen && answer.is_ok() {
                let known = windows.1.entry(req.run().job.clone()).or_default();
                *known = (*known).max(req.claim.max_late);
            }
        }
    }

    fn registered(&self, generation: u64, jobs: Vec<JobName>) {
        let mut registered = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        if registered.0 == generation {
            registered.1.extend(jobs);
        }
    }

    /// Sends the claims in one round trip. Each claim's answer is its own:
    /// a script error in one job's keys, or a failed registration in
    /// `{p}:jobs`, costs no other claim its answer.
    async fn claims(&self, reqs: &[LeaseClaim]) -> Result<Vec<Result<ClaimOutcome, Error>>, Error> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let during = "claiming";
        let (generation, new, prelude) = self.registration(reqs.iter().map(|r| &r.run().job));
        let widen = self.windows_to_widen(generation, reqs);
        let namespace_pause = if self.link.is_cluster() {
            Some(self.namespace_pause(during).await?)
        } else {
            None
        };
        // On a single Redis every key lies on the one server, so a batch is
        // one script per `CLAIMS_PER_SCRIPT` claims; on a cluster each claim
        // is a script of its own, sent to the node of its job's hash slot.
        let per_script = match namespace_pause {
            Some(_) => 1,
            None => CLAIMS_PER_SCRIPT,
        };
        let calls: Vec<Call> = reqs
            .chunks(per_script)
            .zip(widen.chunks(per_script))
            .map(|(chunk, widen)| self.batch_call(chunk, widen, namespace_pause.as_ref()))
            .collect();
        let (registration, replies) = self
            .link
            .eval_with_prelude(&prelude, &calls, Durable::Yes, during)
            .await?;
        match registration.and_then(|replies| {
            replies
                .into_iter()
                .try_for_each(|r| check(r, during).map(drop))
        }) {
            // Registered jobs are not sent again on this connection.
            Ok(()) => self.registered(generation, new),
            // Only garbage collection reads the list: the claims stand, and
            // the registration is tried again with the next claim.
            Err(error) => tracing::warn!(
                backend = BACKEND,
                key = %jobs_key(&self.prefix),
                "could not add jobs to the job list, so garbage collection does not see them yet: {error}"
            ),
        }
        let answers: Vec<Result<ClaimOutcome, Error>> = replies
            .into_iter()
            .zip(reqs.chunks(per_script))
            .flat_map(|(reply, chunk)| match reply {
                Ok(reply) => unbatch_claims(reply, chunk.len()),
                // A cluster node's calls failed: its claims answer the error.
                Err(error) => error
                    .for_each_of(chunk.len())
                    .into_iter()
                    .map(Err)
                    .collect(),
            })
            .collect();
        self.widened(generation, reqs, &widen, &answers);
        Ok(answers)
    }

    /// One script for the claims of `chunk` (see `lua/lease_claim_batch.lua`):
    /// the namespace's pause (its key, or on a cluster its reading), then
    /// each claim's keys and arguments.
    fn batch_call(
        &self,
        chunk: &[LeaseClaim],
        widen: &[bool],
        namespace_pause: Option<&(String, String)>,
    ) -> Call {
        let mut batch = Call {
            lua: &CLAIM,
            keys: Vec::with_capacity(1 + chunk.len() * CLAIM_KEYS),
            args: Vec::with_capacity(3 + chunk.len() * CLAIM_ARGS),
        };
        // The namespace's pause has the tag `{p}`: in Redis Cluster it lies
        // in another hash slot than the job's keys, so there the script gets
        // it as arguments, read just before, and the first key names the
        // pause of the script's one job instead (a key in the job's slot,
        // not read for this).
        match (namespace_pause, chunk.first()) {
            (Some((since, until)), Some(req)) => {
                batch
                    .keys
                    .push(LeaseKeys::new(&self.prefix, &req.run().job).pause);
                batch
                    .args
                    .extend(["given".to_owned(), since.clone(), until.clone()]);
            }
            _ => {
                batch.keys.push(pause_key(&self.prefix, &PauseScope::All));
                batch
                    .args
                    .extend(["read".to_owned(), String::new(), String::new()]);
            }
        }
        for (req, widen) in chunk.iter().zip(widen) {
            self.push_claim(req, *widen, &mut batch.keys, &mut batch.args);
        }
        batch
    }

    /// One heartbeat, release or finish step.
    async fn step(
        &self,
        run: &RunKey,
        token: Token,
        step: &str,
        extra: Vec<String>,
        during: &'static str,
    ) -> Result<Renewal, StoreError> {
        let keys = LeaseKeys::new(&self.prefix, &run.job);
        let mut args = vec![
            run.slot.as_millis().to_string(),
            token.to_string(),
            step.to_owned(),
        ];
        args.extend(extra);
        let call = Call {
            lua: &STEP,
            keys: vec![keys.runs, keys.live],
            args,
        };
        let reply = self
            .link
            .eval_one(call, Durable::Yes, during)
            .await
            .map_err(store_err)?;
        match reply.first().and_then(int) {
            Some(1) => Ok(Renewal::Renewed),
            Some(0) => Ok(Renewal::Fenced),
            _ => Err(store_err(Error::protocol(
                during,
                "the step answered neither 1 nor 0",
            ))),
        }
    }

    /// Runs one script and returns its answer as an array.
    async fn one(&self, call: Call, during: &'static str) -> Result<Vec<Value>, StoreError> {
        self.link
            .eval_one(call, Durable::No, during)
            .await
            .map_err(store_err)
    }

    async fn read(
        &self,
        job: &JobName,
        args: Vec<String>,
        during: &'static str,
    ) -> Result<(Timestamp, Vec<Vec<Value>>), StoreError> {
        let keys = LeaseKeys::new(&self.prefix, job);
        let call = Call {
            lua: &READ,
            keys: vec![keys.runs, keys.slots],
            args,
        };
        let mut items = self.one(call, during).await?.into_iter();
        let now = items
            .next()
            .as_ref()
            .and_then(int)
            .map(Timestamp::from_millis)
            .ok_or_else(|| store_err(Error::protocol(during, "no clock reading")))?;
        let records = items
            .map(|v| match v {
                Value::Array(fields) if fields.len() == RECORD_FIELDS => Ok(fields),
                other => Err(store_err(Error::protocol(
                    during,
                    format!("a record is not {RECORD_FIELDS} fields: {other:?}"),
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((now, records))
    }

    /// The job names in `{p}:jobs`, the set each job's first claim through
    /// a handle adds it to.
    async fn indexed_jobs(&self) -> Result<Vec<JobName>, Error> {
        let key = jobs_key(&self.prefix);
        let members = self.members(&key, "listing jobs").await?;
        let mut jobs = Vec::with_capacity(members.len());
        for member in members {
            match JobName::new(&member) {
                Ok(job) => jobs.push(job),
                Err(_) => tracing::warn!(
                    backend = BACKEND,
                    key = %key,
                    "ignoring a member of the job list that is not a job name: {member:?}"
                ),
            }
        }
        Ok(jobs)
    }

    /// The members of the set `key`, by SSCAN (text members only).
    async fn members(&self, key: &str, during: &'static str) -> Result<Vec<String>, Error> {
        let mut cursor = "0".to_owned();
        let mut out = Vec::new();
        loop {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            pipe.cmd("SSCAN")
                .arg(key)
                .arg(&cursor)
                .arg("COUNT")
                .arg(500);
            let Value::Array(mut parts) = self.link.query_one(&pipe, during).await? else {
                return Err(Error::protocol(during, "SSCAN is not an array"));
            };
            let members = match parts.pop() {
                Some(Value::Array(m)) | Some(Value::Set(m)) => m,
                _ => return Err(Error::protocol(during, "SSCAN has no members")),
            };
            for member in &members {
                match text(member) {
                    Some(member) => out.push(member),
                    None => tracing::warn!(
                        backend = BACKEND,
                        key = %key,
                        "ignoring a member of a set that is not text: {member:?}"
                    ),
                }
            }
            cursor = parts
                .first()
                .and_then(text)
                .ok_or_else(|| Error::protocol(during, "SSCAN has no cursor"))?;
            if cursor == "0" {
                return Ok(out);
            }
        }
    }
}

/// The store's clock in a script's answer.
fn clock_of(item: Option<&Value>, during: &'static str) -> Result<Timestamp, StoreError> {
    item.and_then(int)
        .map(Timestamp::from_millis)
        .ok_or_else(|| store_err(Error::protocol(during, "no clock reading")))
}

/// How a batch script lays its answer out: `head` values that every call
/// of the batch shares (a claim script's clock), then `per_call` values
/// for each call, call after call.
#[derive(Clone, Copy)]
struct Layout {
    head: usize,
    per_call: usize,
}

/// The answers to the `n` calls (claims, steps) of one batch script, each
/// read by `parse` from the answer's head and its own values; or, if the
/// script as a whole was refused (say, a Redis too busy to run it) or
/// answered out of its layout, that error for each call.
fn unbatch<T>(
    reply: Value,
    n: usize,
    layout: Layout,
    what: &str,
    during: &'static str,
    parse: impl Fn(&[Value], &[Value]) -> Result<T, Error>,
) -> Vec<Result<T, Error>> {
    match reply {
        Value::Array(items) if items.len() == layout.head + n * layout.per_call => {
            let (head, calls) = items.split_at(layout.head);
            calls
                .chunks(layout.per_call)
                .map(|call| parse(head, call))
                .collect()
        }
        Value::ServerError(refused) => (0..n)
            .map(|_| Err(Error::from_redis(during, refused.clone().into())))
            .collect(),
        _ => (0..n)
            .map(|_| {
                Err(Error::protocol(
                    during,
                    format!(
                        "a batch of {n} {what} was not answered with {} values and {} for each",
                        layout.head, layout.per_call
                    ),
                ))
            })
            .collect(),
    }
}

/// How a claim script answers (see `lua/lease_claim_batch.lua`): the
/// store's clock, then six values per claim: kind, attempt, fence,
/// lease_until, state, earlier.
const CLAIM_ANSWER: Layout = Layout {
    head: 1,
    per_call: 6,
};

/// How a batch of runner steps answers (see `lua/lease_step_batch.lua`):
/// one reply per step.
const STEP_ANSWER: Layout = Layout {
    head: 0,
    per_call: 1,
};

/// Keys and arguments each claim of a batch script takes, after the
/// batch's own one key and three arguments; `lua/lease_claim_batch.lua`
/// says the same (`KEYS_PER_CLAIM`, `ARGS_PER_CLAIM`), and refuses a batch
/// that does not add up.
const CLAIM_KEYS: usize = 7;
const CLAIM_ARGS: usize = 3;

/// The answers to the `n` claims of one claim script ([`CLAIM_ANSWER`]),
/// each read with [`parse_claim`] at the script's clock.
fn unbatch_claims(reply: Value, n: usize) -> Vec<Result<ClaimOutcome, Error>> {
    let during = "claiming";
    unbatch(reply, n, CLAIM_ANSWER, "claims", during, |head, fields| {
        let now = head.first().and_then(int).ok_or_else(|| {
            Error::protocol(during, "a batch of claims answered no clock reading")
        })?;
        parse_claim(fields, Timestamp::from_millis(now))
    })
}

/// One claim's answer: its six values ([`CLAIM_ANSWER`]), read at
/// `store_now`.
fn parse_claim(fields: &[Value], store_now: Timestamp) -> Result<ClaimOutcome, Error> {
    let during = "claiming";
    let bad = |what: &str| Error::protocol(during, format!("claim answer: {what}"));
    let [kind, attempt, fence, lease_until, state, earlier] = fields else {
        return Err(bad("not 6 values"));
    };
    let kind = text(&check(kind.clone(), during)?).ok_or_else(|| bad("no kind"))?;
    let number = |v: &Value| int(v).ok_or_else(|| bad("not a number"));
    Ok(match kind.as_str() {
        "won" => {
            let attempt = u32::try_from(number(attempt)?)
                .ok()
                .and_then(Attempt::new)
                .ok_or_else(|| bad("attempt"))?;
            let fence = Fence::new(u64::try_from(number(fence)?).map_err(|_| bad("fence"))?);
            // The run's past attempts tell how this attempt came to run.
            let earlier = text(earlier).ok_or_else(|| bad("no past attempts"))?;
            let past = PastAttempts::decode(&earlier).map_err(|e| bad(&e.to_string()))?;
            ClaimOutcome::Won(past.win(attempt, Some(fence)))
        }
        "running" => ClaimOutcome::Running {
            lease_until: Timestamp::from_millis(number(lease_until)?),
            store_now,
        },
        "done" => {
            let state = text(state).ok_or_else(|| bad("no state"))?;
            match RecordState::parse(&state) {
                Some(RecordState::Finished(f)) => ClaimOutcome::Done(f),
                _ => return Err(bad("done with a state that is not final")),
            }
        }
        "late" => ClaimOutcome::Late,
        "missed" => ClaimOutcome::Missed,
        "interrupted" => ClaimOutcome::Interrupted,
        "overlap" => ClaimOutcome::Overlap,
        other => return Err(bad(&format!("unknown kind {other:?}"))),
    })
}

/// How many fields a record from `lease_read.lua` has.
const RECORD_FIELDS: usize = 12;

/// A record from `lease_read.lua`: slot, state, attempt, fence, instance,
/// started, finished, lease, has_error, error, retry_at, earlier.
fn parse_record(job: &JobName, fields: &[Value]) -> Result<RunRecord, Error> {
    let during = "reading history";
    let bad = |what: &str| Error::protocol(during, format!("run record: {what}"));
    let field = |i: usize| text(&fields[i]).unwrap_or_default();
    let opt_int = |i: usize| -> Result<Option<i64>, Error> {
        let t = field(i);
        if t.is_empty() {
            Ok(None)
        } else {
            t.parse().map(Some).map_err(|_| bad("not a number"))
        }
    };
    let slot = opt_int(0)?.ok_or_else(|| bad("no slot"))?;
    let state =
        RecordState::parse(&field(1)).ok_or_else(|| bad(&format!("state {:?}", field(1))))?;
    let attempt = match opt_int(2)? {
        Some(n) => Some(
            u32::try_from(n)
                .ok()
                .and_then(Attempt::new)
                .ok_or_else(|| bad("attempt"))?,
        ),
        None => None,
    };
    let fence = match opt_int(3)? {
        Some(n) => Some(Fence::new(u64::try_from(n).map_err(|_| bad("fence"))?)),
        None => None,
    };
    let instance = Some(field(4))
        .filter(|s| !s.is_empty())
        .and_then(|s| InstanceId::new(&s).ok());
    Ok(RunRecord {
        run: RunKey::new(job.clone(), Slot::from_millis(slot)),
        state,
        attempt,
        fence,
        instance,
        started_at: opt_int(5)?.map(Timestamp::from_millis),
        finished_at: opt_int(6)?.map(Timestamp::from_millis),
        lease_until: opt_int(7)?.map(Timestamp::from_millis),
        error: (field(8) == "1").then(|| field(9)),
        retry_at: opt_int(10)?.map(Timestamp::from_millis),
        earlier: PastAttempts::decode(&field(11)).map_err(|e| bad(&e.to_string()))?,
    })
}

anarchon_core::claims_through_leases!(RedisLeaseStore, BACKEND);

#[async_trait]
impl LeaseStore for RedisLeaseStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let mut outcomes = self
            .claims(std::slice::from_ref(req))
            .await
            .map_err(store_err)?;
        outcomes
            .pop()
            .ok_or_else(|| Error::protocol("claiming", "no answer"))
            .and_then(|answer| answer)
            .map_err(store_err)
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        Ok(self
            .claims(reqs)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|answer| answer.map_err(store_err))
            .collect())
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        let during = "peeking";
        let (store_now, records) = self
            .read(
                &run.job,
                vec!["peek".to_owned(), run.slot.as_millis().to_string()],
                during,
            )
            .await?;
        let state = match records.first() {
            None => RunState::Absent,
            Some(fields) => {
                let rec = parse_record(&run.job, fields).map_err(store_err)?;
                RunState::of_record(
                    rec.state,
                    rec.attempt,
                    rec.lease_until,
                    rec.retry_at,
                    store_now,
                )
            }
        };
        Ok(RunView { store_now, state })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.step(
            run,
            token,
            "renew",
            vec![millis(lease).to_string()],
            "renewing a lease",
        )
        .await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        // The script turns a retry's wait into a due time on Redis's clock.
        let (after, before) = match &outcome {
            RunOutcome::Failed {
                retry: Some(plan), ..
            } => (
                millis(plan.after).to_string(),
                plan.before.as_millis().to_string(),
            ),
            _ => (String::new(), String::new()),
        };
        let (state, error) = outcome.into_record();
        let extra = vec![
            state.as_str().to_owned(),
            if error.is_some() { "1" } else { "0" }.to_owned(),
            error.unwrap_or_default(),
            after,
            before,
            NOT_RETRIED.to_owned(),
        ];
        let Some(finishes) = &self.finishes else {
            return self
                .step(run, token, "finish", extra, "finishing a run")
                .await;
        };
        let mut args = vec![
            run.slot.as_millis().to_string(),
            token.to_string(),
            "finish".to_owned(),
        ];
        args.extend(extra);
        let finish = Finish {
            run: run.clone(),
            args,
        };
        finishes.call(finish).await.unwrap_or_else(|unanswered| {
            Err(unanswered.store_error(BACKEND, &format!("finishing {run}")))
        })
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .step(run, token, "release", Vec::new(), "releasing a lease")
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .step(run, token, "give_back", Vec::new(), "giving a run back")
            .await?;
        Ok(announced(answer, self.announce_hand_over(run)).await)
    }

    fn hand_overs(&self) -> &HandOvers {
        &self.hand_overs
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The last rank to read; beyond a billion runs, read them all.
        let last = if limit > 1_000_000_000 {
            "-1".to_owned()
        } else {
            (limit - 1).to_string()
        };
        let (_, records) = self
            .read(job, vec!["history".to_owned(), last], "reading history")
            .await?;
        records
            .iter()
            .map(|fields| parse_record(job, fields).map_err(store_err))
            .collect()
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.collect_now(keep).await
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        self.pause_now(scope, req).await
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        self.resume_now(scope).await
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        let mut jobs = self
            .indexed_jobs()
            .await
            .map_err(|e| e.into_store_error(BACKEND))?;
        jobs.sort();
        Ok(jobs)
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.pauses_now().await
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.write_request(req).await
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.read_requests().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anarchon_core::{AttemptCause, AttemptEnd, FinalState, PastAttempt};

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn won(attempt: i64, earlier: &str) -> Vec<Value> {
        vec![
            bulk("won"),
            Value::Int(attempt),
            Value::Int(7),
            Value::Int(1000),
            bulk("running"),
            bulk(earlier),
        ]
    }

    const NOW: Timestamp = Timestamp::from_millis(900);

    #[test]
    fn claim_answers_parse() {
        let first = parse_claim(&won(1, ""), NOW).expect("won");
        assert_eq!(
            first,
            ClaimOutcome::Won(anarchon_core::Win::first(Some(Fence::new(7))))
        );
        // A retry: the past attempts as the script's cjson writes them.
        let retried =
            r#"[{"attempt":1,"ended":"failed","at":800,"instance":"inst-1","error":"boom"}]"#;
        let ClaimOutcome::Won(win) = parse_claim(&won(2, retried), NOW).expect("won") else {
            panic!("not won");
        };
        assert_eq!(
            (win.attempt, win.fence, win.cause, win.retries),
            (
                Attempt::FIRST.next(),
                Some(Fence::new(7)),
                AttemptCause::Retry,
                1
            )
        );
        let ClaimOutcome::Won(win) = parse_claim(&won(2, "{}"), NOW).expect("won") else {
            panic!("not won");
        };
        assert_eq!((win.cause, win.retries), (AttemptCause::Takeover, 0));
        assert!(
            parse_claim(&won(2, "[1]"), NOW).is_err(),
            "no past attempts"
        );
        let running = [
            bulk("running"),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1500),
            bulk("failed"),
            bulk(""),
        ];
        assert_eq!(
            parse_claim(&running, NOW).expect("running"),
            ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(1500),
                store_now: NOW,
            }
        );
        let done = [
            bulk("done"),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            bulk("interrupted"),
            bulk(""),
        ];
        assert_eq!(
            parse_claim(&done, NOW).expect("done"),
            ClaimOutcome::Done(FinalState::Interrupted)
        );
        let recorded = |kind: &str| {
            [
                bulk(kind),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                bulk(""),
                bulk(""),
            ]
        };
        assert_eq!(
            parse_claim(&recorded("interrupted"), NOW).expect("interrupted"),
            ClaimOutcome::Interrupted
        );
        assert_eq!(
            parse_claim(&recorded("missed"), NOW).expect("missed"),
            ClaimOutcome::Missed
        );
        assert_eq!(
            parse_claim(&recorded("late"), NOW).expect("late"),
            ClaimOutcome::Late
        );
        assert!(parse_claim(&[Value::Int(1)], NOW).is_err());
    }

    #[test]
    fn the_claim_script_counts_the_keys_and_arguments_we_send_per_claim() {
        let script = include_str!("../lua/lease_claim_batch.lua");
        let counts = format!("local KEYS_PER_CLAIM, ARGS_PER_CLAIM = {CLAIM_KEYS}, {CLAIM_ARGS}\n");
        assert!(script.contains(&counts), "{counts:?} is not in the script");
    }

    #[test]
    fn a_batch_answer_is_the_clock_then_six_values_per_claim() {
        let mut reply = vec![Value::Int(900)];
        reply.extend(won(1, ""));
        // The second claim failed alone: an error for its kind.
        reply.extend([
            redis::parse_redis_value(b"-WRONGTYPE anarchon: key k holds the wrong type\r\n")
                .expect("an error reply"),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            bulk(""),
            bulk(""),
        ]);
        reply.extend(recorded_running());
        let answers = unbatch_claims(Value::Array(reply.clone()), 3);
        assert_eq!(answers.len(), 3);
        assert!(
            matches!(answers[0], Ok(ClaimOutcome::Won(_))),
            "{:?}",
            answers[0]
        );
        let error = answers[1].as_ref().expect_err("the failed claim");
        assert!(error.to_string().contains("WRONGTYPE"), "{error}");
        assert_eq!(
            answers[2].as_ref().expect("running"),
            &ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(1500),
                store_now: NOW,
            }
        );
        // A reply of the wrong length answers every claim with an error.
        let short = unbatch_claims(Value::Array(reply[..reply.len() - 1].to_vec()), 3);
        assert!(short.iter().all(Result::is_err), "{short:?}");
        // So does a reply with no clock reading.
        reply[0] = bulk("noon");
        let clockless = unbatch_claims(Value::Array(reply), 3);
        assert!(clockless.iter().all(Result::is_err), "{clockless:?}");
    }

    fn recorded_running() -> [Value; 6] {
        [
            bulk("running"),
            Value::Int(1),
            Value::Int(7),
            Value::Int(1500),
            bulk("running"),
            bulk(""),
        ]
    }

    #[test]
    fn records_parse() {
        let job = JobName::new("j").expect("job");
        let earlier = r#"[{"attempt":1,"ended":"taken-over","at":3000,"instance":"inst-0"}]"#;
        let fields: Vec<Value> = [
            "5000", "failed", "2", "9", "inst-1", "1000", "6000", "4000", "1", "boom", "9000",
            earlier,
        ]
        .iter()
        .map(|s| bulk(s))
        .collect();
        let rec = parse_record(&job, &fields).expect("record");
        assert_eq!(rec.state, RecordState::Finished(FinalState::Failed));
        assert_eq!(rec.attempt, Attempt::new(2));
        assert_eq!(rec.fence, Some(Fence::new(9)));
        assert_eq!(rec.error.as_deref(), Some("boom"));
        assert_eq!(rec.retry_at, Some(Timestamp::from_millis(9000)));
        assert_eq!(
            rec.earlier.iter().cloned().collect::<Vec<_>>(),
            vec![PastAttempt {
                attempt: Attempt::FIRST,
                ended: AttemptEnd::TakenOver,
                at: Some(Timestamp::from_millis(3000)),
                instance: InstanceId::new("inst-0").ok(),
                error: None,
            }]
        );
        let missed: Vec<Value> = [
            "5000", "missed", "", "", "", "", "6000", "", "0", "", "", "",
        ]
        .iter()
        .map(|s| bulk(s))
        .collect();
        let rec = parse_record(&job, &missed).expect("missed");
        assert_eq!(rec.state, RecordState::Missed);
        assert_eq!((rec.attempt, rec.instance, rec.error), (None, None, None));
        assert_eq!(rec.finished_at, Some(Timestamp::from_millis(6000)));
        assert_eq!((rec.retry_at, rec.earlier), (None, PastAttempts::NONE));
    }
}
