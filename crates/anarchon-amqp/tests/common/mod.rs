//! What the AMQP tests share: the server, and a factory for the suites
//! (directly or behind the testkit's slow proxy).

#![allow(dead_code)]

use anarchon_testkit::{ProxiedFactory, SLOW_LINK_LATENCY};
use std::sync::Arc;
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore};
use anarchon_testkit::servers::{Service, require, unique_prefix};
use anarchon_testkit::{FaultProxy, StoreFactory};

/// The slot TTL the suites use: long enough for the default `max_late`
/// (60 s + 10 s margin), short enough that test queues vanish soon.
pub(crate) const TEST_SLOT_TTL: Duration = Duration::from_secs(90);

/// The broker's URL (ANARCHON_AMQP_URL, or the local default); fails the
/// test with instructions when there is none.
pub(crate) async fn url() -> String {
    require(Service::Amqp).await
}

/// Options for a fresh prefix on the test broker.
pub(crate) async fn options() -> AmqpOptions {
    AmqpOptions::new(url().await)
        .prefix(unique_prefix("t"))
        .slot_ttl(TEST_SLOT_TTL)
}

/// `url` pointed at `proxy` instead of the broker, and the broker's
/// `host:port`.
pub(crate) fn through(url: &str, proxy: Option<&FaultProxy>) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let upstream = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5672")
    };
    let target = proxy.map_or(upstream.clone(), |p| p.address().to_string());
    (format!("{scheme}://{userinfo}{target}{tail}"), upstream)
}

/// Connects, failing the test with the store's error.
pub(crate) async fn connect(options: AmqpOptions) -> AmqpStore {
    match AmqpStore::connect(options).await {
        Ok(store) => store,
        Err(e) => panic!("cannot open the RabbitMQ store: {e}"),
    }
}

/// One prefix per test; every `instance()` is a new store with its own
/// connection, as separate processes would have.
pub(crate) struct AmqpFactory {
    options: AmqpOptions,
}

impl AmqpFactory {
    /// A factory on a fresh prefix.
    pub(crate) async fn new() -> Self {
        Self {
            options: options().await,
        }
    }

    /// This factory's prefix, with instances that connect to `url` (a
    /// proxy in front of the broker) instead.
    pub(crate) fn through(self, url: String) -> Self {
        let old = self.options;
        Self {
            options: AmqpOptions::new(url)
                .prefix(old.get_prefix())
                .slot_ttl(old.get_slot_ttl())
                .timeout(old.get_timeout()),
        }
    }

    /// This factory with every instance behind one [`FaultProxy`] that
    /// delays each chunk by [`SLOW_LINK_LATENCY`] both ways.
    pub(crate) async fn behind_a_slow_proxy(self) -> ProxiedFactory<Self> {
        let url = url().await;
        let (_, upstream) = through(&url, None);
        let proxy = FaultProxy::start(upstream)
            .await
            .expect("a local port for the proxy");
        proxy.set_latency(SLOW_LINK_LATENCY);
        let (proxied, _) = through(&url, Some(&proxy));
        ProxiedFactory::new(self.through(proxied), proxy)
    }
}

#[async_trait::async_trait]
impl StoreFactory for AmqpFactory {
    type Store = AmqpStore;

    /// A claim store decides nothing on a clock (lateness is the
    /// scheduler's check), so `clock` has nothing to reach.
    async fn instance_with_clock(&self, _clock: Arc<dyn anarchon_core::Clock>) -> Arc<AmqpStore> {
        Arc::new(connect(self.options.clone()).await)
    }
}
