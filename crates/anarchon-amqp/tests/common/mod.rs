//! What the AMQP tests share: the server, and a factory for the suites
//! (directly or behind the testkit's slow proxy).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore};
use anarchon_testkit::servers::{Service, require, unique_prefix};
use anarchon_testkit::{FaultProxy, Proxyable, StoreFactory};

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
        .with_prefix(unique_prefix("t"))
        .with_slot_ttl(TEST_SLOT_TTL)
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
    /// The broker's URL.
    url: String,
    options: AmqpOptions,
}

impl AmqpFactory {
    /// A factory on a fresh prefix.
    pub(crate) async fn new() -> Self {
        Self {
            url: url().await,
            options: options().await,
        }
    }
}

impl Proxyable for AmqpFactory {
    type Through = AmqpFactory;

    fn upstream(&self) -> String {
        through(&self.url, None).1
    }

    /// This factory's prefix and options, with instances that connect to
    /// `proxy` instead of the broker.
    fn through_proxy(&self, proxy: &FaultProxy) -> AmqpFactory {
        let (proxied, _) = through(&self.url, Some(proxy));
        AmqpFactory {
            url: self.url.clone(),
            options: AmqpOptions::new(proxied)
                .with_prefix(self.options.prefix())
                .with_slot_ttl(self.options.slot_ttl())
                .with_timeout(self.options.timeout()),
        }
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
