//! What the AMQP tests share: the server, and a factory for the suites.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anarchon_amqp::{AmqpOptions, AmqpStore};
use anarchon_testkit::StoreFactory;
use anarchon_testkit::servers::{Service, require, unique_prefix};

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
}

#[async_trait::async_trait]
impl StoreFactory for AmqpFactory {
    type Store = AmqpStore;

    async fn instance(&self) -> Arc<AmqpStore> {
        Arc::new(connect(self.options.clone()).await)
    }
}
