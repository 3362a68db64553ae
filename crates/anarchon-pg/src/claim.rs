//! The claim path: a batch of claims sent to the `<table>_claim` function
//! (which mirrors [`anarchon_core::decide::claim`]) in one statement.

use anarchon_core::time::millis;
use anarchon_core::{ClaimOutcome, LeaseClaim};

use crate::connection::{Resend, send};
use crate::error::Error;
use crate::rows::ClaimRow;
use crate::store::PgStore;

impl PgStore {
    /// Sends a batch of claims to the claim function. A row that cannot be
    /// read is that claim's error alone (the function has committed: the
    /// other answers, wins included, stand).
    pub(crate) async fn claim_batch(
        &self,
        reqs: &[LeaseClaim],
    ) -> Result<Vec<Result<ClaimOutcome, Error>>, Error> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let n = reqs.len();
        let mut jobs = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut instances = Vec::with_capacity(n);
        let mut max_late = Vec::with_capacity(n);
        let mut leases = Vec::with_capacity(n);
        let mut overlap = Vec::with_capacity(n);
        let mut max_attempts = Vec::with_capacity(n);
        let mut rerun_paused = Vec::with_capacity(n);
        for req in reqs {
            jobs.push(req.run().job.as_str().to_owned());
            slots.push(req.run().slot.as_millis());
            tokens.push(*req.claim.token.as_uuid());
            instances.push(req.claim.instance.as_str().to_owned());
            max_late.push(millis(req.claim.max_late));
            leases.push(millis(req.lease));
            // The rule by name: the function decides every rule itself.
            overlap.push(req.overlap.as_str());
            max_attempts.push(i32::try_from(req.max_attempts.get()).unwrap_or(i32::MAX));
            rerun_paused.push(req.rerun_paused);
        }
        let action = || match reqs {
            [one] => format!("claiming {}", one.run()),
            many => format!("claiming {} runs", many.len()),
        };
        let rows: Vec<ClaimRow> = send!(self, Resend::Always, action(), |conn| {
            sqlx::query_as::<_, ClaimRow>(self.sql.claim.clone())
                .bind(&jobs[..])
                .bind(&slots[..])
                .bind(&tokens[..])
                .bind(&instances[..])
                .bind(&max_late[..])
                .bind(&leases[..])
                .bind(&overlap[..])
                .bind(&max_attempts[..])
                .bind(&rerun_paused[..])
                .fetch_all(conn)
        })?;
        let mut out: Vec<Option<Result<ClaimOutcome, Error>>> = (0..n).map(|_| None).collect();
        for row in rows {
            let slot = usize::try_from(row.idx)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .filter(|i| *i < n)
                .ok_or_else(|| {
                    Error::protocol(action(), format!("answer for claim {} of {n}", row.idx))
                })?;
            let outcome = row.outcome().map_err(|reason| {
                Error::protocol(format!("claiming {}", reqs[slot].run()), reason)
            });
            if out[slot].replace(outcome).is_some() {
                return Err(Error::protocol(
                    action(),
                    format!("two answers for claim {}", row.idx),
                ));
            }
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::protocol(action(), "some claims got no answer"))
    }
}
