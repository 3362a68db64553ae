//! The connection to Redis every strategy shares: start-up checks, one
//! multiplexed connection (or one cluster connection), scripts by EVALSHA
//! with reload on NOSCRIPT, an optional `WAIT` after write steps, and
//! noticing when the server changed under us.
//!
//! **One server.** Each store owns a deadpool-redis pool. The pool opens
//! (and, after a failure, reopens) connections with the configured
//! timeouts; the store keeps the one it got and sends every call over it,
//! concurrently, as redis-rs multiplexes requests on one connection.
//! Checking a connection out of the pool for each call would cost a PING
//! round trip per claim. A batch of calls is one pipeline: one round trip.
//!
//! **Redis Cluster** (`cluster=true`). The store holds one redis-rs
//! cluster connection: a multiplexed connection per node, the slot map,
//! and the redirections (`MOVED`, `ASK`) and slot-map refreshes that follow
//! a failover. A pipeline goes to one node, so a batch of calls is split by
//! the hash slot of each call's first key (every key of a call shares its
//! slot: see [`crate::keys`]); each slot's calls are one pipeline, the
//! pipelines go out concurrently, and the answers come back in the
//! caller's order. Scripts are loaded on every node at start-up, replicas
//! included, so a promoted replica usually has them; a node that answers
//! NOSCRIPT anyway (restarted, flushed) gets the call again as `EVAL` with
//! the script's source, which runs it and caches it on that node, in one
//! round trip to the same node.
//!
//! **`WAIT`** ([`RedisOptions::wait_for_replicas`]). A durable call's
//! pipeline ends with `WAIT n timeout`; on a cluster each slot's pipeline
//! does, so the `WAIT` runs on the master that ran the scripts. Fewer than
//! `n` acknowledgements fail the call with [`Error::NotReplicated`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster::ClusterClientBuilder;
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, Slot,
};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, Script, ServerErrorKind, Value,
};
use deadpool_redis::{Connection, Manager, Pool, PoolError, Runtime};

use crate::cluster::ClusterLink;
use crate::error::Error;
use crate::options::{EvictionCheck, RedisOptions, ReplicaWait};
use crate::server::{EvictionFinding, ServerInfo, info_field, parse_server};
use crate::tls::{connection_info, secret_of, seed_infos};
use anarchon_core::url::redact;

/// How often a cluster store counts a new connection generation, so the
/// lease strategy sends its job list again: a failover may have lost it.
const CLUSTER_GENERATION: Duration = Duration::from_secs(300);

/// How many times one call loads its scripts again after NOSCRIPT before
/// it gives up (each time in the same round trip as the resend).
const MAX_RELOADS: usize = 3;

/// A Lua script of the crate, compiled into the binary.
pub(crate) struct Lua {
    name: &'static str,
    source: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    pub(crate) const fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            script: OnceLock::new(),
        }
    }

    fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.source))
    }

    fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// One script call: EVALSHA with keys and arguments.
pub(crate) struct Call {
    pub(crate) lua: &'static Lua,
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

impl Call {
    fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.lua.script().get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// The call with the script's source: runs it and caches it on the node.
    fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.lua.source)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// The hash slot of the call's keys (its first key's; a call without
    /// keys goes with slot 0's).
    fn slot(&self) -> Slot {
        Slot::for_key(self.keys.first().map_or("", String::as_str))
    }
}

/// Whether a write step waits for replicas ([`RedisOptions::wait_for_replicas`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durable {
    /// A read, or a step that decides nothing: no `WAIT`.
    No,
    /// A claim or a lease step: `WAIT` when the options ask for it.
    Yes,
}

/// How a store reaches Redis.
enum Conn {
    /// One server: the pool, and the connection in use with its generation.
    Single {
        pool: Pool,
        current: Mutex<Option<(u64, Connection)>>,
        reconnecting: tokio::sync::Mutex<()>,
    },
    /// A Redis Cluster: one cluster connection, which follows the cluster
    /// on its own, replaced if it stalls.
    Cluster(Box<ClusterLink>),
}

/// The connection a store owns: pool, connection in use, scripts, server facts.
pub(crate) struct Link {
    backend: &'static str,
    conn: Conn,
    generation: AtomicU64,
    scripts: &'static [&'static Lua],
    server: ServerInfo,
    run_id: Mutex<String>,
    server_changes: AtomicU64,
    connect_timeout: Duration,
    wait: Option<ReplicaWait>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A text reply.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

/// An integer reply (or a text reply holding one).
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// A server error inside a reply, as the crate's error.
pub(crate) fn check(v: Value, during: &'static str) -> Result<Value, Error> {
    v.extract_error().map_err(|e| Error::from_redis(during, e))
}

fn is_noscript(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => {
            e.kind() == Some(ServerErrorKind::NoScript) || e.code() == "NOSCRIPT"
        }
        _ => false,
    }
}

