//! What the NATS tests share: the server, factories for the suites
//! (directly or behind the testkit's slow proxy), and clean-up of the
//! streams and buckets tests create.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anarchon_nats::{ClaimOptions, NatsClaimStore, NatsLeaseOptions, NatsLeaseStore, NatsOptions};
use anarchon_testkit::servers::{Cluster, Service, require, require_cluster, unique_prefix};
use anarchon_testkit::{FaultProxy, Proxyable, StoreFactory};

/// The duplicate window the suites use: long enough for the default
/// `max_late` (60 s + 10 s margin).
pub(crate) const TEST_WINDOW: Duration = Duration::from_secs(90);

/// The server's URL (ANARCHON_NATS_URL, or the local default); fails the
/// test with instructions when there is none.
pub(crate) async fn url() -> String {
    require(Service::Nats).await
}

/// How long the cluster suites let one call to the cluster take. A
/// three-node cluster on a loaded two-core machine (the suites run two
/// tests at once, each racing eight instances, beside whatever else the
/// machine runs) has been seen to take longer than the stores' 5 s default
/// to answer a first `$JS.API.INFO`. The suites check who wins, not how
/// fast, so they wait longer rather than fail on a slow answer; the fault
/// tests keep their own short limits.
pub(crate) const CLUSTER_CALL_LIMIT: Duration = Duration::from_secs(20);

/// How many replicas the streams and buckets of the cluster tests have:
/// one per node of the test cluster.
pub(crate) const CLUSTER_REPLICAS: usize = 3;

/// The test NATS cluster's seed URL (ANARCHON_NATS_CLUSTER_URL, or the
/// local default); fails the test with instructions when there is none.
pub(crate) async fn cluster_url() -> String {
    let url = require_cluster(Cluster::Nats).await;
    // A connection that fails is left for the test to report.
    if let Ok(client) = async_nats::connect(url.as_str()).await {
        let version = client.server_info().version;
        let numbers: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
        assert!(
            numbers.as_slice() >= [2, 9, 21].as_slice(),
            "the test NATS cluster at {url} runs nats-server {version}: before 2.9.21 a clustered \
             stream can store two compare-and-swap writes of one key (nats-server issue 4320), \
             so the KV lease store's claims are not exclusive there. Run the cluster on a newer \
             server (`cargo xtask services --start` says how)"
        );
    }
    url
}

/// The server's `host:port` from a `nats://host:port` URL.
pub(crate) fn upstream(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = host.trim_end_matches('/');
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:4222")
    }
}

/// Claim options on a fresh prefix (and so a fresh stream).
pub(crate) fn claims() -> ClaimOptions {
    ClaimOptions::new()
        .with_prefix(unique_prefix("t"))
        .with_duplicate_window(TEST_WINDOW)
}

/// Connects, failing the test with the store's error.
pub(crate) async fn connect(connection: &NatsOptions, claims: ClaimOptions) -> NatsClaimStore {
    match NatsClaimStore::connect(connection, claims).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open the NATS claim store: {e}"),
    }
}

/// Deletes a test's stream when dropped, even when the test failed.
pub(crate) struct StreamGuard {
    url: String,
    stream: String,
}

impl StreamGuard {
    pub(crate) fn new(url: &str, stream: String) -> Self {
        Self {
            url: url.to_owned(),
            stream,
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let (url, stream) = (self.url.clone(), self.stream.clone());
        // The test's runtime may be shutting down: use a thread of our own.
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let client = async_nats::connect(url.as_str()).await.ok()?;
                let jetstream = async_nats::jetstream::new(client);
                tokio::time::timeout(Duration::from_secs(5), jetstream.delete_stream(&stream))
                    .await
                    .ok()?
                    .ok()
            })
        })
        .join();
        if !matches!(deleted, Ok(Some(_))) {
            eprintln!("note: could not delete the test stream {}", self.stream);
        }
    }
}

/// One prefix and stream per test; every `instance()` is a new store with
/// its own client, as separate processes would have.
pub(crate) struct NatsFactory {
    pub(crate) connection: NatsOptions,
    pub(crate) claims: ClaimOptions,
    /// `host:port` of the server.
    upstream: String,
    _guard: Option<StreamGuard>,
}

#[async_trait::async_trait]
impl StoreFactory for NatsFactory {
    type Store = NatsClaimStore;

    /// A claim store decides nothing on a clock (lateness is the
    /// scheduler's check), so `clock` has nothing to reach.
    async fn instance_with_clock(
        &self,
        _clock: Arc<dyn anarchon_core::Clock>,
    ) -> Arc<NatsClaimStore> {
        Arc::new(connect(&self.connection, self.claims.clone()).await)
    }
}

