//! What the Redis tests share: factories per strategy (directly or behind
//! the testkit's slow proxy), raw access to the server, and a proxy that
//! counts commands and can cut or freeze the line.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod log;
pub mod proxy;

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{Clock, async_trait};
use anarchon_redis::{
    Error, RedisIdmpStore, RedisLeaseStore, RedisOptions, RedisScriptStore, RedisStreamIdStore,
    Version,
};
use anarchon_testkit::servers::{Service, require, unique_prefix};
use anarchon_testkit::{FaultProxy, Proxyable, StoreFactory};
use deadpool_redis::redis::{self, AsyncCommands};

/// The test server's URL (fails the test with instructions if there is none).
pub async fn url() -> String {
    require(Service::Redis).await
}

/// Deletes every key under a test's prefix when the test ends, pass or
/// fail, so test runs do not pile keys up on the shared server.
pub struct Cleanup {
    url: String,
    prefix: String,
}

impl Cleanup {
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        use redis::Commands;
        let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        else {
            return;
        };
        for pattern in [
            format!("{{{}:*", self.prefix),
            format!("{{{}}}:*", self.prefix),
        ] {
            let keys: Vec<String> = match conn.scan_match::<_, String>(&pattern) {
                Ok(iter) => iter.filter_map(Result::ok).collect(),
                Err(_) => continue,
            };
            for chunk in keys.chunks(500) {
                let _: redis::RedisResult<i64> = conn.del(chunk);
            }
        }
    }
}

/// A fresh prefix on the test server: (url, prefix, options, cleanup).
pub async fn fresh(stem: &str) -> (String, String, RedisOptions, Cleanup) {
    let url = url().await;
    let prefix = unique_prefix(stem);
    let opts = RedisOptions::new(url.clone())
        .with_prefix(&prefix)
        .expect("unique prefixes are valid");
    let cleanup = Cleanup::new(&url, &prefix);
    (url, prefix, opts, cleanup)
}

/// A plain connection to the test server, outside any store.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("test URL parses")
        .get_multiplexed_async_connection()
        .await
        .expect("the test server answers")
}

/// Runs `command` on a new blocking connection to `url`: for the guards
/// that put the server back when dropped, where nothing can be awaited.
pub fn query_blocking<T: redis::FromRedisValue>(
    url: &str,
    command: &redis::Cmd,
) -> redis::RedisResult<T> {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| command.query::<T>(&mut c))
}

/// The server's setting `name`, as `CONFIG GET` reads it.
pub async fn config_get(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    pair[1].clone()
}

/// Sets the server's `maxmemory-policy` (the eviction tests change it and
/// put it back).
pub async fn set_eviction_policy(conn: &mut redis::aio::MultiplexedConnection, policy: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .query_async(conn)
        .await
        .unwrap();
}

/// Every key under `prefix` (job keys `{prefix:job}:…` and `{prefix}:…`).
pub async fn keys_of(url: &str, prefix: &str) -> Vec<String> {
    let mut conn = raw(url).await;
    let mut keys = Vec::new();
    for pattern in [format!("{{{prefix}:*"), format!("{{{prefix}}}:*")] {
        let mut found: Vec<String> = {
            let mut iter: redis::AsyncIter<'_, String> = conn
                .scan_options(
                    redis::ScanOptions::default()
                        .with_pattern(pattern)
                        .with_count(1000),
                )
                .await
                .unwrap();
            let mut out = Vec::new();
            while let Some(key) = futures::StreamExt::next(&mut iter).await {
                out.push(key.unwrap());
            }
            out
        };
        keys.append(&mut found);
    }
    keys.sort();
    keys
}

/// Deletes every key under `prefix`: what a Redis restart without
/// persistence does to the store's data.
pub async fn forget_prefix(url: &str, prefix: &str) -> usize {
    let keys = keys_of(url, prefix).await;
    if !keys.is_empty() {
        let mut conn = raw(url).await;
        let _: () = conn.del(&keys).await.unwrap();
    }
    keys.len()
}

/// The server's version, read directly.
pub async fn server_version(url: &str) -> (String, Version) {
    let mut conn = raw(url).await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    if let Some(v) = field("valkey_version") {
        return ("Valkey".into(), Version::parse(&v).unwrap());
    }
    let v = field("redis_version").unwrap();
    ("Redis".into(), Version::parse(&v).unwrap())
}

