//! The `script` strategy: a Lua script scans the last window of claims.

use std::time::Duration;

use anarchon_core::time::millis;
use anarchon_core::{ClaimOutcome, ClaimRequest, Memory, Token};

use crate::MIN_MEMORY;
use crate::connection::{Call, Durable, Link, Lua, text};
use crate::error::Error;
use crate::keys::job_key;
use crate::options::{KeyPrefix, RedisOptions};
use crate::server::ServerInfo;
use crate::stream_id::first_claim_answer;

const BACKEND: &str = "redis-script";

static CLAIM: Lua = Lua::new("script_claim", include_str!("../lua/script_claim.lua"));
static SCRIPTS: [&Lua; 1] = [&CLAIM];

/// The Redis `script` strategy: claim-only, remembers a claim for `window`.
///
/// A claim is one Lua script on `{p:job}:script`, a stream of claims: it
/// scans the entries of the last `window` (by Redis's clock, newest first)
/// for the slot; if one is there the run is taken and the script returns
/// that entry's token, otherwise it appends the caller's claim and returns
/// the caller's token. The caller won if the token is its own, so its own
/// retried claim wins again. Entries older than the window are trimmed
/// as claims are added.
///
/// It gives what the `idmp` strategy gives, on any Redis 6.2+ or Valkey.
/// A claim costs one command and one round trip; the script reads every
/// claim of the job inside the window when the slot is new, so keep the
/// window near `max_late` plus the skew margin for jobs that fire often.
///
/// [`ClaimStore::info`](anarchon_core::ClaimStore::info) reports `Memory::Window(window)`: the scheduler
/// refuses jobs whose `max_late` plus the skew margin exceed it.
pub struct RedisScriptStore {
    link: Link,
    prefix: KeyPrefix,
    window: Duration,
}

impl RedisScriptStore {
    /// The window [`RedisScriptStore::connect`] callers usually want:
    /// 10 minutes, enough for `max_late` up to 9 min 50 s.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);

    /// Connects, checks the server and loads the script. Claims are
    /// remembered for `window`, which must be at least [`MIN_MEMORY`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOption`] for a window shorter than
    /// [`MIN_MEMORY`]; otherwise as [`crate::RedisLeaseStore::connect`].
    pub async fn connect(opts: &RedisOptions, window: Duration) -> Result<Self, Error> {
        if window < MIN_MEMORY {
            return Err(Error::InvalidOption {
                strategy: "script",
                option: "window",
                reason: format!(
                    "{window:?} is shorter than the minimum {MIN_MEMORY:?}: the window must outlast max_late plus the clock-skew margin"
                ),
            });
        }
        Ok(Self {
            link: Link::connect(opts, BACKEND, &SCRIPTS).await?,
            prefix: opts.prefix.clone(),
            window,
        })
    }

    /// The server as the store found it at start-up.
    pub fn server(&self) -> &ServerInfo {
        self.link.server()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// How long a claim is remembered.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How many times the store found a different server `run_id` on a new
    /// connection.
    pub fn server_changes(&self) -> u64 {
        self.link.server_changes()
    }

    async fn try_claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        let during = "claiming";
        let call = Call {
            lua: &CLAIM,
            keys: vec![job_key(&self.prefix, &req.run.job, "script")],
            args: vec![
                req.run.slot.as_millis().to_string(),
                req.token.to_string(),
                req.instance.as_str().to_owned(),
                millis(self.window).to_string(),
            ],
        };
        let items = self.link.eval_one(call, Durable::Yes, during).await?;
        let winner = items
            .first()
            .and_then(text)
            .ok_or_else(|| Error::protocol(during, "no token"))?;
        Ok(first_claim_answer(Token::parse(&winner) == Some(req.token)))
    }
}

crate::connection::claim_only_store!(
    RedisScriptStore,
    |store| Memory::Window(store.window),
    window
);