/// Lease options on a fresh bucket.
pub(crate) fn leases() -> NatsLeaseOptions {
    NatsLeaseOptions::new().with_bucket(unique_prefix("t"))
}

/// Connects a lease store, failing the test with the store's error.
pub(crate) async fn connect_leases(
    connection: &NatsOptions,
    leases: NatsLeaseOptions,
) -> NatsLeaseStore {
    match NatsLeaseStore::connect(connection, leases).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open the NATS lease store: {e}"),
    }
}

/// One bucket per test; every `instance()` is a new lease store with its
/// own client, as separate processes would have. The bucket is deleted
/// when the factory is dropped.
pub(crate) struct NatsLeaseFactory {
    pub(crate) connection: NatsOptions,
    pub(crate) leases: NatsLeaseOptions,
    /// `host:port` of the server.
    upstream: String,
    _guard: Option<StreamGuard>,
}

#[async_trait::async_trait]
impl StoreFactory for NatsLeaseFactory {
    type Store = NatsLeaseStore;

    /// The store learns the server's time from a write of its clock key
    /// and never reads a local clock (a unit test of the crate checks its
    /// source), so `clock` has nothing to reach.
    async fn instance_with_clock(
        &self,
        _clock: Arc<dyn anarchon_core::Clock>,
    ) -> Arc<NatsLeaseStore> {
        Arc::new(connect_leases(&self.connection, self.leases.clone()).await)
    }
}

/// What both factories do the same way around their namespace (the
/// field `$options`, made fresh by `$fresh()`): `new`, `through` and
/// reaching the server through a proxy.
macro_rules! factory_on_its_own_stream {
    ($factory:ty, $options:ident: $options_type:ty, $fresh:path) => {
        impl $factory {
            /// A fresh namespace on the test server, deleted when the
            /// factory is dropped.
            pub(crate) async fn new() -> Self {
                Self::on(url().await, $fresh())
            }

            /// A fresh namespace with three replicas on the test NATS
            /// cluster (`ANARCHON_NATS_CLUSTER_URL`, or the local one),
            /// deleted when the factory is dropped.
            pub(crate) async fn on_cluster() -> Self {
                Self::on(
                    cluster_url().await,
                    $fresh().with_replicas(CLUSTER_REPLICAS),
                )
            }

            /// The namespace of `$options` on the server (or cluster) at
            /// `url`, deleted when the factory is dropped.
            fn on(url: String, $options: $options_type) -> Self {
                Self {
                    _guard: Some(StreamGuard::new(&url, $options.stream_name())),
                    upstream: upstream(&url),
                    connection: NatsOptions::new(url),
                    $options,
                }
            }

            /// The same factory, its instances waiting up to `limit` for
            /// each call to the server.
            pub(crate) fn with_call_limit(mut self, limit: Duration) -> Self {
                self.connection = self.connection.with_timeout(limit);
                self
            }

            /// Another factory on the same namespace whose instances
            /// connect to `url` (a proxy) with a 1 s call limit; the
            /// namespace stays this one's to delete.
            pub(crate) fn through(&self, url: String) -> Self {
                Self {
                    _guard: None,
                    upstream: self.upstream.clone(),
                    connection: NatsOptions::new(url).with_timeout(Duration::from_secs(1)),
                    $options: self.$options.clone(),
                }
            }
        }

        impl Proxyable for $factory {
            type Through = $factory;

            fn upstream(&self) -> String {
                self.upstream.clone()
            }

            /// [`Self::through`] the proxy's `nats://` URL.
            fn through_proxy(&self, proxy: &FaultProxy) -> $factory {
                self.through(format!("nats://{}", proxy.address()))
            }
        }
    };
}

factory_on_its_own_stream!(NatsFactory, claims: ClaimOptions, claims);
factory_on_its_own_stream!(NatsLeaseFactory, leases: NatsLeaseOptions, leases);

/// Creates `config`'s stream as another program would. The server answers
/// some failures to create a stream's storage with a bare 500 ("error
/// creating store for stream", writing the cause only to its own log),
/// and they pass; the stores try again on it, and so does this.
pub(crate) async fn create_stream(
    jetstream: &async_nats::jetstream::Context,
    config: async_nats::jetstream::stream::Config,
) {
    use async_nats::jetstream::context::CreateStreamErrorKind;
    let mut failures = Vec::new();
    for _ in 0..5 {
        match jetstream.create_stream(config.clone()).await {
            Ok(_) => return,
            Err(e) if matches!(e.kind(), CreateStreamErrorKind::JetStream(js) if js.code() == 500) =>
            {
                failures.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("creating the stream {}: {e}", config.name),
        }
    }
    panic!(
        "creating the stream {} failed on the server five times: {failures:?}",
        config.name
    );
}
