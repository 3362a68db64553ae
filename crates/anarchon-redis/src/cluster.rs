//! The store's Redis Cluster connection, and its replacement when it stops
//! answering.
//!
//! Why: redis-rs's cluster connection serves every call from one task,
//! and while that task refreshes its slot map it serves nothing. After a
//! master was killed we have seen that refresh never end: from then on
//! every call of the stores it happened to timed out, for as long as we
//! watched (28 s), while the cluster itself had long promoted the replica
//! and answered other clients (see `tests/cluster_faults.rs`). The
//! connection has no way out of that state on its own, so the store
//! watches for it: when its calls have only timed out, none answered, for
//! a while ([`stall_limit`]: two response timeouts, at least 4 s, from the
//! first of those timeouts), it builds a new connection from the seeds and
//! sends the next calls over that.
//!
//! A call answered with a server error still counts as answered; a
//! refused connection is not a timeout. So a node that is down (its
//! slots' calls fail at once) or a failover in progress (the other
//! masters answer) never looks like a stall; a cluster that answers
//! nothing at all is replaced at most once per limit, which costs a
//! connection to each node. The connection replaced is dropped; if its
//! task is the one that hung, it stays behind until the process ends.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::redis::cluster::ClusterClient;
use deadpool_redis::redis::cluster_async::ClusterConnection;

use crate::error::Error;

/// The shortest a cluster connection's calls may only time out before it
/// is replaced, whatever the response timeout.
const LEAST_STALL: Duration = Duration::from_secs(4);

/// A Redis Cluster connection that is replaced when it stalls.
pub(crate) struct ClusterLink {
    /// The connection in use: each call clones it (a handle on the same
    /// connections).
    conn: Mutex<ClusterConnection>,
    /// Builds a new connection from the seeds.
    client: ClusterClient,
    /// How long building one may take.
    connect_bound: Duration,
    /// Whether the calls only time out, and since when.
    watch: Mutex<Watch>,
    /// One replacement at a time.
    replacing: tokio::sync::Mutex<()>,
    /// How many times the connection was replaced.
    replaced: AtomicU64,
    /// When the store connected.
    pub(crate) since: Instant,
}

impl ClusterLink {
    /// Wraps `conn`, built by `client`; a replacement may take
    /// `connect_bound`; calls time out after `response_timeout`.
    pub(crate) fn new(
        conn: ClusterConnection,
        client: ClusterClient,
        connect_bound: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            conn: Mutex::new(conn),
            client,
            connect_bound,
            watch: Mutex::new(Watch::new(stall_limit(response_timeout))),
            replacing: tokio::sync::Mutex::new(()),
            replaced: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// The connection in use.
    pub(crate) fn conn(&self) -> ClusterConnection {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many times the connection was replaced.
    pub(crate) fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::SeqCst)
    }

    /// Notes how a call ended; after a timeout that ends a stall, replaces
    /// the connection before returning (one caller does; the others go
    /// on with the old one meanwhile).
    pub(crate) async fn after<T>(&self, result: &Result<T, Error>, backend: &'static str) {
        let timed_out = matches!(result, Err(e) if e.is_timeout());
        let stalled = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .note(Instant::now(), timed_out);
        if let Some(timing_out_for) = stalled {
            self.replace(backend, timing_out_for).await;
        }
    }

    async fn replace(&self, backend: &'static str, timing_out_for: Duration) {
        let Ok(_one) = self.replacing.try_lock() else {
            return;
        };
        tracing::warn!(
            backend,
            ?timing_out_for,
            "every call on the Redis Cluster connection timed out for {timing_out_for:?}, none answered: connecting to the cluster anew"
        );
        match tokio::time::timeout(self.connect_bound, self.client.get_async_connection()).await {
            Ok(Ok(conn)) => {
                *self
                    .conn
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = conn;
                self.replaced.fetch_add(1, Ordering::SeqCst);
                self.watch
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .restart();
            }
            // Only the kind of failure: the client's own text may carry
            // what the URL held.
            Ok(Err(error)) => tracing::warn!(
                backend,
                kind = error.category(),
                "could not connect to the Redis Cluster anew (the next stall tries again)"
            ),
            Err(_) => tracing::warn!(
                backend,
                bound = ?self.connect_bound,
                "could not connect to the Redis Cluster anew within its bound (the next stall tries again)"
            ),
        }
    }
}

/// How long calls may only time out, from the first of those timeouts,
/// before the connection is replaced: two response timeouts, and never
/// less than [`LEAST_STALL`].
fn stall_limit(response_timeout: Duration) -> Duration {
    (response_timeout * 2).max(LEAST_STALL)
}

/// Whether a connection's calls have only timed out, and since when.
#[derive(Debug)]
struct Watch {
    /// When the first of the timeouts since the last answer came (none
    /// since then: `None`).
    timing_out_since: Option<Instant>,
    limit: Duration,
}

