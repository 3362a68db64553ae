//! The claim-only store: JetStream de-duplication by message id.

use anarchon_core::name::{check_plain, is_name_char};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anarchon_core::{
    BackendInfo, ClaimOutcome, ClaimRequest, ClaimStore, JobName, LeaseStore, Memory, RunKey,
    StoreError, Token, Win,
};
use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{
    Config, DiscardPolicy, LastRawMessageErrorKind, RetentionPolicy,
};
use async_trait::async_trait;

use crate::BACKEND;
use crate::connection::{
    Connected, NoResponderPatience, StreamRole, check_jetstream, connect, ensure_stream,
};
use crate::error::Error;
use crate::options::{
    NatsOptions, Storage, StreamOptions, read_store_url, validate_prefix, validate_replicas,
};

/// The subject prefix unless told otherwise: claims go to
/// `anarchon.<job>.claims`.
pub const DEFAULT_PREFIX: &str = "anarchon";
/// How long the stream recognises a repeated claim unless told otherwise.
///
/// With the default `max_late` of 60 s a job needs at least 70 s; five
/// minutes leaves room for `max_late` up to 4 min 50 s.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(5 * 60);
/// The shortest duplicate window accepted.
///
/// The scheduler refuses a job whose `max_late` plus its 10 s skew margin is
/// longer than the window, so anything shorter could not serve any useful
/// job.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(20);
/// The longest duplicate window accepted (30 days).
pub const MAX_DUPLICATE_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);
/// How much longer than the duplicate window the stream keeps each claim
/// (its `max_age`), so the message behind a "duplicate" answer can always be
/// read back.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(60);
/// The longest stream name accepted.
pub const MAX_STREAM_NAME_LEN: usize = 128;

/// The header that carries the claimant's token.
pub const TOKEN_HEADER: &str = "Anarchon-Token";
/// The header that carries the claimant's instance id.
pub const INSTANCE_HEADER: &str = "Anarchon-Instance";
const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

const CLAIMS_STREAM: StreamRole = StreamRole {
    looking_up: "looking up the claims stream",
    creating: "creating the claims stream",
    created: "created the claims stream",
};

/// The stream and subjects of a [`NatsClaimStore`].
///
/// ```
/// use std::time::Duration;
/// use anarchon_nats::ClaimOptions;
///
/// let claims = ClaimOptions::new()
///     .with_prefix("billing.cron")
///     .with_duplicate_window(Duration::from_secs(600));
/// assert_eq!(claims.stream_name(), "billing_cron-claims");
/// assert_eq!(claims.subject_filter(), "billing.cron.*.claims");
///
/// let (connection, claims) =
///     ClaimOptions::from_url("nats://nats.internal:4222?prefix=billing&duplicate_window_ms=600000")?;
/// assert_eq!(claims.duplicate_window(), Duration::from_secs(600));
/// # Ok::<(), anarchon_nats::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOptions {
    prefix: String,
    stream: Option<String>,
    duplicate_window: Duration,
    storage: Storage,
    replicas: usize,
}

