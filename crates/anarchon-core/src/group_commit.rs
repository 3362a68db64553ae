//! Store calls that arrive while one is in flight wait, and go together
//! (group commit).
//!
//! Why: the runs of one instant end within a millisecond or two of each
//! other (a fleet's every-second jobs, a backfill), and on a SQL store a
//! call sent alone is a transaction of its own, whose commit costs more
//! than the row it writes. A backend that can send many such calls as one
//! (one statement, one transaction) puts them behind a [`GroupCommit`].
//!
//! Nothing waits for a timer: the first call of a burst is sent at once,
//! alone, so a lone call costs what it always did. While it is in flight
//! the calls that arrive wait, and the next send carries all of them, up to
//! [`Group::MOST`]. Each call still gets its own answer: the backend
//! decides each one for its own run.
//!
//! The sends are made by a task of their own, not by a caller: a caller
//! that stops waiting (a timeout, a cancelled run) cannot strand the
//! others. Its call may still be made, as when a reply is lost; store calls
//! that go through a group must therefore be safe to send again (a finish
//! is: the same token gets the same answer).

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::oneshot;

/// How a backend sends a group of calls of one kind.
#[async_trait]
pub trait Group: Send + Sync + 'static {
    /// One call: what its caller hands over.
    type Call: Send + 'static;
    /// One call's answer.
    type Answer: Send + 'static;

    /// The most calls one send carries; more wait for the next send.
    const MOST: usize;

    /// Sends `calls` together and answers each of them: one answer per
    /// call, in the order of `calls`. A call left without an answer (the
    /// list is short) gets [`Unanswered`].
    async fn send(&self, calls: Vec<Self::Call>) -> Vec<Self::Answer>;
}

/// A call got no answer: the task sending its group ended first (a panic,
/// or the runtime shutting down), or the group's [`Group::send`] left it
/// out. Whether the call was made is not known, and it may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unanswered;

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "it got no answer: the task sending it ended first (a panic, or the runtime \
             shutting down), or its group was answered without it",
        )
    }
}

impl std::error::Error for Unanswered {}

impl Unanswered {
    /// The temporary [`StoreError`](crate::StoreError) of `backend` for
    /// the call `doing` names: it may be sent again.
    pub fn store_error(self, backend: &'static str, doing: &str) -> crate::StoreError {
        crate::StoreError::unavailable(backend, format!("{doing}: {self}"))
    }
}

/// The calls of one kind of one store handle: those waiting, and whether
/// a send is in flight.
pub struct GroupCommit<G: Group> {
    group: G,
    pending: Mutex<Pending<G>>,
}

/// Calls not yet sent, and whether a task is sending.
struct Pending<G: Group> {
    queue: Vec<Waiting<G>>,
    sending: bool,
}

/// A call and where its answer goes.
struct Waiting<G: Group> {
    call: G::Call,
    answer: oneshot::Sender<G::Answer>,
}

impl<G: Group> GroupCommit<G> {
    /// Calls sent with `group`.
    pub fn new(group: G) -> Arc<Self> {
        Arc::new(Self {
            group,
            pending: Mutex::new(Pending {
                queue: Vec::new(),
                sending: false,
            }),
        })
    }

    /// The backend's half: how the calls are sent.
    pub fn group(&self) -> &G {
        &self.group
    }

    fn pending(&self) -> MutexGuard<'_, Pending<G>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `call` in the next send, and returns its answer.
    ///
    /// Must be called within a Tokio runtime: the first call of a burst
    /// spawns the task that sends, on the runtime of its caller, and the
    /// calls that arrive meanwhile wait for that task. So the callers of
    /// one `GroupCommit` should share one runtime that keeps running.
    ///
    /// # Errors
    ///
    /// [`Unanswered`] if the sending task ended before it answered.
    pub async fn call(self: &Arc<Self>, call: G::Call) -> Result<G::Answer, Unanswered> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut pending = self.pending();
            pending.queue.push(Waiting { call, answer });
            !std::mem::replace(&mut pending.sending, true)
        };
        if start {
            tokio::spawn(Sender::new(self.clone()).run());
        }
        answered.await.map_err(|_| Unanswered)
    }
}