macro_rules! factory {
    ($name:ident, $store:ty, $stem:literal, |$opts:ident| $connect:expr) => {
        /// A namespace (key prefix) on the test server; each instance is a
        /// new store with its own pool.
        pub struct $name {
            pub url: String,
            pub prefix: String,
            pub opts: RedisOptions,
            /// Deletes the prefix's keys when dropped; `None` on a second
            /// factory of the same prefix.
            _cleanup: Option<Cleanup>,
        }

        impl $name {
            pub async fn new() -> Self {
                let (url, prefix, opts, _cleanup) = fresh($stem).await;
                Self {
                    url,
                    prefix,
                    opts,
                    _cleanup: Some(_cleanup),
                }
            }

            pub async fn connect(&self) -> Result<$store, Error> {
                let $opts = &self.opts;
                $connect
            }

            /// Connects as an instance whose process clock is `clock`.
            pub async fn connect_with_clock(&self, clock: Arc<dyn Clock>) -> Result<$store, Error> {
                let $opts = &self.opts.clone().with_clock(clock);
                $connect
            }
        }

        impl Proxyable for $name {
            type Through = $name;

            fn upstream(&self) -> String {
                proxy::host_port(&self.url)
            }

            /// This factory's prefix, with instances that connect to
            /// `proxy` instead; the clean-up stays with `self`.
            fn through_proxy(&self, proxy: &FaultProxy) -> $name {
                $name {
                    url: self.url.clone(),
                    prefix: self.prefix.clone(),
                    opts: RedisOptions::new(proxy.url_through(&self.url))
                        .with_prefix(&self.prefix)
                        .expect("unique prefixes are valid"),
                    _cleanup: None,
                }
            }
        }

        #[async_trait]
        impl StoreFactory for $name {
            type Store = $store;

            async fn instance_with_clock(&self, clock: Arc<dyn Clock>) -> Arc<$store> {
                Arc::new(
                    self.connect_with_clock(clock)
                        .await
                        .unwrap_or_else(|e| panic!("cannot connect to the test Redis: {e}")),
                )
            }
        }
    };
}

factory!(LeaseFactory, RedisLeaseStore, "lease", |opts| {
    RedisLeaseStore::connect(opts).await
});
factory!(StreamIdFactory, RedisStreamIdStore, "sid", |opts| {
    RedisStreamIdStore::connect(opts).await
});
factory!(ScriptFactory, RedisScriptStore, "script", |opts| {
    RedisScriptStore::connect(opts, RedisScriptStore::DEFAULT_WINDOW).await
});
factory!(IdmpFactory, RedisIdmpStore, "idmp", |opts| {
    RedisIdmpStore::connect(opts, RedisIdmpStore::DEFAULT_DURATION).await
});

/// A factory for the idmp strategy's suite; fails the test, saying how to
/// run it, when the test server has no `XADD ... IDMP`.
pub async fn idmp_factory() -> IdmpFactory {
    let factory = IdmpFactory::new().await;
    let (product, version) = server_version(&factory.url).await;
    assert!(
        product == "Redis" && version >= anarchon_redis::IDMP_MIN_VERSION,
        "the idmp suite needs Redis {} or newer, and the test server is {product} {version}: \
         point ANARCHON_REDIS_URL at one. `cargo xtask test-all` leaves this suite out on an \
         older server and reports it NOT TESTED.",
        anarchon_redis::IDMP_MIN_VERSION
    );
    factory
}

