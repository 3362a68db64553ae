//! The connection to Redis every strategy shares: start-up checks, one
//! multiplexed connection, scripts by EVALSHA with reload on NOSCRIPT, and
//! noticing when the server changed under us.
//!
//! Each store owns a deadpool-redis pool. The pool opens (and, after a
//! failure, reopens) connections with the configured timeouts; the store
//! keeps the one it got and sends every call over it, concurrently, as
//! redis-rs multiplexes requests on one connection. Checking a connection
//! out of the pool for each call would cost a PING round trip per claim.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, Script, ServerErrorKind, Value,
};
use deadpool_redis::{Connection, Manager, Pool, PoolError, Runtime};

use crate::error::Error;
use crate::options::{EvictionCheck, RedisOptions};
use crate::server::{EvictionFinding, ServerInfo, info_field, parse_server};
use crate::tls::{connection_info, secret_of};
use anarchon_core::url::redact;

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
}

/// The connection a store owns: pool, connection in use, scripts, server facts.
pub(crate) struct Link {
    backend: &'static str,
    pool: Pool,
    /// The connection in use and its generation.
    current: Mutex<Option<(u64, Connection)>>,
    reconnecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    scripts: &'static [&'static Lua],
    server: ServerInfo,
    run_id: Mutex<String>,
    server_changes: AtomicU64,
    connect_timeout: Duration,
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
    /// eviction policy as `opts` says. One round trip after the connection.
    pub(crate) async fn connect(
        opts: &RedisOptions,
        backend: &'static str,
        scripts: &'static [&'static Lua],
    ) -> Result<Self, Error> {
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
        judge_server(&server, opts, backend)?;
        Ok(Self {
            backend,
            pool,
            current: Mutex::new(Some((1, obj))),
            reconnecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(1),
            scripts,
            server,
            run_id: Mutex::new(run_id),
            server_changes: AtomicU64::new(0),
            connect_timeout: opts.connect_timeout,
        })
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
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The connection in use, or a new one.
    async fn conn(&self) -> Result<(u64, MultiplexedConnection), Error> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let during = "reconnecting";
        let obj = checkout(&self.pool, self.connect_timeout, during).await?;
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
        *lock(&self.current) = Some((generation, obj));
        Ok((generation, conn))
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        lock(&self.current)
            .as_ref()
            .map(|(generation, obj)| (*generation, (**obj).clone()))
    }

    /// Forgets the connection of `generation` after a connection-level error,
    /// so the next call opens a new one.
    fn broken(&self, generation: u64) {
        let mut current = lock(&self.current);
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
    /// errors in place.
    pub(crate) async fn query(
        &self,
        pipe: &Pipeline,
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let (generation, mut conn) = self.conn().await?;
        query(&mut conn, pipe, during).await.inspect_err(|e| {
            if e.is_temporary() {
                self.broken(generation);
            }
        })
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
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let reply = self.eval(&[], std::slice::from_ref(&call), during).await?;
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
        during: &'static str,
    ) -> Result<Vec<Value>, Error> {
        let (prelude, answers) = self.eval_with_prelude(prelude, calls, during).await?;
        for reply in prelude {
            check(reply, during)?;
        }
        Ok(answers)
    }

    /// [`Self::eval`], but the prelude's answers come back unchecked, beside
    /// the calls' answers: a failed prelude command does not hide what the
    /// calls did.
    pub(crate) async fn eval_with_prelude(
        &self,
        prelude: &[Cmd],
        calls: &[Call],
        during: &'static str,
    ) -> Result<(Vec<Value>, Vec<Value>), Error> {
        let mut prelude_replies = Vec::new();
        let mut answers: Vec<Option<Value>> = vec![None; calls.len()];
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut reload: Vec<&'static Lua> = Vec::new();
        for round in 0..=MAX_RELOADS {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for lua in &reload {
                pipe.add_command(lua.load_cmd());
            }
            let prelude_len = if round == 0 { prelude.len() } else { 0 };
            for cmd in &prelude[..prelude_len] {
                pipe.add_command(cmd.clone());
            }
            for &i in &pending {
                pipe.add_command(calls[i].evalsha());
            }
            let replies = self.query(&pipe, during).await?;
            let expected = reload.len() + prelude_len + pending.len();
            if replies.len() != expected {
                return Err(Error::protocol(
                    during,
                    format!("{} answers to {expected} commands", replies.len()),
                ));
            }
            let mut replies = replies.into_iter();
            for reply in replies.by_ref().take(reload.len()) {
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
                "Redis does not have our scripts (SCRIPT FLUSH or a restart): loading them again"
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
    pub(crate) async fn check_server(&self) -> Result<bool, Error> {
        let before = self.server_changes();
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg("server");
        let during = "reading INFO";
        let info = text(&self.query_one(&pipe, during).await?)
            .ok_or_else(|| Error::protocol(during, "INFO is not text"))?;
        let (_, _, run_id) =
            parse_server(&info).ok_or_else(|| Error::protocol(during, "INFO has no run_id"))?;
        self.observe_run_id(run_id);
        Ok(self.server_changes() > before)
    }
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

async fn query(
    conn: &mut MultiplexedConnection,
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
}
