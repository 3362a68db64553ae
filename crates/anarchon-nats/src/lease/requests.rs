//! Manual-run requests: one KV key per request, stamped on the server's
//! clock.
//!
//! A request of job `j` with id `i` is `request.j.i` (a request id's `:`,
//! which KV keys cannot hold, is written `=`, which ids cannot hold; job
//! names hold no `.`, so the first `.` after the job ends it). It is
//! created only if absent, so the same id twice is one request. The job's
//! latest stamp is `requested.j`, moved forward by compare-and-swap before
//! the request is created, so every request of a job gets a stamp of its
//! own. The new request's run is announced on the hand-over subject.

use std::time::Duration;

use anarchon_core::request::stamp;
use anarchon_core::time::millis;
use anarchon_core::{
    Backfill, JobName, RequestId, RunRequest, RunRequests, StoreError, StoreErrorKind, Timestamp,
    TriggerRequest,
};
use futures::future::join_all;
use serde::{Deserialize, Serialize};

use super::NatsLeaseStore;

/// What the key of a request starts with; `<job>.<id>` follows.
pub(super) const REQUEST_PREFIX: &str = "request.";
/// What the key of a job's latest stamp starts with; the job follows.
pub(super) const REQUESTED_PREFIX: &str = "requested.";

/// How often a request is tried again when another request of the job
/// moved the latest stamp first.
const TRIES: usize = 16;

/// A request key's value.
#[derive(Debug, Serialize, Deserialize)]
struct RequestDoc {
    /// The stamp (server time, ms).
    at: i64,
    /// Who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    by: Option<String>,
    /// A backfill's range (ms, both included); absent for a manual run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    range: Option<(i64, i64)>,
}

impl RequestDoc {
    fn backfill(&self) -> Result<Option<Backfill>, String> {
        self.range
            .map(|(from, to)| {
                Backfill::new(Timestamp::from_millis(from), Timestamp::from_millis(to))
                    .map_err(|e| e.to_string())
            })
            .transpose()
    }

    fn encode(&self) -> Vec<u8> {
        // Serialising a number and a string cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("a request is not valid JSON: {e}"))
    }
}

impl NatsLeaseStore {
    /// The key of request `id` of `job`.
    pub fn request_key(job: &JobName, id: &RequestId) -> String {
        format!("{REQUEST_PREFIX}{job}.{}", id.as_str().replace(':', "="))
    }

    /// The job and request id of a request key.
    fn request_of(key: &str) -> Option<(JobName, RequestId)> {
        let rest = key.strip_prefix(REQUEST_PREFIX)?;
        let (job, id) = rest.split_once('.')?;
        Some((
            JobName::new(job).ok()?,
            RequestId::new(&id.replace('=', ":")).ok()?,
        ))
    }

    async fn read_request(&self, key: &str) -> Result<Option<RequestDoc>, StoreError> {
        match self.read(key).await? {
            Some(entry) if !entry.removed => RequestDoc::decode(&entry.payload)
                .map(Some)
                .map_err(|m| self.protocol(format!("{key}: {m}"))),
            _ => Ok(None),
        }
    }

    pub(super) async fn write_request(
        &self,
        req: &TriggerRequest,
    ) -> Result<RunRequest, StoreError> {
        let job = req.job();
        let key = Self::request_key(job, req.id());
        let answer = |doc: RequestDoc| -> Result<RunRequest, StoreError> {
            let backfill = doc
                .backfill()
                .map_err(|m| self.protocol(format!("{key}: {m}")))?;
            Ok(req.answer(Timestamp::from_millis(doc.at), doc.by, backfill))
        };
        if let Some(doc) = self.read_request(&key).await? {
            self.round_trips(1);
            return answer(doc);
        }
        let latest_key = format!("{REQUESTED_PREFIX}{job}");
        for _ in 0..TRIES {
            let (now, latest) = tokio::join!(self.server_now(), self.read(&latest_key));
            let (now, latest) = (now?, latest?);
            let (revision, previous) = match &latest {
                Some(entry) => (
                    entry.revision,
                    std::str::from_utf8(&entry.payload)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                        .map(Timestamp::from_millis),
                ),
                None => (0, None),
            };
            let at = stamp(Timestamp::from_millis(now), previous);
            let moved = self
                .write(
                    &latest_key,
                    at.as_millis().to_string().into_bytes(),
                    Some(revision),
                )
                .await?;
            if moved.is_none() {
                continue;
            }
            let doc = RequestDoc {
                at: at.as_millis(),
                by: req.by().map(str::to_owned),
                range: req
                    .range()
                    .map(|r| (r.from().as_millis(), r.to().as_millis())),
            };
            let created = self.write(&key, doc.encode(), Some(0)).await?;
            self.round_trips(5);
            if created.is_none() {
                // The same id, sent at once from elsewhere, was created
                // first: that one is the request.
                let stored = self
                    .read_request(&key)
                    .await?
                    .ok_or_else(|| self.protocol(format!("{key} vanished as it was created")))?;
                return answer(stored);
            }
            let request = answer(doc)?;
            self.announce_hand_over(&request.news()).await;
            return Ok(request);
        }
        Err(self.unavailable(format!(
            "other requests of job {job} kept moving its latest stamp; {TRIES} tries failed"
        )))
    }

