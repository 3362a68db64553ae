//! The operator's pauses: one script (`lua/lease_pause.lua`) per step, on
//! Redis's clock. See [`RedisLeaseStore`] (Pauses).

use anarchon_core::time::millis;
use anarchon_core::{
    Pause, PauseEnd, PauseRequest, PauseScope, Pauses, StoreError, Timestamp, Until,
};
use deadpool_redis::redis::{self, Value};

use super::{BACKEND, PAUSE, RedisLeaseStore, clock_of, store_err};
use crate::connection::{Call, Durable, check, int, text};
use crate::error::Error;
use crate::keys::{pause_key, pauses_key};

/// The longest pause for a while the store takes, in ms (about 35,000
/// years): the script adds it to Redis's clock in Lua, whose numbers are
/// exact only up to 2^53.
const MAX_PAUSE_MS: i64 = 1 << 50;

impl RedisLeaseStore {
    /// One step of `lua/lease_pause.lua` on the pause of `scope`.
    ///
    /// On a Redis Cluster a job's pause (`{p:job}:pause`) and the index
    /// (`{p}:pauses`) lie in two hash slots: the script then writes the
    /// pause alone, and the index is updated beside it — added to before
    /// a pause, removed from after a resume — so the index may name a
    /// scope without a pause (which reading the pauses skips) but never
    /// misses one.
    async fn pause_step(
        &self,
        scope: &PauseScope,
        args: Vec<String>,
        during: &'static str,
    ) -> Result<Vec<Value>, StoreError> {
        let pause = pause_key(&self.prefix, scope);
        let index = pauses_key(&self.prefix);
        let split = self.link.is_cluster() && matches!(scope, PauseScope::Job(_));
        if !split {
            let call = Call {
                lua: &PAUSE,
                keys: vec![pause, index],
                args,
            };
            return self.one(call, during).await;
        }
        let pausing = args.first().is_some_and(|op| op == "pause");
        if pausing {
            self.index(&index, "SADD", scope, during).await?;
        }
        let call = Call {
            lua: &PAUSE,
            keys: vec![pause],
            args,
        };
        let reply = self.one(call, during).await?;
        if !pausing {
            self.index(&index, "SREM", scope, during).await?;
        }
        Ok(reply)
    }

    /// `SADD` or `SREM` of `scope` in the pause index `index`.
    async fn index(
        &self,
        index: &str,
        command: &str,
        scope: &PauseScope,
        during: &'static str,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd(command).arg(index).arg(scope.key());
        self.link
            .query_one(&pipe, during)
            .await
            .map(drop)
            .map_err(store_err)
    }

    pub(super) async fn pause_now(
        &self,
        scope: &PauseScope,
        req: &PauseRequest,
    ) -> Result<Pause, StoreError> {
        let during = "pausing";
        let (kind, value) = match req.until() {
            Until::Resumed => ("resumed", String::new()),
            Until::At(until) => ("at", until.as_millis().to_string()),
            Until::For(d) if d.is_zero() => {
                return Err(anarchon_core::PauseRefused::Empty.into_store_error(BACKEND));
            }
            Until::For(d) if millis(d) > MAX_PAUSE_MS => {
                return Err(StoreError::invalid(
                    BACKEND,
                    format!(
                        "a pause for {d:?} is longer than the store keeps (about 35,000 years); \
                         pause until resumed instead"
                    ),
                ));
            }
            Until::For(d) => ("for", millis(d).to_string()),
        };
        let note = |n: Option<&str>| match n {
            Some(text) => ["1".to_owned(), text.to_owned()],
            None => ["0".to_owned(), String::new()],
        };
        let mut args = vec![
            "pause".to_owned(),
            scope.key().to_owned(),
            kind.to_owned(),
            value,
        ];
        args.extend(note(req.reason()));
        args.extend(note(req.by()));
        let reply = self.pause_step(scope, args, during).await?;
        let answer = reply.first().and_then(text).unwrap_or_default();
        let now = clock_of(reply.get(1), during)?;
        // The script judged the end on Redis's clock as `PauseRequest::at`
        // does; the same function with the script's `now` gives the pause
        // as written, or the refusal to report.
        let expected = req.at(scope, now);
        match (answer.as_str(), expected) {
            ("refused", Err(refused)) => Err(refused.into_store_error(BACKEND)),
            ("paused", Ok(pause)) => {
                let stored = match reply.get(2).and_then(text).as_deref() {
                    None | Some("") => None,
                    Some(ms) => Some(ms.parse::<i64>().map_err(|_| {
                        store_err(Error::protocol(during, "the pause's end is not a number"))
                    })?),
                };
                if stored != pause.end.as_millis() {
                    return Err(store_err(Error::protocol(
                        during,
                        format!(
                            "the script stored the end {stored:?}, the request asks for {:?}",
                            pause.end.as_millis()
                        ),
                    )));
                }
                Ok(pause)
            }
            (other, expected) => Err(store_err(Error::protocol(
                during,
                format!("the script answered {other:?} where the request gives {expected:?}"),
            ))),
        }
    }

