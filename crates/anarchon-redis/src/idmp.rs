//! The `idmp` strategy: idempotent XADD (Redis 8.6+).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{ClaimOutcome, ClaimRequest, Clock, JobName, Memory};
use deadpool_redis::redis::{self, Value};

use crate::MIN_MEMORY;
use crate::connection::{Call, Durable, Link, Lua, check, int, text};
use crate::error::Error;
use crate::keys::job_key;
use crate::options::{KeyPrefix, RedisOptions};
use crate::server::{ServerInfo, Version};
use crate::stream_id::answer_from_entry;

const BACKEND: &str = "redis-idmp";

static SETUP: Lua = Lua::new("idmp_setup", include_str!("../lua/idmp_setup.lua"));
static SCRIPTS: [&Lua; 1] = [&SETUP];

/// The first Redis with `XADD ... IDMP`.
pub const IDMP_MIN_VERSION: Version = Version::new(8, 6, 0);

/// The Redis `idmp` strategy (Redis 8.6+): claim-only, remembers a claim
/// for its IDMP duration.
///
/// A claim is `XADD {p:job}:idmp IDMP <job> <slot> * slot .. token ..`:
/// every instance is the same producer (the job's name) sending the same
/// message id (the slot), so Redis stores the first and answers every
/// repeat with the first entry's ID. The store then reads that entry
/// (`XRANGE`) and compares tokens. Two round trips per claim.
///
/// Before the first claim of a job, a script creates the job's stream and
/// sets its `IDMP-DURATION` (the `duration` given here) and `IDMP-MAXSIZE`
/// (10,000, the most Redis allows) in one step. It never reconfigures an
/// existing stream — `XCFGSET` clears the stream's idempotency memory, which
/// could let a slot be claimed twice — and refuses one configured shorter
/// or smaller than asked.
///
/// Redis keeps at most IDMP-MAXSIZE ids per producer, so a job is
/// remembered for `duration` or its last 10,000 slots, whichever is
/// shorter: a job firing more often than every `duration / 10000` forgets
/// sooner than [`ClaimStore::info`](anarchon_core::ClaimStore::info) says.
///
/// The constructor reads the server version and refuses anything older
/// than Redis 8.6 (and Valkey), naming the `script` strategy, which gives
/// the same claim everywhere.
pub struct RedisIdmpStore {
    link: Link,
    prefix: KeyPrefix,
    duration: Duration,
    /// Jobs whose stream is known to be set up, for the connection generation.
    ready: Mutex<(u64, HashSet<JobName>)>,
    lost_entries: AtomicU64,
    /// Where the trimming horizon reads "now" ([`RedisOptions::with_clock`]).
    clock: Arc<dyn Clock>,
}

impl RedisIdmpStore {
    /// The duration [`RedisIdmpStore::connect`] callers usually want:
    /// 10 minutes, enough for `max_late` up to 9 min 50 s.
    pub const DEFAULT_DURATION: Duration = Duration::from_secs(600);
    /// The longest IDMP duration Redis accepts: one day.
    pub const MAX_DURATION: Duration = Duration::from_secs(86_400);
    /// IDMP-MAXSIZE: how many slots per job Redis remembers at most.
    pub const MAX_SIZE: u32 = 10_000;

