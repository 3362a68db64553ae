//! What the PostgreSQL tests share: the server, a factory with its own
//! table per test (directly or through a slow proxy), and clean-up.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use anarchon_core::Clock;
use anarchon_pg::{PgOptions, PgStore, TableName};
use anarchon_testkit::servers::{Service, require, unique_prefix};
use anarchon_testkit::{FaultProxy, Proxyable, StoreFactory};
use async_trait::async_trait;
use sqlx::{Connection, PgConnection};

/// The test server's URL (`ANARCHON_PG_URL` or the local default); fails
/// the test with instructions when there is none.
pub async fn url() -> String {
    require(Service::Postgres).await
}

/// A fresh, unused table name.
pub fn fresh_table() -> TableName {
    TableName::new(&unique_prefix("anarchon_t_")).expect("unique_prefix makes valid table names")
}

/// A plain connection to the test server, for checks from the outside.
pub async fn admin(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"))
}

/// `url` split around its `host[:port]`: (scheme and user, host, rest).
fn split_host(url: &str) -> (String, &str, &str) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{scheme}://{user}@"), host, tail),
        None => (format!("{scheme}://"), authority, tail),
    }
}

/// The server's `host:port` in `url`.
pub fn upstream(url: &str) -> String {
    let (_, host, _) = split_host(url);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// `url` with `proxy`'s address in place of the server's.
pub fn via(url: &str, proxy: &FaultProxy) -> String {
    let (head, _, tail) = split_host(url);
    format!("{head}{}{tail}", proxy.address())
}

/// One table per test; every [`StoreFactory::instance`] is a new
/// [`PgStore`] with its own pool. The table and its objects are dropped
/// when the factory is, even when the test failed.
pub struct PgFactory {
    url: String,
    /// Where instances connect: `url`, or a proxy in front of it.
    connect_to: String,
    table: TableName,
    /// Whether dropping this factory drops the table (not for a second
    /// factory on the same table, see [`Proxyable::through_proxy`]).
    owns_table: bool,
}

impl PgFactory {
    /// A factory on a fresh table.
    pub async fn new() -> Self {
        let url = url().await;
        Self {
            connect_to: url.clone(),
            url,
            table: fresh_table(),
            owns_table: true,
        }
    }

    /// This factory with instances that connect to `url` (a proxy in front
    /// of the server) instead; [`Self::url`] and the clean-up still go
    /// straight to the server.
    pub fn through(mut self, url: String) -> Self {
        self.connect_to = url;
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The factory's table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The options every instance uses: a small pool of its own.
    pub fn options(&self) -> PgOptions {
        PgOptions::new(&self.connect_to)
            .with_table_name(self.table.clone())
            .with_pool_size(2)
    }

    /// A store with `options`.
    pub async fn store_with(&self, options: PgOptions) -> PgStore {
        PgStore::connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("cannot open a PostgreSQL store: {e}"))
    }
}

#[async_trait]
impl StoreFactory for PgFactory {
    type Store = PgStore;

    /// The store reads `clock_timestamp()` inside its statements; it
    /// computes nothing on the client side, so `clock` has nothing to reach.
    async fn instance_with_clock(&self, _clock: Arc<dyn Clock>) -> Arc<PgStore> {
        Arc::new(self.store_with(self.options()).await)
    }
}

impl Proxyable for PgFactory {
    type Through = PgFactory;

    fn upstream(&self) -> String {
        upstream(&self.url)
    }

    fn through_proxy(&self, proxy: &FaultProxy) -> PgFactory {
        PgFactory {
            url: self.url.clone(),
            connect_to: via(&self.url, proxy),
            table: self.table.clone(),
            owns_table: false,
        }
    }
}

impl Drop for PgFactory {
    fn drop(&mut self) {
        if !self.owns_table {
            return;
        }
        let url = self.url.clone();
        let table = self.table.clone();
        // Drop runs inside the test's runtime (or while unwinding): clean up
        // on a thread of our own with a runtime of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&url).await {
                    let _ = anarchon_pg::migrate::drop_schema(&mut conn, &table).await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// A 30 s heartbeat of `run` with `token` on `store` renews the lease;
/// `what` names the heartbeat, should it fail.
pub async fn heartbeat_renews(
    store: &PgStore,
    run: &anarchon_core::RunKey,
    token: anarchon_core::Token,
    what: &str,
) {
    use anarchon_core::LeaseStore as _;
    let renewal = store
        .heartbeat(run, token, std::time::Duration::from_secs(30))
        .await
        .expect(what);
    assert_eq!(renewal, anarchon_core::Renewal::Renewed, "{what}");
}
