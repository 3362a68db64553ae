//! Stores in front of other stores: a forwarding layer with default methods.
//!
//! Tests and tools wrap a store to change one or two of its calls: inject a
//! fault, record a history, count round trips, break one rule on purpose.
//! Written against [`ClaimStore`] and [`LeaseStore`] directly, each such
//! wrapper forwards every other method by hand, and a method added to the
//! store traits later must be added to every wrapper — or, for a method
//! with a default body, is silently answered by that default instead of by
//! the wrapped store (a [`LeaseStore::claim_many`] that claims one by one
//! where the store would have sent one round trip).
//!
//! Here, as in OpenDAL's layered accessor, a wrapper implements a layer
//! trait instead: it names the store it wraps ([`ClaimLayer::inner`],
//! [`LeaseLayer::inner`]) and writes only the methods it changes; every
//! other method forwards to the inner store by default. A blanket impl
//! then makes every layer a store:
//!
//! * a [`LeaseLayer`] is a [`ClaimLayer`], a [`ClaimStore`] and a
//!   [`LeaseStore`], and its [`ClaimStore::as_lease_store`] is the wrapper
//!   itself — never the inner store, which would let the scheduler's lease
//!   calls bypass the wrapper;
//! * a [`ClaimLayer`] that is not a lease layer is a [`ClaimStore`] only,
//!   and says itself whether it is a lease store (there is no default, as
//!   for every store; a claim-only wrapper answers `None`).
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! use anarchon_core::layer::LeaseLayer;
//! use anarchon_core::{
//!     ClaimOutcome, ClaimStore, LeaseClaim, LeaseStore, MemoryStore, StoreError, async_trait,
//! };
//!
//! /// Counts lease claims; every other call goes straight through.
//! struct CountClaims {
//!     inner: Arc<MemoryStore>,
//!     claims: AtomicU64,
//! }
//!
//! #[async_trait]
//! impl LeaseLayer for CountClaims {
//!     type Inner = MemoryStore;
//!
//!     fn inner(&self) -> &MemoryStore {
//!         &self.inner
//!     }
//!
//!     async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
//!         self.claims.fetch_add(1, Ordering::Relaxed);
//!         self.inner.claim_lease(req).await
//!     }
//! }
//!
//! let store = Arc::new(CountClaims { inner: Arc::new(MemoryStore::new()), claims: AtomicU64::new(0) });
//! // Still a lease store, seen through `dyn ClaimStore` too.
//! let dynamic: Arc<dyn ClaimStore> = store;
//! assert!(dynamic.as_lease_store().is_some());
//! ```
//!
//! # Coherence
//!
//! The blanket impls cover sized types that implement a layer trait. A
//! backend implements [`ClaimStore`] and [`LeaseStore`] for its own type,
//! which implements no layer trait, so the two never overlap; `dyn
//! ClaimStore` and `dyn LeaseStore` are unsized and keep the compiler's own
//! impls. A type is either a store written out in full or a layer, never
//! both.
//!
//! The layer traits are not re-exported at the crate root: their methods
//! share the store traits' names, so a glob import of the crate would make
//! a call such as `claim` ambiguous on every layered type. Import them from
//! here where a wrapper is written.
//!
//! # Adding a store method
//!
//! A method added to [`ClaimStore`] or [`LeaseStore`] is added here once:
//! to the layer trait, with a body that forwards to the inner store, and to
//! the blanket impl. Required methods fail to compile until then; a
//! provided method (one with a default body) must not be forgotten, or
//! layers answer with the trait's default instead of the inner store's.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::control::{Pause, PauseRequest, PauseScope, Pauses};
use crate::error::StoreError;
use crate::hand_over::HandOvers;
use crate::ids::Token;
use crate::name::JobName;
use crate::request::{RunRequest, RunRequests, TriggerRequest};
use crate::store::{
    BackendInfo, ClaimAnswers, ClaimOutcome, ClaimRequest, ClaimStore, LeaseClaim, LeaseStore,
    Renewal, RunKey, RunOutcome, RunRecord, RunView,
};