impl<G: Group + std::fmt::Debug> std::fmt::Debug for GroupCommit<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("group", &self.group)
            .field("waiting", &self.pending().queue.len())
            .finish()
    }
}

/// The task that sends what waits until nothing does. Should it end any
/// other way (a panic, the runtime dropping it), the calls still waiting
/// are answered [`Unanswered`] and the next call starts a new task.
struct Sender<G: Group> {
    commit: Arc<GroupCommit<G>>,
    done: bool,
}

impl<G: Group> Sender<G> {
    fn new(commit: Arc<GroupCommit<G>>) -> Self {
        Self {
            commit,
            done: false,
        }
    }

    async fn run(mut self) {
        loop {
            let batch: Vec<Waiting<G>> = {
                let mut pending = self.commit.pending();
                if pending.queue.is_empty() {
                    pending.sending = false;
                    self.done = true;
                    return;
                }
                let n = pending.queue.len().min(G::MOST.max(1));
                pending.queue.drain(..n).collect()
            };
            let (calls, answers): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|w| (w.call, w.answer)).unzip();
            let answered = self.commit.group.send(calls).await;
            // A caller that stopped waiting needs no answer; one the group
            // left out learns it from its dropped sender.
            for (to, answer) in answers.into_iter().zip(answered) {
                let _ = to.send(answer);
            }
        }
    }
}

