//! The operator's pauses: one KV key per pause, on the server's clock.
//!
//! A job's pause is `pause.job.<job>`, the pause of every job
//! `pause.all` (KV keys cannot hold `*`, the scope's own key). Each holds
//! a [`PauseDoc`]. A pause is written with a plain put (it replaces the
//! scope's pause), a resume purges the key (no delete marker is left,
//! and the purge's count says whether there was a pause), and `pauses()`
//! lists the keys under `pause.>`.
//!
//! A claim reads the two pauses of its job before its compare-and-swap of
//! the job's document: NATS KV has no step that reads one key and writes
//! another atomically. See [`NatsLeaseStore`] (Pauses) for what that means.

use anarchon_core::{
    JobName, Pause, PauseEnd, PauseRequest, PauseScope, Paused, Pauses, StoreError, Timestamp,
};
use futures::future::join_all;
use tokio::sync::OnceCell;

use super::{LEASE_BACKEND, NatsLeaseStore};
use serde::{Deserialize, Serialize};

/// The key of the pause of every job.
pub const PAUSE_ALL_KEY: &str = "pause.all";
/// What the key of a job's pause starts with; the job's name follows.
pub const PAUSE_JOB_PREFIX: &str = "pause.job.";

/// The end of the pause of every job, read at most once per batch of
/// claims and shared by the batch's jobs.
pub(super) type AllPause = OnceCell<Option<PauseEnd>>;

impl NatsLeaseStore {
    /// The key of the pause of `scope`: `pause.job.<job>` or `pause.all`.
    pub fn pause_key(scope: &PauseScope) -> String {
        match scope {
            PauseScope::Job(job) => format!("{PAUSE_JOB_PREFIX}{job}"),
            PauseScope::All => PAUSE_ALL_KEY.to_owned(),
        }
    }

    /// The scope whose pause lives under `key`, if it is a pause key.
    fn scope_of(key: &str) -> Option<PauseScope> {
        if key == PAUSE_ALL_KEY {
            return Some(PauseScope::All);
        }
        let job = key.strip_prefix(PAUSE_JOB_PREFIX)?;
        JobName::new(job).ok().map(PauseScope::Job)
    }

    /// The pause under `key`, if there is one.
    async fn read_pause(&self, key: &str) -> Result<Option<PauseDoc>, StoreError> {
        match self.read(key).await? {
            None => Ok(None),
            Some(entry) if entry.removed => Ok(None),
            Some(entry) => PauseDoc::decode(&entry.payload)
                .map(Some)
                .map_err(|m| self.protocol(format!("{key}: {m}"))),
        }
    }

    /// The pauses a claim of `job` must respect: its own (read now) and
    /// the namespace's (read once for the batch, in `all`). One round trip.
    pub(super) async fn paused(&self, job: &JobName, all: &AllPause) -> Result<Paused, StoreError> {
        let own_key = Self::pause_key(&PauseScope::Job(job.clone()));
        let (own, every) = tokio::join!(
            self.read_pause(&own_key),
            all.get_or_try_init(|| async {
                let every = self.read_pause(PAUSE_ALL_KEY).await?;
                Ok::<_, StoreError>(every.map(|p| PauseEnd::from_millis(p.until)))
            })
        );
        Ok(Paused {
            job: own?.map(|p| PauseEnd::from_millis(p.until)),
            all: *every?,
        })
    }

    /// [`LeaseStore::pause`](anarchon_core::LeaseStore::pause): the
    /// server's time (two round trips), then one put of the pause's key.
    pub(super) async fn pause_now(
        &self,
        scope: &PauseScope,
        req: &PauseRequest,
    ) -> Result<Pause, StoreError> {
        let now = Timestamp::from_millis(self.server_now().await?);
        self.round_trips(2);
        let pause = req
            .at(scope, now)
            .map_err(|refused| refused.into_store_error(LEASE_BACKEND))?;
        self.write(&Self::pause_key(scope), PauseDoc::of(&pause).encode(), None)
            .await?;
        self.round_trips(1);
        Ok(pause)
    }

