//! The lease store: a JetStream KV bucket, compare-and-swap on revisions,
//! and the NATS server's clock.

mod attempts;
mod batch;
mod clock;
mod gc;
mod kv;
mod live;
mod options;
mod pauses;
mod records;
mod requests;
mod store;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anarchon_core::hand_over::{news_of, run_in_news};
use anarchon_core::{HandOvers, JobName, Listener, RunKey, StoreError};
use async_nats::jetstream::Context;
use async_nats::jetstream::stream::Stream;
use futures::StreamExt;

use crate::connection::{Connected, StreamRole, connect, ensure_stream};
use crate::error::Error;
use crate::options::NatsOptions;

pub use self::kv::is_wrong_last_sequence;
pub use self::options::{DEFAULT_BUCKET, MAX_BUCKET_NAME_LEN, MAX_HISTORY, NatsLeaseOptions};
pub use self::pauses::{PAUSE_ALL_KEY, PAUSE_JOB_PREFIX};

/// The lease store's name in [`BackendInfo`](anarchon_core::BackendInfo), logs and errors.
pub const LEASE_BACKEND: &str = "nats-kv";

/// The key every claim and peek writes to learn the server's time.
pub const CLOCK_KEY: &str = "clock";

/// How many compare-and-swap races one call may lose in a row before it
/// gives up with a temporary error. Each lost race means another instance
/// changed the job, so this is only reached under extreme contention.
const MAX_ROUNDS: u32 = 64;
/// At most this many requests in flight for history and garbage collection.
const PARALLEL: usize = 32;

const LEASE_BUCKET: StreamRole = StreamRole {
    looking_up: "looking up the lease bucket",
    creating: "creating the lease bucket",
    created: "created the lease bucket",
};

/// What a [`NatsLeaseStore`] handle has sent to the server so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Waits for the server: requests sent together and awaited together
    /// count once.
    pub round_trips: u64,
    /// Requests: reads, writes, purges, listings.
    pub requests: u64,
    /// Compare-and-swap writes that lost to another writer and were
    /// decided again.
    pub conflicts: u64,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    requests: AtomicU64,
    conflicts: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A lease store on a NATS JetStream key-value bucket.
