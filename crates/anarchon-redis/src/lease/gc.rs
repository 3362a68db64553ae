//! Garbage collection: one script (`lua/lease_gc.lua`) per job, many jobs
//! per round trip, then the old manual-run requests.

use std::time::Duration;

use anarchon_core::StoreError;
use anarchon_core::time::millis;
use deadpool_redis::redis::Value;

use super::{BACKEND, GC, RedisLeaseStore, store_err};
use crate::connection::{Call, Durable, check, int};
use crate::error::Error;
use crate::keys::LeaseKeys;

/// How many records one garbage-collection script deletes at most, so a
/// long backlog does not block Redis in one go.
const GC_BATCH: u32 = 1000;
/// How many jobs one garbage-collection round trip covers.
const GC_JOBS_PER_TRIP: usize = 64;

impl RedisLeaseStore {
    pub(super) async fn collect_now(&self, keep: Duration) -> Result<u64, StoreError> {
        let during = "collecting garbage";
        let mut pending = self.indexed_jobs().await.map_err(store_err)?;
        let mut deleted: u64 = 0;
        let mut first_error = None;
        while !pending.is_empty() {
            let mut more = Vec::new();
            for chunk in pending.chunks(GC_JOBS_PER_TRIP) {
                let calls: Vec<Call> = chunk
                    .iter()
                    .map(|job| {
                        let keys = LeaseKeys::new(&self.prefix, job);
                        Call {
                            lua: &GC,
                            keys: vec![keys.runs, keys.slots, keys.live, keys.window, keys.waiting],
                            args: vec![millis(keep).to_string(), GC_BATCH.to_string()],
                        }
                    })
                    .collect();
                let replies = self
                    .link
                    .eval(&[], &calls, Durable::No, during)
                    .await
                    .map_err(store_err)?;
                for (job, reply) in chunk.iter().zip(replies) {
                    // One job's broken keys must not stop the others' collection.
                    let items = match check(reply, during) {
                        Ok(Value::Array(items)) => items,
                        Ok(other) => {
                            first_error.get_or_insert(Error::protocol(
                                during,
                                format!("expected an array, got {other:?}"),
                            ));
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(backend = BACKEND, job = %job, "garbage collection skipped the job: {e}");
                            first_error.get_or_insert(e);
                            continue;
                        }
                    };
                    let n = items.first().and_then(int).unwrap_or(0);
                    deleted += u64::try_from(n).unwrap_or(0);
                    if items.get(1).and_then(int) == Some(1) {
                        more.push(job.clone());
                    }
                }
            }
            pending = more;
        }
        self.collect_requests(keep).await?;
        match first_error {
            Some(e) => Err(store_err(e)),
            None => Ok(deleted),
        }
    }
}
