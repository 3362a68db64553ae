//! The operator's pauses: one script (`lua/lease_pause.lua`) per step, on
//! Redis's clock. See [`RedisLeaseStore`] (Pauses).

use anarchon_core::time::millis;
use anarchon_core::{
    Pause, PauseEnd, PauseRequest, PauseScope, Pauses, StoreError, Timestamp, Until,
};
use deadpool_redis::redis::Value;

use super::{BACKEND, PAUSE, RedisLeaseStore, clock_of, store_err};
use crate::connection::{Call, int, text};
use crate::error::Error;
use crate::keys::{pause_key, pauses_key};

/// The longest pause for a while the store takes, in ms (about 35,000
/// years): the script adds it to Redis's clock in Lua, whose numbers are
/// exact only up to 2^53.
const MAX_PAUSE_MS: i64 = 1 << 50;

impl RedisLeaseStore {
    /// One step of `lua/lease_pause.lua` on the pause of `scope`.
    async fn pause_step(
        &self,
        scope: &PauseScope,
        args: Vec<String>,
        during: &'static str,
    ) -> Result<Vec<Value>, StoreError> {
        let call = Call {
            lua: &PAUSE,
            keys: vec![pause_key(&self.prefix, scope), pauses_key(&self.prefix)],
            args,
        };
        self.one(call, during).await
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
        let mut args = vec!["read".to_owned()];
        args.extend(scopes.iter().map(|s| s.key().to_owned()));
        let call = Call {
            lua: &PAUSE,
            keys: scopes.iter().map(|s| pause_key(&self.prefix, s)).collect(),
            args,
        };
        let mut items = self.one(call, during).await?.into_iter();
        let now = clock_of(items.next().as_ref(), during)?;
        let pauses = items
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
