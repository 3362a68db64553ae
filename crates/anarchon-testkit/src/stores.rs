//! Stores for tests: a claim-only store, and a wrapper that injects faults.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::layer::LeaseLayer;
use anarchon_core::{
    BackendInfo, ClaimAnswers, ClaimOutcome, ClaimRequest, ClaimStore, Fence, JobName, LeaseClaim,
    LeaseStore, Memory, Renewal, RunKey, RunOutcome, RunRecord, RunView, StoreError, Token, Win,
};
use async_trait::async_trait;

/// A claim-only store in memory: the first token to claim a run wins it for
/// as long as the store lives. It answers "was I first?" and nothing else,
/// like the broker backends, so the compile-fail tests and the claim suite
/// have a claim-only store without a server.
pub struct ClaimOnlyStore {
    winners: Mutex<HashMap<RunKey, Token>>,
    memory: Memory,
}

impl ClaimOnlyStore {
    /// A store that claims to remember runs for `memory` (it never forgets,
    /// but the scheduler's checks read this).
    pub fn remembering(memory: Memory) -> Self {
        Self {
            winners: Mutex::new(HashMap::new()),
            memory,
        }
    }
}

impl Default for ClaimOnlyStore {
    fn default() -> Self {
        Self::remembering(Memory::Forever)
    }
}

impl fmt::Debug for ClaimOnlyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimOnlyStore")
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ClaimStore for ClaimOnlyStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut winners = self.winners.lock().unwrap_or_else(|p| p.into_inner());
        let winner = *winners.entry(req.run.clone()).or_insert(req.token);
        Ok(if winner == req.token {
            ClaimOutcome::Won(Win::first(None))
        } else {
            ClaimOutcome::Lost
        })
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "claim-only-test",
            memory: self.memory,
        }
    }

    /// Always answers: the store is this process's memory.
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

/// A lease store in front of another, with switches that make its calls
/// fail: one simulated instance losing its connection, or only its
/// heartbeats.
pub struct Faulty<S: ?Sized> {
    inner: Arc<S>,
    down: AtomicBool,
    heartbeats_down: AtomicBool,
    heartbeats_hang: AtomicBool,
    replies_lost: AtomicBool,
    claims_to_hang: AtomicU64,
    claim_delay_ms: AtomicU64,
    last_renewal_sent: Mutex<Option<tokio::time::Instant>>,
    heartbeats: AtomicU64,
    claims: AtomicU64,
    peeks: AtomicU64,
}