impl Link {
    /// Connects, reads what the server is, loads `scripts`, and checks the
    /// eviction policy as `opts` says. One round trip after the connection
    /// (on a cluster: one to every node).
    pub(crate) async fn connect(
        opts: &RedisOptions,
        backend: &'static str,
        scripts: &'static [&'static Lua],
    ) -> Result<Self, Error> {
        if let Some(wait) = opts.wait {
            if wait.replicas == 0 || wait.timeout.is_zero() {
                return Err(Error::InvalidSetting {
                    setting: "wait_for_replicas",
                    reason: format!(
                        "{} replicas within {:?}: ask for at least one replica and a timeout above zero (WAIT with timeout 0 would block forever)",
                        wait.replicas, wait.timeout
                    ),
                });
            }
            if wait.timeout >= opts.response_timeout {
                return Err(Error::InvalidSetting {
                    setting: "wait_for_replicas",
                    reason: format!(
                        "the WAIT timeout {:?} must be shorter than the response timeout {:?}, or the client gives up before Redis answers: lower wait_timeout_ms or raise timeout_ms",
                        wait.timeout, opts.response_timeout
                    ),
                });
            }
        }
        if opts.cluster {
            return Self::connect_cluster(opts, backend, scripts).await;
        }
        if !opts.seeds.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "seed",
                reason: "seed nodes name more nodes of a Redis Cluster: turn cluster mode on (cluster=true, RedisOptions::with_cluster), or remove them".to_owned(),
            });
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.response_timeout));
        let info = connection_info(opts)?;
        let manager = Manager::new_with_config(info, config).map_err(|e| {
            let mut reason = e.to_string();
            if secret_of(&opts.url).is_some_and(|s| reason.contains(s)) {
                reason = e.category().to_owned();
            }
            Error::InvalidUrl {
                reason: format!("{reason} (got {})", redact(&opts.url)),
            }
        })?;
        let pool = Pool::builder(manager)
            .max_size(1)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(opts.connect_timeout))
            .create_timeout(Some(opts.connect_timeout))
            .recycle_timeout(Some(opts.response_timeout))
            .build()
            .map_err(|e| Error::protocol("building the connection pool", e.to_string()))?;

        let during = "starting up";
        let obj = checkout(&pool, opts.connect_timeout, during).await?;
        let mut conn: MultiplexedConnection = (*obj).clone();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("INFO");
        pipe.cmd("CONFIG").arg("GET").arg("maxmemory-policy");
        for lua in scripts {
            pipe.add_command(lua.load_cmd());
        }
        let mut replies = query(&mut conn, &pipe, during).await?.into_iter();
        let (Some(info), Some(policy)) = (replies.next(), replies.next()) else {
            return Err(Error::protocol(during, "too few answers"));
        };
        for (lua, reply) in scripts.iter().zip(replies) {
            check(reply, "loading the scripts").map_err(|e| match e {
                Error::Server { detail, .. } => Error::Server {
                    during: "loading the scripts",
                    detail: format!("script {}: {detail}", lua.name),
                    source: None,
                },
                other => other,
            })?;
        }
        let info = text(&check(info, "reading INFO")?)
            .ok_or_else(|| Error::protocol("reading INFO", "INFO is not text"))?;
        let (product, version, run_id) = parse_server(&info).ok_or_else(|| {
            Error::protocol(
                "reading INFO",
                "INFO has no redis_version or run_id: is this a Redis or Valkey server?",
            )
        })?;
        let eviction = match check(policy, "reading maxmemory-policy") {
            Ok(v) => config_value(&v)
                .map(|p| EvictionFinding::from_policy(&p))
                .or_else(|| info_field(&info, "maxmemory_policy").map(EvictionFinding::from_policy))
                .unwrap_or_else(|| EvictionFinding::Unknown {
                    reason: "CONFIG GET maxmemory-policy answered nothing".into(),
                }),
            Err(refused) => match info_field(&info, "maxmemory_policy") {
                Some(p) => EvictionFinding::from_policy(p),
                None => EvictionFinding::Unknown {
                    reason: refused.to_string(),
                },
            },
        };
        let aof_enabled = info_field(&info, "aof_enabled").map(|v| v == "1");
        let server = ServerInfo {
            product,
            version,
            run_id: run_id.clone(),
            eviction,
            aof_enabled,
        };
        if info_field(&info, "cluster_enabled") == Some("1") {
            return Err(Error::InvalidSetting {
                setting: "cluster",
                reason: format!(
                    "{} is a node of a Redis Cluster, and the store was not told so: add cluster=true to the URL (RedisOptions::with_cluster(true)), or each job's keys could go to a node that does not own them",
                    opts.server()
                ),
            });
        }
        judge_server(&server, opts, backend)?;
        Ok(Self {
            backend,
            conn: Conn::Single {
                pool,
                current: Mutex::new(Some((1, obj))),
                reconnecting: tokio::sync::Mutex::new(()),
            },
            generation: AtomicU64::new(1),
            scripts,
            server,
            run_id: Mutex::new(run_id),
            server_changes: AtomicU64::new(0),
            connect_timeout: opts.connect_timeout,
            wait: opts.wait,
        })
    }

    /// [`Link::connect`] for a Redis Cluster: a cluster connection from the
    /// seeds, `INFO` from every master, the scripts loaded on every node.
    async fn connect_cluster(
        opts: &RedisOptions,
        backend: &'static str,
        scripts: &'static [&'static Lua],
    ) -> Result<Self, Error> {
        let during = "connecting to the Redis Cluster";
        let seeds = seed_infos(opts)?;
        let host = opts.server();
        let host = host.rsplit_once('/').map_or(host.as_str(), |(h, _)| h);
        let seed_names: Vec<String> = std::iter::once(host.to_owned())
            .chain(opts.seeds.iter().cloned())
            .collect();
        #[allow(unused_mut)]
        let mut builder = ClusterClientBuilder::new(seeds)
            .connection_timeout(opts.connect_timeout)
            .response_timeout(opts.response_timeout);
        #[cfg(feature = "tls")]
        if let Some(certificates) = crate::tls::cluster_certificates(opts)? {
            builder = builder.certs(certificates);
        }
        let scrub = |e: &redis::RedisError| {
            let reason = e.to_string();
            if secret_of(&opts.url).is_some_and(|s| reason.contains(s)) {
                e.category().to_owned()
            } else {
                reason
            }
        };
        let client = builder.build().map_err(|e| Error::InvalidUrl {
            reason: format!("{} (got {})", scrub(&e), redact(&opts.url)),
        })?;
        // Each seed is tried in turn with the connect timeout.
        let bound = opts.connect_timeout * u32::try_from(seed_names.len()).unwrap_or(1)
            + Duration::from_secs(1);
        let conn = match tokio::time::timeout(bound, client.get_async_connection()).await {
            Err(_) => {
                return Err(Error::Unavailable {
                    during,
                    cause: format!(
                        "no seed node ({}) answered within {bound:?}",
                        seed_names.join(", ")
                    ),
                    source: None,
                });
            }
            Ok(Err(e)) => {
                let shown = scrub(&e);
                if shown.contains("cluster support disabled") {
                    return Err(not_a_cluster(opts));
                }
                // A refused certificate: the same hint as on one server. The
                // cluster client keeps only the text of the seeds' errors.
                #[cfg(feature = "tls")]
                if let Some(detail) = crate::tls::handshake_failure(&e)
                    .or_else(|| crate::tls::handshake_failure_in_text(&shown))
                {
                    let source = (shown == e.to_string()).then_some(e);
                    return Err(Error::Tls {
                        during,
                        detail,
                        source,
                    });
                }
                // The cluster client reports a refused password inside an
                // I/O error ("Failed to create initial connections").
                if ["AuthenticationFailed", "WRONGPASS", "NOAUTH", "NOPERM"]
                    .iter()
                    .any(|code| shown.contains(code))
                {
                    return Err(Error::AccessDenied {
                        during,
                        detail: shown,
                    });
                }
                return Err(match Error::from_redis(during, e) {
                    Error::Unavailable { cause, source, .. } => Error::Unavailable {
                        during,
                        cause: format!(
                            "no seed node ({}) gave the cluster's slots: {}",
                            seed_names.join(", "),
                            if secret_of(&opts.url).is_some_and(|s| cause.contains(s)) {
                                "the client's error shows the password, so it is left out"
                            } else {
                                &cause
                            }
                        ),
                        source,
                    },
                    other => other,
                });
            }
            Ok(Ok(conn)) => conn,
        };
        let mut conn_for_start = conn.clone();
        let infos = masters_info(&mut conn_for_start, "reading INFO").await?;
        let Some((_, first)) = infos.first() else {
            return Err(Error::protocol("reading INFO", "the cluster has no master"));
        };
        let (product, version, _) = parse_server(first).ok_or_else(|| {
            Error::protocol(
                "reading INFO",
                "INFO has no redis_version or run_id: is this a Redis or Valkey server?",
            )
        })?;
        if info_field(first, "cluster_enabled") != Some("1") {
            return Err(not_a_cluster(opts));
        }
        // The most dangerous policy of any master decides.
        let eviction = infos
            .iter()
            .map(|(_, info)| match info_field(info, "maxmemory_policy") {
                Some(p) => EvictionFinding::from_policy(p),
                None => EvictionFinding::Unknown {
                    reason: "INFO has no maxmemory_policy".into(),
                },
            })
            .max_by_key(eviction_rank)
            .unwrap_or(EvictionFinding::NoEviction);
        let aof_enabled = Some(
            infos
                .iter()
                .all(|(_, info)| info_field(info, "aof_enabled") == Some("1")),
        );
        let run_id = cluster_fingerprint(&infos);
        let server = ServerInfo {
            product,
            version,
            run_id: run_id.clone(),
            eviction,
            aof_enabled,
        };
        load_everywhere(&mut conn_for_start, scripts).await?;
        judge_server(&server, opts, backend)?;
        Ok(Self {
            backend,
            conn: Conn::Cluster(Box::new(ClusterLink::new(
                conn,
                client,
                bound,
                opts.response_timeout,
            ))),
            generation: AtomicU64::new(1),
            scripts,
            server,
            run_id: Mutex::new(run_id),
            server_changes: AtomicU64::new(0),
            connect_timeout: opts.connect_timeout,
            wait: opts.wait,
        })
    }

    /// Whether the store talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// The server as found at start-up.
    pub(crate) fn server(&self) -> &ServerInfo {
        &self.server
    }

    /// How many times a new connection found another server `run_id`.
    pub(crate) fn server_changes(&self) -> u64 {
        self.server_changes.load(Ordering::SeqCst)
    }

    /// The generation of the connection in use: it grows at each reconnect.
    ///
    /// A cluster connection never reconnects as a whole; its generation
    /// grows when the store sees the masters change and every
    /// [`CLUSTER_GENERATION`], so what the lease strategy sends once per
    /// connection (its job list) is sent again after a failover lost it.
    pub(crate) fn generation(&self) -> u64 {
        match &self.conn {
            Conn::Single { .. } => self.generation.load(Ordering::SeqCst),
            Conn::Cluster(cluster) => {
                let periods = cluster.since.elapsed().as_secs() / CLUSTER_GENERATION.as_secs();
                1 + self.server_changes() + cluster.replaced() + periods
            }
        }
    }

    /// The connection in use, or a new one.
    async fn conn(
        &self,
        pool: &Pool,
        current: &Mutex<Option<(u64, Connection)>>,
        reconnecting: &tokio::sync::Mutex<()>,
    ) -> Result<(u64, MultiplexedConnection), Error> {
        if let Some(found) = cached(current) {
            return Ok(found);
        }
        let _one_at_a_time = reconnecting.lock().await;
        if let Some(found) = cached(current) {
            return Ok(found);
        }
        let during = "reconnecting";
        let obj = checkout(pool, self.connect_timeout, during).await?;
        let mut conn: MultiplexedConnection = (*obj).clone();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("INFO").arg("server");
        for lua in self.scripts {
            pipe.add_command(lua.load_cmd());
        }
        let mut replies = query(&mut conn, &pipe, during).await?.into_iter();
        let info = replies
            .next()
            .map(|v| check(v, during))
            .transpose()?
            .as_ref()
            .and_then(text)
            .unwrap_or_default();
        for reply in replies {
            check(reply, "loading the scripts")?;
        }
        if let Some((_, _, run_id)) = parse_server(&info) {
            self.observe_run_id(run_id);
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *lock(current) = Some((generation, obj));
        Ok((generation, conn))
    }

    /// Forgets the connection of `generation` after a connection-level error,
    /// so the next call opens a new one.
    fn broken(current: &Mutex<Option<(u64, Connection)>>, generation: u64) {
        let mut current = lock(current);
        if current.as_ref().is_some_and(|(g, _)| *g == generation)
            && let Some((_, obj)) = current.take()
        {
            // Out of the pool for good: it is not recycled.
            drop(Connection::take(obj));
        }
    }

    /// Compares the server's `run_id` with the last one seen.
    fn observe_run_id(&self, run_id: String) {
        let mut last = lock(&self.run_id);
        if *last != run_id {
            self.server_changes.fetch_add(1, Ordering::SeqCst);
            tracing::error!(
                backend = self.backend,
                previous_run_id = %last,
                run_id = %run_id,
                "REDIS CHANGED UNDER THE STORE: the server restarted or a replica took over. \
                 Without AOF persistence a restart forgets every claimed run, and a failover can \
                 lose the last claims: runs may be claimed and run a second time. \
                 See docs/backends/redis.md (persistence)."
            );
            *last = run_id;
        }
    }

    /// Sends `pipe` (no scripts in it) and returns the answers, server
    /// errors in place. On a cluster every keyed command of `pipe` must
    /// lie in one hash slot (a pipeline without keys goes to any node).
    pub(crate) async fn query(
        &self,
        pipe: &Pipeline,
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        match &self.conn {
            Conn::Single {
                pool,
                current,
                reconnecting,
            } => {
                let (generation, mut conn) = self.conn(pool, current, reconnecting).await?;
                query(&mut conn, pipe, during).await.inspect_err(|e| {
                    if e.is_temporary() {
                        Self::broken(current, generation);
                    }
                })
            }
            Conn::Cluster(cluster) => {
                let result = query(&mut cluster.conn(), pipe, during).await;
                cluster.after(&result, self.backend).await;
                result
            }
        }
    }

    /// [`Link::query`] for a write step: with `WAIT` after it when the
    /// options ask for one, checked (and its answer dropped).
    pub(crate) async fn query_durable(
        &self,
        pipe: &Pipeline,
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let Some(wait) = self.wait else {
            return self.query(pipe, during).await;
        };
        let mut pipe = pipe.clone();
        pipe.add_command(wait_cmd(wait));
        let mut replies = self.query(&pipe, during).await?;
        let acked = replies
            .pop()
            .ok_or_else(|| Error::protocol(during, "no answer to WAIT"))?;
        check_wait(wait, acked, during)?;
        Ok(replies)
    }

    /// Sends a pipeline of one command and returns its answer, a server
    /// error turned into [`Error`].
    pub(crate) async fn query_one(
        &self,
        pipe: &Pipeline,
        during: &'static str,
    ) -> Result<Value, Error> {
        let reply = self.query(pipe, during).await?.into_iter().next();
        check(
            reply.ok_or_else(|| Error::protocol(during, "no answer"))?,
            during,
        )
    }

    /// Runs one script and returns its answer as an array, a server error
    /// turned into [`Error`].
    pub(crate) async fn eval_one(
        &self,
        call: Call,
        durable: Durable,
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let reply = self
            .eval(&[], std::slice::from_ref(&call), durable, during)
            .await?;
        let reply = reply.into_iter().next();
        match check(
            reply.ok_or_else(|| Error::protocol(during, "no answer"))?,
            during,
        )? {
            Value::Array(items) => Ok(items),
            other => Err(Error::protocol(
                during,
                format!("expected an array, got {other:?}"),
            )),
        }
    }

    /// Runs `prelude` (plain commands, answers checked and dropped) and
    /// `calls` in one round trip, loading scripts again in the same round
    /// trip as a resend when Redis answers NOSCRIPT (after SCRIPT FLUSH or a
    /// restart). Returns the calls' answers in order; server errors stay in
    /// place for the caller to map.
    pub(crate) async fn eval(
        &self,
        prelude: &[Cmd],
        calls: &[Call],
        durable: Durable,
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let (prelude, answers) = self
            .eval_with_prelude(prelude, calls, durable, during)
            .await?;
        for reply in prelude? {
            check(reply, during)?;
        }
        answers.into_iter().collect()
    }

    /// [`Self::eval`], but the prelude's answers come back unchecked, beside
    /// the calls' answers: a failed prelude command does not hide what the
    /// calls did. (On a cluster the prelude may fail to be sent at all
    /// while the calls were answered: then its answers are that error.)
    ///
    /// On a cluster the prelude is its own pipeline (its commands must
    /// share a hash slot) and the calls are grouped by hash slot, each
    /// group one pipeline; all are sent at once. A group that fails (its
    /// node is down, its round trip timed out) fails only its own calls:
    /// each of them answers the group's error, and the other nodes' calls
    /// keep their answers. On one server all calls share one round trip,
    /// so they fail together: as the outer error.
    pub(crate) async fn eval_with_prelude(
        &self,
        prelude: &[Cmd],
        calls: &[Call],
        durable: Durable,
        during: &'static str,
    ) -> Result<(Result<Vec<Value>, Error>, Vec<Result<Value, Error>>), Error> {
        let wait = match durable {
            Durable::Yes => self.wait,
            Durable::No => None,
        };
        if !self.is_cluster() {
            let all: Vec<&Call> = calls.iter().collect();
            let (prelude, answers) = self
                .rounds(prelude, &all, wait, Reload::InPipeline, during)
                .await?;
            return Ok((Ok(prelude), answers.into_iter().map(Ok).collect()));
        }
        let mut groups: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, call) in calls.iter().enumerate() {
            groups.entry(call.slot()).or_default().push(i);
        }
        let groups: Vec<Vec<usize>> = groups.into_values().collect();
        let prelude_future = async {
            if prelude.is_empty() {
                return Ok(Vec::new());
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for cmd in prelude {
                pipe.add_command(cmd.clone());
            }
            self.query(&pipe, during).await
        };
        let group_futures = groups.iter().map(|indices| {
            let group: Vec<&Call> = indices.iter().map(|&i| &calls[i]).collect();
            async move { self.rounds(&[], &group, wait, Reload::Eval, during).await }
        });
        let (prelude_replies, group_answers) =
            futures::future::join(prelude_future, futures::future::join_all(group_futures)).await;
        let mut answers: Vec<Option<Result<Value, Error>>> =
            std::iter::repeat_with(|| None).take(calls.len()).collect();
        for (indices, result) in groups.iter().zip(group_answers) {
            match result {
                Ok((_, replies)) => {
                    for (&i, reply) in indices.iter().zip(replies) {
                        answers[i] = Some(Ok(reply));
                    }
                }
                Err(error) => {
                    for (&i, error) in indices.iter().zip(error.for_each_of(indices.len())) {
                        answers[i] = Some(Err(error));
                    }
                }
            }
        }
        let answers = answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(Error::protocol(during, "an answer is missing"))))
            .collect();
        Ok((prelude_replies, answers))
    }

    /// Sends `prelude` and `calls` as one pipeline (then again for the
    /// calls that met NOSCRIPT), with `WAIT` at the end of each when
    /// `wait` says so.
    async fn rounds(
        &self,
        prelude: &[Cmd],
        calls: &[&Call],
        wait: Option<ReplicaWait>,
        reload_by: Reload,
        during: &'static str,
    ) -> Result<(Vec<Value>, Vec<Value>), Error> {
        let mut prelude_replies = Vec::new();
        let mut answers: Vec<Option<Value>> = vec![None; calls.len()];
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut reload: Vec<&'static Lua> = Vec::new();
        for round in 0..=MAX_RELOADS {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let by_eval = round > 0 && reload_by == Reload::Eval;
            let loads = if by_eval { 0 } else { reload.len() };
            for lua in &reload[..loads] {
                pipe.add_command(lua.load_cmd());
            }
            let prelude_len = if round == 0 { prelude.len() } else { 0 };
            for cmd in &prelude[..prelude_len] {
                pipe.add_command(cmd.clone());
            }
            for &i in &pending {
                pipe.add_command(if by_eval {
                    calls[i].eval()
                } else {
                    calls[i].evalsha()
                });
            }
            if let Some(wait) = wait {
                pipe.add_command(wait_cmd(wait));
            }
            let mut replies = self.query(&pipe, during).await?;
            let expected = loads + prelude_len + pending.len() + usize::from(wait.is_some());
            if replies.len() != expected {
                return Err(Error::protocol(
                    during,
                    format!("{} answers to {expected} commands", replies.len()),
                ));
            }
            let acked = wait.and_then(|_| replies.pop());
            let mut replies = replies.into_iter();
            for reply in replies.by_ref().take(loads) {
                check(reply, during)?;
            }
            prelude_replies.extend(replies.by_ref().take(prelude_len));
            let mut again = Vec::new();
            reload.clear();
            for (&i, reply) in pending.iter().zip(replies) {
                if is_noscript(&reply) {
                    again.push(i);
                    if !reload.iter().any(|l| std::ptr::eq(*l, calls[i].lua)) {
                        reload.push(calls[i].lua);
                    }
                } else {
                    answers[i] = Some(reply);
                }
            }
            if let (Some(wait), Some(acked)) = (wait, acked) {
                check_wait(wait, acked, during)?;
            }
            if again.is_empty() {
                let answers = answers
                    .into_iter()
                    .map(|a| a.ok_or_else(|| Error::protocol(during, "an answer is missing")))
                    .collect::<Result<_, _>>()?;
                return Ok((prelude_replies, answers));
            }
            tracing::info!(
                backend = self.backend,
                scripts = ?reload.iter().map(|l| l.name).collect::<Vec<_>>(),
                "Redis does not have our scripts (SCRIPT FLUSH, a restart or a failover): loading them again"
            );
            pending = again;
        }
        Err(Error::Server {
            during,
            detail: format!(
                "NOSCRIPT after loading the scripts {MAX_RELOADS} times: something keeps flushing them"
            ),
            source: None,
        })
    }

    /// Re-reads the server's `run_id` now (one `INFO server`), logging loudly
    /// and counting it if the server changed since the store last looked.
    /// On a cluster: the `run_id`s of every master, so a failover (a
    /// replica promoted) or a master's restart counts as a change.
    pub(crate) async fn check_server(&self) -> Result<bool, Error> {
        let before = self.server_changes();
        let during = "reading INFO";
        if let Conn::Cluster(cluster) = &self.conn {
            let infos = masters_info(&mut cluster.conn(), during).await;
            cluster.after(&infos, self.backend).await;
            let infos = infos?;
            self.observe_run_id(cluster_fingerprint(&infos));
            return Ok(self.server_changes() > before);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg("server");
        let info = text(&self.query_one(&pipe, during).await?)
            .ok_or_else(|| Error::protocol(during, "INFO is not text"))?;
        let (_, _, run_id) =
            parse_server(&info).ok_or_else(|| Error::protocol(during, "INFO has no run_id"))?;
        self.observe_run_id(run_id);
        Ok(self.server_changes() > before)
    }
}

