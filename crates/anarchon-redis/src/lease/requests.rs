//! Manual-run requests: one script (`lua/lease_request.lua`) per step, on
//! Redis's clock, and the news of a new request's run published on the
//! hand-over channel.

use std::time::Duration;

use anarchon_core::time::millis;
use anarchon_core::{
    Backfill, JobName, RequestId, RunRequest, RunRequests, StoreError, Timestamp, TriggerRequest,
};
use deadpool_redis::redis::Value;

use super::{REQUEST, RedisLeaseStore, clock_of, store_err};
use crate::connection::{Call, int, text};
use crate::error::Error;
use crate::keys::{requested_key, requests_key};

impl RedisLeaseStore {
    fn request_call(&self, args: Vec<String>) -> Call {
        Call {
            lua: &REQUEST,
            keys: vec![requests_key(&self.prefix), requested_key(&self.prefix)],
            args,
        }
    }

    pub(super) async fn write_request(
        &self,
        req: &TriggerRequest,
    ) -> Result<RunRequest, StoreError> {
        let during = "requesting a manual run";
        let args = vec![
            "request".to_owned(),
            req.job().as_str().to_owned(),
            req.id().as_str().to_owned(),
            if req.by().is_some() { "1" } else { "0" }.to_owned(),
            req.by().unwrap_or_default().to_owned(),
            end(req.range().map(|r| r.from())),
            end(req.range().map(|r| r.to())),
        ];
        let items = self.one(self.request_call(args), during).await?;
        let bad = |what: &str| store_err(Error::protocol(during, what.to_owned()));
        let (Some(new), Some(at), Some(has_by)) = (
            items.first().and_then(int),
            items.get(1).and_then(int),
            items.get(2).and_then(text),
        ) else {
            return Err(bad("the request script answered something else"));
        };
        let by = (has_by == "1").then(|| items.get(3).and_then(text).unwrap_or_default());
        let field = |i: usize| items.get(i).and_then(text).unwrap_or_default();
        let backfill = range(&field(4), &field(5)).map_err(store_err)?;
        let request = req.answer(Timestamp::from_millis(at), by, backfill);
        if new == 1 {
            self.announce_hand_over(&request.news()).await;
        }
        Ok(request)
    }

    pub(super) async fn read_requests(&self) -> Result<RunRequests, StoreError> {
        let during = "reading the requests";
        let items = self
            .one(self.request_call(vec!["read".to_owned()]), during)
            .await?;
        let store_now = clock_of(items.first(), during)?;
        let mut requests = Vec::new();
        for pair in items[1..].chunks(2) {
            let [field, value] = pair else {
                return Err(store_err(Error::protocol(during, "an odd reply")));
            };
            // One entry nobody can read (written by hand, or by something
            // else) must not hide every other request from every instance.
            match parse_request(field, value) {
                Ok(request) => requests.push(request),
                Err(error) => tracing::warn!(
                    key = %requests_key(&self.prefix),
                    "an unreadable manual-run request is passed over: {error}"
                ),
            }
        }
        requests
            .sort_by(|a, b| (a.requested_at, &a.job, &a.id).cmp(&(b.requested_at, &b.job, &b.id)));
        Ok(RunRequests {
            store_now,
            requests,
        })
    }

    pub(super) async fn collect_requests(&self, keep: Duration) -> Result<(), StoreError> {
        let args = vec!["collect".to_owned(), millis(keep).to_string()];
        self.one(self.request_call(args), "collecting old requests")
            .await
            .map(drop)
    }
}

/// A range's end as the script keeps it: ms, or `-` for none.
fn end(at: Option<Timestamp>) -> String {
    at.map_or_else(|| "-".to_owned(), |t| t.as_millis().to_string())
}

/// A backfill range from the script's `from` and `to` (`-` for none).
fn range(from: &str, to: &str) -> Result<Option<Backfill>, Error> {
    let bad = || {
        Error::protocol(
            "reading the requests",
            format!("backfill range {from:?} to {to:?}"),
        )
    };
    match (from, to) {
        ("-", "-") => Ok(None),
        (from, to) => {
            let (from, to) = (
                from.parse().map_err(|_| bad())?,
                to.parse().map_err(|_| bad())?,
            );
            Backfill::new(Timestamp::from_millis(from), Timestamp::from_millis(to))
                .map(Some)
                .map_err(|_| bad())
        }
    }
}

/// One request from its hash field (`<job> <id>`) and value
/// (`<stamp> <from> <to>`, then ` <by>` if there is one).
fn parse_request(field: &Value, value: &Value) -> Result<RunRequest, Error> {
    let during = "reading the requests";
    let bad = |what: String| Error::protocol(during, what);
    let (field, value) = (
        text(field).unwrap_or_default(),
        text(value).unwrap_or_default(),
    );
    let (job, id) = field
        .split_once(' ')
        .ok_or_else(|| bad(format!("request field {field:?} is not '<job> <id>'")))?;
    let mut parts = value.splitn(4, ' ');
    let (at, from, to, by) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("-"),
        parts.next().unwrap_or("-"),
        parts.next().map(str::to_owned),
    );
    Ok(RunRequest {
        job: JobName::new(job).map_err(|_| bad(format!("invalid job name {job:?}")))?,
        id: RequestId::new(id).map_err(|_| bad(format!("invalid request id {id:?}")))?,
        requested_at: Timestamp::from_millis(
            at.parse()
                .map_err(|_| bad(format!("request stamp {at:?} is not a number")))?,
        ),
        by,
        backfill: range(from, to)?,
    })
}