impl Default for ClaimOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ClaimOptions {
    /// The defaults: prefix `anarchon`, a 5 min duplicate window, file
    /// storage, one replica.
    pub fn new() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            stream: None,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            storage: Storage::File,
            replicas: 1,
        }
    }

    /// Reads a store URL: a NATS URL (`nats://`, or `tls://` for TLS)
    /// whose query may carry `prefix`, `stream`, `duplicate_window_ms`,
    /// `storage` (`file` or `memory`), `replicas`, `timeout_ms`, and for
    /// TLS `tls=true` (TLS with a `nats://` URL), `tls_ca_file=<path>` (a
    /// private certificate authority, %-escaped) and `tls_first=true`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for an unknown parameter or a bad value; the
    /// options' own errors as [`Self::validate`] and
    /// [`NatsOptions::validate`] report them.
    pub fn from_url(url: &str) -> Result<(NatsOptions, Self), Error> {
        read_store_url(
            url,
            "prefix, stream, duplicate_window_ms",
            Self::new(),
            |claims, param| {
                match param.key {
                    "prefix" => claims.prefix = param.value.to_owned(),
                    "stream" => claims.stream = Some(param.value.to_owned()),
                    "duplicate_window_ms" => {
                        claims.duplicate_window = Duration::from_millis(param.number()?);
                    }
                    _ => return Ok(false),
                }
                Ok(true)
            },
        )
    }

    /// The subject prefix (default `anarchon`): one or more segments of
    /// `[A-Za-z0-9_-]` joined by `.`, at most 100 bytes. Claims of job `j`
    /// are published to `<prefix>.j.claims`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The stream's name (default: the prefix with `.` turned into `_`,
    /// then `-claims`).
    pub fn with_stream(mut self, name: impl Into<String>) -> Self {
        self.stream = Some(name.into());
        self
    }

    /// How long the stream recognises a repeated claim (default 5 min): how
    /// long the store remembers a run. Between [`MIN_DUPLICATE_WINDOW`] and
    /// [`MAX_DUPLICATE_WINDOW`]. An existing stream with a longer window is
    /// used as it is; one with a shorter window is refused.
    pub fn with_duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Where a new stream keeps its messages (default on disk).
    pub fn with_storage(mut self, storage: Storage) -> Self {
        self.storage = storage;
        self
    }

    /// How many replicas a new stream has in a cluster (default 1).
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// The subject prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The duplicate window asked for.
    pub fn duplicate_window(&self) -> Duration {
        self.duplicate_window
    }

    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.stream
            .clone()
            .unwrap_or_else(|| format!("{}-claims", self.prefix.replace('.', "_")))
    }

    /// The stream's one subject filter: `<prefix>.*.claims`.
    pub fn subject_filter(&self) -> String {
        format!("{}.*.claims", self.prefix)
    }

    /// Checks the options without touching the server.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`], [`Error::InvalidStreamName`],
    /// [`Error::DuplicateWindowOutOfRange`] or [`Error::InvalidOption`].
    pub fn validate(&self) -> Result<(), Error> {
        validate_prefix(&self.prefix)?;
        let stream = self.stream_name();
        check_plain(&stream, MAX_STREAM_NAME_LEN, is_name_char).map_err(|problem| {
            Error::InvalidStreamName {
                stream: stream.chars().take(140).collect(),
                reason: problem.to_string(),
            }
        })?;
        if self.duplicate_window < MIN_DUPLICATE_WINDOW
            || self.duplicate_window > MAX_DUPLICATE_WINDOW
        {
            return Err(Error::DuplicateWindowOutOfRange {
                window: self.duplicate_window,
            });
        }
        validate_replicas(self.replicas)
    }

    fn stream_config(&self) -> Config {
        Config {
            name: self.stream_name(),
            description: Some(
                "anarchon claims: one message per run, de-duplicated by Nats-Msg-Id".into(),
            ),
            subjects: vec![self.subject_filter()],
            retention: RetentionPolicy::Limits,
            discard: DiscardPolicy::Old,
            storage: self.storage.stream_type(),
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            max_age: self.duplicate_window + RETENTION_MARGIN,
            ..Default::default()
        }
    }
}

impl StreamOptions for ClaimOptions {
    fn stream_shape(&mut self) -> (&mut Storage, &mut usize) {
        (&mut self.storage, &mut self.replicas)
    }

    fn check(&self) -> Result<(), Error> {
        self.validate()
    }
}