/// How a round reloads scripts Redis no longer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reload {
    /// SCRIPT LOAD at the head of the next pipeline (one server).
    InPipeline,
    /// The calls again as EVAL with the source (a cluster: the pipeline
    /// stays on the node that owns the calls' slot).
    Eval,
}

/// `WAIT replicas timeout_ms`.
fn wait_cmd(wait: ReplicaWait) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(wait.replicas)
        .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
    cmd
}

/// The answer to `WAIT`: enough replicas, or [`Error::NotReplicated`].
fn check_wait(wait: ReplicaWait, acked: Value, during: &'static str) -> Result<(), Error> {
    let acked = int(&check(acked, during)?)
        .ok_or_else(|| Error::protocol(during, "WAIT did not answer a number"))?;
    if acked < i64::from(wait.replicas) {
        return Err(Error::NotReplicated {
            during,
            wanted: wait.replicas,
            acknowledged: acked,
            timeout: wait.timeout,
        });
    }
    Ok(())
}

/// The connection of `current`, if there is one.
fn cached(current: &Mutex<Option<(u64, Connection)>>) -> Option<(u64, MultiplexedConnection)> {
    lock(current)
        .as_ref()
        .map(|(generation, obj)| (*generation, (**obj).clone()))
}

/// `INFO` from every master of the cluster: (node, text), by node.
async fn masters_info(
    conn: &mut ClusterConnection,
    during: &'static str,
) -> Result<Vec<(String, String)>, Error> {
    let reply = conn
        .route_command(
            redis::cmd("INFO"),
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await
        .map_err(|e| Error::from_redis(during, e))?;
    let pairs = match reply {
        Value::Map(pairs) => pairs,
        other => {
            return Err(Error::protocol(
                during,
                format!("INFO from every master is not a map: {other:?}"),
            ));
        }
    };
    let mut infos = Vec::with_capacity(pairs.len());
    for (node, info) in pairs {
        let node = text(&node).unwrap_or_default();
        let info = text(&check(info, during)?)
            .ok_or_else(|| Error::protocol(during, "INFO is not text"))?;
        infos.push((node, info));
    }
    infos.sort();
    Ok(infos)
}

/// The masters' `run_id`s, sorted: changes when a replica takes over or a
/// master restarts.
fn cluster_fingerprint(infos: &[(String, String)]) -> String {
    let mut ids: Vec<String> = infos
        .iter()
        .filter_map(|(_, info)| parse_server(info).map(|(_, _, run_id)| run_id))
        .collect();
    ids.sort();
    ids.join(",")
}

/// The refusal of `cluster=true` on a server without cluster support.
fn not_a_cluster(opts: &RedisOptions) -> Error {
    Error::InvalidSetting {
        setting: "cluster",
        reason: format!(
            "{} is not a Redis Cluster node (its cluster support is disabled): remove cluster=true (and any seed) from the URL",
            opts.server()
        ),
    }
}

/// How much a finding puts the store's keys at risk, to pick the worst
/// among a cluster's masters.
fn eviction_rank(finding: &EvictionFinding) -> u8 {
    match finding {
        EvictionFinding::NoEviction => 0,
        EvictionFinding::Unknown { .. } => 1,
        EvictionFinding::VolatileOnly { .. } => 2,
        _ => 3,
    }
}

/// Loads `scripts` on every node of the cluster, replicas too: a replica
/// promoted by a failover then has them already.
async fn load_everywhere(
    conn: &mut ClusterConnection,
    scripts: &'static [&'static Lua],
) -> Result<(), Error> {
    let during = "loading the scripts";
    for lua in scripts {
        conn.route_command(
            lua.load_cmd(),
            RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllNodes,
                Some(ResponsePolicy::AllSucceeded),
            )),
        )
        .await
        .map_err(|e| match Error::from_redis(during, e) {
            Error::Server { detail, .. } => Error::Server {
                during,
                detail: format!("script {}: {detail}", lua.name),
                source: None,
            },
            other => other,
        })?;
    }
    Ok(())
}

