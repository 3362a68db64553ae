//! Garbage collection: dropping old runs from the job documents and
//! purging old run keys.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anarchon_core::time::millis;
use anarchon_core::{JobName, StoreError};
use futures::StreamExt;
use futures::future::join_all;

#[cfg(doc)]
use anarchon_core::LeaseStore;

use super::{Counters, MAX_ROUNDS, NatsLeaseStore, PARALLEL};

/// What collecting one job's document gives: its cutoff and the slots
/// dropped.
type Collected = (i64, Vec<i64>);

impl NatsLeaseStore {
    /// The jobs with a document in the bucket (`job.<name>`), in name
    /// order: every job a claim has written, since documents outlive their
    /// runs. A job whose only records are `missed` ones has none.
    pub(super) async fn indexed_jobs(&self) -> Result<Vec<JobName>, StoreError> {
        let mut jobs: Vec<JobName> = self
            .list("job.*")
            .await?
            .into_iter()
            .filter_map(|key| {
                key.strip_prefix("job.")
                    .and_then(|name| JobName::new(name).ok())
            })
            .collect();
        jobs.sort();
        Ok(jobs)
    }

    /// Garbage collection: see [`LeaseStore::collect_garbage`].
    pub(super) async fn collect_garbage_now(&self, keep: Duration) -> Result<u64, StoreError> {
        let now = self.server_now().await?;
        let keep = millis(keep);
        // For run keys of jobs without a document (only `missed` records).
        let cutoff = now.saturating_sub(keep);
        let jobs = self.indexed_jobs().await?;
        let mut deleted: HashSet<(String, i64)> = HashSet::new();
        let mut first_error = None;
        // Each job's cutoff; a job whose document could not be read has
        // none, and its run keys are left for the next collection.
        let mut cutoffs: HashMap<String, Option<i64>> = HashMap::new();
        let collected: Vec<(JobName, Result<Collected, StoreError>)> =
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
                (slot.saturating_abs() < cutoff).then(|| (job.to_owned(), slot, key.clone()))
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
        self.collect_requests(now, Duration::from_millis(u64::try_from(keep).unwrap_or(0)))
            .await?;
        if let Some(error) = first_error {
            return Err(error);
        }
        Ok(u64::try_from(deleted.len()).unwrap_or(u64::MAX))
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
    ) -> Result<Collected, StoreError> {
        let key = Self::job_key(job);
        for _ in 0..MAX_ROUNDS {
            let read = self.read_job(job).await?;
            let cutoff = now.saturating_sub(keep.max(read.doc.window.unwrap_or(0)));
            let lease_cutoff = now.saturating_sub(keep);
            let mut next = read.doc.clone();
            let mut dropped = Vec::new();
            let mut keep = Vec::new();
            for (slot, record) in &read.doc.ended {
                if slot.saturating_abs() < cutoff {
                    dropped.push(*slot);
                } else if !record.is_waiting() {
                    keep.push((*slot, record));
                }
            }
            for entry in read.doc.live.iter() {
                let (slot, live) = entry.map_err(|m| self.protocol(format!("{key}: {m}")))?;
                if slot.saturating_abs() < cutoff && live.live_until(lease_cutoff) < lease_cutoff {
                    dropped.push(slot);
                }
            }
            let puts = join_all(keep.iter().map(|(slot, rec)| self.put_run(job, *slot, rec))).await;
            // The document changed when something left it.
            let mut changed = false;
            for ((slot, _), put) in keep.iter().zip(puts) {
                if put.is_ok() {
                    changed |= next.ended.remove(slot).is_some();
                }
            }
            for slot in &dropped {
                changed |= next.ended.remove(slot).is_some();
                changed |= next.live.discard(*slot);
            }
            if !changed {
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