    pub(super) async fn read_requests(&self) -> Result<RunRequests, StoreError> {
        Ok(self.read_requests_and_unreadable().await?.0)
    }

    /// The requests, and the keys of those nobody can read (passed over
    /// with a warning).
    async fn read_requests_and_unreadable(&self) -> Result<(RunRequests, Vec<String>), StoreError> {
        let (keys, tick) = tokio::join!(self.list("request.>"), self.tick());
        let (keys, sequence) = (keys?, tick?);
        let named: Vec<(String, (JobName, RequestId))> = keys
            .into_iter()
            .filter_map(|key| Self::request_of(&key).map(|named| (key, named)))
            .collect();
        let (now, read) = tokio::join!(
            self.clock_after(sequence),
            join_all(named.iter().map(|(key, _)| self.read_request(key)))
        );
        self.round_trips(2);
        let mut requests = Vec::with_capacity(named.len());
        let mut unreadable = Vec::new();
        for ((key, (job, id)), doc) in named.into_iter().zip(read) {
            // One request nobody can read (written by hand, or by
            // something else) must not hide every other request from
            // every instance; a read that failed fails the call.
            let doc = match doc {
                Err(error) if error.kind() == StoreErrorKind::Protocol => {
                    tracing::warn!(bucket = %self.bucket, "an unreadable manual-run request is passed over: {error}");
                    unreadable.push(key);
                    continue;
                }
                other => other?,
            };
            if let Some(doc) = doc {
                let backfill = match doc.backfill() {
                    Ok(backfill) => backfill,
                    Err(message) => {
                        tracing::warn!(bucket = %self.bucket, %key, "an unreadable manual-run request is passed over: {message}");
                        unreadable.push(key);
                        continue;
                    }
                };
                requests.push(RunRequest {
                    job,
                    id,
                    requested_at: Timestamp::from_millis(doc.at),
                    by: doc.by,
                    backfill,
                });
            }
        }
        requests
            .sort_by(|a, b| (a.requested_at, &a.job, &a.id).cmp(&(b.requested_at, &b.job, &b.id)));
        let listed = RunRequests {
            store_now: Timestamp::from_millis(now?),
            requests,
        };
        Ok((listed, unreadable))
    }

    /// Purges the requests stamped more than `keep` before `now`, and those
    /// nobody can read (nothing could ever run them).
    pub(super) async fn collect_requests(
        &self,
        now: i64,
        keep: Duration,
    ) -> Result<(), StoreError> {
        let before = now.saturating_sub(millis(keep));
        let (listed, unreadable) = self.read_requests_and_unreadable().await?;
        let old: Vec<String> = listed
            .requests
            .iter()
            .filter(|r| r.requested_at.as_millis() < before)
            .map(|r| Self::request_key(&r.job, &r.id))
            .chain(unreadable)
            .collect();
        for result in join_all(old.iter().map(|key| self.purge(key))).await {
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keys_are_kv_keys_and_read_back() {
        let job = JobName::new("report-2").expect("job");
        let id = RequestId::new("deploy:v1.2").expect("id");
        let key = NatsLeaseStore::request_key(&job, &id);
        assert_eq!(key, "request.report-2.deploy=v1.2");
        assert_eq!(NatsLeaseStore::request_of(&key), Some((job, id)));
        assert_eq!(NatsLeaseStore::request_of("requested.report-2"), None);
    }
}