/// A claim-only store on NATS JetStream.
///
/// A claim of run (job, slot) is a message published to
/// `<prefix>.<job>.claims` with the header `Nats-Msg-Id: <job>:<slot>` and
/// the claimant's token and instance id. The stream stores the first message
/// with that id and answers every later one, within its duplicate window,
/// with `duplicate: true` and the first message's sequence:
///
/// * `duplicate: false`: stored, **won**;
/// * `duplicate: true`: the store reads the stored message back and
///   compares tokens: the caller's own token (a retry after a lost
///   acknowledgement) is **won** again, any other is **lost**.
///
/// Because the same id always names the same run, a claim whose
/// acknowledgement was lost is simply sent again (the scheduler does, with
/// the same token, after the temporary error this store returns) and gets
/// the right answer. This store never answers `Unknown` for a lost
/// acknowledgement.
///
/// # The stream
///
/// [`NatsClaimStore::connect`] creates the stream (one subject filter
/// `<prefix>.*.claims`, limits retention, the duplicate window, `max_age` =
/// the window plus [`RETENTION_MARGIN`]) or verifies an existing one, and
/// refuses one with other subjects, a shorter window or another retention.
/// It reports the stream's actual window as its memory
/// ([`Memory::Window`]); the scheduler refuses jobs whose `max_late` plus
/// the skew margin is longer.
///
/// # Connections
///
/// One client per store. async-nats reconnects by itself after the server
/// restarts or the network drops; claims made meanwhile fail with a
/// temporary error.
///
/// # Cancel safety
///
/// A dropped claim may or may not have been stored; sending it again with
/// the same token gives the right answer.
pub struct NatsClaimStore {
    client: async_nats::Client,
    jetstream: Context,
    url: String,
    prefix: String,
    stream: String,
    window: Duration,
    timeout: Duration,
    /// What the stream was made from: to make it again when a server
    /// restart deleted an in-memory stream.
    claims: ClaimOptions,
    /// Waits for the server by claims and pings, for [`Self::stats`].
    round_trips: AtomicU64,
}

/// What a [`NatsClaimStore`] handle has asked the server so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimStats {
    /// Waits for the server by claims and pings: a claim's publish and its
    /// acknowledgement are one, a losing claim's read of the stored claim
    /// another. Connecting and making the stream are not counted.
    pub round_trips: u64,
}

impl NatsClaimStore {
    /// Connects, checks that JetStream answers, and creates or verifies the
    /// stream.
    ///
    /// # Errors
    ///
    /// The option errors; [`Error::AuthorizationViolation`] for refused
    /// credentials, [`Error::NoJetStream`] when the server or account has no
    /// JetStream, [`Error::StreamMismatch`] when a stream of that name does
    /// not fit, [`Error::SubjectsOverlap`] when another stream takes the
    /// subjects, [`Error::Unreachable`] or [`Error::Timeout`] when the server
    /// does not answer.
    pub async fn connect(connection: &NatsOptions, claims: ClaimOptions) -> Result<Self, Error> {
        claims.validate()?;
        let Connected {
            client,
            jetstream,
            url,
        } = connect(connection, None).await?;
        let timeout = connection.timeout();
        let (window, _stream) = ensure_stream(
            &jetstream,
            claims.stream_config(),
            &url,
            timeout,
            &CLAIMS_STREAM,
            |config| verify(config, &claims),
        )
        .await?;
        Ok(Self {
            client,
            jetstream,
            url,
            prefix: claims.prefix.clone(),
            stream: claims.stream_name(),
            window,
            timeout,
            claims,
            round_trips: AtomicU64::new(0),
        })
    }

    /// What this handle has asked the server so far.
    pub fn stats(&self) -> ClaimStats {
        ClaimStats {
            round_trips: self.round_trips.load(Ordering::Relaxed),
        }
    }

    fn waited(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// The stream's name.
    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// The stream's duplicate window: how long the store remembers a run.
    pub fn duplicate_window(&self) -> Duration {
        self.window
    }

    /// The subject claims of `job` are published to.
    pub fn subject(&self, job: &JobName) -> String {
        format!("{}.{job}.claims", self.prefix)
    }

    /// The message id of a claim of `run`: `<job>:<slot in UTC ms>`.
    pub fn message_id(run: &RunKey) -> String {
        format!("{}:{}", run.job, run.slot.as_millis())
    }

    /// The underlying client (shared by every clone of it).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    fn unavailable(&self, message: String) -> StoreError {
        StoreError::unavailable(BACKEND, format!("NATS at {}: {message}", self.url))
    }

