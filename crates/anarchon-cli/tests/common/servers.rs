//! The test servers the CLI's tests run daemons against, found as the
//! testkit finds them, and guards that remove what a test left on them
//! (its stream, keys or table), passed or failed.

use std::time::Duration;

use anarchon_testkit::servers::{Service, require};

/// A runtime for set-up and clean-up.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for set-up and clean-up")
}

/// The test server's URL for `service` (the test fails, saying how to
/// provide one, when there is none).
pub fn server(service: Service) -> String {
    runtime().block_on(require(service))
}

/// `url` with `params` added to its query.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Deletes a test's NATS stream when dropped.
pub struct NatsStream {
    url: String,
    stream: String,
}

impl NatsStream {
    pub fn named(url: &str, stream: String) -> Self {
        Self {
            url: url.to_owned(),
            stream,
        }
    }
}

impl Drop for NatsStream {
    fn drop(&mut self) {
        let deleted = runtime().block_on(async {
            let client = async_nats::connect(self.url.as_str()).await.ok()?;
            let jetstream = async_nats::jetstream::new(client);
            tokio::time::timeout(
                Duration::from_secs(5),
                jetstream.delete_stream(&self.stream),
            )
            .await
            .ok()?
            .ok()
        });
        if deleted.is_none() {
            eprintln!("note: could not delete the test stream {}", self.stream);
        }
    }
}

/// Deletes every key under a test's Redis prefix when dropped.
pub struct RedisKeys {
    url: String,
    prefix: String,
}

impl RedisKeys {
    pub fn under(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        use deadpool_redis::redis::{self, Commands as _};
        let Ok(mut conn) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        else {
            eprintln!("note: could not delete the test keys {}*", self.prefix);
            return;
        };
        for pattern in [
            format!("{{{}:*", self.prefix),
            format!("{{{}}}:*", self.prefix),
            format!("{}:*", self.prefix),
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

/// Drops a test's PostgreSQL table (and its companions) when dropped.
pub struct PgTable {
    url: String,
    table: String,
}

impl PgTable {
    pub fn named(url: &str, table: &str) -> Self {
        Self {
            url: url.to_owned(),
            table: table.to_owned(),
        }
    }
}

impl Drop for PgTable {
    fn drop(&mut self) {
        let dropped = runtime().block_on(async {
            // `connect_with` would create a missing table only to drop it:
            // harmless, and it makes the clean-up not depend on how far
            // the test got.
            let options = anarchon::pg::PgOptions::new(self.url.as_str())
                .with_table(&self.table)
                .ok()?;
            let store = anarchon::pg::PgStore::connect_with(options).await.ok()?;
            let dropped = store.drop_schema().await.ok();
            store.close().await;
            dropped
        });
        if dropped.is_none() {
            eprintln!("note: could not drop the test table {}", self.table);
        }
    }
}

/// The lease stores the daemon's fleet tests run on, each in a namespace
/// of the test's own.
#[derive(Clone, Copy, Debug)]
pub enum Lease {
    /// A SQLite file in the test's directory.
    Sqlite,
    /// A table of its own on the test PostgreSQL server.
    Postgres,
    /// A key prefix of its own on the test Redis server.
    Redis,
    /// A KV bucket of its own on the test NATS server.
    NatsKv,
}

/// A lease store for one test: its URL, and the guard that removes the
/// test's table, keys or bucket when dropped, passed or failed.
pub struct LeaseStore {
    /// The store URL for the crontab's `store`.
    pub url: String,
    _cleanup: Cleanup,
}

/// What a [`LeaseStore`] removes when dropped.
enum Cleanup {
    /// The file goes with the test's directory.
    Nothing,
    Table(PgTable),
    Keys(RedisKeys),
    Bucket(NatsStream),
}

impl Lease {
    /// A fresh namespace on this store, named from `tag` (a short word for
    /// the test); a SQLite file goes in `dir`.
    pub fn store(self, dir: &std::path::Path, tag: &str) -> LeaseStore {
        let name = anarchon_testkit::servers::unique_prefix(tag);
        let (url, cleanup) = match self {
            Lease::Sqlite => (
                format!("sqlite://{}", dir.join(format!("{tag}.db")).display()),
                Cleanup::Nothing,
            ),
            Lease::Postgres => {
                let base = server(Service::Postgres);
                let guard = PgTable::named(&base, &name);
                let url = with_params(&base, &format!("table={name}&pool_size=2"));
                (url, Cleanup::Table(guard))
            }
            Lease::Redis => {
                let base = server(Service::Redis);
                let guard = RedisKeys::under(&base, &name);
                (
                    with_params(&base, &format!("prefix={name}")),
                    Cleanup::Keys(guard),
                )
            }
            Lease::NatsKv => {
                let base = server(Service::Nats);
                let guard = NatsStream::named(&base, format!("KV_{name}"));
                let url = with_params(
                    &base.replacen("nats://", "nats-kv://", 1),
                    &format!("bucket={name}"),
                );
                (url, Cleanup::Bucket(guard))
            }
        };
        LeaseStore {
            url,
            _cleanup: cleanup,
        }
    }
}

/// One test per lease store, in a module `$name`: `on_sqlite`,
/// `on_postgres`, `on_redis` and `on_nats_kv`, each calling
/// `$body(dir, url)` with a fresh temporary directory and a fresh
/// namespace on that store.
#[allow(unused_macros)]
macro_rules! on_every_lease_store {
    ($(#[$doc:meta])* $name:ident, $tag:literal, $body:path) => {
        $(#[$doc])*
        mod $name {
            use super::*;

            fn on(lease: common::servers::Lease) {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let store = lease.store(dir.path(), $tag);
                $body(dir.path(), &store.url);
            }

            #[test]
            fn on_sqlite() {
                on(common::servers::Lease::Sqlite);
            }

            #[test]
            fn on_postgres() {
                on(common::servers::Lease::Postgres);
            }

            #[test]
            fn on_redis() {
                on(common::servers::Lease::Redis);
            }

            #[test]
            fn on_nats_kv() {
                on(common::servers::Lease::NatsKv);
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_every_lease_store;
