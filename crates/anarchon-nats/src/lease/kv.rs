//! KV I/O: reading, writing (with compare-and-swap), listing and purging
//! the bucket's keys, and the documents kept in them.

use std::time::Duration;

use anarchon_core::{JobName, RecordState, RunKey, Slot, StoreError};
use async_nats::HeaderMap;
use async_nats::StatusCode;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind};
use futures::TryStreamExt;

use super::clock::server_millis;
use super::records::{JobDoc, Outside, RunDoc};
use super::{Counters, LEASE_BACKEND, LEASE_BUCKET, NatsLeaseStore};
use crate::connection::{NoResponderPatience, ensure_stream};
use crate::options::Storage;

const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const KV_OPERATION: &str = "KV-Operation";

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

/// A failed request, and whether it failed because the bucket's stream is
/// gone.
enum Gone {
    /// No stream answered: deleted, an in-memory bucket after a server
    /// restart, or a replicated bucket between leaders.
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
pub(super) struct Entry {
    pub(super) revision: u64,
    pub(super) payload: Vec<u8>,
    pub(super) written_at: i64,
    pub(super) removed: bool,
}

/// A job's document as read.
pub(super) struct JobRead {
    /// 0 when the key has no message.
    pub(super) revision: u64,
    pub(super) doc: JobDoc,
    /// The server timestamp of the revision.
    pub(super) written_at: Option<i64>,
}

/// How far past the deletion of a job's document (by hand) a claim still
/// reads the run key of its slot: further than any claim goes out ahead.
const DELETED_DOCUMENT_MARGIN_MS: i64 = 3_600_000;

impl NatsLeaseStore {
    /// Whether a call that found the bucket's stream gone may make it
    /// again: only an in-memory bucket, which a server restart deletes. One
    /// on disk that is gone was deleted by someone; making it again would
    /// start every job's fence numbers from 1 behind their back.
    fn may_recreate(&self) -> bool {
        self.leases.storage() == Storage::Memory
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

    /// The latest message of `key`: by direct get on a one-replica bucket,
    /// from the stream's leader otherwise (see `reads_directly`).
    pub(super) async fn read(&self, key: &str) -> Result<Option<Entry>, StoreError> {
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
        let late = || {
            Gone::Not(
                self.unavailable(format!("reading {key} took longer than {:?}", self.timeout)),
            )
        };
        let failed = |gone: bool, e: Box<dyn std::error::Error + Send + Sync>| {
            let error = self
                .unavailable(format!("reading {key} failed: {e}"))
                .with_source(e);
            if gone {
                Gone::Yes(error)
            } else {
                Gone::Not(error)
            }
        };
        let message = if self.direct_reads {
            let answer = tokio::time::timeout(
                self.timeout,
                self.stream.direct_get_last_for_subject(subject),
            )
            .await;
            match answer {
                Err(_) => return Err(late()),
                Ok(Err(e)) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
                Ok(Err(e)) => {
                    // Nobody answers a direct get for a stream that is gone.
                    let gone = matches!(e.kind(), DirectGetErrorKind::ErrorResponse(status, _) if status == StatusCode::NO_RESPONDERS);
                    return Err(failed(gone, Box::new(e)));
                }
                Ok(Ok(message)) => message,
            }
        } else {
            let answer = tokio::time::timeout(
                self.timeout,
                self.stream.get_last_raw_message_by_subject(&subject),
            )
            .await;
            match answer {
                Err(_) => return Err(late()),
                Ok(Err(e)) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return Ok(None);
                }
                Ok(Err(e)) => {
                    let gone = matches!(e.kind(), LastRawMessageErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND);
                    return Err(failed(gone, Box::new(e)));
                }
                Ok(Ok(message)) => message,
            }
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
    pub(super) async fn write(
        &self,
        key: &str,
        payload: Vec<u8>,
        expected: Option<u64>,
    ) -> Result<Option<u64>, StoreError> {
        let mut patience = NoResponderPatience::new();
        loop {
            match self.write_once(key, payload.clone(), expected).await {
                Err(Gone::Yes(_)) if self.may_recreate() => {
                    self.recreate().await?;
                    return self
                        .write_once(key, payload, expected)
                        .await
                        .map_err(Gone::into_error);
                }
                Err(Gone::Yes(gone)) => {
                    if !patience.wait().await {
                        return Err(gone);
                    }
                }
                other => return other.map_err(Gone::into_error),
            }
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

    /// Reads `job`'s document (the default for a job that has none).
    pub(super) async fn read_job(&self, job: &JobName) -> Result<JobRead, StoreError> {
        let key = Self::job_key(job);
        Ok(match self.read(&key).await? {
            None => JobRead {
                revision: 0,
                doc: JobDoc::default(),
                written_at: None,
            },
            Some(entry) if entry.removed => {
                tracing::warn!(bucket = %self.bucket, %key, "the job's document was deleted by hand: its fence numbers start again from 1");
                // Its runs that ended before are under their own keys, and
                // the document no longer says which slots may have one: a
                // claim reads the key of any slot up to an hour past the
                // deletion (no claim goes out that far ahead), so that no
                // finished run is started again.
                let doc = JobDoc {
                    high: Some(entry.written_at.saturating_add(DELETED_DOCUMENT_MARGIN_MS)),
                    ..JobDoc::default()
                };
                JobRead {
                    revision: entry.revision,
                    doc,
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

    pub(super) async fn read_run(&self, run: &RunKey) -> Result<Option<RunDoc>, StoreError> {
        let key = Self::run_key(run);
        match self.read(&key).await? {
            None => Ok(None),
            Some(entry) if entry.removed => Ok(None),
            Some(entry) => RunDoc::decode(&entry.payload, entry.written_at)
                .map(Some)
                .map_err(|m| self.protocol(format!("{key}: {m}"))),
        }
    }

    pub(super) async fn outside(&self, run: &RunKey) -> Result<Outside, StoreError> {
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
    pub(super) async fn put_run(
        &self,
        job: &JobName,
        slot: i64,
        record: &RunDoc,
    ) -> Result<(), StoreError> {
        let run = RunKey::new(job.clone(), Slot::from_millis(slot));
        let payload = serde_json::to_vec(record).unwrap_or_default();
        self.write(&Self::run_key(&run), payload, None).await?;
        Ok(())
    }

    /// Records `run` as missed unless it has a record.
    pub(super) async fn create_missed(&self, run: &RunKey) -> Result<bool, StoreError> {
        let record = RunDoc::nobody(RecordState::Missed);
        let payload = serde_json::to_vec(&record).unwrap_or_default();
        // A conflict means the run has a record already: nothing to do.
        Ok(self
            .write(&Self::run_key(run), payload, Some(0))
            .await?
            .is_some())
    }

    /// Lists the keys under `pattern` (e.g. `run.<job>.*`), without the
    /// bucket's prefix.
    pub(super) async fn list(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
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
    pub(super) async fn purge(&self, key: &str) -> Result<u64, StoreError> {
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
}