    /// Publishes the claim; returns the acknowledgement's sequence and
    /// whether it was a duplicate.
    ///
    /// An in-memory stream is gone after the server restarted: it is made
    /// again (empty: every run is forgotten, as [`Storage::Memory`] says) and
    /// the claim sent once more. A stream on disk that is gone was deleted
    /// by someone: the claim fails with a temporary error naming it.
    ///
    /// A replicated stream (JetStream cluster) answers a claim whose
    /// message id another claim of the same run is still being stored
    /// under with "duplicate message id is in process" (error code 10158):
    /// the claim is sent again, with the same token, until the stream has
    /// decided (then it says `duplicate`), for up to the store's timeout.
    async fn publish(&self, req: &ClaimRequest) -> Result<(u64, bool), StoreError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            match self.publish_deciding(req).await {
                Err(Sent::InProcess(_)) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(run = %req.run, "another claim of the run is being stored: sending this one again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                other => return other.map_err(Sent::into_error),
            }
        }
    }

    /// [`Self::publish`] without waiting out another claim in process.
    async fn publish_deciding(&self, req: &ClaimRequest) -> Result<(u64, bool), Sent> {
        let mut patience = NoResponderPatience::new();
        loop {
            match self.publish_once(req).await {
                Err(Sent::StreamGone(_)) if self.claims.storage == Storage::Memory => {
                    tracing::warn!(stream = %self.stream, "the in-memory claims stream is gone (did the NATS server restart?): creating it again; every run claimed before is forgotten");
                    self.recreate().await.map_err(Sent::Failed)?;
                    return self.publish_once(req).await;
                }
                Err(Sent::StreamGone(gone)) => {
                    if !patience.wait().await {
                        return Err(Sent::StreamGone(gone));
                    }
                }
                other => return other,
            }
        }
    }

    /// Creates the stream again as [`NatsClaimStore::connect`] did.
    async fn recreate(&self) -> Result<(), StoreError> {
        ensure_stream(
            &self.jetstream,
            self.claims.stream_config(),
            &self.url,
            self.timeout,
            &CLAIMS_STREAM,
            |config| verify(config, &self.claims),
        )
        .await?;
        Ok(())
    }

    async fn publish_once(&self, req: &ClaimRequest) -> Result<(u64, bool), Sent> {
        let subject = self.subject(&req.run.job);
        let mut headers = HeaderMap::new();
        headers.insert(MESSAGE_ID_HEADER, Self::message_id(&req.run).as_str());
        headers.insert(TOKEN_HEADER, req.token.to_string().as_str());
        headers.insert(INSTANCE_HEADER, req.instance.as_str());
        let payload = format!(
            "anarchon-claim\njob {}\nslot {}\ntoken {}\ninstance {}\n",
            req.run.job,
            req.run.slot.as_millis(),
            req.token,
            req.instance
        );
        self.waited();
        let sent = async {
            self.jetstream
                .publish_with_headers(subject.clone(), headers, payload.into())
                .await?
                .await
        };
        let limit = self.timeout + Duration::from_secs(1);
        let ack = match tokio::time::timeout(limit, sent).await {
            Err(_) => {
                return Err(Sent::Failed(self.unavailable(format!(
                    "no acknowledgement for the claim of {} within {limit:?}; it may have been stored: send it again with the same token",
                    req.run
                ))));
            }
            Ok(Err(e)) => {
                let message = format!("publishing the claim of {} failed: {e}", req.run);
                return Err(match e.kind() {
                    PublishErrorKind::StreamNotFound => Sent::StreamGone(
                        self.unavailable(format!(
                            "no JetStream stream takes {subject:?}: the stream {:?} was deleted, or JetStream is still starting; restarting the application creates it again",
                            self.stream
                        ))
                        .with_source(e),
                    ),
                    PublishErrorKind::MaxPayloadExceeded => {
                        Sent::Failed(StoreError::invalid(BACKEND, message).with_source(e))
                    }
                    PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
                        Sent::Failed(StoreError::protocol(BACKEND, message).with_source(e))
                    }
                    _ if in_process(&e) => Sent::InProcess(self.unavailable(message).with_source(e)),
                    _ => Sent::Failed(self.unavailable(message).with_source(e)),
                });
            }
            Ok(Ok(ack)) => ack,
        };
        if ack.stream != self.stream {
            return Err(Sent::Failed(StoreError::protocol(
                BACKEND,
                format!(
                    "the claim of {} was stored in stream {:?}, not {:?}",
                    req.run, ack.stream, self.stream
                ),
            )));
        }
        Ok((ack.sequence, ack.duplicate))
    }

    /// Reads the claim stored at `sequence` and says whether it holds
    /// `token`; `None` when the message is gone.
    async fn holds(&self, req: &ClaimRequest, sequence: u64) -> Result<Option<bool>, StoreError> {
        let stream = self
            .jetstream
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| {
                StoreError::protocol(BACKEND, format!("the stream name was refused: {e}"))
            })?;
        self.waited();
        let read = tokio::time::timeout(self.timeout, stream.get_raw_message(sequence)).await;
        let message = match read {
            Err(_) => {
                return Err(self.unavailable(format!(
                    "reading back the claim of {} (sequence {sequence}) took longer than {:?}",
                    req.run, self.timeout
                )));
            }
            Ok(Err(e)) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
                return Ok(None);
            }
            Ok(Err(e)) => {
                return Err(self
                    .unavailable(format!(
                        "reading back the claim of {} (sequence {sequence}) failed: {e}",
                        req.run
                    ))
                    .with_source(e));
            }
            Ok(Ok(message)) => message,
        };
        let id = message
            .headers
            .get(MESSAGE_ID_HEADER)
            .map(|v| v.as_str().to_owned());
        if id.as_deref() != Some(Self::message_id(&req.run).as_str()) {
            return Err(StoreError::protocol(
                BACKEND,
                format!(
                    "the duplicate of the claim of {} points at sequence {sequence}, which holds message id {id:?}",
                    req.run
                ),
            ));
        }
        let token = message
            .headers
            .get(TOKEN_HEADER)
            .and_then(|v| Token::parse(v.as_str()));
        match token {
            Some(token) => Ok(Some(token == req.token)),
            None => {
                tracing::warn!(run = %req.run, sequence, "the stored claim has no valid {TOKEN_HEADER} header: someone else published it; the run counts as taken");
                Ok(Some(false))
            }
        }
    }
}