/// Logs (or refuses) what the start-up checks found.
fn judge_server(
    server: &ServerInfo,
    opts: &RedisOptions,
    backend: &'static str,
) -> Result<(), Error> {
    let policy = server.eviction.policy().unwrap_or("unknown").to_owned();
    match &server.eviction {
        EvictionFinding::NoEviction => {}
        EvictionFinding::Unknown { reason } => tracing::warn!(
            backend,
            reason = %reason,
            "could not read Redis's maxmemory-policy; make sure it is `noeviction`, or a claimed \
             run can be evicted and run a second time"
        ),
        finding if opts.eviction == EvictionCheck::Refuse => {
            return Err(Error::EvictionPolicy {
                policy,
                why: finding.risk(),
            });
        }
        EvictionFinding::VolatileOnly { .. } => tracing::warn!(
            backend,
            maxmemory_policy = %policy,
            "Redis maxmemory-policy is not `noeviction`: {}",
            server.eviction.risk()
        ),
        EvictionFinding::AnyKey { .. } => tracing::warn!(
            backend,
            maxmemory_policy = %policy,
            "REDIS MAY EVICT THE STORE'S KEYS (maxmemory-policy {policy}): {}. \
             Set `maxmemory-policy noeviction` on this server.",
            server.eviction.risk()
        ),
    }
    if server.aof_enabled == Some(false) {
        tracing::warn!(
            backend,
            "Redis does not write an AOF (appendonly no): if it restarts it forgets every claimed \
             run, and runs may run a second time; see docs/backends/redis.md (persistence)"
        );
    }
    Ok(())
}

