//! Manual runs: how a running scheduler hears of an operator's "run now"
//! and claims the run.
//!
//! The store announces the run of every new request
//! ([`LeaseStore::announcements`]); the scheduler claims each announced
//! manual run of a job it has, at once, like a slot that is due. It also
//! reads the store's requests when it starts and whenever it may have
//! missed news, and claims the runs of the recent ones, so a request made
//! while no instance was up, or whose news was lost, still runs. The claim
//! decides who runs it: one instance wins, the others become its backups.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use super::driver::{Due, claim_batch};
use super::{Inner, MANUAL_RUN_WINDOW, StoreHandle};
use crate::store::{LeaseStore, RunKey};
use crate::time::Slot;

/// How long after the latest news the scheduler reads the store's requests
/// again by itself, in case news was lost without a lag showing it (a
/// listener that reconnected). Long enough that an idle fleet costs the
/// store next to nothing.
const READ_AGAIN_EVERY: Duration = Duration::from_secs(600);

pub(crate) async fn watch(inner: Arc<Inner>) {
    let StoreHandle::Lease(store) = &inner.store else {
        return;
    };
    // Subscribe before the first read, so a request made in between is
    // heard, not lost.
    let mut news = store.announcements();
    let mut claimed = BTreeSet::new();
    read_requests(&inner, store, &mut claimed).await;
    loop {
        let heard = tokio::select! {
            heard = news.recv() => heard,
            () = tokio::time::sleep(READ_AGAIN_EVERY) => Err(RecvError::Lagged(0)),
            () = inner.stop.cancelled() => return,
        };
        match heard {
            Ok(run) if run.slot.is_manual() => claim(&inner, run, &mut claimed).await,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => read_requests(&inner, store, &mut claimed).await,
            Err(RecvError::Closed) => {
                inner.stop.cancelled().await;
                return;
            }
        }
    }
}

/// Claims the runs of the store's requests that are young enough to run.
async fn read_requests(
    inner: &Arc<Inner>,
    store: &Arc<dyn LeaseStore>,
    claimed: &mut BTreeSet<RunKey>,
) {
    let requests = match store.run_requests().await {
        Ok(requests) => requests,
        Err(error) => {
            tracing::warn!(%error, "could not read the manual-run requests; they are read again later");
            return;
        }
    };
    let oldest = requests.store_now.saturating_sub(MANUAL_RUN_WINDOW);
    // Forget what is too old to be announced again.
    claimed.retain(|run: &RunKey| run.slot.at() >= oldest);
    for request in requests.requests {
        if request.requested_at >= oldest {
            claim(inner, request.run(), claimed).await;
        }
    }
}

/// Claims one manual run if this instance has its job and has not claimed
/// it yet.
async fn claim(inner: &Arc<Inner>, run: RunKey, claimed: &mut BTreeSet<RunKey>) {
    let Some(index) = inner.jobs.iter().position(|j| j.name == run.job) else {
        return;
    };
    if !claimed.insert(run.clone()) {
        return;
    }
    let slot: Slot = run.slot;
    tracing::info!(job = %run.job, %slot, "manual run requested");
    let due = Due {
        index,
        slot,
        fire_at: inner.clock.now(),
        caught_up: false,
        permit: None,
    };
    inner.tasks.spawn(claim_batch(inner.clone(), vec![due]));
}
