//! Connection options and the key prefix.

use anarchon_core::name::check_plain;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anarchon_core::url::{Authority, Query, millis, percent_decode, positive_millis, redact};
use anarchon_core::{Clock, Memory, SystemClock};

use crate::error::Error;
use crate::{MIN_MEMORY, RedisIdmpStore, RedisScriptStore};

/// The query parameters of a store URL that [`RedisOptions::from_url`]
/// reads itself.
const STORE_PARAMETERS: &str = "strategy, prefix, window_ms, duration_ms, timeout_ms, connect_timeout_ms, eviction, tls_ca_file, cluster, seed, wait_replicas, wait_timeout_ms";

/// How a store opened from a URL claims runs: the URL's `strategy`
/// parameter, with the memory of the claim-only ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `lease` (the default): a lease store, [`RedisLeaseStore`](crate::RedisLeaseStore).
    Lease,
    /// `stream-id`: claim-only, remembers runs forever,
    /// [`RedisStreamIdStore`](crate::RedisStreamIdStore).
    StreamId,
    /// `idmp` (Redis 8.6+): claim-only, remembers runs for the duration,
    /// [`RedisIdmpStore`].
    Idmp(Duration),
    /// `script`: claim-only, remembers runs for the window,
    /// [`RedisScriptStore`].
    Script(Duration),
}

impl Strategy {
    /// The name the store of this strategy reports as its backend
    /// (`redis-lease`, `redis-stream-id`, `redis-idmp`, `redis-script`).
    pub fn backend(self) -> &'static str {
        match self {
            Strategy::Lease => "redis-lease",
            Strategy::StreamId => "redis-stream-id",
            Strategy::Idmp(_) => "redis-idmp",
            Strategy::Script(_) => "redis-script",
        }
    }

    /// The strategy as a URL writes it (`lease`, `stream-id`, `idmp`,
    /// `script`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Lease => "lease",
            Strategy::StreamId => "stream-id",
            Strategy::Idmp(_) => "idmp",
            Strategy::Script(_) => "script",
        }
    }

    /// Whether the store keeps leases (only `lease` does).
    pub fn is_lease(self) -> bool {
        self == Strategy::Lease
    }

    /// How long the store remembers a run.
    pub fn memory(self) -> Memory {
        match self {
            Strategy::Lease => Memory::UntilCollected,
            Strategy::StreamId => Memory::Forever,
            Strategy::Idmp(d) | Strategy::Script(d) => Memory::Window(d),
        }
    }
}

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// The prefix of every key a store writes, validated: 1 to 64 characters of
/// `[A-Za-z0-9_.:-]`. The default is `cron`.
///
/// It becomes part of each job's hash tag, `{<prefix>:<job>}`, so braces,
/// spaces, glob characters and anything else that would change which keys
/// the tag covers are refused. Job names cannot contain `:`, so no two
/// (prefix, job) pairs share a tag.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Validates `prefix`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`] if it is empty, longer than
    /// [`MAX_PREFIX_LEN`] or contains a character outside `[A-Za-z0-9_.:-]`.
    pub fn new(prefix: &str) -> Result<Self, Error> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
        check_plain(prefix, MAX_PREFIX_LEN, allowed).map_err(|problem| Error::InvalidPrefix {
            prefix: prefix.chars().take(80).collect(),
            reason: problem.with_hint("; use only letters, digits, '_', '.', ':' and '-'"),
        })?;
        Ok(Self(prefix.to_owned()))
    }

    /// The prefix as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self("cron".to_owned())
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// What a store does at start-up when Redis may evict keys
/// (`maxmemory-policy` other than `noeviction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionCheck {
    /// Log a warning and go on (the default). The finding is on
    /// [`ServerInfo::eviction`](crate::ServerInfo::eviction).
    #[default]
    Warn,
    /// Refuse to start unless the policy is `noeviction`. A server that does
    /// not let us read the policy (managed Redis) is still accepted, with a
    /// warning.
    Refuse,
}