/// The value of a one-parameter `CONFIG GET` answer.
fn config_value(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

async fn checkout(
    pool: &Pool,
    timeout: Duration,
    during: &'static str,
) -> Result<Connection, Error> {
    // The pool has its own timeouts; this one also covers a hung DNS lookup.
    let got = tokio::time::timeout(timeout + Duration::from_secs(1), pool.get())
        .await
        .map_err(|_| Error::timeout(during, timeout))?;
    got.map_err(|e| match e {
        PoolError::Backend(e) => Error::from_redis(during, e),
        PoolError::Timeout(_) => Error::timeout(during, timeout),
        other => Error::Unavailable {
            during,
            cause: other.to_string(),
            source: None,
        },
    })
}

async fn query<C: ConnectionLike>(
    conn: &mut C,
    pipe: &Pipeline,
    during: &'static str,
) -> Result<Vec<Value>, Error> {
    pipe.query_async::<Vec<Value>>(conn).await.map_err(|e| {
        if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
            Error::protocol(during, "NOSCRIPT outside a script call")
        } else {
            Error::from_redis(during, e)
        }
    })
}

/// Implements [`ClaimStore`](anarchon_core::ClaimStore) for a claim-only
/// strategy's store: its `try_claim` is the claim, `$memory` (an
/// expression over the store) how long it remembers a run, and it is no
/// lease store. The three claim-only strategies differ only there.
///
/// Also implements `Debug`: the store's key prefix, its memory setting
/// (the field `$setting`, when it has one) and the server, never the URL,
/// so never a password.
macro_rules! claim_only_store {
    ($store:ty, |$this:ident| $memory:expr $(, $setting:ident)?) => {
        impl std::fmt::Debug for $store {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("prefix", &self.prefix)
                    $(.field(stringify!($setting), &self.$setting))?
                    .field("server", &self.link.server().describe())
                    .finish_non_exhaustive()
            }
        }

        #[async_trait::async_trait]
        impl anarchon_core::ClaimStore for $store {
            async fn claim(
                &self,
                req: &anarchon_core::ClaimRequest,
            ) -> Result<anarchon_core::ClaimOutcome, anarchon_core::StoreError> {
                self.try_claim(req)
                    .await
                    .map_err(|e| e.into_store_error(BACKEND))
            }

            fn info(&self) -> anarchon_core::BackendInfo {
                let $this = self;
                anarchon_core::BackendInfo {
                    name: BACKEND,
                    memory: $memory,
                }
            }

            /// One `INFO server` (on a cluster, one per master), which
            /// also notices a restarted server.
            async fn ping(&self) -> Result<(), anarchon_core::StoreError> {
                self.link
                    .check_server()
                    .await
                    .map(drop)
                    .map_err(|e| e.into_store_error(BACKEND))
            }

            fn as_lease_store(
                self: std::sync::Arc<Self>,
            ) -> Option<std::sync::Arc<dyn anarchon_core::LeaseStore>> {
                None
            }
        }
    };
}

