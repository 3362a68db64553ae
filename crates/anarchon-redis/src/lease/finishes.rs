//! Finishes that wait go together, in one script: Redis's half of the
//! core's [`GroupCommit`].
//!
//! The runs of one instant end together. A finish sent alone is an
//! `EVALSHA` and a `TIME` of its own around the few commands that record
//! it, so the finishes that arrive while one script is in flight go in the
//! next (`lua/lease_step_batch.lua`, up to [`STEPS_PER_SCRIPT`] a script,
//! every script of a group in one round trip), each decided and answered
//! for its own run and token by `lua/lease_heartbeat.lua`. Only a store on
//! a single Redis has a group: on a Redis Cluster the runs of different
//! jobs lie on different nodes, so a script would carry one finish anyway,
//! and a group waiting for one slow node would hold up the finishes bound
//! for the others.

use std::sync::Arc;

use anarchon_core::group_commit::{Group, GroupCommit};
use anarchon_core::{Renewal, RunKey, StoreError};
use async_trait::async_trait;
use deadpool_redis::redis::Value;

use super::{BACKEND, STEP_ANSWER, STEPS, store_err, unbatch};
use crate::connection::{Call, Durable, Link, check, int};
use crate::error::Error;
use crate::keys::LeaseKeys;
use crate::options::KeyPrefix;

/// The most steps one script carries on a single Redis: Redis runs nothing
/// else while a script runs.
const STEPS_PER_SCRIPT: usize = 100;

const DURING: &str = "finishing a run";

/// A store's finishes, grouped.
pub(super) type Finishes = GroupCommit<FinishGroup>;

/// One run's end: its run, and the arguments of `lua/lease_heartbeat.lua`'s
/// `finish` step.
pub(super) struct Finish {
    pub(super) run: RunKey,
    pub(super) args: Vec<String>,
}

/// How a store's finishes are sent.
pub(super) struct FinishGroup {
    link: Arc<Link>,
    prefix: KeyPrefix,
}

impl FinishGroup {
    pub(super) fn new(link: Arc<Link>, prefix: KeyPrefix) -> Self {
        Self { link, prefix }
    }

    /// One script for the finishes of `chunk`: each one's two keys, and its
    /// arguments after their count.
    fn call(&self, chunk: &[Finish]) -> Call {
        let mut call = Call {
            lua: &STEPS,
            keys: Vec::with_capacity(chunk.len() * 2),
            args: Vec::with_capacity(chunk.len() * 10),
        };
        for finish in chunk {
            let keys = LeaseKeys::new(&self.prefix, &finish.run.job);
            call.keys.extend([keys.runs, keys.live]);
            call.args.push(finish.args.len().to_string());
            call.args.extend(finish.args.iter().cloned());
        }
        call
    }
}

#[async_trait]
impl Group for FinishGroup {
    type Call = Finish;
    type Answer = Result<Renewal, StoreError>;
    const MOST: usize = 1000;

    async fn send(&self, finishes: Vec<Finish>) -> Vec<Self::Answer> {
        let calls: Vec<Call> = finishes
            .chunks(STEPS_PER_SCRIPT)
            .map(|chunk| self.call(chunk))
            .collect();
        match self.link.eval(&[], &calls, Durable::Yes, DURING).await {
            Ok(replies) => replies
                .into_iter()
                .zip(finishes.chunks(STEPS_PER_SCRIPT))
                .flat_map(|(reply, chunk)| {
                    unbatch(
                        reply,
                        chunk.len(),
                        STEP_ANSWER,
                        "steps",
                        DURING,
                        |_, step| renewal(step[0].clone()),
                    )
                })
                .map(|answer| answer.map_err(store_err))
                .collect(),
            // Alone, a finish keeps the whole error, its source too.
            Err(error) if finishes.len() == 1 => vec![Err(store_err(error))],
            Err(error) => {
                let error = error.into_store_error(BACKEND);
                finishes
                    .iter()
                    .map(|f| Err(error.copied(&format!("finishing {}", f.run))))
                    .collect()
            }
        }
    }
}

/// A step's answer: `{1, now}` if the token held the run, `{0, now}` if not.
fn renewal(reply: Value) -> Result<Renewal, Error> {
    match check(reply, DURING)? {
        Value::Array(items) => match items.first().and_then(int) {
            Some(1) => Ok(Renewal::Renewed),
            Some(0) => Ok(Renewal::Fenced),
            _ => Err(Error::protocol(DURING, "the step answered neither 1 nor 0")),
        },
        other => Err(Error::protocol(
            DURING,
            format!("expected an array, got {other:?}"),
        )),
    }
}