    pub(super) async fn resume_now(&self, scope: &PauseScope) -> Result<bool, StoreError> {
        let during = "resuming";
        let args = vec!["resume".to_owned(), scope.key().to_owned()];
        let reply = self.pause_step(scope, args, during).await?;
        match reply.first().and_then(int) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            _ => Err(store_err(Error::protocol(
                during,
                "the resume answered neither 1 nor 0",
            ))),
        }
    }

    pub(super) async fn pauses_now(&self) -> Result<Pauses, StoreError> {
        let during = "reading pauses";
        let index = pauses_key(&self.prefix);
        let mut scopes = Vec::new();
        for member in self.members(&index, during).await.map_err(store_err)? {
            match PauseScope::from_key(&member) {
                Some(scope) => scopes.push(scope),
                None => tracing::warn!(
                    backend = BACKEND,
                    key = %index,
                    "ignoring a member of the pause list that is neither * nor a job name: {member:?}"
                ),
            }
        }
        let (now, items) = if self.link.is_cluster() {
            self.read_pauses_apart(&scopes, during).await?
        } else {
            let mut args = vec!["read".to_owned()];
            args.extend(scopes.iter().map(|s| s.key().to_owned()));
            let call = Call {
                lua: &PAUSE,
                keys: scopes.iter().map(|s| pause_key(&self.prefix, s)).collect(),
                args,
            };
            let mut items = self.one(call, during).await?.into_iter();
            let now = clock_of(items.next().as_ref(), during)?;
            (now, items.collect())
        };
        let pauses = items
            .into_iter()
            .map(|item| match item {
                Value::Array(fields) => parse_pause(&fields).map_err(store_err),
                other => Err(store_err(Error::protocol(
                    during,
                    format!("a pause is not an array: {other:?}"),
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pauses::holding(pauses, now))
    }

    /// Cluster mode: each scope's pause read by its own script call (the
    /// calls grouped by hash slot, sent at once), so not one snapshot:
    /// a pause written meanwhile may be seen or not. The store's `now` is
    /// the latest clock reading among the answers.
    async fn read_pauses_apart(
        &self,
        scopes: &[PauseScope],
        during: &'static str,
    ) -> Result<(Timestamp, Vec<Value>), StoreError> {
        let calls: Vec<Call> = scopes
            .iter()
            .map(|scope| Call {
                lua: &PAUSE,
                keys: vec![pause_key(&self.prefix, scope)],
                args: vec!["read".to_owned(), scope.key().to_owned()],
            })
            .collect();
        let mut now = if calls.is_empty() {
            // Nothing to read: one clock reading from the index's node.
            let call = Call {
                lua: &PAUSE,
                keys: vec![pause_key(&self.prefix, &PauseScope::All)],
                args: vec!["read".to_owned(), PauseScope::All.key().to_owned()],
            };
            let items = self.one(call, during).await?;
            Some(clock_of(items.first(), during)?)
        } else {
            None
        };
        let replies = self
            .link
            .eval(&[], &calls, Durable::No, during)
            .await
            .map_err(store_err)?;
        let mut items = Vec::new();
        for reply in replies {
            let Value::Array(answer) = check(reply, during).map_err(store_err)? else {
                return Err(store_err(Error::protocol(
                    during,
                    "a pause read is not an array",
                )));
            };
            let mut answer = answer.into_iter();
            let at = clock_of(answer.next().as_ref(), during)?;
            now = Some(now.map_or(at, |n: Timestamp| n.max(at)));
            items.extend(answer);
        }
        let now = now.ok_or_else(|| store_err(Error::protocol(during, "no clock reading")))?;
        Ok((now, items))
    }
}

/// A pause from `lua/lease_pause.lua`'s read: scope, since, until,
/// has_reason, reason, has_by, by.
fn parse_pause(fields: &[Value]) -> Result<Pause, Error> {
    let during = "reading pauses";
    let bad = |what: &str| Error::protocol(during, format!("pause: {what}"));
    if fields.len() != 7 {
        return Err(bad("not 7 fields"));
    }
    let field = |i: usize| text(&fields[i]).unwrap_or_default();
    let scope = PauseScope::from_key(&field(0))
        .ok_or_else(|| bad(&format!("scope {:?} is neither * nor a job", field(0))))?;
    let since = field(1).parse().map_err(|_| bad("since is not a number"))?;
    let until = match field(2).as_str() {
        "" => None,
        ms => Some(ms.parse().map_err(|_| bad("until is not a number"))?),
    };
    Ok(Pause {
        scope,
        since: Timestamp::from_millis(since),
        end: PauseEnd::from_millis(until),
        reason: (field(3) == "1").then(|| field(4)),
        by: (field(5) == "1").then(|| field(6)),
    })
}