pub(crate) use claim_only_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_get_answers_are_read() {
        let v = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(config_value(&v).as_deref(), Some("allkeys-lru"));
        assert_eq!(config_value(&Value::Array(vec![])), None);
    }

    #[test]
    fn too_few_replicas_is_a_temporary_error_that_says_so() {
        let wait = ReplicaWait {
            replicas: 2,
            timeout: Duration::from_millis(100),
        };
        assert!(check_wait(wait, Value::Int(2), "claiming").is_ok());
        assert!(check_wait(wait, Value::Int(3), "claiming").is_ok());
        let err = check_wait(wait, Value::Int(1), "claiming").unwrap_err();
        assert!(err.is_temporary(), "{err}");
        let message = err.to_string();
        assert!(message.contains("only 1 of the 2 replicas"), "{message}");
        assert_eq!(
            err.into_store_error("redis-lease").kind(),
            anarchon_core::StoreErrorKind::Unavailable
        );
        assert!(check_wait(wait, Value::Nil, "claiming").is_err());
    }

    /// A key whose hash slot lies in `first..=last`.
    fn key_in(first: u16, last: u16) -> String {
        (0..)
            .map(|i| format!("{{job-{i}}}:x"))
            .find(|key| (first..=last).any(|slot| Some(Slot::for_key(key)) == Slot::new(slot)))
            .expect("some key hashes into any range")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_node_that_stops_answering_costs_only_its_own_calls() {
        let cluster = crate::fake_cluster::FakeCluster::start(2).await;
        let opts = RedisOptions::new(format!(
            "{}?cluster=true&seed={}",
            cluster.url(0),
            cluster.address(1)
        ))
        .with_cluster(true)
        .with_response_timeout(Duration::from_millis(300));
        let link = Link::connect(&opts, "redis-lease", &[]).await.unwrap();
        let call = |node: usize| {
            let (first, last) = cluster.slots_of(node);
            Call {
                lua: &TEST_LUA,
                keys: vec![key_in(first, last)],
                args: Vec::new(),
            }
        };
        let calls = [call(0), call(1), call(0)];
        let (_, answers) = link
            .eval_with_prelude(&[], &calls, Durable::No, "claiming")
            .await
            .unwrap();
        assert!(
            answers.iter().all(Result::is_ok),
            "both nodes answer: {answers:?}"
        );

        cluster.hang_open_connections(1);
        let (_, answers) = link
            .eval_with_prelude(&[], &calls, Durable::No, "claiming")
            .await
            .expect("the calls answer one by one, not as one error");
        let [first, hung, second] = &answers[..] else {
            panic!("three answers: {answers:?}");
        };
        assert!(
            first.is_ok() && second.is_ok(),
            "node 0 answered: {answers:?}"
        );
        assert!(
            hung.as_ref().is_err_and(Error::is_timeout),
            "node 1's call timed out on its own: {hung:?}"
        );
    }

    #[test]
    fn calls_of_one_job_share_a_slot() {
        let call = |key: &str| Call {
            lua: &TEST_LUA,
            keys: vec![key.to_owned(), "other".to_owned()],
            args: Vec::new(),
        };
        assert_eq!(call("{p:a}:runs").slot(), call("{p:a}:live").slot());
        assert_ne!(call("{p:a}:runs").slot(), call("{p}:pause").slot());
    }

    static TEST_LUA: Lua = Lua::new("test", "return 1");
}