/// A claim store in front of another claim store: every method forwards to
/// [`Self::inner`] unless the wrapper overrides it.
///
/// Every `ClaimLayer` is a [`ClaimStore`]. For a wrapper of a lease store
/// implement [`LeaseLayer`] instead, which makes the wrapper a lease store
/// and a `ClaimLayer` too.
#[async_trait]
pub trait ClaimLayer: Send + Sync + 'static {
    /// The store this one wraps.
    type Inner: ClaimStore + ?Sized;

    /// The wrapped store, where calls the wrapper does not change go.
    fn inner(&self) -> &Self::Inner;

    /// [`ClaimStore::claim`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner().claim(req).await
    }

    /// [`ClaimStore::info`]; forwards by default.
    fn info(&self) -> BackendInfo {
        self.inner().info()
    }

    /// [`ClaimStore::ping`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner().ping().await
    }

    /// [`ClaimStore::as_lease_store`]: whether the wrapper is a lease store.
    /// No default, as for every store. A wrapper that is only a
    /// `ClaimLayer` is not a lease store and answers `None`, even when the
    /// store inside is one: the inner store's lease calls would bypass the
    /// wrapper. [`LeaseLayer`]s answer `Some(self)` without writing it.
    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>>;
}

/// A lease store in front of another lease store: every method of
/// [`ClaimStore`] and [`LeaseStore`] forwards to [`Self::inner`] unless the
/// wrapper overrides it.
///
/// Every `LeaseLayer` is a [`ClaimLayer`], a [`ClaimStore`] and a
/// [`LeaseStore`]; its [`ClaimStore::as_lease_store`] is the wrapper itself.
#[async_trait]
pub trait LeaseLayer: Send + Sync + 'static {
    /// The lease store this one wraps.
    type Inner: LeaseStore + ?Sized;

    /// The wrapped store, where calls the wrapper does not change go.
    fn inner(&self) -> &Self::Inner;

    /// [`ClaimStore::claim`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner().claim(req).await
    }

    /// [`ClaimStore::info`]; forwards by default.
    fn info(&self) -> BackendInfo {
        self.inner().info()
    }

    /// [`ClaimStore::ping`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner().ping().await
    }

    /// [`LeaseStore::claim_lease`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        self.inner().claim_lease(req).await
    }

    /// [`LeaseStore::claim_many`]; forwards by default, so the inner
    /// store's batch (one round trip where it has one) is what is sent.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        self.inner().claim_many(reqs).await
    }

    /// [`LeaseStore::peek`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.inner().peek(run).await
    }

    /// [`LeaseStore::heartbeat`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.inner().heartbeat(run, token, lease).await
    }

    /// [`LeaseStore::finish`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        self.inner().finish(run, token, outcome).await
    }

    /// [`LeaseStore::release`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.inner().release(run, token).await
    }

    /// [`LeaseStore::give_back`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.inner().give_back(run, token).await
    }

    /// [`LeaseStore::wait_for_hand_over`]; forwards by default.
    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.inner().wait_for_hand_over(run, timeout).await
    }

    /// [`LeaseStore::hand_overs`]; the inner store's board.
    fn hand_overs(&self) -> &HandOvers {
        self.inner().hand_overs()
    }

    /// [`LeaseStore::history`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.inner().history(job, limit).await
    }

    /// [`LeaseStore::collect_garbage`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.inner().collect_garbage(keep).await
    }

    /// [`LeaseStore::pause`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        self.inner().pause(scope, req).await
    }

    /// [`LeaseStore::resume`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        self.inner().resume(scope).await
    }

    /// [`LeaseStore::jobs`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        self.inner().jobs().await
    }

    /// [`LeaseStore::pauses`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn pauses(&self) -> Result<Pauses, StoreError> {
        self.inner().pauses().await
    }

    /// [`LeaseStore::request_run`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        self.inner().request_run(req).await
    }

    /// [`LeaseStore::run_requests`]; forwards by default.
    ///
    /// # Errors
    ///
    /// The inner store's, unless overridden.
    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        self.inner().run_requests().await
    }

    /// [`LeaseStore::announcements`]; forwards by default.
    fn announcements(&self) -> broadcast::Receiver<RunKey> {
        self.inner().announcements()
    }
}