    /// [`LeaseStore::resume`](anarchon_core::LeaseStore::resume): one purge
    /// of the pause's key; there was a pause if it removed a message.
    pub(super) async fn resume_now(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        let purged = self.purge(&Self::pause_key(scope)).await?;
        self.round_trips(1);
        Ok(purged > 0)
    }

    /// [`LeaseStore::pauses`](anarchon_core::LeaseStore::pauses): the pause
    /// keys and a write of the clock, then the pauses and the clock.
    pub(super) async fn pauses_now(&self) -> Result<Pauses, StoreError> {
        let (keys, tick) = tokio::join!(self.list("pause.>"), self.tick());
        let (keys, sequence) = (keys?, tick?);
        let scoped: Vec<(String, PauseScope)> = keys
            .into_iter()
            .filter_map(|key| match Self::scope_of(&key) {
                Some(scope) => Some((key, scope)),
                None => {
                    tracing::debug!(bucket = %self.bucket, %key, "not a pause key; ignored");
                    None
                }
            })
            .collect();
        let (now, read) = tokio::join!(
            self.clock_after(sequence),
            join_all(scoped.iter().map(|(key, _)| self.read_pause(key)))
        );
        self.round_trips(2);
        let mut pauses = Vec::with_capacity(scoped.len());
        for ((_, scope), doc) in scoped.into_iter().zip(read) {
            // Resumed meanwhile: gone.
            if let Some(doc) = doc? {
                pauses.push(doc.into_pause(scope));
            }
        }
        Ok(Pauses::holding(pauses, Timestamp::from_millis(now?)))
    }
}

/// A pause as its key holds it (`pause.all`, `pause.job.<job>`): times on
/// the server's clock in UTC ms, `until` absent for "until resumed".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PauseDoc {
    /// When the pause was written.
    pub(crate) since: i64,
    /// When it ends; absent until resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) until: Option<i64>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Who.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) by: Option<String>,
}

impl PauseDoc {
    /// The document of `pause`.
    pub(crate) fn of(pause: &Pause) -> Self {
        Self {
            since: pause.since.as_millis(),
            until: pause.end.as_millis(),
            reason: pause.reason.clone(),
            by: pause.by.clone(),
        }
    }

    /// The document as JSON.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Serialising numbers and strings cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a pause key's value.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("a pause is not valid JSON: {e}"))
    }

    /// The pause of `scope` this document holds.
    pub(crate) fn into_pause(self, scope: PauseScope) -> Pause {
        Pause {
            scope,
            since: Timestamp::from_millis(self.since),
            end: PauseEnd::from_millis(self.until),
            reason: self.reason,
            by: self.by,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_keys_are_kv_keys_and_read_back() {
        let job = JobName::new("Nightly_report-2").expect("job");
        let key = NatsLeaseStore::pause_key(&PauseScope::Job(job.clone()));
        assert_eq!(key, "pause.job.Nightly_report-2");
        assert_eq!(NatsLeaseStore::scope_of(&key), Some(PauseScope::Job(job)));
        assert_eq!(NatsLeaseStore::pause_key(&PauseScope::All), "pause.all");
        assert_eq!(NatsLeaseStore::scope_of("pause.all"), Some(PauseScope::All));
        assert_eq!(NatsLeaseStore::scope_of("pause.job.a.b"), None);
        assert_eq!(NatsLeaseStore::scope_of("job.a"), None);
    }

    #[test]
    fn pauses_read_back_as_written() {
        let pause = Pause {
            scope: PauseScope::All,
            since: Timestamp::from_millis(7),
            end: PauseEnd::At(Timestamp::from_millis(9)),
            reason: Some("deploy \"v2\"".into()),
            by: None,
        };
        let bytes = PauseDoc::of(&pause).encode();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            r#"{"since":7,"until":9,"reason":"deploy \"v2\""}"#
        );
        let read = PauseDoc::decode(&bytes).expect("decodes");
        assert_eq!(read.into_pause(PauseScope::All), pause);
        assert!(PauseDoc::decode(b"{}").is_err());
    }
}