/// Why a publish failed.
enum Sent {
    /// No stream takes the subject.
    StreamGone(StoreError),
    /// A replicated stream is still storing another message with the
    /// claim's id (error code 10158); sending it again gets the decision.
    InProcess(StoreError),
    /// Anything else.
    Failed(StoreError),
}

impl Sent {
    fn into_error(self) -> StoreError {
        match self {
            Sent::StreamGone(e) | Sent::InProcess(e) | Sent::Failed(e) => e,
        }
    }
}

/// Whether a failed publish is a replicated stream's "duplicate message id
/// is in process" (10158): a message with the same id is on its way
/// through the stream's replication and not yet stored or refused.
/// async-nats 0.51 has no kind for it: it comes as `Other` with the
/// server's error as its source.
fn in_process(error: &async_nats::jetstream::context::PublishError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|js| {
            js.error_code() == async_nats::jetstream::ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT
        })
}

fn won() -> ClaimOutcome {
    ClaimOutcome::Won(Win::first(None))
}

/// Checks that an existing stream serves this store; returns its window.
fn verify(config: &Config, claims: &ClaimOptions) -> Result<Duration, Error> {
    let mismatch = |reason: String| Error::StreamMismatch {
        stream: config.name.clone(),
        reason,
    };
    let filter = claims.subject_filter();
    if config.subjects != [filter.clone()] {
        return Err(mismatch(format!(
            "its subjects are {:?}, not [{filter:?}]",
            config.subjects
        )));
    }
    if config.duplicate_window < claims.duplicate_window {
        return Err(mismatch(format!(
            "its duplicate window is {:?}, shorter than the {:?} this store was given",
            config.duplicate_window, claims.duplicate_window
        )));
    }
    if config.retention != RetentionPolicy::Limits {
        return Err(mismatch(format!(
            "its retention is {:?}, not limits: claims must stay readable for the whole window",
            config.retention
        )));
    }
    if !config.max_age.is_zero() && config.max_age < config.duplicate_window {
        return Err(mismatch(format!(
            "it keeps messages for {:?}, less than its duplicate window {:?}",
            config.max_age, config.duplicate_window
        )));
    }
    Ok(config.duplicate_window)
}