impl<G: Group> Drop for Sender<G> {
    fn drop(&mut self) {
        if !self.done {
            let waiting = {
                let mut pending = self.commit.pending();
                pending.sending = false;
                std::mem::take(&mut pending.queue)
            };
            // Dropping the answers' senders tells each caller.
            drop(waiting);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Semaphore;

    /// Doubles numbers, one send at a time, and keeps each send's calls.
    /// A send waits for a permit, so a test decides when it ends.
    #[derive(Default)]
    struct Doubler {
        sends: Mutex<Vec<Vec<u32>>>,
        gate: Option<Arc<Semaphore>>,
        panic_once: AtomicBool,
        short: bool,
    }

    #[async_trait]
    impl Group for Doubler {
        type Call = u32;
        type Answer = u32;
        const MOST: usize = 4;

        async fn send(&self, calls: Vec<u32>) -> Vec<u32> {
            self.sends.lock().unwrap().push(calls.clone());
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("gate").forget();
            }
            if self.panic_once.swap(false, Ordering::SeqCst) {
                panic!("a send that panics");
            }
            let take = if self.short {
                calls.len() - 1
            } else {
                calls.len()
            };
            calls.into_iter().take(take).map(|n| n * 2).collect()
        }
    }

    fn gated() -> (Arc<GroupCommit<Doubler>>, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let commit = GroupCommit::new(Doubler {
            gate: Some(gate.clone()),
            ..Doubler::default()
        });
        (commit, gate)
    }

    fn spawn_call(
        commit: &Arc<GroupCommit<Doubler>>,
        n: u32,
    ) -> tokio::task::JoinHandle<Result<u32, Unanswered>> {
        let commit = commit.clone();
        tokio::spawn(async move { commit.call(n).await })
    }

    async fn until_sends(commit: &GroupCommit<Doubler>, n: usize) {
        let sent = async {
            while commit.group().sends.lock().unwrap().len() < n {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), sent)
            .await
            .unwrap_or_else(|_| panic!("{n} sends were never made"));
    }

    #[test]
    fn an_unanswered_call_is_a_temporary_store_error_naming_it() {
        let e = Unanswered.store_error("pg", "recording the end of a@1");
        assert!(e.is_temporary(), "{e}");
        assert!(
            e.message()
                .starts_with("recording the end of a@1: it got no answer"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_lone_call_is_sent_at_once_alone() {
        let commit = GroupCommit::new(Doubler::default());
        assert_eq!(commit.call(21).await, Ok(42));
        assert_eq!(*commit.group().sends.lock().unwrap(), vec![vec![21]]);
    }

    #[tokio::test]
    async fn calls_that_arrive_during_a_send_go_together_each_answered_for_itself() {
        let (commit, gate) = gated();
        let first = spawn_call(&commit, 1);
        until_sends(&commit, 1).await;
        // Nine calls arrive while the first is in flight.
        let rest: Vec<_> = (2..=10)
            .map(|n| {
                let commit = commit.clone();
                tokio::spawn(async move { (n, commit.call(n).await) })
            })
            .collect();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(10);
        assert_eq!(first.await.unwrap(), Ok(2));
        for call in rest {
            let (n, answer) = call.await.unwrap();
            assert_eq!(answer, Ok(n * 2), "call {n}");
        }
        let sends = commit.group().sends.lock().unwrap().clone();
        assert_eq!(
            sends,
            vec![vec![1], vec![2, 3, 4, 5], vec![6, 7, 8, 9], vec![10]],
            "the first alone, then the waiting ones in order, at most MOST a send"
        );
    }

    #[tokio::test]
    async fn a_send_that_panics_answers_its_calls_and_the_next_call_starts_again() {
        let commit = GroupCommit::new(Doubler {
            panic_once: AtomicBool::new(true),
            ..Doubler::default()
        });
        assert_eq!(commit.call(1).await, Err(Unanswered));
        assert_eq!(
            commit.call(2).await,
            Ok(4),
            "a new task sends the next call"
        );
    }

    #[tokio::test]
    async fn calls_waiting_behind_a_send_that_panics_are_answered() {
        let gate = Arc::new(Semaphore::new(0));
        let commit = GroupCommit::new(Doubler {
            gate: Some(gate.clone()),
            panic_once: AtomicBool::new(true),
            ..Doubler::default()
        });
        let first = spawn_call(&commit, 1);
        until_sends(&commit, 1).await;
        let waiting = spawn_call(&commit, 2);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(10);
        let answered = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            (first.await.unwrap(), waiting.await.unwrap())
        })
        .await
        .expect("both calls are answered");
        assert_eq!(answered, (Err(Unanswered), Err(Unanswered)));
        assert_eq!(
            commit.call(3).await,
            Ok(6),
            "a new task sends the next call"
        );
        assert_eq!(
            commit.group().sends.lock().unwrap().clone(),
            vec![vec![1], vec![3]],
            "the call waiting behind the panic was not sent"
        );
    }

    #[tokio::test]
    async fn a_call_the_group_leaves_without_an_answer_learns_it() {
        let (commit, gate) = {
            let gate = Arc::new(Semaphore::new(0));
            let commit = GroupCommit::new(Doubler {
                gate: Some(gate.clone()),
                short: true,
                ..Doubler::default()
            });
            (commit, gate)
        };
        let first = spawn_call(&commit, 1);
        until_sends(&commit, 1).await;
        let second = spawn_call(&commit, 2);
        let third = spawn_call(&commit, 3);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(2);
        assert_eq!(
            first.await.unwrap(),
            Err(Unanswered),
            "a group of one, answered none"
        );
        assert_eq!(second.await.unwrap(), Ok(4));
        assert_eq!(
            third.await.unwrap(),
            Err(Unanswered),
            "the last of two left out"
        );
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_does_not_hold_up_the_others() {
        let (commit, gate) = gated();
        let first = spawn_call(&commit, 1);
        until_sends(&commit, 1).await;
        let gone = spawn_call(&commit, 2);
        let kept = spawn_call(&commit, 3);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(2));
        assert_eq!(kept.await.unwrap(), Ok(6));
        assert_eq!(
            commit.group().sends.lock().unwrap().clone(),
            vec![vec![1], vec![2, 3]],
            "the call of a caller gone is still made"
        );
    }
}
