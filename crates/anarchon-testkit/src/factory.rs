//! How a suite gets stores: one factory per test, one handle per instance.

use std::sync::Arc;

use anarchon_core::{ClaimStore, Clock, MemoryStore, SystemClock};
use async_trait::async_trait;

use crate::clock::TestClock;
use crate::stores::ClaimOnlyStore;

/// Makes store handles for one test.
///
/// A factory stands for one isolated namespace on a store (its own table,
/// key prefix, stream, file); every test gets a new factory, so tests run in
/// parallel against one server. Each [`StoreFactory::instance`] call is one
/// simulated instance of a service: its own connection pool onto the same
/// namespace, never a clone of another handle.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// The store type.
    type Store: ClaimStore;

    /// A new handle onto this factory's namespace, opened as an instance
    /// whose process clock reads `clock` would open it.
    ///
    /// The kit gives instances clocks a minute off the store's to check
    /// that a lease store decides on its own clock only. Whatever the
    /// store computes on the client side (a trimming horizon, an estimate
    /// of the server's time) must read `clock`, so those checks reach it; a
    /// store with nothing on the client side ignores it, and its factory
    /// says why in a comment.
    ///
    /// Panics (failing the test with a message that says how to provide a
    /// server) when the store cannot be reached.
    async fn instance_with_clock(&self, clock: Arc<dyn Clock>) -> Arc<Self::Store>;

    /// A new handle onto this factory's namespace, on the factory's
    /// [`clock`](Self::clock).
    async fn instance(&self) -> Arc<Self::Store> {
        self.instance_with_clock(self.clock()).await
    }

    /// A clock that reads about what the store's clock reads. Real servers:
    /// the system clock. In-process stores on a [`TestClock`]: that clock.
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SystemClock)
    }
}

/// One store shared by every "instance", as processes share a server,
/// with a [`TestClock`] for the schedulers: what [`MemoryFactory`] and
/// [`ClaimOnlyFactory`] are.
#[derive(Debug)]
pub struct SharedStoreFactory<S> {
    store: Arc<S>,
    clock: Arc<TestClock>,
}

/// One [`MemoryStore`] on a [`TestClock`]; every "instance" shares it, as
/// processes share a server.
pub type MemoryFactory = SharedStoreFactory<MemoryStore>;

/// One [`ClaimOnlyStore`] shared by every instance, with a [`TestClock`]
/// for the schedulers.
pub type ClaimOnlyFactory = SharedStoreFactory<ClaimOnlyStore>;

impl MemoryFactory {
    /// A fresh store whose clock starts at the real time now.
    pub fn new() -> Self {
        let clock = TestClock::new();
        Self {
            store: Arc::new(MemoryStore::with_clock(clock.clone())),
            clock,
        }
    }

    /// The shared store.
    pub fn store(&self) -> Arc<MemoryStore> {
        self.store.clone()
    }
}

impl ClaimOnlyFactory {
    /// A fresh store.
    pub fn new() -> Self {
        Self {
            store: Arc::default(),
            clock: TestClock::new(),
        }
    }
}

impl Default for MemoryFactory {
    fn default() -> Self {
        Self::new()
    }
}

impl Default for ClaimOnlyFactory {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl<S: ClaimStore> StoreFactory for SharedStoreFactory<S> {
    type Store = S;

    /// Every instance shares the one store. A `MemoryStore` decides on its
    /// own clock and has no client side to read `clock`; a claim-only store
    /// decides nothing on a clock (claim-only stores leave lateness to the
    /// scheduler).
    async fn instance_with_clock(&self, _clock: Arc<dyn Clock>) -> Arc<S> {
        self.store.clone()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }
}

/// How much a [`ProxiedFactory`] made by the backends' "slow link" suites
/// delays each chunk, each way: enough that racing claims overlap as they
/// would between hosts, little enough for a suite to stay quick.
pub const SLOW_LINK_LATENCY: std::time::Duration = std::time::Duration::from_millis(2);

/// A factory whose instances all reach the server through one
/// [`FaultProxy`](crate::FaultProxy), which lives as long as the factory.
///
/// `factory` must already point at the proxy. Every new instance has to
/// open a connection through it: a URL that misses the proxy fails the test
/// instead of quietly testing the direct path. `K` is anything else to keep
/// alive as long (say, the direct factory that cleans up at the end).
pub struct ProxiedFactory<F, K = ()> {
    factory: F,
    proxy: crate::FaultProxy,
    _keep: K,
}

impl<F: StoreFactory> ProxiedFactory<F> {
    /// Wraps `factory`, whose instances connect through `proxy`.
    pub fn new(factory: F, proxy: crate::FaultProxy) -> Self {
        Self {
            factory,
            proxy,
            _keep: (),
        }
    }

    /// Also keeps `keep` alive until the factory is dropped.
    pub fn keeping<K: Send + Sync + 'static>(self, keep: K) -> ProxiedFactory<F, K> {
        ProxiedFactory {
            factory: self.factory,
            proxy: self.proxy,
            _keep: keep,
        }
    }
}

impl<F, K> ProxiedFactory<F, K> {
    /// The proxy, to inject faults while a check runs.
    pub fn proxy(&self) -> &crate::FaultProxy {
        &self.proxy
    }

    /// The wrapped factory.
    pub fn factory(&self) -> &F {
        &self.factory
    }
}

#[async_trait]
impl<F: StoreFactory, K: Send + Sync + 'static> StoreFactory for ProxiedFactory<F, K> {
    type Store = F::Store;

    async fn instance_with_clock(&self, clock: Arc<dyn Clock>) -> Arc<F::Store> {
        let before = self.proxy.connections();
        let store = self.factory.instance_with_clock(clock).await;
        assert!(
            self.proxy.connections() > before,
            "a new instance opened no connection through the proxy"
        );
        store
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.factory.clock()
    }
}

/// A factory whose instances can reach their server through a
/// [`FaultProxy`](crate::FaultProxy): what [`fault_suite!`](crate::fault_suite)
/// and [`behind_a_slow_proxy`] need from a networked backend.
pub trait Proxyable: StoreFactory + Sized {
    /// The factory [`Self::through_proxy`] makes.
    type Through: StoreFactory<Store = Self::Store>;

    /// `host:port` of the server this factory's instances connect to: where
    /// a proxy forwards to.
    fn upstream(&self) -> String;

    /// A factory on this factory's namespace whose instances connect to
    /// `proxy` (started in front of [`Self::upstream`]) instead of the
    /// server, with the same credentials and options. Cleaning the
    /// namespace up stays with `self`.
    fn through_proxy(&self, proxy: &crate::FaultProxy) -> Self::Through;
}

/// `factory` with every instance behind one [`FaultProxy`](crate::FaultProxy)
/// that delays each chunk by [`SLOW_LINK_LATENCY`] both ways: on loopback a
/// claim comes back in microseconds and racing instances hardly overlap;
/// here each round trip takes milliseconds on a real TCP path, so claims of
/// one run are in flight together as they would be between hosts.
pub async fn behind_a_slow_proxy<F: Proxyable>(factory: F) -> ProxiedFactory<F::Through, F> {
    let proxy = crate::FaultProxy::start(factory.upstream())
        .await
        .expect("a local port for the proxy");
    proxy.set_latency(SLOW_LINK_LATENCY);
    ProxiedFactory::new(factory.through_proxy(&proxy), proxy).keeping(factory)
}