#[async_trait]
impl ClaimStore for NatsClaimStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let (sequence, duplicate) = self.publish(req).await?;
        if !duplicate {
            return Ok(won());
        }
        if sequence == 0 {
            return Err(self.unavailable(format!(
                "the claim of {} is a duplicate of a message still being stored; send it again",
                req.run
            )));
        }
        match self.holds(req, sequence).await? {
            Some(true) => Ok(won()),
            Some(false) => Ok(ClaimOutcome::Lost),
            None => {
                tracing::warn!(run = %req.run, sequence, stream = %self.stream, "the stream says this run was claimed but no longer holds the claim (purged?): cannot tell whose it was");
                Ok(ClaimOutcome::Unknown)
            }
        }
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: BACKEND,
            memory: Memory::Window(self.window),
        }
    }

    /// Asks JetStream for the account's usage (`$JS.API.INFO`): the
    /// server and its JetStream answer. The stream itself may be missing
    /// (an in-memory stream after a restart): the next claim makes it.
    async fn ping(&self) -> Result<(), StoreError> {
        self.waited();
        check_jetstream(&self.jetstream, &self.url, self.timeout)
            .await
            .map_err(StoreError::from)
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

impl fmt::Debug for NatsClaimStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsClaimStore")
            .field("url", &self.url)
            .field("stream", &self.stream)
            .field("prefix", &self.prefix)
            .field("duplicate_window", &self.window)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix() {
        let claims = ClaimOptions::new().with_prefix("a.b");
        assert_eq!(claims.stream_name(), "a_b-claims");
        assert_eq!(claims.subject_filter(), "a.b.*.claims");
        let config = claims.stream_config();
        assert_eq!(config.max_age, DEFAULT_DUPLICATE_WINDOW + RETENTION_MARGIN);
        assert_eq!(
            verify(&config, &claims).expect("fits"),
            DEFAULT_DUPLICATE_WINDOW
        );
    }

    #[test]
    fn streams_that_do_not_fit_are_named() {
        let claims = ClaimOptions::new().with_prefix("p");
        let mut other = claims.stream_config();
        other.subjects = vec!["p.>".into()];
        let err = verify(&other, &claims).expect_err("other subjects");
        assert!(err.to_string().contains("p-claims"), "{err}");
        assert!(err.to_string().contains("p.>"), "{err}");
        let mut short = claims.stream_config();
        short.duplicate_window = Duration::from_secs(30);
        let err = verify(&short, &claims).expect_err("shorter window");
        assert!(err.to_string().contains("30s"), "{err}");
        let mut work = claims.stream_config();
        work.retention = RetentionPolicy::WorkQueue;
        assert!(verify(&work, &claims).is_err());
        let longer = ClaimOptions::new()
            .with_prefix("p")
            .with_duplicate_window(Duration::from_secs(600));
        assert_eq!(
            verify(&longer.stream_config(), &claims).expect("a longer window is fine"),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn options_are_checked() {
        assert!(ClaimOptions::new().validate().is_ok());
        for bad in [
            ClaimOptions::new().with_prefix("a*"),
            ClaimOptions::new().with_stream("a.b"),
            ClaimOptions::new().with_stream(""),
            ClaimOptions::new().with_duplicate_window(Duration::from_secs(19)),
            ClaimOptions::new()
                .with_duplicate_window(MAX_DUPLICATE_WINDOW + Duration::from_secs(1)),
            ClaimOptions::new().with_replicas(0),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn from_url_splits_connection_and_claims() {
        let (connection, claims) = ClaimOptions::from_url(
            "nats://u:pw@h:4222?prefix=x&stream=S&duplicate_window_ms=90000&timeout_ms=1500&storage=memory&replicas=3",
        )
        .expect("valid");
        assert_eq!(connection.timeout(), Duration::from_millis(1500));
        assert_eq!(claims.stream_name(), "S");
        assert_eq!(claims.duplicate_window(), Duration::from_secs(90));
        assert_eq!(claims.storage, Storage::Memory);
        assert_eq!(claims.replicas, 3);
        let err = ClaimOptions::from_url("nats://u:pw@h:4222?bogus=1").expect_err("unknown");
        assert!(!err.to_string().contains("pw@"), "{err}");
    }
}