#[async_trait]
impl<L: LeaseLayer> ClaimLayer for L {
    type Inner = <L as LeaseLayer>::Inner;

    fn inner(&self) -> &Self::Inner {
        LeaseLayer::inner(self)
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        LeaseLayer::claim(self, req).await
    }

    fn info(&self) -> BackendInfo {
        LeaseLayer::info(self)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        LeaseLayer::ping(self).await
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        Some(self)
    }
}

#[async_trait]
impl<L: ClaimLayer> ClaimStore for L {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        ClaimLayer::claim(self, req).await
    }

    fn info(&self) -> BackendInfo {
        ClaimLayer::info(self)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        ClaimLayer::ping(self).await
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        ClaimLayer::as_lease_store(self)
    }
}

#[async_trait]
impl<L: LeaseLayer> LeaseStore for L {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        LeaseLayer::claim_lease(self, req).await
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        LeaseLayer::claim_many(self, reqs).await
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        LeaseLayer::peek(self, run).await
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        LeaseLayer::heartbeat(self, run, token, lease).await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        LeaseLayer::finish(self, run, token, outcome).await
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        LeaseLayer::release(self, run, token).await
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        LeaseLayer::give_back(self, run, token).await
    }

    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        LeaseLayer::wait_for_hand_over(self, run, timeout).await
    }

    fn hand_overs(&self) -> &HandOvers {
        LeaseLayer::hand_overs(self)
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        LeaseLayer::history(self, job, limit).await
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        LeaseLayer::collect_garbage(self, keep).await
    }

    async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
        LeaseLayer::pause(self, scope, req).await
    }

    async fn resume(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        LeaseLayer::resume(self, scope).await
    }

    async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
        LeaseLayer::jobs(self).await
    }

    async fn pauses(&self) -> Result<Pauses, StoreError> {
        LeaseLayer::pauses(self).await
    }

    async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
        LeaseLayer::request_run(self, req).await
    }

    async fn run_requests(&self) -> Result<RunRequests, StoreError> {
        LeaseLayer::run_requests(self).await
    }

    fn announcements(&self) -> broadcast::Receiver<RunKey> {
        LeaseLayer::announcements(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use super::*;
    use crate::ids::InstanceId;
    use crate::request::RequestId;
    use crate::store::{Memory, RunState};
    use crate::time::{Slot, Timestamp};

    /// A lease store that answers every call and notes which one it was.
    #[derive(Default)]
    struct Probe {
        calls: Mutex<Vec<&'static str>>,
        board: HandOvers,
    }

    impl Probe {
        fn saw(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }

        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl ClaimStore for Probe {
        async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            self.saw("claim");
            Ok(ClaimOutcome::Lost)
        }

        fn info(&self) -> BackendInfo {
            self.saw("info");
            BackendInfo {
                name: "probe",
                memory: Memory::Forever,
            }
        }

        async fn ping(&self) -> Result<(), StoreError> {
            self.saw("ping");
            Ok(())
        }

        fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
            Some(self)
        }
    }

    #[async_trait]
    impl LeaseStore for Probe {
        async fn claim_lease(&self, _: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
            self.saw("claim_lease");
            Ok(ClaimOutcome::Lost)
        }

        async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
            self.saw("claim_many");
            Ok(vec![ClaimOutcome::Lost; reqs.len()].into())
        }

        async fn peek(&self, _: &RunKey) -> Result<RunView, StoreError> {
            self.saw("peek");
            Ok(RunView {
                store_now: Timestamp::from_millis(0),
                state: RunState::Absent,
            })
        }

        async fn heartbeat(
            &self,
            _: &RunKey,
            _: Token,
            _: Duration,
        ) -> Result<Renewal, StoreError> {
            self.saw("heartbeat");
            Ok(Renewal::Renewed)
        }

        async fn finish(&self, _: &RunKey, _: Token, _: RunOutcome) -> Result<Renewal, StoreError> {
            self.saw("finish");
            Ok(Renewal::Renewed)
        }

        async fn release(&self, _: &RunKey, _: Token) -> Result<Renewal, StoreError> {
            self.saw("release");
            Ok(Renewal::Renewed)
        }

        async fn give_back(&self, _: &RunKey, _: Token) -> Result<Renewal, StoreError> {
            self.saw("give_back");
            Ok(Renewal::Renewed)
        }

        async fn wait_for_hand_over(&self, _: &RunKey, _: Duration) -> bool {
            self.saw("wait_for_hand_over");
            true
        }

        fn hand_overs(&self) -> &HandOvers {
            &self.board
        }

        async fn history(&self, _: &JobName, _: usize) -> Result<Vec<RunRecord>, StoreError> {
            self.saw("history");
            Ok(Vec::new())
        }

        async fn collect_garbage(&self, _: Duration) -> Result<u64, StoreError> {
            self.saw("collect_garbage");
            Ok(0)
        }

        async fn pause(&self, scope: &PauseScope, req: &PauseRequest) -> Result<Pause, StoreError> {
            self.saw("pause");
            req.at(scope, Timestamp::from_millis(0))
                .map_err(|e| e.into_store_error("probe"))
        }

        async fn resume(&self, _: &PauseScope) -> Result<bool, StoreError> {
            self.saw("resume");
            Ok(false)
        }

        async fn jobs(&self) -> Result<Vec<JobName>, StoreError> {
            self.saw("jobs");
            Ok(Vec::new())
        }

        async fn pauses(&self) -> Result<Pauses, StoreError> {
            self.saw("pauses");
            Ok(Pauses::holding(Vec::new(), Timestamp::from_millis(0)))
        }

        async fn request_run(&self, req: &TriggerRequest) -> Result<RunRequest, StoreError> {
            self.saw("request_run");
            Ok(req.stamped(Timestamp::from_millis(1)))
        }

        async fn run_requests(&self) -> Result<RunRequests, StoreError> {
            self.saw("run_requests");
            Ok(RunRequests {
                store_now: Timestamp::from_millis(0),
                requests: Vec::new(),
            })
        }

        fn announcements(&self) -> broadcast::Receiver<RunKey> {
            self.saw("announcements");
            broadcast::channel(1).1
        }
    }

    /// A lease layer that changes nothing, over any lease store.
    struct Through<S: ?Sized>(Arc<S>);

    impl<S: LeaseStore + ?Sized> LeaseLayer for Through<S> {
        type Inner = S;

        fn inner(&self) -> &S {
            &self.0
        }
    }

    /// A claim layer that changes nothing, over any claim store.
    struct ClaimsOnly<S: ?Sized>(Arc<S>);

    impl<S: ClaimStore + ?Sized> ClaimLayer for ClaimsOnly<S> {
        type Inner = S;

        fn inner(&self) -> &S {
            &self.0
        }

        fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
            None
        }
    }

    /// A layer that changes one call: claims are refused.
    struct Refusing(Arc<Probe>);

    #[async_trait]
    impl LeaseLayer for Refusing {
        type Inner = Probe;

        fn inner(&self) -> &Probe {
            &self.0
        }

        async fn claim_lease(&self, _: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
            Ok(ClaimOutcome::Late)
        }
    }

    fn run() -> RunKey {
        RunKey::new(JobName::new("job").unwrap(), Slot::from_millis(1000))
    }

    fn plain() -> ClaimRequest {
        ClaimRequest {
            run: run(),
            token: Token::generate(),
            instance: InstanceId::new("i").unwrap(),
            max_late: Duration::from_secs(1),
        }
    }

    /// Makes every store call once through `store`.
    async fn call_everything(store: &dyn LeaseStore) {
        let run = run();
        let token = Token::generate();
        let lease = LeaseClaim::from_plain(&plain());
        store.claim(&plain()).await.unwrap();
        store.info();
        store.ping().await.unwrap();
        store.claim_lease(&lease).await.unwrap();
        let answers = store.claim_many(&[lease.clone(), lease]).await.unwrap();
        assert_eq!(answers.len(), 2);
        store.peek(&run).await.unwrap();
        store
            .heartbeat(&run, token, Duration::from_secs(1))
            .await
            .unwrap();
        store
            .finish(&run, token, RunOutcome::Succeeded)
            .await
            .unwrap();
        store.release(&run, token).await.unwrap();
        store.give_back(&run, token).await.unwrap();
        assert!(store.wait_for_hand_over(&run, Duration::ZERO).await);
        store.history(&run.job, 1).await.unwrap();
        store.collect_garbage(Duration::ZERO).await.unwrap();
        store
            .pause(&PauseScope::All, &PauseRequest::new())
            .await
            .unwrap();
        store.resume(&PauseScope::All).await.unwrap();
        store.pauses().await.unwrap();
        store.jobs().await.unwrap();
        let req = TriggerRequest::new(run.job.clone(), RequestId::new("r").unwrap());
        store.request_run(&req).await.unwrap();
        store.run_requests().await.unwrap();
        let _news = store.announcements();
    }

    const EVERY_CALL: [&str; 20] = [
        "claim",
        "info",
        "ping",
        "claim_lease",
        "claim_many",
        "peek",
        "heartbeat",
        "finish",
        "release",
        "give_back",
        "wait_for_hand_over",
        "history",
        "collect_garbage",
        "pause",
        "resume",
        "pauses",
        "jobs",
        "request_run",
        "run_requests",
        "announcements",
    ];

    #[tokio::test]
    async fn a_lease_layer_forwards_every_call_and_stays_a_lease_store() {
        let probe = Arc::new(Probe::default());
        let dynamic: Arc<dyn ClaimStore> = Arc::new(Through(probe.clone()));
        let lease = dynamic
            .as_lease_store()
            .expect("a lease layer is a lease store");
        call_everything(&*lease).await;
        // `claim_many` reached the inner store's own batch, not the trait's
        // one-by-one default.
        assert_eq!(probe.calls(), EVERY_CALL);
    }

    #[tokio::test]
    async fn a_lease_layer_over_a_dyn_store_forwards_every_call() {
        let probe = Arc::new(Probe::default());
        let inner: Arc<dyn LeaseStore> = probe.clone();
        let layered = Arc::new(Through(Arc::new(Through(inner))));
        call_everything(&*layered).await;
        assert_eq!(probe.calls(), EVERY_CALL);
    }

    #[tokio::test]
    async fn a_lease_layer_is_its_own_lease_store() {
        let probe = Arc::new(Probe::default());
        let dynamic: Arc<dyn ClaimStore> = Arc::new(Refusing(probe.clone()));
        let lease = dynamic.as_lease_store().unwrap();
        // The override answers, not the inner store: `as_lease_store` gave
        // the wrapper, not what it wraps.
        let outcome = lease
            .claim_lease(&LeaseClaim::from_plain(&plain()))
            .await
            .unwrap();
        assert_eq!(outcome, ClaimOutcome::Late);
        assert!(probe.calls().is_empty(), "{:?}", probe.calls());
        lease.peek(&run()).await.unwrap();
        assert_eq!(probe.calls(), ["peek"]);
    }

    #[tokio::test]
    async fn a_claim_layer_forwards_claims_and_is_not_a_lease_store() {
        let probe = Arc::new(Probe::default());
        let dynamic: Arc<dyn ClaimStore> = Arc::new(ClaimsOnly(probe.clone()));
        dynamic.claim(&plain()).await.unwrap();
        assert_eq!(dynamic.info().name, "probe");
        dynamic.ping().await.unwrap();
        assert_eq!(probe.calls(), ["claim", "info", "ping"]);
        assert!(dynamic.as_lease_store().is_none());
    }
}