/// How to reach Redis, and the options every strategy shares.
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) url: String,
    pub(crate) prefix: KeyPrefix,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) eviction: EvictionCheck,
    pub(crate) tls_ca_file: Option<PathBuf>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Redis Cluster mode: a cluster client instead of one connection.
    pub(crate) cluster: bool,
    /// More cluster nodes to start from than the URL's host (`host:port`).
    pub(crate) seeds: Vec<String>,
    /// `WAIT` after each write step: replicas and timeout.
    pub(crate) wait: Option<ReplicaWait>,
}

/// How many replicas must have a write step before the store answers, and
/// how long Redis waits for them: see [`RedisOptions::wait_for_replicas`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaWait {
    /// The replicas that must acknowledge the step (`WAIT`'s first argument).
    pub replicas: u32,
    /// How long Redis waits for them (`WAIT`'s second argument).
    pub timeout: Duration,
}

impl RedisOptions {
    /// The default time allowed to open a connection.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default time allowed for an answer.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

    /// Options for the server at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://…` for TLS, which needs the crate's `tls` feature):
    /// prefix `cron`, 2 s to connect, 2 s for each answer, warn about
    /// eviction, the system's root certificates for TLS.
    ///
    /// The URL is read when a store connects: a URL that does not parse, or
    /// a TLS URL in a build without the `tls` feature, fails there.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: KeyPrefix::default(),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            eviction: EvictionCheck::Warn,
            tls_ca_file: None,
            clock: Arc::new(SystemClock),
            cluster: false,
            seeds: Vec::new(),
            wait: None,
        }
    }

    /// Reads a store URL: a Redis URL (`redis://[user:password@]host[:port][/db]`,
    /// or `rediss://…` for TLS) whose query may also carry the store's own
    /// parameters: `strategy` (`lease`, the default; `stream-id`; `idmp`;
    /// `script`), `prefix`, `window_ms` (`script` only), `duration_ms`
    /// (`idmp` only, whole seconds), `timeout_ms`, `connect_timeout_ms`,
    /// `eviction` (`warn` or `refuse`) and `tls_ca_file` (a path,
    /// `%`-escaped where needed; `rediss://` only); for a Redis Cluster
    /// `cluster=true` and any number of `seed=host:port` (more nodes to
    /// start from, with the URL's scheme, user and password); and
    /// `wait_replicas` with `wait_timeout_ms` (see
    /// [`wait_for_replicas`](Self::wait_for_replicas)). They are taken out of
    /// the URL; the client's `protocol` stays in it. The rest of the URL is
    /// read by the Redis client's own parser, which connects to nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use anarchon_redis::{RedisOptions, Strategy};
    ///
    /// let (options, strategy) =
    ///     RedisOptions::from_url("redis://:s3cret@redis.internal:6379/2?strategy=script&window_ms=600000&prefix=billing")?;
    /// assert_eq!(strategy, Strategy::Script(Duration::from_secs(600)));
    /// assert_eq!(options.key_prefix().as_str(), "billing");
    /// assert_eq!(options.server(), "redis.internal:6379/2");
    /// assert!(!format!("{options:?}").contains("s3cret"));
    /// # Ok::<(), anarchon_redis::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that names no host, a bad
    /// database number, an unknown parameter or strategy, a value out of
    /// range or a URL the client cannot read; [`Error::InvalidPrefix`]
    /// for a bad `prefix`; [`Error::TlsNotEnabled`] for
    /// `rediss://` in a build without the `tls` feature. No message shows
    /// the password.
    pub fn from_url(url: &str) -> Result<(Self, Strategy), Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            reason: anarchon_core::url::unreadable_reason(url, &reason),
        };
        if let Some(reason) = anarchon_core::url::ambiguous_user_info(url) {
            return Err(Error::InvalidUrl { reason });
        }
        let query = Query::split(url);
        let auth = Authority::of(query.base).map_err(invalid)?;
        if auth.host.is_empty() {
            return Err(invalid(
                "it names no host (redis://[user:password@]host:6379[/db])".into(),
            ));
        }
        let db = auth.path.trim_start_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(invalid(format!("the database {db:?} is not a number")));
        }
        let mut kept = Vec::new();
        let mut strategy = "lease";
        let mut window = None;
        let mut duration = None;
        let mut options = Self::new(String::new());
        let mut prefix = None;
        let mut ca_file = None;
        let mut wait_replicas = None;
        let mut wait_timeout = None;
        for &(key, value) in &query.pairs {
            match key {
                "cluster" => {
                    options.cluster = match value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(invalid(format!(
                                "cluster must be true or false, not {value:?}"
                            )));
                        }
                    };
                }
                "seed" => options.seeds.push(seed_address(value).map_err(invalid)?),
                "wait_replicas" => {
                    wait_replicas = Some(value.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        invalid(format!(
                            "wait_replicas must be a number of replicas from 1 up, not {value:?}"
                        ))
                    })?);
                }
                "wait_timeout_ms" => {
                    wait_timeout = Some(positive_millis(key, value).map_err(invalid)?)
                }
                "strategy" => strategy = value,
                "tls_ca_file" => {
                    ca_file = Some(percent_decode(value).ok_or_else(|| {
                        invalid(format!(
                            "{key} has a broken %-escape or is not UTF-8 once decoded"
                        ))
                    })?);
                }
                "prefix" => prefix = Some(value),
                "window_ms" => window = Some(millis(key, value).map_err(invalid)?),
                "duration_ms" => duration = Some(millis(key, value).map_err(invalid)?),
                "timeout_ms" => {
                    options.response_timeout = positive_millis(key, value).map_err(invalid)?;
                }
                "connect_timeout_ms" => {
                    options.connect_timeout = positive_millis(key, value).map_err(invalid)?;
                }
                "eviction" => {
                    options.eviction = match value {
                        "warn" => EvictionCheck::Warn,
                        "refuse" => EvictionCheck::Refuse,
                        _ => {
                            return Err(invalid(format!(
                                "eviction must be warn or refuse, not {value:?}"
                            )));
                        }
                    };
                }
                "protocol" => kept.push((key, value)),
                other => {
                    return Err(invalid(format!(
                        "unknown parameter {other:?}; anarchon reads {STORE_PARAMETERS}; the Redis client reads protocol"
                    )));
                }
            }
        }
        let strategy = match strategy {
            "lease" => Strategy::Lease,
            "stream-id" => Strategy::StreamId,
            "idmp" => {
                let d = duration.unwrap_or(RedisIdmpStore::DEFAULT_DURATION);
                if d.subsec_nanos() != 0 {
                    return Err(invalid(format!(
                        "duration_ms must be whole seconds (Redis keeps IDMP ids for whole seconds), not {}",
                        d.as_millis()
                    )));
                }
                if d < MIN_MEMORY || d > RedisIdmpStore::MAX_DURATION {
                    return Err(invalid(format!(
                        "duration_ms must be from {} to {}",
                        MIN_MEMORY.as_millis(),
                        RedisIdmpStore::MAX_DURATION.as_millis()
                    )));
                }
                Strategy::Idmp(d)
            }
            "script" => {
                let w = window.unwrap_or(RedisScriptStore::DEFAULT_WINDOW);
                if w < MIN_MEMORY {
                    return Err(invalid(format!(
                        "window_ms must be at least {}",
                        MIN_MEMORY.as_millis()
                    )));
                }
                Strategy::Script(w)
            }
            other => {
                return Err(invalid(format!(
                    "unknown strategy {other:?}; use lease (the default), stream-id, idmp or script"
                )));
            }
        };
        if window.is_some() && !matches!(strategy, Strategy::Script(_)) {
            return Err(invalid("window_ms applies to strategy=script only".into()));
        }
        if duration.is_some() && !matches!(strategy, Strategy::Idmp(_)) {
            return Err(invalid("duration_ms applies to strategy=idmp only".into()));
        }
        if !options.seeds.is_empty() && !options.cluster {
            return Err(invalid(
                "seed names more nodes of a Redis Cluster: add cluster=true, or remove seed".into(),
            ));
        }
        if options.cluster && !db.is_empty() && db != "0" {
            return Err(invalid(format!(
                "a Redis Cluster has only database 0, and the URL asks for database {db}: remove /{db} from the URL"
            )));
        }
        match (wait_replicas, wait_timeout) {
            (Some(replicas), Some(timeout)) => {
                options = options.wait_for_replicas(replicas, timeout)
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(invalid(
                    "wait_replicas needs wait_timeout_ms too (how long Redis waits for the replicas, e.g. wait_timeout_ms=100)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "wait_timeout_ms needs wait_replicas too (how many replicas must acknowledge each claim, e.g. wait_replicas=1)".into(),
                ));
            }
        }
        options.url = query.rebuild(&kept);
        let tls = query.base.starts_with("rediss://") || query.base.starts_with("valkeys://");
        #[cfg(not(feature = "tls"))]
        if tls {
            let scheme = query.base.split_once("://").map_or("", |(s, _)| s);
            return Err(Error::TlsNotEnabled {
                requested_by: format!("the URL scheme {scheme}://"),
            });
        }
        check_with_client(&options.url).map_err(invalid)?;
        if let Some(prefix) = prefix {
            options = options.with_prefix(prefix)?;
        }
        if let Some(path) = ca_file {
            if !tls {
                return Err(invalid("tls_ca_file needs a rediss:// URL (TLS)".into()));
            }
            options = options.with_tls_ca_file(path);
        }
        Ok((options, strategy))
    }

    /// The clock this process reads where a strategy computes something on
    /// the client side (default: the system clock). Only `idmp` does: it
    /// trims entries far older than its memory. No strategy decides who
    /// runs a slot with it; the lease strategy reads Redis's `TIME`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Redis Cluster mode: the store connects with a cluster client, which
    /// learns the cluster's nodes from the URL's host (and the seeds added
    /// with [`with_seed`](Self::with_seed)), sends each job's keys to the
    /// master of their hash slot and follows failovers and resharding.
    /// The URL form is `cluster=true`. See the crate docs (Redis Cluster)
    /// for what cluster mode changes.
    pub fn with_cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// One more cluster node (`host:port`) to start from, beside the URL's
    /// host, with the URL's scheme, user and password: the store can start
    /// while the URL's own node is down. Only with
    /// [`with_cluster`](Self::with_cluster); the URL form is `seed=host:port`,
    /// once per node.
    pub fn with_seed(mut self, host_port: impl Into<String>) -> Self {
        self.seeds.push(host_port.into());
        self
    }

    /// Makes every write step that decides a run — each claim, and the
    /// lease strategy's heartbeat, finish, release and give-back — answer
    /// only once `replicas` replicas have it: the store sends
    /// `WAIT replicas timeout` right after the step, in the same pipeline
    /// to the same node. If fewer replicas acknowledge within `timeout`,
    /// the call fails with [`Error::NotReplicated`], a temporary error: the
    /// step stands on the master but could be lost if the master fails
    /// before a replica has it; sent again with the same token, a claim
    /// finds its own claim and waits again. `WAIT` makes a write survive
    /// the failover of one master only if a replica that has it is
    /// promoted; it does not make Redis strongly consistent (see
    /// docs/backends/redis.md). The URL form is
    /// `wait_replicas=N&wait_timeout_ms=T`.
    ///
    /// `timeout` must be shorter than the response timeout; checked when
    /// the store connects.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// The `WAIT` the store sends after each write step, if any.
    pub fn replica_wait(&self) -> Option<ReplicaWait> {
        self.wait
    }

    /// Whether the store connects to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The key prefix (default `cron`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`], see [`KeyPrefix::new`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, Error> {
        self.prefix = KeyPrefix::new(prefix)?;
        Ok(self)
    }

    /// How long opening a connection may take before the call fails as
    /// unavailable.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one answer may take before the call fails as unavailable.
    /// Scripts run inside Redis, so this also bounds a claim's script.
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// What to do when the server may evict keys.
    pub fn with_eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction = check;
        self
    }

    /// Trust the certificate authorities in the PEM file at `path` — and
    /// only those — for the server's certificate, instead of the system's
    /// root certificates: for a server whose certificate a private
    /// authority signed. Needs a `rediss://` URL and the crate's `tls`
    /// feature.
    ///
    /// The file is read each time a store connects (so it can be replaced
    /// between restarts); the server's certificate must still name the
    /// URL's host.
    ///
    /// # Errors
    ///
    /// None here. When a store connects:
    /// [`Error::CaFile`] (naming the file) if it cannot be read or
    /// holds no usable certificate, [`Error::InvalidUrl`] if the
    /// URL is not a TLS URL, [`Error::TlsNotEnabled`] in a build
    /// without the `tls` feature.
    pub fn with_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// `host:port/db` as the URL names them (port 6379 and database 0
    /// unless it says otherwise), for messages. Never the password.
    pub fn server(&self) -> String {
        // Read from the redacted URL: a password that breaks the URL's
        // structure cannot then be taken for a host or a port.
        let redacted = redact(&self.url);
        let query = Query::split(&redacted);
        match Authority::of(query.base) {
            Ok(auth) => {
                let db = auth.path.trim_start_matches('/');
                let db = if db.is_empty() { "0" } else { db };
                format!("{}:{}/{db}", auth.host, auth.port.unwrap_or(6379))
            }
            Err(_) => query.base.to_owned(),
        }
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The certificate authority file set with
    /// [`with_tls_ca_file`](Self::with_tls_ca_file), if any.
    pub fn tls_ca_file(&self) -> Option<&Path> {
        self.tls_ca_file.as_deref()
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("eviction", &self.eviction)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("cluster", &self.cluster)
            .field("seeds", &self.seeds)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// A `seed` parameter's value: `host:port`, the port a number.
fn seed_address(value: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "seed must be one cluster node as host:port (e.g. seed=10.0.0.2:7001), not {value:?}; give one seed parameter per node"
        )
    };
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':');
    if host.is_empty() || !host.chars().all(plain) || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(value.to_owned())
}

