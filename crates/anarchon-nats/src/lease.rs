//! The lease store: a JetStream KV bucket, compare-and-swap on revisions,
//! and the NATS server's clock.

mod options;
mod records;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anarchon_core::time::millis;
use anarchon_core::{
    ClaimAnswers, ClaimOutcome, FinalState, HandOvers, JobName, LeaseClaim, LeaseStore, Listener,
    RecordState, Renewal, RunKey, RunOutcome, RunRecord, RunState, RunView, Slot, StoreError,
    StoreErrorKind, Timestamp, Token,
};
use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::{Context, ErrorCode};
use async_trait::async_trait;
use futures::future::join_all;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use self::records::{Effect, JobDoc, Outside, RunDoc, Stamp, decide, needs_time};
use crate::connection::{Connected, StreamRole, connect, ensure_stream};
use crate::error::Error;
use crate::options::{NatsOptions, Storage};

pub use self::options::{DEFAULT_BUCKET, MAX_BUCKET_NAME_LEN, MAX_HISTORY, NatsLeaseOptions};

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

const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const KV_OPERATION: &str = "KV-Operation";

const LEASE_BUCKET: StreamRole = StreamRole {
    looking_up: "looking up the lease bucket",
    creating: "creating the lease bucket",
    created: "created the lease bucket",
};

/// Whether a failed write is the server's "wrong last sequence" answer to
/// a compare-and-swap: another writer was first.
///
/// NATS answers it with error code 10071 on a single server and, from a
/// replicated stream, sometimes with 10164 ("wrong last sequence", checked
/// in the replication pipeline). async-nats 0.51 recognises only the first
/// (as [`PublishErrorKind::WrongLastSequence`]); the second arrives as
/// [`PublishErrorKind::Other`] with the server's error as its source. Both
/// mean the same thing here.
pub fn is_wrong_last_sequence(error: &PublishError) -> bool {
    if error.kind() == PublishErrorKind::WrongLastSequence {
        return true;
    }
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|js| {
            matches!(
                js.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                    | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            )
        })
}

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
/// longer in it, so they answer [`Renewal::Fenced`]. Since a job's live
/// runs share one document, the `overlap` check and the write are one swap.
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
/// | claim that wins, takes over, skips or is late | 3: read document + write clock, read clock (+ the run key when needed), swap |
/// | claim that finds a live lease | 2 |
/// | claim by the run's own token, or of an ended run in the document | 1 |
/// | lost swap | +2 (read again, swap again) |
/// | heartbeat, finish, release | 2: read, swap |
/// | peek | 2 |
/// | `claim_many` | as one claim, whatever the number of jobs |
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
    /// Hand-overs heard, from this handle and (through the subscription)
    /// from every other handle on the bucket.
    hand_overs: Arc<HandOvers>,
    _listener: Listener,
}

/// The core NATS subject on which a bucket's hand-overs are announced.
fn hand_over_subject(bucket: &str) -> String {
    format!("anarchon.hand-over.{bucket}")
}

/// A failed request, and whether it failed because the bucket's stream is
/// gone.
enum Gone {
    /// No stream: deleted, or an in-memory bucket after a server restart.
    Yes(StoreError),
    /// Any other failure.
    Not(StoreError),
}

impl Gone {
    fn into_error(self) -> StoreError {
        match self {
            Gone::Yes(e) | Gone::Not(e) => e,
        }
    }
}

/// One key's latest message.
struct Entry {
    revision: u64,
    payload: Vec<u8>,
    written_at: i64,
    removed: bool,
}

/// A job's document as read.
struct JobRead {
    /// 0 when the key has no message.
    revision: u64,
    doc: JobDoc,
    /// The server timestamp of the revision.
    written_at: Option<i64>,
}

/// The server's time, learned once per call from a write of [`CLOCK_KEY`].
struct ServerClock<'a> {
    store: &'a NatsLeaseStore,
    tick: Result<u64, String>,
    now: OnceCell<i64>,
}

impl ServerClock<'_> {
    async fn now(&self) -> Result<i64, StoreError> {
        self.now
            .get_or_try_init(|| async {
                match &self.tick {
                    Ok(sequence) => self.store.clock_after(*sequence).await,
                    Err(message) => Err(self.store.unavailable(message.clone())),
                }
            })
            .await
            .copied()
    }
}