    /// Connects, checks that the server is Redis 8.6 or newer, checks the
    /// eviction policy and loads the set-up script. Claims are remembered
    /// for `duration`: whole seconds, from [`MIN_MEMORY`] to one day.
    ///
    /// # Errors
    ///
    /// [`Error::ServerTooOld`] on Redis before 8.6 and on Valkey
    /// (use [`RedisScriptStore`](crate::RedisScriptStore));
    /// [`Error::InvalidOption`] for a duration out of range;
    /// otherwise as [`crate::RedisLeaseStore::connect`].
    pub async fn connect(opts: &RedisOptions, duration: Duration) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidOption {
            strategy: "idmp",
            option: "duration",
            reason,
        };
        if duration.subsec_nanos() != 0 {
            return Err(invalid(format!(
                "{duration:?} is not whole seconds (Redis keeps IDMP ids for whole seconds)"
            )));
        }
        if duration < MIN_MEMORY || duration > Self::MAX_DURATION {
            return Err(invalid(format!(
                "{duration:?} is outside {MIN_MEMORY:?} ..= {:?}: the duration must outlast max_late plus the clock-skew margin, and Redis accepts at most one day",
                Self::MAX_DURATION
            )));
        }
        let link = Link::connect(opts, BACKEND, &SCRIPTS).await?;
        let server = link.server();
        if server.product != "Redis" || server.version < IDMP_MIN_VERSION {
            return Err(Error::ServerTooOld {
                strategy: "idmp",
                needs: "Redis 8.6 or newer (XADD ... IDMP)",
                found: server.describe(),
            });
        }
        Ok(Self {
            link,
            prefix: opts.prefix.clone(),
            clock: opts.clock.clone(),
            duration,
            ready: Mutex::new((0, HashSet::new())),
            lost_entries: AtomicU64::new(0),
        })
    }

    /// The server as the store found it at start-up.
    pub fn server(&self) -> &ServerInfo {
        self.link.server()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// How long a claim is remembered (IDMP-DURATION).
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How many times the store found a different server `run_id` on a new
    /// connection.
    pub fn server_changes(&self) -> u64 {
        self.link.server_changes()
    }

    /// Creates and configures the job's stream unless this connection
    /// already did.
    async fn set_up(&self, job: &JobName, key: &str) -> Result<(), Error> {
        let generation = self.link.generation();
        {
            let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            if ready.0 == generation && ready.1.contains(job) {
                return Ok(());
            }
        }
        let during = "setting up an idmp stream";
        let call = Call {
            lua: &SETUP,
            keys: vec![key.to_owned()],
            args: vec![
                self.duration.as_secs().to_string(),
                Self::MAX_SIZE.to_string(),
            ],
        };
        let items = self.link.eval_one(call, Durable::No, during).await?;
        let duration = items.get(1).and_then(int).unwrap_or(-1);
        let maxsize = items.get(2).and_then(int).unwrap_or(-1);
        let want_duration = self.duration.as_secs();
        let want_maxsize = u64::from(Self::MAX_SIZE);
        if u64::try_from(duration).is_ok_and(|d| d >= want_duration)
            && u64::try_from(maxsize).is_ok_and(|m| m >= want_maxsize)
        {
            let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            if ready.0 != generation {
                *ready = (generation, HashSet::new());
            }
            ready.1.insert(job.clone());
            Ok(())
        } else {
            Err(Error::IdmpConfig {
                key: key.to_owned(),
                found_duration_s: duration,
                found_maxsize: maxsize,
                want_duration_s: want_duration,
                want_maxsize,
            })
        }
    }

    fn forget_set_up(&self, job: &JobName) {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .remove(job);
    }

    async fn try_claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        let during = "claiming";
        let key = job_key(&self.prefix, &req.run.job, "idmp");
        let slot = req.run.slot.as_millis().to_string();
        // Entries far older than the IDMP memory can go; never one that an
        // id Redis still remembers could point to.
        let keep_ms = (2 * self.duration.as_millis() + 3_600_000) as i64;
        let now_ms = self.clock.now().as_millis();
        let mut id = None;
        for _ in 0..2 {
            self.set_up(&req.run.job, &key).await?;
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let xadd = pipe
                .cmd("XADD")
                .arg(&key)
                .arg("NOMKSTREAM")
                .arg("IDMP")
                .arg(req.run.job.as_str())
                .arg(&slot);
            if now_ms > keep_ms {
                xadd.arg("MINID").arg("~").arg(now_ms - keep_ms);
            }
            xadd.arg("*")
                .arg("slot")
                .arg(&slot)
                .arg("token")
                .arg(req.token.to_string())
                .arg("instance")
                .arg(req.instance.as_str());
            match self.link.query_one(&pipe, during).await? {
                // NOMKSTREAM: the stream is gone (deleted by hand); set it up again.
                Value::Nil => self.forget_set_up(&req.run.job),
                other => {
                    id = Some(
                        text(&other)
                            .ok_or_else(|| Error::protocol(during, "XADD did not answer an ID"))?,
                    );
                    break;
                }
            }
        }
        let id = id.ok_or_else(|| {
            Error::protocol(during, "the idmp stream vanished twice while claiming")
        })?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("XRANGE").arg(&key).arg(&id).arg(&id);
        // With `WAIT` when the options ask for it: it covers the XADD sent
        // before on the same connection, to the same node.
        let range = self
            .link
            .query_durable(&pipe, during)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::protocol(during, "no answer"))?;
        Ok(match answer_from_entry(check(range, during)?, req.token) {
            Some(answer) => answer,
            None => {
                self.lost_entries.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(
                    backend = BACKEND,
                    job = %req.run.job,
                    slot = %req.run.slot,
                    entry = %id,
                    "the first claim's entry is gone (trimmed or deleted); treating the claim as lost"
                );
                ClaimOutcome::Lost
            }
        })
    }
}

crate::connection::claim_only_store!(
    RedisIdmpStore,
    |store| Memory::Window(store.duration),
    duration
);
