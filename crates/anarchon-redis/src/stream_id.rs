//! The `stream-id` strategy: the slot is the stream entry's ID.

use std::sync::atomic::{AtomicU64, Ordering};

use anarchon_core::{ClaimOutcome, ClaimRequest, Memory, Token, Win};
use deadpool_redis::redis::{self, Value};

use crate::connection::{Link, check, text};
use crate::error::Error;
use crate::keys::job_key;
use crate::options::{KeyPrefix, RedisOptions};
use crate::server::ServerInfo;

const BACKEND: &str = "redis-stream-id";

/// The Redis `stream-id` strategy: claim-only, remembers forever.
///
/// A claim is `XADD {p:job}:stream-id <slot>-0 token <t> instance <i>`:
/// Redis accepts an entry only if its ID is greater than the stream's last
/// ID, so the first claim of a slot is stored and every other is refused.
/// On a refusal the store reads the entry at that ID (`XRANGE`, sent in
/// the same round trip) and compares tokens, so the caller's own retried
/// claim still wins. One round trip, two commands, no script.
///
/// **A slot older than one already claimed can no longer be claimed.** An
/// explicit ID must exceed the stream's last ID, so once slot S was claimed
/// a first claim of an earlier slot is refused and finds no entry: it is
/// *lost*, never run twice. The store answers [`ClaimOutcome::Lost`], logs
/// a warning and counts it ([`RedisStreamIdStore::out_of_order_losses`]).
/// This happens when an instance fires a slot late after another already
/// claimed a later one (a long `max_late`, a clock far behind). Use the
/// `script` or `lease` strategy if such slots must still run.
///
/// The stream keeps every claim (it doubles as the history). Trimming it
/// with `XTRIM <key> MINID <slot>` is safe: trimmed slots still cannot be
/// claimed again, because the stream's last ID stays. Deleting the key is
/// not: then every slot can be claimed again.
pub struct RedisStreamIdStore {
    link: Link,
    prefix: KeyPrefix,
    out_of_order: AtomicU64,
}

impl RedisStreamIdStore {
    /// Connects and checks the server (eviction policy, persistence).
    ///
    /// # Errors
    ///
    /// [`Error`]: unreachable, access denied, a bad URL, or an
    /// eviction policy the options refuse.
    pub async fn connect(opts: &RedisOptions) -> Result<Self, Error> {
        Ok(Self {
            link: Link::connect(opts, BACKEND, &[]).await?,
            prefix: opts.prefix.clone(),
            out_of_order: AtomicU64::new(0),
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

    /// How many claims this handle lost because a later slot of the job was
    /// already claimed and nobody had claimed theirs (see the type's docs).
    pub fn out_of_order_losses(&self) -> u64 {
        self.out_of_order.load(Ordering::SeqCst)
    }

    /// How many times the store found a different server `run_id` on a new
    /// connection.
    pub fn server_changes(&self) -> u64 {
        self.link.server_changes()
    }

    async fn try_claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        let during = "claiming";
        let slot = req.run.slot.as_millis();
        if slot <= 0 {
            return Err(Error::InvalidOption {
                strategy: "stream-id",
                option: "slot",
                reason: format!("stream IDs start after 0-0; slot {slot} cannot be one"),
            });
        }
        let key = job_key(&self.prefix, &req.run.job, "stream-id");
        let id = format!("{slot}-0");
        let token = req.token.to_string();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("XADD")
            .arg(&key)
            .arg(&id)
            .arg("token")
            .arg(&token)
            .arg("instance")
            .arg(req.instance.as_str());
        pipe.cmd("XRANGE").arg(&key).arg(&id).arg(&id);
        let mut replies = self.link.query_durable(&pipe, during).await?.into_iter();
        let (Some(added), Some(entry)) = (replies.next(), replies.next()) else {
            return Err(Error::protocol(during, "two answers expected"));
        };
        match added {
            Value::ServerError(e)
                if e.details().is_some_and(|d| d.contains("equal or smaller")) =>
            {
                match answer_from_entry(check(entry, during)?, req.token) {
                    Some(answer) => Ok(answer),
                    None => {
                        self.out_of_order.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!(
                            backend = BACKEND,
                            job = %req.run.job,
                            slot = %req.run.slot,
                            "slot lost: a later slot of this job was already claimed, and a \
                             stream-id claim can only add IDs after the last one; the slot will \
                             not run (it is lost, not run twice)"
                        );
                        Ok(ClaimOutcome::Lost)
                    }
                }
            }
            other => {
                check(other, during)?;
                Ok(first_claim_answer(true))
            }
        }
    }
}

/// The answer to a claim that met the run's first claim: won when the
/// first claim was the caller's own (`own`), lost otherwise. Claim-only
/// stores count no attempts and give no fence.
pub(crate) fn first_claim_answer(own: bool) -> ClaimOutcome {
    if own {
        ClaimOutcome::Won(Win::first(None))
    } else {
        ClaimOutcome::Lost
    }
}

/// The answer to a claim, read from the `XRANGE` answer for the run's
/// first entry: won when that entry holds `token`, lost when it holds
/// another; `None` when there is no entry (trimmed, or never written).
pub(crate) fn answer_from_entry(range: Value, token: Token) -> Option<ClaimOutcome> {
    let first = entry_token(range)?;
    Some(first_claim_answer(Token::parse(&first) == Some(token)))
}

/// The `token` field of the one entry of an `XRANGE` answer.
pub(crate) fn entry_token(range: Value) -> Option<String> {
    let Value::Array(mut entries) = range else {
        return None;
    };
    let Value::Array(mut entry) = entries.pop()? else {
        return None;
    };
    let Value::Array(fields) = entry.pop()? else {
        return None;
    };
    fields
        .chunks(2)
        .find(|pair| pair.first().and_then(text).as_deref() == Some("token"))
        .and_then(|pair| pair.get(1).and_then(text))
}

crate::connection::claim_only_store!(RedisStreamIdStore, |_store| Memory::Forever);

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn tokens_are_read_from_a_range() {
        let range = Value::Array(vec![Value::Array(vec![
            bulk("1000-0"),
            Value::Array(vec![
                bulk("token"),
                bulk("abc"),
                bulk("instance"),
                bulk("i"),
            ]),
        ])]);
        assert_eq!(entry_token(range).as_deref(), Some("abc"));
        assert_eq!(entry_token(Value::Array(vec![])), None);
    }
}