/// The server timestamp of a message as UTC milliseconds.
fn server_millis(time: impl Into<SystemTime>) -> Option<i64> {
    let since = time.into().duration_since(SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
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
        let Connected {
            client,
            jetstream,
            url,
        } = connect(connection).await?;
        let timeout = connection.get_timeout();
        let ((), stream) = ensure_stream(
            &jetstream,
            leases.stream_config(),
            &url,
            timeout,
            &LEASE_BUCKET,
            |config| leases.verify(config),
        )
        .await?;
        let hand_overs = Arc::new(HandOvers::new());
        let mut news = client
            .subscribe(hand_over_subject(leases.get_bucket()))
            .await
            .map_err(|e| Error::Unreachable {
                url: url.clone(),
                source: Box::new(e),
            })?;
        let board = hand_overs.clone();
        let listener = Listener::spawn(async move {
            while let Some(message) = news.next().await {
                let text = String::from_utf8_lossy(&message.payload);
                let parsed = text.split_once(' ').and_then(|(job, slot)| {
                    Some(RunKey::new(
                        JobName::new(job).ok()?,
                        Slot::from_millis(slot.parse().ok()?),
                    ))
                });
                match parsed {
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
            bucket: leases.get_bucket().to_owned(),
            timeout,
            counters: Counters::default(),
            leases,
            hand_overs,
            _listener: listener,
        })
    }

    /// Tells the backups of every handle on the bucket (this one at once)
    /// that `run` was handed over. Best effort: a backup that misses it
    /// reads the run when the lease would have ended.
    async fn announce_hand_over(&self, run: &RunKey) {
        self.hand_overs.announce(run);
        let payload = format!("{} {}", run.job, run.slot.as_millis());
        if let Err(error) = self
            .client
            .publish(hand_over_subject(&self.bucket), payload.into())
            .await
        {
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

    /// Whether a call that found the bucket's stream gone may make it
    /// again: only an in-memory bucket, which a server restart deletes. One
    /// on disk that is gone was deleted by someone; making it again would
    /// start every job's fence numbers from 1 behind their back.
    fn may_recreate(&self) -> bool {
        self.leases.get_storage() == Storage::Memory
    }

    /// Creates the in-memory bucket again, empty, as
    /// [`NatsLeaseStore::connect`] did.
    async fn recreate(&self) -> Result<(), StoreError> {
        tracing::warn!(bucket = %self.bucket, "the in-memory lease bucket is gone (did the NATS server restart?): creating it again; every run and fence counter before is forgotten");
        ensure_stream(
            &self.jetstream,
            self.leases.stream_config(),
            &self.url,
            self.timeout,
            &LEASE_BUCKET,
            |config| self.leases.verify(config),
        )
        .await?;
        Ok(())
    }

    /// The latest message of `key`, from the stream's leader.
    async fn read(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        match self.read_once(key).await {
            Err(Gone::Yes(_)) if self.may_recreate() => {
                self.recreate().await?;
                self.read_once(key).await.map_err(Gone::into_error)
            }
            other => other.map_err(Gone::into_error),
        }
    }

    async fn read_once(&self, key: &str) -> Result<Option<Entry>, Gone> {
        Counters::add(&self.counters.requests, 1);
        let subject = self.subject(key);
        let answer = tokio::time::timeout(
            self.timeout,
            self.stream.get_last_raw_message_by_subject(&subject),
        )
        .await;
        let message = match answer {
            Err(_) => {
                return Err(Gone::Not(self.unavailable(format!(
                    "reading {key} took longer than {:?}",
                    self.timeout
                ))));
            }
            Ok(Err(e)) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Ok(Err(e)) => {
                let gone = matches!(e.kind(), LastRawMessageErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND);
                let error = self
                    .unavailable(format!("reading {key} failed: {e}"))
                    .with_source(e);
                return Err(if gone {
                    Gone::Yes(error)
                } else {
                    Gone::Not(error)
                });
            }
            Ok(Ok(message)) => message,
        };
        let written_at = server_millis(message.time).ok_or_else(|| {
            Gone::Not(self.protocol(format!("{key} has a timestamp before 1970 or after 2262")))
        })?;
        let removed = message
            .headers
            .get(KV_OPERATION)
            .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
        Ok(Some(Entry {
            revision: message.sequence,
            payload: message.payload.to_vec(),
            written_at,
            removed,
        }))
    }

    /// Writes `key`; with `expected`, only if its latest revision is that
    /// (0: only if it has none). `None` when another writer was first.
    async fn write(
        &self,
        key: &str,
        payload: Vec<u8>,
        expected: Option<u64>,
    ) -> Result<Option<u64>, StoreError> {
        match self.write_once(key, payload.clone(), expected).await {
            Err(Gone::Yes(_)) if self.may_recreate() => {
                self.recreate().await?;
                self.write_once(key, payload, expected)
                    .await
                    .map_err(Gone::into_error)
            }
            other => other.map_err(Gone::into_error),
        }
    }

    async fn write_once(
        &self,
        key: &str,
        payload: Vec<u8>,
        expected: Option<u64>,
    ) -> Result<Option<u64>, Gone> {
        Counters::add(&self.counters.requests, 1);
        let mut headers = HeaderMap::new();
        if let Some(revision) = expected {
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE,
                revision.to_string().as_str(),
            );
        }
        let sent = async {
            self.jetstream
                .publish_with_headers(self.subject(key), headers, payload.into())
                .await?
                .await
        };
        let limit = self.timeout + Duration::from_secs(1);
        match tokio::time::timeout(limit, sent).await {
            Err(_) => Err(Gone::Not(self.unavailable(format!(
                "no acknowledgement for the write of {key} within {limit:?}; it may have been stored: send the same call again"
            )))),
            Ok(Err(e)) if expected.is_some() && is_wrong_last_sequence(&e) => Ok(None),
            Ok(Err(e)) => {
                let message = format!("writing {key} failed: {e}");
                Err(match e.kind() {
                    PublishErrorKind::StreamNotFound => Gone::Yes(self.unavailable(format!(
                        "no JetStream stream takes {key} in bucket {:?}: it was deleted, or JetStream is still starting; restarting the application creates it again",
                        self.bucket
                    )).with_source(e)),
                    PublishErrorKind::MaxPayloadExceeded => {
                        Gone::Not(StoreError::invalid(LEASE_BACKEND, message).with_source(e))
                    }
                    _ => Gone::Not(self.unavailable(message).with_source(e)),
                })
            }
            Ok(Ok(ack)) if ack.stream != self.stream.cached_info().config.name => {
                Err(Gone::Not(self.protocol(format!(
                    "the write of {key} was stored in stream {:?}",
                    ack.stream
                ))))
            }
            Ok(Ok(ack)) => Ok(Some(ack.sequence)),
        }
    }

    /// Writes [`CLOCK_KEY`]; returns the write's sequence.
    async fn tick(&self) -> Result<u64, StoreError> {
        self.write(CLOCK_KEY, Vec::new(), None)
            .await?
            .ok_or_else(|| self.protocol("a plain write was refused as a conflict"))
    }

    /// The server timestamp of the latest write of [`CLOCK_KEY`], which is
    /// at least the write at `sequence`: a server time from before now.
    async fn clock_after(&self, sequence: u64) -> Result<i64, StoreError> {
        let entry = self
            .read(CLOCK_KEY)
            .await?
            .ok_or_else(|| self.unavailable("the clock key vanished right after a write"))?;
        if entry.revision < sequence {
            return Err(self.unavailable(format!(
                "the server answered with clock revision {} from before this call's write {sequence}; ask again",
                entry.revision
            )));
        }
        Ok(entry.written_at)
    }

    /// The server's time now (a lower bound): two round trips.
    async fn server_now(&self) -> Result<i64, StoreError> {
        let sequence = self.tick().await?;
        self.clock_after(sequence).await
    }

    async fn read_job(&self, job: &JobName) -> Result<JobRead, StoreError> {
        let key = Self::job_key(job);
        Ok(match self.read(&key).await? {
            None => JobRead {
                revision: 0,
                doc: JobDoc::default(),
                written_at: None,
            },
            Some(entry) if entry.removed => {
                tracing::warn!(bucket = %self.bucket, %key, "the job's document was deleted by hand: its fence numbers start again from 1");
                JobRead {
                    revision: entry.revision,
                    doc: JobDoc::default(),
                    written_at: Some(entry.written_at),
                }
            }
            Some(entry) => JobRead {
                revision: entry.revision,
                doc: JobDoc::decode(&entry.payload, entry.written_at)
                    .map_err(|m| self.protocol(format!("{key}: {m}")))?,
                written_at: Some(entry.written_at),
            },
        })
    }

    async fn read_run(&self, run: &RunKey) -> Result<Option<RunDoc>, StoreError> {
        let key = Self::run_key(run);
        match self.read(&key).await? {
            None => Ok(None),
            Some(entry) if entry.removed => Ok(None),
            Some(entry) => RunDoc::decode(&entry.payload, entry.written_at)
                .map(Some)
                .map_err(|m| self.protocol(format!("{key}: {m}"))),
        }
    }

    async fn outside(&self, run: &RunKey) -> Result<Outside, StoreError> {
        Ok(match self.read_run(run).await? {
            None => Outside::Absent,
            Some(doc) => match doc.record_state().map_err(|m| self.protocol(m))? {
                RecordState::Finished(state) => Outside::Ended(state),
                _ => Outside::Missed,
            },
        })
    }

    /// Moves an ended run's record to its own key (the same record every
    /// time, so writing it twice does no harm).
    async fn put_run(&self, job: &JobName, slot: i64, record: &RunDoc) -> Result<(), StoreError> {
        let run = RunKey::new(job.clone(), Slot::from_millis(slot));
        let payload = serde_json::to_vec(record).unwrap_or_default();
        self.write(&Self::run_key(&run), payload, None).await?;
        Ok(())
    }

    /// Records `run` as missed unless it has a record.
    async fn create_missed(&self, run: &RunKey) -> Result<(), StoreError> {
        let record = RunDoc::nobody(RecordState::Missed);
        let payload = serde_json::to_vec(&record).unwrap_or_default();
        // A conflict means the run has a record already: nothing to do.
        self.write(&Self::run_key(run), payload, Some(0)).await?;
        Ok(())
    }

    /// Claims a batch: one round trip to read every job's document (and
    /// write the clock), one to read the clock and any run keys, one to
    /// write; more only for jobs whose write lost a race.
    /// Settles a batch job by job. A job whose claims fail (its document
    /// unreadable, its swaps lost) answers each of its claims with that
    /// error; the other jobs' answers, wins included, stand.
    async fn claim_batch(
        &self,
        reqs: &[LeaseClaim],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut groups: Vec<(&JobName, Vec<(usize, &LeaseClaim)>)> = Vec::new();
        let mut index: HashMap<&JobName, usize> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            let job = &req.run().job;
            let g = *index.entry(job).or_insert_with(|| {
                groups.push((job, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((i, req));
        }
        let (tick, reads) = tokio::join!(
            self.tick(),
            join_all(groups.iter().map(|(job, _)| self.read_job(job)))
        );
        let clock = ServerClock {
            store: self,
            tick: tick.map_err(|e| e.to_string()),
            now: OnceCell::new(),
        };
        let settled = join_all(
            groups
                .iter()
                .zip(reads)
                .map(|((job, claims), read)| self.claim_job(job, claims, read, &clock)),
        )
        .await;
        let mut out: Vec<Option<Result<ClaimOutcome, StoreError>>> =
            (0..reqs.len()).map(|_| None).collect();
        let mut depth = 0;
        for ((job, claims), result) in groups.iter().zip(settled) {
            match result {
                Ok((answers, d)) => {
                    depth = depth.max(d);
                    for (i, outcome) in answers {
                        out[i] = Some(Ok(outcome));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, job = %job, "the job's claims failed; the batch's other jobs go on");
                    for (i, _) in claims {
                        out[*i] = Some(Err(same_error(&e)));
                    }
                }
            }
        }
        self.round_trips(1 + depth);
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(self.protocol("a claim of the batch got no answer"))))
            .collect())
    }

    /// Settles the claims of one job, starting from `first`, the read of
    /// its document. Returns the answers and how many round trips it
    /// waited after that read.
    async fn claim_job(
        &self,
        job: &JobName,
        claims: &[(usize, &LeaseClaim)],
        first: Result<JobRead, StoreError>,
        clock: &ServerClock<'_>,
    ) -> Result<(Vec<(usize, ClaimOutcome)>, u64), StoreError> {
        let key = Self::job_key(job);
        let mut read = first?;
        let mut depth = 0;
        for round in 0..MAX_ROUNDS {
            if round > 0 {
                read = self.read_job(job).await?;
                depth += 1;
            }
            let doc = &read.doc;
            let in_doc = |slot: i64| doc.live.contains_key(&slot) || doc.ended.contains_key(&slot);
            // Run keys matter only for slots the document once had.
            let mut to_read: Vec<&RunKey> = Vec::new();
            for (_, claim) in claims {
                let slot = claim.run().slot.as_millis();
                if !in_doc(slot)
                    && doc.high.is_some_and(|high| slot <= high)
                    && !to_read.contains(&claim.run())
                {
                    to_read.push(claim.run());
                }
            }
            let timed = claims.iter().any(|(_, c)| needs_time(doc, None, c));
            // Ended runs move to their run keys before the swap that drops
            // them from the document; only a call that may write does it.
            let flush: Vec<(i64, &RunDoc)> = if timed {
                doc.ended.iter().map(|(s, r)| (*s, r)).collect()
            } else {
                Vec::new()
            };
            let mut outside: HashMap<i64, Outside> = HashMap::new();
            let mut flushed = Vec::new();
            let mut now = None;
            // The clock is read once per call; a later round reuses it.
            let asks = (timed && clock.now.get().is_none()) || !flush.is_empty();
            if timed || !to_read.is_empty() {
                let time = async {
                    if timed {
                        clock.now().await.map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let (runs, puts, time) = tokio::join!(
                    join_all(to_read.iter().map(|run| self.outside(run))),
                    join_all(
                        flush
                            .iter()
                            .map(|(slot, rec)| self.put_run(job, *slot, rec))
                    ),
                    time,
                );
                if asks || !to_read.is_empty() {
                    depth += 1;
                }
                for (run, found) in to_read.iter().zip(runs) {
                    outside.insert(run.slot.as_millis(), found?);
                }
                for ((slot, _), put) in flush.iter().zip(puts) {
                    match put {
                        Ok(()) => flushed.push(*slot),
                        Err(error) => {
                            tracing::debug!(%error, job = %job, slot, "could not move an ended run to its key yet");
                        }
                    }
                }
                // Both are server times from before this decision.
                now = time?.map(|t| read.written_at.map_or(t, |w| w.max(t)));
            }
            let mut next = read.doc.clone();
            let mut answers = Vec::with_capacity(claims.len());
            let mut write_job = false;
            let mut missed: Vec<&RunKey> = Vec::new();
            for (i, claim) in claims {
                let slot = claim.run().slot.as_millis();
                let found = outside.get(&slot).copied().unwrap_or(Outside::NoneOrMissed);
                let (outcome, effect) = match decide(&mut next, found, now, claim) {
                    None => {
                        return Err(
                            self.protocol("a claim needed the server's time, which was not read")
                        );
                    }
                    Some(Err(m)) => return Err(self.protocol(format!("{key}: {m}"))),
                    Some(Ok(decided)) => decided,
                };
                match effect {
                    Effect::Job => write_job = true,
                    Effect::CreateMissed => missed.push(claim.run()),
                    Effect::None => {}
                }
                answers.push((*i, outcome));
            }
            if write_job {
                for slot in &flushed {
                    next.ended.remove(slot);
                }
                // The write records the job's longest late window too.
                let longest = claims.iter().map(|(_, c)| millis(c.claim.max_late)).max();
                next.window = next.window.max(longest);
                let written = self.write(&key, next.encode(), Some(read.revision)).await?;
                depth += 1;
                if written.is_none() {
                    Counters::add(&self.counters.conflicts, 1);
                    continue;
                }
            }
            if !missed.is_empty() {
                let created = join_all(missed.iter().map(|run| self.create_missed(run))).await;
                depth += 1;
                for result in created {
                    result?;
                }
            }
            return Ok((answers, depth));
        }
        Err(self.unavailable(format!(
            "the claims of job {job} lost {MAX_ROUNDS} compare-and-swap races in a row; try again"
        )))
    }

    /// Read-and-swap on the live run `run` held by `token`: `change` edits
    /// the document (the run is in `live`). `Fenced` when `token` does not
    /// hold the run.
    async fn change_live(
        &self,
        run: &RunKey,
        token: Token,
        change: impl Fn(&mut JobDoc, i64),
    ) -> Result<Renewal, StoreError> {
        let key = Self::job_key(&run.job);
        let slot = run.slot.as_millis();
        for _ in 0..MAX_ROUNDS {
            let read = self.read_job(&run.job).await?;
            self.round_trips(1);
            if !read.doc.live.get(&slot).is_some_and(|l| l.held_by(token)) {
                return Ok(Renewal::Fenced);
            }
            let mut next = read.doc;
            change(&mut next, slot);
            let written = self.write(&key, next.encode(), Some(read.revision)).await?;
            self.round_trips(1);
            if written.is_some() {
                return Ok(Renewal::Renewed);
            }
            Counters::add(&self.counters.conflicts, 1);
        }
        Err(self.unavailable(format!(
            "the update of {run} lost {MAX_ROUNDS} compare-and-swap races in a row; try again"
        )))
    }

    /// Lists the keys under `pattern` (e.g. `run.<job>.*`), without the
    /// bucket's prefix.
    async fn list(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        Counters::add(&self.counters.requests, 1);
        let filter = self.subject(pattern);
        let prefix = self.subject("");
        let limit = self.timeout;
        let timeout = || self.unavailable(format!("listing {pattern} took longer than {limit:?}"));
        let mut subjects =
            match tokio::time::timeout(limit, self.stream.info_with_subjects(&filter)).await {
                Err(_) => return Err(timeout()),
                Ok(Err(e)) => {
                    return Err(self
                        .unavailable(format!("listing {pattern} failed: {e}"))
                        .with_source(e));
                }
                Ok(Ok(subjects)) => subjects,
            };
        let mut keys = Vec::new();
        loop {
            match tokio::time::timeout(limit, subjects.try_next()).await {
                Err(_) => return Err(timeout()),
                Ok(Err(e)) => {
                    return Err(self
                        .unavailable(format!("listing {pattern} failed: {e}"))
                        .with_source(e));
                }
                Ok(Ok(None)) => return Ok(keys),
                Ok(Ok(Some((subject, _count)))) => {
                    if let Some(key) = subject.strip_prefix(&prefix) {
                        keys.push(key.to_owned());
                    }
                }
            }
        }
    }

    /// Removes every message of `key`, leaving no marker. Returns how many
    /// messages went.
    async fn purge(&self, key: &str) -> Result<u64, StoreError> {
        Counters::add(&self.counters.requests, 1);
        match tokio::time::timeout(self.timeout, self.stream.purge().filter(self.subject(key)))
            .await
        {
            Err(_) => {
                Err(self.unavailable(format!("purging {key} took longer than {:?}", self.timeout)))
            }
            Ok(Err(e)) => Err(self
                .unavailable(format!("purging {key} failed: {e}"))
                .with_source(e)),
            Ok(Ok(response)) => Ok(response.purged),
        }
    }

    /// Garbage collection for one job's document: drops ended runs and
    /// live runs older than the job's cutoff (`now` less `keep` or the
    /// job's late window, whichever is longer) whose lease ended more than
    /// `keep` ago, and moves the other
    /// ended runs to their keys. Returns the cutoff and the slots dropped.
    async fn collect_job(
        &self,
        job: &JobName,
        now: i64,
        keep: i64,
    ) -> Result<(i64, Vec<i64>), StoreError> {
        let key = Self::job_key(job);
        for _ in 0..MAX_ROUNDS {
            let read = self.read_job(job).await?;
            let cutoff = now.saturating_sub(keep.max(read.doc.window.unwrap_or(0)));
            let lease_cutoff = now.saturating_sub(keep);
            let mut next = read.doc.clone();
            let mut dropped = Vec::new();
            let mut keep = Vec::new();
            for (slot, record) in &read.doc.ended {
                if *slot < cutoff {
                    dropped.push(*slot);
                } else {
                    keep.push((*slot, record));
                }
            }
            for (slot, live) in &read.doc.live {
                if *slot < cutoff && live.lease_until.at_or(lease_cutoff) < lease_cutoff {
                    dropped.push(*slot);
                }
            }
            let puts = join_all(keep.iter().map(|(slot, rec)| self.put_run(job, *slot, rec))).await;
            for ((slot, _), put) in keep.iter().zip(puts) {
                if put.is_ok() {
                    next.ended.remove(slot);
                }
            }
            for slot in &dropped {
                next.ended.remove(slot);
                next.live.remove(slot);
            }
            if next == read.doc {
                return Ok((cutoff, dropped));
            }
            if self
                .write(&key, next.encode(), Some(read.revision))
                .await?
                .is_some()
            {
                return Ok((cutoff, dropped));
            }
            Counters::add(&self.counters.conflicts, 1);
        }
        Err(self.unavailable(format!(
            "collecting job {job} lost {MAX_ROUNDS} compare-and-swap races in a row; try again"
        )))
    }
}

anarchon_core::claims_through_leases!(NatsLeaseStore, LEASE_BACKEND);

#[async_trait]
impl LeaseStore for NatsLeaseStore {
    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let mut answers = self.claim_batch(std::slice::from_ref(req)).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(self.protocol("a claim got no answer")))
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        Ok(ClaimAnswers::new(self.claim_batch(reqs).await?))
    }

    async fn peek(&self, run: &RunKey) -> Result<RunView, StoreError> {
        let (tick, read) = tokio::join!(self.tick(), self.read_job(&run.job));
        self.round_trips(1);
        let (sequence, read) = (tick?, read?);
        let slot = run.slot.as_millis();
        let in_doc = read.doc.live.contains_key(&slot) || read.doc.ended.contains_key(&slot);
        let (now, outside) = if in_doc {
            (self.clock_after(sequence).await?, None)
        } else {
            let (now, outside) = tokio::join!(self.clock_after(sequence), self.outside(run));
            (now?, Some(outside?))
        };
        self.round_trips(1);
        let now = read.written_at.map_or(now, |w| w.max(now));
        let state = if let Some(live) = read.doc.live.get(&slot) {
            RunState::Running {
                attempt: anarchon_core::Attempt::new(live.attempt)
                    .ok_or_else(|| self.protocol("a live run has attempt 0"))?,
                lease_until: Timestamp::from_millis(live.lease_until.at_or(now)),
            }
        } else if let Some(ended) = read.doc.ended.get(&slot) {
            match ended.record_state().map_err(|m| self.protocol(m))? {
                RecordState::Finished(state) => RunState::Finished(state),
                other => {
                    return Err(self.protocol(format!(
                        "an ended run in the document of {} has the state {}",
                        run.job,
                        other.as_str()
                    )));
                }
            }
        } else {
            match outside {
                Some(Outside::Missed) => RunState::Missed,
                Some(Outside::Ended(state)) => RunState::Finished(state),
                _ => RunState::Absent,
            }
        };
        Ok(RunView {
            store_now: Timestamp::from_millis(now),
            state,
        })
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        self.change_live(run, token, |doc, slot| {
            if let Some(live) = doc.live.get_mut(&slot) {
                live.lease_until = Stamp::after_write(lease);
            }
        })
        .await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        let (state, error) = match outcome {
            RunOutcome::Succeeded => (FinalState::Succeeded, None),
            RunOutcome::Failed { error } => (FinalState::Failed, Some(error)),
        };
        let changed = self
            .change_live(run, token, |doc, slot| {
                if let Some(live) = doc.live.remove(&slot) {
                    doc.ended
                        .insert(slot, RunDoc::from_live(&live, state, error.clone()));
                }
            })
            .await?;
        if changed == Renewal::Renewed {
            return Ok(changed);
        }
        // The same finish sent again by the token that finished the run:
        // it was recorded (its answer was lost), and gets the same answer.
        let slot = run.slot.as_millis();
        let read = self.read_job(&run.job).await?;
        let ended = match read.doc.ended.get(&slot) {
            Some(record) => Some(record.clone()),
            None => self.read_run(run).await?,
        };
        Ok(if ended.is_some_and(|r| r.finished_by(token, state)) {
            Renewal::Renewed
        } else {
            Renewal::Fenced
        })
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .change_live(run, token, |doc, slot| {
                if let Some(live) = doc.live.get_mut(&slot) {
                    // Alive means `lease end >= now`: 1 ms before the write's
                    // own timestamp has run out for every later reader.
                    live.lease_until = Stamp::Written { w: -1 };
                }
            })
            .await?;
        if answer == Renewal::Renewed {
            self.announce_hand_over(run).await;
        }
        Ok(answer)
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let answer = self
            .change_live(run, token, |doc, slot| {
                if let Some(live) = doc.live.get_mut(&slot) {
                    live.lease_until = Stamp::Written { w: -1 };
                    live.token.clear();
                }
            })
            .await?;
        if answer == Renewal::Renewed {
            self.announce_hand_over(run).await;
        }
        Ok(answer)
    }

    async fn wait_for_hand_over(&self, run: &RunKey, timeout: Duration) -> bool {
        self.hand_overs.wait(run, timeout).await
    }

    async fn history(&self, job: &JobName, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The document first, then the keys: a run that moves from one to
        // the other meanwhile is written to its key before it leaves the
        // document, so it is found in one of them.
        let read = self.read_job(job).await?;
        let keys = self.list(&format!("run.{job}.*")).await?;
        self.round_trips(2);
        enum Source<'a> {
            Live(&'a records::LiveRun),
            Ended(&'a RunDoc),
            Key,
        }
        let key_prefix = format!("run.{job}.");
        let mut all: BTreeMap<i64, Source<'_>> = BTreeMap::new();
        for key in &keys {
            match key
                .strip_prefix(&key_prefix)
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(slot) => {
                    all.insert(slot, Source::Key);
                }
                None => {
                    tracing::debug!(bucket = %self.bucket, %key, "not a run key; ignored");
                }
            }
        }
        for (slot, record) in &read.doc.ended {
            all.insert(*slot, Source::Ended(record));
        }
        for (slot, live) in &read.doc.live {
            all.insert(*slot, Source::Live(live));
        }
        let newest: Vec<(i64, Source<'_>)> = all.into_iter().rev().take(limit).collect();
        let to_fetch: Vec<RunKey> = newest
            .iter()
            .filter(|(_, source)| matches!(source, Source::Key))
            .map(|(slot, _)| RunKey::new(job.clone(), Slot::from_millis(*slot)))
            .collect();
        let fetching = !to_fetch.is_empty();
        let fetched: Vec<(RunKey, Result<Option<RunDoc>, StoreError>)> =
            futures::stream::iter(to_fetch.into_iter().map(|run| async move {
                let record = self.read_run(&run).await;
                (run, record)
            }))
            .buffered(PARALLEL)
            .collect()
            .await;
        if fetching {
            self.round_trips(1);
        }
        let mut fetched: HashMap<i64, Result<Option<RunDoc>, StoreError>> = fetched
            .into_iter()
            .map(|(run, record)| (run.slot.as_millis(), record))
            .collect();
        let mut out = Vec::with_capacity(newest.len());
        for (slot, source) in &newest {
            let run = RunKey::new(job.clone(), Slot::from_millis(*slot));
            let record = match source {
                Source::Live(live) => live.to_record(run),
                Source::Ended(record) => record.to_record(run),
                Source::Key => match fetched.remove(slot).transpose()?.flatten() {
                    Some(record) => record.to_record(run),
                    // Collected meanwhile.
                    None => continue,
                },
            };
            out.push(record.map_err(|m| self.protocol(m))?);
        }
        Ok(out)
    }

    async fn collect_garbage(&self, keep: Duration) -> Result<u64, StoreError> {
        let now = self.server_now().await?;
        let keep = millis(keep);
        // For run keys of jobs without a document (only `missed` records).
        let cutoff = now.saturating_sub(keep);
        let jobs: Vec<JobName> = self
            .list("job.*")
            .await?
            .into_iter()
            .filter_map(|key| {
                key.strip_prefix("job.")
                    .and_then(|name| JobName::new(name).ok())
            })
            .collect();
        let mut deleted: HashSet<(String, i64)> = HashSet::new();
        let mut first_error = None;
        // Each job's cutoff; a job whose document could not be read has
        // none, and its run keys are left for the next collection.
        let mut cutoffs: HashMap<String, Option<i64>> = HashMap::new();
        let collected: Vec<(JobName, Result<(i64, Vec<i64>), StoreError>)> =
            futures::stream::iter(jobs.into_iter().map(|job| async move {
                let dropped = self.collect_job(&job, now, keep).await;
                (job, dropped)
            }))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (job, dropped) in collected {
            match dropped {
                Ok((job_cutoff, slots)) => {
                    cutoffs.insert(job.to_string(), Some(job_cutoff));
                    for slot in slots {
                        deleted.insert((job.to_string(), slot));
                    }
                }
                Err(error) => {
                    cutoffs.insert(job.to_string(), None);
                    tracing::warn!(%error, job = %job, "could not collect the job's document");
                    first_error = first_error.or(Some(error));
                }
            }
        }
        let old_runs: Vec<(String, i64, String)> = self
            .list("run.>")
            .await?
            .into_iter()
            .filter_map(|key| {
                let rest = key.strip_prefix("run.")?;
                let (job, slot) = rest.rsplit_once('.')?;
                let slot = slot.parse::<i64>().ok()?;
                let cutoff = cutoffs.get(job).copied().unwrap_or(Some(cutoff))?;
                (slot < cutoff).then(|| (job.to_owned(), slot, key.clone()))
            })
            .collect();
        let purged: Vec<(String, i64, Result<u64, StoreError>)> =
            futures::stream::iter(old_runs.into_iter().map(|(job, slot, key)| async move {
                let purged = self.purge(&key).await;
                (job, slot, purged)
            }))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (job, slot, result) in purged {
            match result {
                Ok(0) => {}
                Ok(_) => {
                    deleted.insert((job, slot));
                }
                Err(error) => {
                    tracing::warn!(%error, %job, slot, "could not purge an old run record");
                    first_error = first_error.or(Some(error));
                }
            }
        }
        self.round_trips(6);
        if let Some(error) = first_error {
            return Err(error);
        }
        Ok(u64::try_from(deleted.len()).unwrap_or(u64::MAX))
    }
}

/// The same error again, for each claim of a job that failed as a whole
/// (a `StoreError` is not `Clone`: it may hold a source).
fn same_error(error: &StoreError) -> StoreError {
    let message = error.message().to_owned();
    match error.kind() {
        StoreErrorKind::Unavailable => StoreError::unavailable(LEASE_BACKEND, message),
        StoreErrorKind::Invalid => StoreError::invalid(LEASE_BACKEND, message),
        _ => StoreError::protocol(LEASE_BACKEND, message),
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
    use super::*;
    use async_nats::jetstream::context::PublishError;

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
            include_str!("lease/records.rs"),
            include_str!("lease/options.rs"),
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
