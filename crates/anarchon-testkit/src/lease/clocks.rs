//! Clocks: leases end by the store's clock, never an instance's.

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::{ClaimOutcome, LeaseStore, Renewal, RunKey, Timestamp, Token};

use crate::claim::{future_slot, job};
use crate::clock::SkewedClock;
use crate::factory::StoreFactory;

use super::{LONG_LEASE, SHORT_LEASE, lease_claim, lease_end, short, wait_out, won};

/// How far off the store's clock the skew checks set an instance's clock:
/// more than any lease the checks use, so a store that decides on the
/// caller's clock gets every answer wrong.
pub const SKEW: Duration = Duration::from_secs(60);

/// Two instances of the factory's namespace, one [`SKEW`] ahead of the
/// store's clock and one [`SKEW`] behind it.
pub(super) async fn skewed_pair<F: StoreFactory>(factory: &F) -> (Arc<F::Store>, Arc<F::Store>) {
    let store_clock = factory.clock();
    let ahead = SkewedClock::new(store_clock.clone(), true, SKEW);
    let behind = SkewedClock::new(store_clock, false, SKEW);
    (
        factory.instance_with_clock(ahead).await,
        factory.instance_with_clock(behind).await,
    )
}

pub(crate) fn assert_store_clock(what: &str, store_now: Timestamp, reference: Timestamp) {
    let off = (store_now.as_millis() - reference.as_millis()).abs();
    assert!(
        off < SKEW.as_millis() as i64 / 4,
        "{what}: the store reported {store_now} as its clock, {off} ms off the store's \
         clock ({reference}): it must answer with its own clock, not the caller's"
    );
}

/// Instances whose clocks are [`SKEW`] off the store's decide nothing with
/// them: one a minute ahead is told `Running` on a fresh lease and renews
/// to the store's `now + lease`; one a minute behind still takes over a
/// lease that ran out; `peek` and `Running` report the store's clock.
pub async fn lease_expiry_is_judged_on_the_store_clock<F: StoreFactory>(factory: &F)
where
    F::Store: LeaseStore,
{
    let store_clock = factory.clock();
    let holder = factory.instance().await;
    let (ahead, behind) = skewed_pair(factory).await;

    // A fresh 30 s lease has "run out" on a clock a minute ahead.
    let run = RunKey::new(job("skew-ahead"), future_slot(factory, 0));
    won(holder
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "holder"))
        .await
        .expect("claim"));
    let holders_end = lease_end(&holder.peek(&run).await.expect("peek"));
    match ahead
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "ahead"))
        .await
        .expect("claim from the instance ahead")
    {
        ClaimOutcome::Running {
            lease_until,
            store_now,
        } => {
            assert_eq!(lease_until, holders_end, "the holder's lease is untouched");
            assert_store_clock("Running", store_now, store_clock.now());
        }
        other => panic!(
            "an instance {SKEW:?} ahead must be told Running on a fresh {LONG_LEASE:?} lease, \
             got {other:?}: the store judged the lease on the caller's clock"
        ),
    }
    let view = ahead
        .peek(&run)
        .await
        .expect("peek from the instance ahead");
    assert_store_clock("peek", view.store_now, store_clock.now());

    // A renewal from the instance ahead counts from the store's now.
    let token = Token::generate();
    let run_ahead = RunKey::new(job("skew-renew"), future_slot(factory, 0));
    won(ahead
        .claim_lease(&lease_claim(run_ahead.clone(), token, "ahead"))
        .await
        .expect("claim from the instance ahead"));
    assert_eq!(
        ahead
            .heartbeat(&run_ahead, token, LONG_LEASE)
            .await
            .expect("heartbeat"),
        Renewal::Renewed
    );
    let view = ahead.peek(&run_ahead).await.expect("peek");
    let left = lease_end(&view).since(view.store_now);
    assert!(
        left <= LONG_LEASE,
        "a renewal from an instance {SKEW:?} ahead left {left:?} of a {LONG_LEASE:?} lease: \
         the lease end was counted from the caller's clock"
    );

    // A lease that ran out is still alive on a clock a minute behind.
    let run = RunKey::new(job("skew-behind"), future_slot(factory, 0));
    let first = won(holder
        .claim_lease(&short(lease_claim(
            run.clone(),
            Token::generate(),
            "holder",
        )))
        .await
        .expect("claim"));
    wait_out(SHORT_LEASE).await;
    match behind
        .claim_lease(&lease_claim(run.clone(), Token::generate(), "behind"))
        .await
        .expect("claim from the instance behind")
    {
        ClaimOutcome::Won(win) => assert_eq!(win.attempt, first.attempt.next()),
        other => panic!(
            "an instance {SKEW:?} behind must take over a lease that ran out, got {other:?}: \
             the store judged the lease on the caller's clock"
        ),
    }
    let view = behind
        .peek(&run)
        .await
        .expect("peek from the instance behind");
    assert_store_clock("peek", view.store_now, store_clock.now());
}