impl Watch {
    fn new(limit: Duration) -> Self {
        Self {
            timing_out_since: None,
            limit,
        }
    }

    /// Notes a call that ended at `now`: answered, or timed out. Returns
    /// how long the calls have only timed out when a timeout ends a stall
    /// (the limit passed since the first of them); then the next stall is
    /// counted from now, so one stall asks for one replacement. A store
    /// that sent nothing for a while is not stalled: only timeouts count.
    fn note(&mut self, now: Instant, timed_out: bool) -> Option<Duration> {
        if !timed_out {
            self.timing_out_since = None;
            return None;
        }
        let since = *self.timing_out_since.get_or_insert(now);
        let timing_out_for = now.saturating_duration_since(since);
        if timing_out_for < self.limit {
            return None;
        }
        self.timing_out_since = Some(now);
        Some(timing_out_for)
    }

    /// A new connection: nothing timed out on it yet.
    fn restart(&mut self) {
        self.timing_out_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_cluster::FakeCluster;

    const LIMIT: Duration = Duration::from_secs(4);

    fn at(start: Instant, s: u64) -> Instant {
        start + Duration::from_secs(s)
    }

    #[test]
    fn an_answer_ends_a_run_of_timeouts() {
        let start = Instant::now();
        let mut watch = Watch::new(LIMIT);
        assert_eq!(watch.note(at(start, 1), true), None);
        assert_eq!(watch.note(at(start, 4), true), None);
        assert_eq!(watch.note(at(start, 4), false), None);
        // Counted afresh from the next timeout.
        assert_eq!(watch.note(at(start, 6), true), None);
        assert_eq!(watch.note(at(start, 9), true), None);
    }

    #[test]
    fn only_timeouts_for_the_limit_are_a_stall_asked_for_once() {
        let start = Instant::now();
        let mut watch = Watch::new(LIMIT);
        assert_eq!(watch.note(at(start, 2), true), None);
        assert_eq!(watch.note(at(start, 4), true), None);
        assert_eq!(
            watch.note(at(start, 6), true),
            Some(LIMIT),
            "four seconds of nothing but timeouts"
        );
        // The calls that time out right after do not ask again...
        assert_eq!(watch.note(at(start, 7), true), None);
        // ...until another whole limit passed.
        assert_eq!(watch.note(at(start, 10), true), Some(LIMIT));
    }

    #[test]
    fn a_store_that_sent_nothing_for_long_is_not_stalled_by_one_timeout() {
        let start = Instant::now();
        let mut watch = Watch::new(LIMIT);
        assert_eq!(watch.note(at(start, 1), false), None);
        assert_eq!(watch.note(at(start, 3_600), true), None);
    }

    #[test]
    fn errors_that_are_not_timeouts_never_ask_for_a_new_connection() {
        let start = Instant::now();
        let mut watch = Watch::new(LIMIT);
        for s in 1..60 {
            assert_eq!(watch.note(at(start, s), false), None);
        }
    }

    #[test]
    fn the_limit_is_two_response_timeouts_and_at_least_four_seconds() {
        assert_eq!(stall_limit(Duration::from_secs(3)), Duration::from_secs(6));
        assert_eq!(stall_limit(Duration::from_millis(300)), LEAST_STALL);
    }

    /// A GET through `link`, noted as the store notes its calls.
    async fn get(link: &ClusterLink) -> Result<Option<String>, Error> {
        let result = deadpool_redis::redis::cmd("GET")
            .arg("k")
            .query_async::<Option<String>>(&mut link.conn())
            .await
            .map_err(|e| Error::from_redis("reading", e));
        link.after(&result, "redis-lease").await;
        result
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_only_times_out_is_replaced_and_the_calls_go_on() {
        let node = FakeCluster::start(1).await;
        let response_timeout = Duration::from_millis(200);
        let client = ClusterClient::builder(vec![node.url(0)])
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(response_timeout)
            .build()
            .unwrap();
        let conn = client.get_async_connection().await.unwrap();
        let link = ClusterLink::new(conn, client, Duration::from_secs(2), response_timeout);
        assert_eq!(get(&link).await.unwrap(), None, "the fake node answers");

        node.hang_open_connections(0);
        let hung_at = Instant::now();
        let mut timeouts = 0;
        let answered = loop {
            match get(&link).await {
                Ok(value) => break value,
                Err(e) => {
                    assert!(e.is_timeout(), "only timeouts while hung: {e}");
                    timeouts += 1;
                }
            }
            assert!(
                hung_at.elapsed() < LEAST_STALL * 3,
                "still no answer {:?} after the connection hung",
                hung_at.elapsed()
            );
        };
        assert_eq!(answered, None);
        assert_eq!(link.replaced(), 1, "one new connection");
        assert!(
            hung_at.elapsed() >= LEAST_STALL,
            "replaced only once the calls had timed out for the limit ({:?})",
            hung_at.elapsed()
        );
        assert!(timeouts >= 2, "the calls timed out first ({timeouts})");
    }
}