///
/// The full lease store of anarchon (backups, takeover, `overlap`,
/// `max_attempts`, catch-up, hand-over, fence numbers and history) on
/// NATS 2.9 or newer, with no other server.
///
/// # Keys
///
/// | key | holds |
/// |---|---|
/// | `job.<job>` | the job's document: its fence counter, its live runs (token, attempt, fence, instance, lease end), and runs that ended since the job was last claimed |
/// | `run.<job>.<slot ms>` | the record of a run that ended or was missed |
/// | `clock` ([`CLOCK_KEY`]) | empty; written to learn the server's time |
/// | `pause.job.<job>` ([`PAUSE_JOB_PREFIX`]) | the job's pause (JSON: since, until, reason, by; server times) |
/// | `pause.all` ([`PAUSE_ALL_KEY`]) | the pause of every job of the bucket |
///
/// # One compare-and-swap per decision
///
/// A claim reads the job's document (revision `r`), decides with the
/// lease flowchart, and writes the result with
/// `Nats-Expected-Last-Subject-Sequence: r`. If another instance wrote
/// in between, the server refuses the write ("wrong last sequence", error
/// 10071, or 10164 from a replicated bucket: [`is_wrong_last_sequence`]) and
/// the claim reads again and decides again. Heartbeat, finish and release
/// are the same read-then-swap on the document; an old runner's token is no
/// longer in it, so they answer [`Renewal::Fenced`](anarchon_core::Renewal::Fenced). Since a job's live
/// runs share one document, the `overlap` check and the write are one swap.
///
/// # Pauses
///
/// [`pause`](anarchon_core::LeaseStore::pause) reads the server's time,
/// judges the request on it ([`PauseRequest::at`](anarchon_core::PauseRequest::at))
/// and puts the pause's key; [`resume`](anarchon_core::LeaseStore::resume)
/// purges it; [`pauses`](anarchon_core::LeaseStore::pauses) lists the keys
/// under `pause.>` and reads them with the server's time.
///
/// A claim that may start a slot (no record, or a `missed` one) reads the
/// job's pause and `pause.all` in the round trip that reads the server's
/// time, and decides with them. **NATS KV has no step that reads one key
/// and writes another atomically**: the pauses are read before the swap of
/// the job's document, not in it. So a claim that has already read the
/// pauses when a pause is written may still start that one slot; every
/// claim that reads after the pause's write was acknowledged sees it, and
/// [`pause`](anarchon_core::LeaseStore::pause) returns only after that
/// acknowledgement. Each slot still has exactly one outcome — the swap of
/// the document decides between a start and a `paused` record — and a
/// slot recorded `paused` is in the document like a skipped one. The
/// other lease stores (Redis `lease`, PostgreSQL, SQLite) read the pauses
/// inside the claim's atomic step and have no such window.
///
/// # Time
///
/// Every lease decision uses the NATS server's clock, never an instance's.
/// A write that starts or renews a lease does not say when the lease ends:
/// it says "the timestamp the server gives this write, plus the lease", and
/// the next reader resolves it with that timestamp. A claim learns the
/// server's "now" by writing [`CLOCK_KEY`] (at the same time as it reads the
/// document) and reading back the server timestamp of that write; the
/// decision then uses the later of that and the document's own timestamp.
/// Both are server times from before the decision, so a lease is only taken
/// over once the server's clock has passed its end. This store has no
/// clock of its own and never reads the local one.
///
/// # Round trips
///
/// | call | round trips |
/// |---|---|
/// | claim that wins, takes over, skips or is late | 3: read document + write clock, read clock and the pauses (+ the run key when needed), swap |
/// | claim of a paused job's slot the document never held | 4: its run key is read after the pauses (a `missed` record stays) |
/// | claim that finds a live lease | 2 |
/// | claim by the run's own token, or of an ended run in the document | 1 |
/// | lost swap | +2 (read again, swap again) |
/// | heartbeat, finish, release | 2: read, swap |
/// | peek | 2 |
/// | `claim_many` | as one claim, whatever the number of jobs |
/// | pause | 3: write + read the clock, put |
/// | resume | 1: purge |
/// | pauses | 2: list + write the clock, read the pauses + the clock |
///
/// [`NatsLeaseStore::stats`] counts them.
///
/// # Cancel safety
///
/// Every call is one or more reads and at most one compare-and-swap per
/// job: a dropped call either wrote or did not, and the same call again
/// (same token) gives the right answer.
pub struct NatsLeaseStore {
    client: async_nats::Client,
    jetstream: Context,
    stream: Stream,
    url: String,
    bucket: String,
    timeout: Duration,
    counters: Counters,
    /// What the bucket was made from: to make it again when a server
    /// restart deleted an in-memory bucket.
    leases: NatsLeaseOptions,
    /// Whether reads use JetStream's direct get: only when the bucket has
    /// one replica and allows it (see [`NatsLeaseStore::read`]).
    direct_reads: bool,
    /// Hand-overs heard, from this handle and (through the subscription)
    /// from every other handle on the bucket.
    hand_overs: Arc<HandOvers>,
    _listener: Listener,
}

/// Whether a bucket of this configuration is read with direct get.
///
/// Direct get answers from any server that holds the stream, without the
/// JSON and base64 wrapping of the leader's message API, so it costs the
/// server and the client much less for a large job document. With one
/// replica the one server that answers is the leader, so a read never
/// misses a write that was acknowledged; with more, a follower that lags
/// could answer, and a heartbeat could then think its run was lost. So a
/// replicated bucket is read from its leader. A bucket made without
/// `allow_direct` (by hand) has no server answering direct gets at all.
fn reads_directly(config: &async_nats::jetstream::stream::Config) -> bool {
    config.allow_direct && config.num_replicas <= 1
}