impl<S: LeaseStore + ?Sized> Faulty<S> {
    /// Wraps `inner`; all switches off.
    pub fn new(inner: Arc<S>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            down: AtomicBool::new(false),
            heartbeats_down: AtomicBool::new(false),
            heartbeats_hang: AtomicBool::new(false),
            replies_lost: AtomicBool::new(false),
            claims_to_hang: AtomicU64::new(0),
            claim_delay_ms: AtomicU64::new(0),
            last_renewal_sent: Mutex::new(None),
            heartbeats: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            peeks: AtomicU64::new(0),
        })
    }

    /// How many claim calls (`claim`, `claim_lease`, `claim_many`) were
    /// sent through this handle: each is one round trip.
    pub fn claim_calls(&self) -> u64 {
        self.claims.load(Ordering::SeqCst)
    }

    /// How many `peek` calls were sent through this handle.
    pub fn peeks(&self) -> u64 {
        self.peeks.load(Ordering::SeqCst)
    }

    /// While `true`, every call fails as if the store were unreachable.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// While `true`, heartbeats fail as if the store were unreachable;
    /// everything else works.
    pub fn set_heartbeats_down(&self, down: bool) {
        self.heartbeats_down.store(down, Ordering::SeqCst);
    }

    /// While `true`, heartbeats never answer, as on a connection whose
    /// packets are silently dropped.
    pub fn set_heartbeats_hang(&self, hang: bool) {
        self.heartbeats_hang.store(hang, Ordering::SeqCst);
    }

    /// While `true`, every call reaches the store and is done there, but
    /// its caller gets a temporary error instead of the answer: a reply
    /// lost on the way back, the case where the caller cannot know.
    pub fn set_replies_lost(&self, lost: bool) {
        self.replies_lost.store(lost, Ordering::SeqCst);
    }

    /// The next `n` claim calls reach the store and are done there, but
    /// never answer: a reply that hangs until the caller's timeout.
    pub fn hang_after_next_claims(&self, n: u64) {
        self.claims_to_hang.store(n, Ordering::SeqCst);
    }

    /// Every claim call reaches the store at once, but its answer comes
    /// back `delay` later: a slow way back.
    pub fn set_claim_reply_delay(&self, delay: Duration) {
        self.claim_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Turns every fault off.
    pub fn heal(&self) {
        self.set_down(false);
        self.set_heartbeats_down(false);
        self.set_heartbeats_hang(false);
        self.set_replies_lost(false);
        self.hang_after_next_claims(0);
        self.set_claim_reply_delay(Duration::ZERO);
    }

    /// When the last heartbeat that came back `Renewed` was sent (tokio's
    /// clock): where a runner's lease is counted from.
    pub fn last_renewal_sent(&self) -> Option<tokio::time::Instant> {
        *self
            .last_renewal_sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How many heartbeats were attempted through this handle.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::unavailable(
                "faulty",
                "switched off by the test",
            ))
        } else {
            Ok(())
        }
    }

    /// Applies the claim switches around a claim call.
    async fn claim_call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        let answer = call.await;
        let delay = self.claim_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let hang = self
            .claims_to_hang
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if hang {
            std::future::pending::<()>().await;
        }
        self.reply(answer)
    }

    /// What the caller gets for a call the store answered with `answer`.
    fn reply<T>(&self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        if self.replies_lost.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(
                "faulty",
                "the reply was lost by the test (the store did the call)",
            ));
        }
        answer
    }
}

impl<S: ?Sized> fmt::Debug for Faulty<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faulty")
            .field("down", &self.down)
            .field("heartbeats_down", &self.heartbeats_down)
            .finish_non_exhaustive()
    }
}

/// Every call the switches touch is written out; the rest forward.
#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseLayer for Faulty<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_call(self.inner.claim(req)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.check()?;
        self.inner.ping().await
    }

    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        self.claim_call(self.inner.claim_lease(req)).await
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        self.claim_call(self.inner.claim_many(reqs)).await
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        self.peeks.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        self.reply(self.inner.peek(run).await)
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        if self.heartbeats_down.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(
                "faulty",
                "heartbeats switched off by the test",
            ));
        }
        if self.heartbeats_hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let sent = tokio::time::Instant::now();
        let answer = self.inner.heartbeat(run, token, lease).await;
        if matches!(answer, Ok(Renewal::Renewed)) && !self.replies_lost.load(Ordering::SeqCst) {
            *self
                .last_renewal_sent
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(sent);
        }
        self.reply(answer)
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        self.check()?;
        self.reply(self.inner.finish(run, token, outcome).await)
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.check()?;
        self.reply(self.inner.release(run, token).await)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        self.check()?;
        self.reply(self.inner.give_back(run, token).await)
    }

    // `wait_for_hand_over` forwards: news travels beside the store's
    // answers, so a store switched off gives none, but news of hand-overs
    // made before still arrives.

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.check()?;
        self.inner.history(job, limit).await
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        self.check()?;
        self.inner.collect_garbage(keep).await
    }
}

/// A downstream resource that refuses writes carrying a fence lower than
/// one it has already accepted, as a handler's database or API should.
#[derive(Debug, Default)]
pub struct FencedResource {
    highest: Mutex<Option<Fence>>,
    accepted: Mutex<Vec<(Fence, String)>>,
}

impl FencedResource {
    /// Accepts `value` if `fence` is at least the highest seen; returns
    /// whether it was accepted.
    pub fn write(&self, fence: Fence, value: impl Into<String>) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        if highest.is_some_and(|h| fence < h) {
            return false;
        }
        *highest = Some(fence);
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((fence, value.into()));
        true
    }

    /// What was accepted, in order.
    pub fn accepted(&self) -> Vec<(Fence, String)> {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
