//! The server's clock: every lease decision uses the NATS server's time,
//! learned from the timestamp of a write of [`CLOCK_KEY`].

use std::time::SystemTime;

use anarchon_core::StoreError;
use tokio::sync::OnceCell;

use super::{CLOCK_KEY, NatsLeaseStore};

/// The server's time, learned once per call from a write of [`CLOCK_KEY`].
pub(super) struct ServerClock<'a> {
    pub(super) store: &'a NatsLeaseStore,
    pub(super) tick: Result<u64, String>,
    pub(super) now: OnceCell<i64>,
}

impl ServerClock<'_> {
    pub(super) async fn now(&self) -> Result<i64, StoreError> {
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
pub(super) fn server_millis(time: impl Into<SystemTime>) -> Option<i64> {
    let since = time.into().duration_since(SystemTime::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}

impl NatsLeaseStore {
    /// Writes [`CLOCK_KEY`]; returns the write's sequence.
    pub(super) async fn tick(&self) -> Result<u64, StoreError> {
        self.write(CLOCK_KEY, Vec::new(), None)
            .await?
            .ok_or_else(|| self.protocol("a plain write was refused as a conflict"))
    }

    /// The server timestamp of the latest write of [`CLOCK_KEY`], which is
    /// at least the write at `sequence`: a server time from before now.
    pub(super) async fn clock_after(&self, sequence: u64) -> Result<i64, StoreError> {
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
    pub(super) async fn server_now(&self) -> Result<i64, StoreError> {
        let sequence = self.tick().await?;
        self.clock_after(sequence).await
    }
}