/// Waits up to `bound` for `fut`, failing the test if it takes longer.
pub async fn within<T>(
    bound: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(bound, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {bound:?}"))
}

// ---------------------------------------------------------------------
// The Redis Cluster (`ANARCHON_REDIS_CLUSTER_URL`, or the one `cargo
// xtask services --start` runs on 127.0.0.1:7000-7005).
// ---------------------------------------------------------------------

/// The test cluster's URL, `cluster=true` and its seeds included (fails
/// the test with instructions if there is none).
pub async fn cluster_url() -> String {
    anarchon_testkit::servers::require_cluster(anarchon_testkit::servers::Cluster::Redis).await
}

/// Options for the test cluster under `prefix` (cluster mode on even if
/// the URL from the environment does not say so).
pub fn cluster_options(url: &str, prefix: &str) -> RedisOptions {
    let (opts, _) = RedisOptions::from_url(url).expect("the cluster URL is a store URL");
    opts.with_cluster(true)
        .with_prefix(prefix)
        .expect("unique prefixes are valid")
}

/// The `host:port` of every node the cluster URL names (host and seeds).
pub fn cluster_nodes(url: &str) -> Vec<String> {
    let (_, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host = rest[..end]
        .rsplit_once('@')
        .map_or(&rest[..end], |(_, h)| h);
    let mut nodes = vec![host.to_owned()];
    if let Some((_, query)) = rest.split_once('?') {
        nodes.extend(
            query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("seed="))
                .map(str::to_owned),
        );
    }
    nodes
}

/// `url` with its `host[:port]` replaced by `node`, and no query.
pub fn node_url(url: &str, node: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let user = rest[..end]
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("{scheme}://{user}{node}")
}

/// Whether the node at `url` is a master now (`ROLE`).
pub fn is_master(url: &str) -> bool {
    let role: redis::RedisResult<redis::Value> = query_blocking(url, &redis::cmd("ROLE"));
    matches!(role, Ok(redis::Value::Array(items))
        if items.first().is_some_and(|v| matches!(v, redis::Value::BulkString(b) if b == b"master")))
}

/// Deletes the keys under `prefix` on the one node at `url`, one `DEL`
/// each (keys of several hash slots cannot share a `DEL` on a cluster).
fn delete_one_by_one(url: &str, prefix: &str) {
    use redis::Commands;
    let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
        return;
    };
    for pattern in [format!("{{{prefix}:*"), format!("{{{prefix}}}:*")] {
        let keys: Vec<String> = match conn.scan_match::<_, String>(&pattern) {
            Ok(iter) => iter.filter_map(Result::ok).collect(),
            Err(_) => continue,
        };
        for key in keys {
            let _: redis::RedisResult<i64> = conn.del(&key);
        }
    }
}

/// Deletes every key under a prefix on every master of the cluster when
/// dropped, pass or fail.
pub struct ClusterCleanup {
    url: String,
    prefix: String,
}

impl ClusterCleanup {
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        for node in cluster_nodes(&self.url) {
            let at = node_url(&self.url, &node);
            if is_master(&at) {
                delete_one_by_one(&at, &self.prefix);
            }
        }
    }
}

macro_rules! cluster_factory {
    ($name:ident, $store:ty, $stem:literal, |$opts:ident| $connect:expr) => {
        /// A namespace (key prefix) on the test cluster; each instance is
        /// a new store with its own cluster connection.
        pub struct $name {
            pub url: String,
            pub prefix: String,
            pub opts: RedisOptions,
            _cleanup: ClusterCleanup,
        }

        impl $name {
            pub async fn new() -> Self {
                let url = cluster_url().await;
                let prefix = unique_prefix($stem);
                Self {
                    opts: cluster_options(&url, &prefix),
                    _cleanup: ClusterCleanup::new(&url, &prefix),
                    url,
                    prefix,
                }
            }

            pub async fn connect(&self) -> Result<$store, Error> {
                let $opts = &self.opts;
                $connect.await
            }
        }

        #[async_trait]
        impl StoreFactory for $name {
            type Store = $store;

            async fn instance_with_clock(&self, clock: Arc<dyn Clock>) -> Arc<$store> {
                let $opts = &self.opts.clone().with_clock(clock);
                Arc::new(
                    $connect.await.unwrap_or_else(|e| {
                        panic!("cannot connect to the test Redis Cluster: {e}")
                    }),
                )
            }
        }
    };
}

cluster_factory!(ClusterLeaseFactory, RedisLeaseStore, "clease", |opts| {
    RedisLeaseStore::connect(opts)
});
cluster_factory!(ClusterStreamIdFactory, RedisStreamIdStore, "csid", |opts| {
    RedisStreamIdStore::connect(opts)
});
cluster_factory!(ClusterScriptFactory, RedisScriptStore, "cscript", |opts| {
    RedisScriptStore::connect(opts, RedisScriptStore::DEFAULT_WINDOW)
});