/// The core NATS subject on which a bucket's hand-overs are announced.
fn hand_over_subject(bucket: &str) -> String {
    format!("anarchon.hand-over.{bucket}")
}

impl NatsLeaseStore {
    /// Connects, checks that JetStream answers, and creates or verifies the
    /// bucket.
    ///
    /// # Errors
    ///
    /// The option errors; [`Error::AuthorizationViolation`] for refused
    /// credentials, [`Error::NoJetStream`] when the server or account has no
    /// JetStream, [`Error::BucketMismatch`] when a bucket of that name does
    /// not fit, [`Error::SubjectsOverlap`] when another stream takes its
    /// subjects, [`Error::Unreachable`] or [`Error::Timeout`] when the
    /// server does not answer.
    pub async fn connect(
        connection: &NatsOptions,
        leases: NatsLeaseOptions,
    ) -> Result<Self, Error> {
        leases.validate()?;
        let hand_overs = Arc::new(HandOvers::new());
        let Connected {
            client,
            jetstream,
            url,
        } = connect(connection, Some(hand_overs.clone())).await?;
        let timeout = connection.timeout();
        let ((), stream) = ensure_stream(
            &jetstream,
            leases.stream_config(),
            &url,
            timeout,
            &LEASE_BUCKET,
            |config| leases.verify(config),
        )
        .await?;
        let direct_reads = reads_directly(&stream.cached_info().config);
        let mut news = client
            .subscribe(hand_over_subject(leases.bucket()))
            .await
            .map_err(|e| Error::Unreachable {
                url: url.clone(),
                source: Box::new(e),
            })?;
        let board = hand_overs.clone();
        let listener = Listener::spawn(async move {
            while let Some(message) = news.next().await {
                let text = String::from_utf8_lossy(&message.payload);
                match run_in_news(&text) {
                    Some(run) => board.announce(&run),
                    None => {
                        tracing::debug!(%text, "ignoring a hand-over message that names no run")
                    }
                }
            }
        });
        Ok(Self {
            client,
            jetstream,
            stream,
            url,
            bucket: leases.bucket().to_owned(),
            timeout,
            counters: Counters::default(),
            leases,
            direct_reads,
            hand_overs,
            _listener: listener,
        })
    }

    /// Tells the backups of every handle on the bucket (this one at once)
    /// that `run` was handed over. Best effort: a backup that misses it
    /// reads the run when the lease would have ended.
    async fn announce_hand_over(&self, run: &RunKey) {
        self.hand_overs.announce(run);
        let payload = news_of(run);
        // Flushed, so news sent just before the process exits (a release at
        // shutdown, a request from `anarchon trigger`) is not left in the
        // client's buffer.
        let sent = async {
            self.client
                .publish(hand_over_subject(&self.bucket), payload.into())
                .await?;
            self.client.flush().await.map_err(|e| {
                async_nats::PublishError::with_source(async_nats::client::PublishErrorKind::Send, e)
            })
        };
        if let Err(error) = sent.await {
            tracing::debug!(%error, %run, "could not announce a hand-over; backups learn of it at their next read");
        }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// What this handle has sent to the server so far.
    pub fn stats(&self) -> LeaseStats {
        LeaseStats {
            round_trips: self.counters.round_trips.load(Ordering::Relaxed),
            requests: self.counters.requests.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
        }
    }

    /// The key of a job's document: `job.<job>`.
    pub fn job_key(job: &JobName) -> String {
        format!("job.{job}")
    }

    /// The key of a run's record: `run.<job>.<slot in UTC ms>`.
    pub fn run_key(run: &RunKey) -> String {
        format!("run.{}.{}", run.job, run.slot.as_millis())
    }

    fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
    }

    fn unavailable(&self, message: impl fmt::Display) -> StoreError {
        StoreError::unavailable(LEASE_BACKEND, format!("NATS at {}: {message}", self.url))
    }

