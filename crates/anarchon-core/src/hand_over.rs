//! Hand-over news: how a backup learns at once that the run it watches was
//! released or given back.
//!
//! A backup reads a run it watches once per lease period, when the holder's
//! lease would end. A holder that hands the run over (at shutdown, or before
//! its handler started) ends its lease early, and without news the backup
//! would learn of it only at that next read, up to a lease later. Each lease
//! store therefore announces its hand-overs: the store handle that made one
//! announces it to waiting backups in its own process, and stores that can
//! push a change to other processes (PostgreSQL `NOTIFY`, NATS messages)
//! forward the ones made elsewhere. [`HandOvers`] is the board a store
//! keeps for its waiting backups.
//!
//! News is a hint, never a decision: a woken backup reads the run and
//! claims it under the store's lock like any other takeover, and a backup
//! that hears nothing still reads at the lease end.

use std::future::Future;

use crate::store::Renewal;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::store::RunKey;

/// How many announcements a slow waiter may fall behind by before it is
/// woken regardless (it then reads the run, which is always correct).
const BACKLOG: usize = 1024;

/// The hand-overs a store has heard of, for the backups waiting on it.
#[derive(Debug)]
pub struct HandOvers {
    news: broadcast::Sender<RunKey>,
    /// How often the store's listener has (re)connected: news sent while it
    /// was away is lost, and whoever depends on it reads the store.
    reconnects: tokio::sync::watch::Sender<u64>,
}

impl Default for HandOvers {
    fn default() -> Self {
        Self::new()
    }
}

impl HandOvers {
    /// A board nobody has announced anything on.
    pub fn new() -> Self {
        Self {
            news: broadcast::channel(BACKLOG).0,
            reconnects: tokio::sync::watch::channel(0).0,
        }
    }

    /// Tells whoever watches [`Self::reconnections`] that the store's
    /// listener has just (re)connected, so news may have been lost.
    pub fn reconnected(&self) {
        self.reconnects.send_modify(|n| *n += 1);
    }

    /// Changes after each (re)connection of the store's listener, from now
    /// on. The scheduler reads the store's requests on each.
    pub fn reconnections(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reconnects.subscribe()
    }

    /// Waits at most `timeout` until the store's listener has connected
    /// once; whether it has. A store opened this way hears news from the
    /// moment it is handed out.
    pub async fn listening(&self, timeout: Duration) -> bool {
        let mut connected = self.reconnects.subscribe();
        tokio::time::timeout(timeout, connected.wait_for(|n| *n > 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Tells every backup waiting for `run` that it was handed over.
    pub fn announce(&self, run: &RunKey) {
        // No receiver means nobody waits: nothing to tell.
        let _ = self.news.send(run.clone());
    }

    /// Every run announced from now on (what
    /// [`crate::LeaseStore::announcements`] hands out).
    pub fn subscribe(&self) -> broadcast::Receiver<RunKey> {
        self.news.subscribe()
    }

    /// Waits at most `timeout` for an announcement of `run`. `true` when
    /// one came (or the waiter fell so far behind that it may have missed
    /// one); `false` when the time ran out.
    pub async fn wait(&self, run: &RunKey, timeout: Duration) -> bool {
        let mut news = self.news.subscribe();
        let heard = async {
            loop {
                match news.recv().await {
                    Ok(announced) if &announced == run => return true,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return true,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        tokio::time::timeout(timeout, heard).await.unwrap_or(false)
    }
}

/// A run as one line of news between processes: `<job> <slot>`, the slot
/// as its stored number (see [`crate::Slot::as_millis`]).
pub fn news_of(run: &RunKey) -> String {
    format!("{} {}", run.job, run.slot.as_millis())
}

/// The run a line of news names, as [`news_of`] writes it; `None` for
/// anything else.
pub fn run_in_news(text: &str) -> Option<RunKey> {
    let (job, slot) = text.split_once(' ')?;
    Some(RunKey::new(
        crate::name::JobName::new(job).ok()?,
        crate::time::Slot::from_millis(slot.parse().ok()?),
    ))
}

/// The task a store runs to hear other processes' hand-overs (a
/// subscription, a `LISTEN`): it lives as long as the store, and is
/// stopped when the store is dropped.
#[derive(Debug)]
pub struct Listener(tokio::task::JoinHandle<()>);

impl Listener {
    /// Runs `listening` on the current tokio runtime until the listener is
    /// dropped.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn spawn(listening: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(listening))
    }

    /// Runs `listen` again and again until the listener is dropped: one
    /// connection's listening, which returns (with an error, or at all)
    /// when its connection is lost. A second passes between two tries, and
    /// each loss is logged at debug level as `what` losing its connection.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn reconnecting<F, Fut, E>(what: &'static str, mut listen: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: std::fmt::Display,
    {
        Self::spawn(async move {
            loop {
                if let Err(error) = listen().await {
                    tracing::debug!(%error, "{what} lost its connection; listening again shortly");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `answer` to a release or give-back, once `announce` (the store's way
/// of telling other instances, e.g. a publish) has run if the hand-over
/// took effect (`Renewed`): backups waiting in
/// [`LeaseStore::wait_for_hand_over`](crate::LeaseStore::wait_for_hand_over)
/// learn of it at once. `announce` is not polled otherwise.
pub async fn announced(answer: Renewal, announce: impl Future<Output = ()>) -> Renewal {
    if answer == Renewal::Renewed {
        announce.await;
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::JobName;
    use crate::time::Slot;

    fn run(job: &str, slot: i64) -> RunKey {
        RunKey::new(JobName::new(job).unwrap(), Slot::from_millis(slot))
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnection_is_told_to_those_who_watch_from_before_it() {
        let board = HandOvers::new();
        assert!(!board.listening(Duration::from_millis(10)).await);
        board.reconnected();
        assert!(board.listening(Duration::ZERO).await);
        let mut watcher = board.reconnections();
        assert!(!watcher.has_changed().unwrap(), "nothing new at first");
        board.reconnected();
        watcher.changed().await.unwrap();
    }

    #[test]
    fn news_names_a_run_and_reads_back() {
        for run in [run("a", 1000), run("b-2", -1_791_633_610_000)] {
            assert_eq!(run_in_news(&news_of(&run)), Some(run));
        }
        assert_eq!(run_in_news("no-slot"), None);
        assert_eq!(run_in_news("bad name! 5"), None);
        assert_eq!(run_in_news("job five"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_hears_its_run_and_only_its_run() {
        let board = std::sync::Arc::new(HandOvers::new());
        let waiter = {
            let board = board.clone();
            tokio::spawn(async move { board.wait(&run("a", 1000), Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        board.announce(&run("a", 2000));
        board.announce(&run("b", 1000));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "other runs' news does not wake it");
        board.announce(&run("a", 1000));
        assert!(waiter.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_without_news_times_out() {
        let board = HandOvers::new();
        assert!(!board.wait(&run("a", 1000), Duration::from_secs(5)).await);
    }
}