/// Reads `url` with the Redis client's own parser, which connects to
/// nothing: what it refuses (a bad database number, an unknown `protocol`)
/// is refused before a store connects. Its message is dropped if it shows
/// any of the URL's user info.
fn check_with_client(url: &str) -> Result<(), String> {
    use deadpool_redis::redis::IntoConnectionInfo as _;
    let Err(e) = url.into_connection_info() else {
        return Ok(());
    };
    let message = e.to_string();
    let userinfo = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .map(|(userinfo, _)| userinfo);
    let leaks = userinfo.is_some_and(|u| {
        u.split(':')
            .any(|part| !part.is_empty() && message.contains(part))
    });
    Err(if leaks {
        "the Redis client cannot read it".to_owned()
    } else {
        format!("the Redis client cannot read it: {message}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_validated() {
        for ok in ["cron", "a", "my-app:prod.v2_x", &"p".repeat(64)] {
            assert_eq!(KeyPrefix::new(ok).expect("valid").as_str(), ok);
        }
        for bad in [
            "",
            "a{b",
            "}",
            "a b",
            "a*",
            "a?",
            "[a]",
            "é",
            &"p".repeat(65),
        ] {
            let err = KeyPrefix::new(bad).expect_err(bad);
            assert!(matches!(err, Error::InvalidPrefix { .. }), "{bad:?}: {err}");
        }
        assert_eq!(KeyPrefix::default().as_str(), "cron");
    }

    #[test]
    fn passwords_are_redacted() {
        for (url, want) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://user:s3cret@h", "redis://user:***@h"),
            ("redis://s3cret@h", "redis://***@h"),
            ("rediss://:s3cret@h:6380/0", "rediss://:***@h:6380/0"),
            ("rediss://s3cret@h", "rediss://***@h"),
            ("valkeys://user:s3cret@h", "valkeys://user:***@h"),
            (
                "redis+unix:///tmp/r.sock?pass=s3cret&db=1",
                "redis+unix:///tmp/r.sock?pass=***&db=1",
            ),
        ] {
            assert_eq!(redact(url), want);
        }
        let opts = RedisOptions::new("redis://user:s3cret@h:6379");
        let shown = format!("{opts:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("user:***@h:6379"), "{shown}");
        let opts =
            RedisOptions::new("rediss://user:s3cret@h:6380/1").with_tls_ca_file("/etc/ca.pem");
        let shown = format!("{opts:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("rediss://user:***@h:6380/1"), "{shown}");
        assert!(shown.contains("/etc/ca.pem"), "{shown}");
    }
    #[test]
    fn store_urls_choose_a_strategy() {
        let (options, strategy) =
            RedisOptions::from_url("redis://:s3cret@127.0.0.1:6379/2?prefix=team.a").unwrap();
        assert_eq!(strategy, Strategy::Lease);
        assert!(strategy.is_lease());
        assert_eq!(strategy.backend(), "redis-lease");
        assert_eq!(strategy.memory(), Memory::UntilCollected);
        assert_eq!(options.server(), "127.0.0.1:6379/2");
        assert_eq!(options.key_prefix().as_str(), "team.a");
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("prefix=team.a"), "stripped: {shown}");

        for (url, want, name, memory) in [
            (
                "redis://h?strategy=stream-id",
                Strategy::StreamId,
                "redis-stream-id",
                Memory::Forever,
            ),
            (
                "redis://h?strategy=script&window_ms=120000",
                Strategy::Script(Duration::from_secs(120)),
                "redis-script",
                Memory::Window(Duration::from_secs(120)),
            ),
            (
                "redis://h?strategy=script",
                Strategy::Script(RedisScriptStore::DEFAULT_WINDOW),
                "redis-script",
                Memory::Window(RedisScriptStore::DEFAULT_WINDOW),
            ),
            (
                "redis://h?strategy=idmp&duration_ms=3600000&protocol=resp2",
                Strategy::Idmp(Duration::from_secs(3600)),
                "redis-idmp",
                Memory::Window(Duration::from_secs(3600)),
            ),
        ] {
            let (options, strategy) = RedisOptions::from_url(url).unwrap();
            assert_eq!(strategy, want, "{url}");
            assert!(!strategy.is_lease(), "{url}");
            assert_eq!(strategy.backend(), name);
            assert_eq!(strategy.memory(), memory);
            assert_eq!(options.server(), "h:6379/0");
        }
        let (options, _) = RedisOptions::from_url(
            "redis://h:7000?timeout_ms=250&connect_timeout_ms=500&eviction=refuse&protocol=resp3",
        )
        .unwrap();
        assert_eq!(options.response_timeout, Duration::from_millis(250));
        assert_eq!(options.connect_timeout, Duration::from_millis(500));
        assert_eq!(options.eviction, EvictionCheck::Refuse);
        assert_eq!(options.url, "redis://h:7000?protocol=resp3");
        for url in [
            "redis://:pa?ssw@h",
            "redis://:12#ssw@h",
            "redis://u:pa/ssw@h",
        ] {
            let server = RedisOptions::new(url).server();
            assert!(
                !server.contains("pa") && !server.contains("12") && !server.contains("ssw"),
                "{url}: {server}"
            );
        }
    }

    #[test]
    fn bad_store_urls_say_what_is_wrong() {
        for (url, says) in [
            (
                "redis://:s3cret@h?strategy=leases",
                "unknown strategy \"leases\"",
            ),
            (
                "redis://:s3cret@h?strategie=lease",
                "unknown parameter \"strategie\"",
            ),
            (
                "redis://:s3cret@h?window_ms=60000",
                "window_ms applies to strategy=script",
            ),
            (
                "redis://:s3cret@h?strategy=script&duration_ms=60000",
                "duration_ms applies to strategy=idmp",
            ),
            (
                "redis://:s3cret@h?strategy=script&window_ms=5",
                "window_ms must be at least",
            ),
            (
                "redis://:s3cret@h?strategy=idmp&duration_ms=1500",
                "whole seconds",
            ),
            (
                "redis://:s3cret@h?strategy=idmp&duration_ms=172800000",
                "duration_ms must be from",
            ),
            ("redis://:s3cret@h?prefix=a%20b", "invalid key prefix"),
            ("redis://:s3cret@h/zero", "database \"zero\""),
            ("redis://:s3cret@:6379", "names no host"),
            ("redis://:s3cret@h?timeout_ms=0", "longer than zero"),
            (
                "redis://:s3cret@h?eviction=maybe",
                "eviction must be warn or refuse",
            ),
            (
                "redis://:s3cret@h?protocol=resp9",
                "Invalid protocol version",
            ),
            (
                "redis://:s3cret@h?tls_ca_file=/ca.pem",
                "needs a rediss:// URL",
            ),
            ("redis://:s3/cret@h", "%2F"),
            ("redis://:s3cret@h?seed=h2:7001", "add cluster=true"),
            (
                "redis://:s3cret@h?cluster=yes",
                "cluster must be true or false",
            ),
            (
                "redis://:s3cret@h?cluster=true&seed=h2",
                "seed must be one cluster node as host:port",
            ),
            (
                "redis://:s3cret@h?cluster=true&seed=h2:0",
                "seed must be one cluster node",
            ),
            (
                "redis://:s3cret@h?cluster=true&seed=h2:7001,h3:7002",
                "one seed parameter per node",
            ),
            ("redis://:s3cret@h/2?cluster=true", "only database 0"),
            (
                "redis://:s3cret@h?wait_replicas=1",
                "wait_replicas needs wait_timeout_ms",
            ),
            (
                "redis://:s3cret@h?wait_timeout_ms=50",
                "wait_timeout_ms needs wait_replicas",
            ),
            (
                "redis://:s3cret@h?wait_replicas=0&wait_timeout_ms=50",
                "wait_replicas must be a number",
            ),
            (
                "redis://:s3cret@h?wait_replicas=1&wait_timeout_ms=0",
                "longer than zero",
            ),
        ] {
            let err = RedisOptions::from_url(url).unwrap_err();
            let text = err.to_string();
            assert!(!err.is_temporary(), "{text}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(
                !text.contains("s3cret") && !text.contains("cret@"),
                "{text}"
            );
        }
    }

    #[test]
    fn cluster_urls_name_seeds_and_a_wait() {
        let (options, strategy) = RedisOptions::from_url(
            "redis://:s3cret@10.0.0.1:7000?cluster=true&seed=10.0.0.2:7000&seed=n3.internal:7001&strategy=script&wait_replicas=1&wait_timeout_ms=50",
        )
        .unwrap();
        assert_eq!(strategy.backend(), "redis-script");
        assert!(options.is_cluster());
        assert_eq!(options.seeds, ["10.0.0.2:7000", "n3.internal:7001"]);
        assert_eq!(
            options.replica_wait(),
            Some(ReplicaWait {
                replicas: 1,
                timeout: Duration::from_millis(50)
            })
        );
        assert_eq!(options.url, "redis://:s3cret@10.0.0.1:7000");
        assert!(!format!("{options:?}").contains("s3cret"));
        let (options, _) = RedisOptions::from_url("redis://h:7000/0?cluster=false").unwrap();
        assert!(!options.is_cluster());
        let built = RedisOptions::new("redis://h:7000")
            .with_cluster(true)
            .with_seed("h2:7001");
        assert!(built.is_cluster());
        assert_eq!(built.seeds, ["h2:7001"]);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_store_urls_carry_a_private_authority() {
        let (options, strategy) = RedisOptions::from_url(
            "rediss://:s3cret@h:6380/0?strategy=script&tls_ca_file=/etc/ca%20files/team.pem",
        )
        .unwrap();
        assert_eq!(strategy.backend(), "redis-script");
        assert_eq!(
            options.tls_ca_file(),
            Some(Path::new("/etc/ca files/team.pem"))
        );
        assert!(!format!("{options:?}").contains("s3cret"));
        let err = RedisOptions::from_url("rediss://:s3cret@h?tls_ca_file=%zz")
            .unwrap_err()
            .to_string();
        assert!(err.contains("broken %-escape"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_store_urls_need_the_tls_feature() {
        let err = RedisOptions::from_url("rediss://:s3cret@h:6380").unwrap_err();
        assert!(
            matches!(&err, Error::TlsNotEnabled { requested_by } if requested_by.contains("rediss://")),
            "{err}"
        );
        assert!(!err.to_string().contains("s3cret"));
    }
}