    fn protocol(&self, message: impl fmt::Display) -> StoreError {
        StoreError::protocol(
            LEASE_BACKEND,
            format!("bucket {:?}: {message}", self.bucket),
        )
    }

    fn round_trips(&self, n: u64) {
        Counters::add(&self.counters.round_trips, n);
    }
}

impl fmt::Debug for NatsLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLeaseStore")
            .field("url", &self.url)
            .field("bucket", &self.bucket)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::clock::server_millis;
    use super::*;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    use std::time::SystemTime;

    fn server_error(code: u16) -> async_nats::jetstream::Error {
        serde_json::from_str(&format!(
            r#"{{"code":400,"err_code":{code},"description":"wrong last sequence: 7"}}"#
        ))
        .expect("a JetStream error as the server sends it")
    }

    #[test]
    fn both_wrong_last_sequence_codes_are_conflicts() {
        // 10071 as async-nats classifies it itself.
        let single =
            PublishError::with_source(PublishErrorKind::WrongLastSequence, server_error(10071));
        assert!(is_wrong_last_sequence(&single));
        // 10164, from a replicated stream: async-nats calls it `Other`.
        let replicated = PublishError::with_source(PublishErrorKind::Other, server_error(10164));
        assert!(is_wrong_last_sequence(&replicated));
        // 10071 arriving as `Other` (another client version) too.
        let other = PublishError::with_source(PublishErrorKind::Other, server_error(10071));
        assert!(is_wrong_last_sequence(&other));
        // Not conflicts: a duplicate message id, a missing stream, a timeout.
        for code in [10070, 10059, 10077] {
            let e = PublishError::with_source(PublishErrorKind::Other, server_error(code));
            assert!(!is_wrong_last_sequence(&e), "{code}");
        }
        assert!(!is_wrong_last_sequence(&PublishError::new(
            PublishErrorKind::TimedOut
        )));
        assert!(!is_wrong_last_sequence(&PublishError::new(
            PublishErrorKind::Other
        )));
    }

    #[test]
    fn only_a_one_replica_bucket_that_allows_it_is_read_directly() {
        let config = NatsLeaseOptions::new().stream_config();
        assert!(reads_directly(&config), "the bucket we make, one replica");
        let replicated = async_nats::jetstream::stream::Config {
            num_replicas: 3,
            ..config.clone()
        };
        assert!(!reads_directly(&replicated), "a follower could lag");
        let by_hand = async_nats::jetstream::stream::Config {
            allow_direct: false,
            ..config
        };
        assert!(!reads_directly(&by_hand), "nobody answers a direct get");
    }

    #[test]
    fn server_timestamps_become_utc_millis() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_791_633_610_123);
        assert_eq!(server_millis(t), Some(1_791_633_610_123));
        assert_eq!(
            server_millis(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            None
        );
    }

    /// The store decides on the server's clock only: nothing in it reads
    /// the local wall clock or measures local time (the timeouts around
    /// requests are tokio's, and only limit how long a call waits).
    #[test]
    fn the_store_never_reads_a_local_clock() {
        let sources = [
            include_str!("lease.rs"),
            include_str!("lease/batch.rs"),
            include_str!("lease/clock.rs"),
            include_str!("lease/gc.rs"),
            include_str!("lease/kv.rs"),
            include_str!("lease/options.rs"),
            include_str!("lease/pauses.rs"),
            include_str!("lease/records.rs"),
            include_str!("lease/store.rs"),
        ];
        let forbidden = [
            concat!("SystemTime", "::now"),
            concat!("Utc", "::now"),
            concat!("System", "Clock"),
            concat!("Instant", "::now"),
            concat!(".elap", "sed()"),
            concat!("datetime", "::now"),
            concat!("Local", "::now"),
            concat!("dyn ", "Clock"),
        ];
        for source in sources {
            for word in forbidden {
                assert!(
                    !source.contains(word),
                    "the lease store must not read a local clock, but uses {word}"
                );
            }
        }
    }
}
