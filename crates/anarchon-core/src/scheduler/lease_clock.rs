//! A runner's view of its own lease, on its monotonic clock.
//!
//! The store counts a lease from when it processed the claim or the last
//! renewal; the runner cannot see that instant, only when it *sent* the
//! request, which is earlier. So the runner counts its lease from the send:
//! its idea of the lease end is never later than the store's, and a runner
//! that gives the run up at that end has stopped before any backup can take
//! it over. Renewals are due every `heartbeat` after the last successful
//! one was sent — from the claim's first send for the first renewal, even
//! when the handler starts later (a claim sent ahead of its slot, or won on
//! a retry).
//!
//! [`LeaseClock::heartbeat_ended`] turns each heartbeat's answer into a
//! [`Renew`], and [`Holding`] is what a running handler's lease has come
//! to: still renewed, or ended (fenced, or contact lost) with the reason
//! its handler is cancelled. The store calls themselves are made in `run`.

use std::time::Duration;

use tokio::time::Instant;

use super::context::CancelReason;
use crate::store::Renewal;

/// When a runner renews and when it must give the run up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseClock {
    lease: Duration,
    /// How long before the lease could end the runner gives the run up, so
    /// a cancelled handler has that long to stop.
    stop_grace: Duration,
    every: Duration,
    /// When the last successful renewal (or the claim) was first sent.
    last_sent: Instant,
    /// When the next renewal is due.
    next_try: Instant,
}

impl LeaseClock {
    /// A lease of `lease` won by a claim first sent at `claim_sent`, renewed
    /// every `every`.
    #[cfg(test)]
    pub(crate) fn new(claim_sent: Instant, lease: Duration, every: Duration) -> Self {
        Self::with_stop_grace(claim_sent, lease, every, Duration::ZERO)
    }

    /// [`Self::new`], giving the run up `stop_grace` before the lease could
    /// end on the store.
    pub(crate) fn with_stop_grace(
        claim_sent: Instant,
        lease: Duration,
        every: Duration,
        stop_grace: Duration,
    ) -> Self {
        Self {
            lease,
            stop_grace,
            every,
            last_sent: claim_sent,
            next_try: claim_sent + every,
        }
    }

    /// The lease each renewal asks for.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// When the runner gives the run up: `stop_grace` before the latest
    /// instant the lease can end on the store, so its handler has stopped
    /// by then.
    pub(crate) fn deadline(&self) -> Instant {
        self.last_sent + self.lease.saturating_sub(self.stop_grace)
    }

    /// Whether the lease may have run out on the store by `now`.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        now >= self.deadline()
    }

    /// How much lease is surely left at `now`.
    pub(crate) fn left(&self, now: Instant) -> Duration {
        self.deadline().saturating_duration_since(now)
    }

    /// When to send the next renewal: on schedule, never after the deadline.
    pub(crate) fn next_renewal(&self) -> Instant {
        self.next_try.min(self.deadline())
    }

    /// A renewal sent at `sent` was answered `Renewed`.
    pub(crate) fn renewed(&mut self, sent: Instant) {
        self.last_sent = self.last_sent.max(sent);
        self.next_try = self.last_sent + self.every;
    }

    /// A renewal failed at `now`: try again a heartbeat later (or at the
    /// deadline, whichever comes first).
    pub(crate) fn failed(&mut self, now: Instant) {
        self.next_try = now + self.every;
    }

    /// Notes how a heartbeat sent at `sent` ended at `now`: answered
    /// (`Some`), or not (`None`: an error, or no answer in time).
    pub(crate) fn heartbeat_ended(
        &mut self,
        sent: Instant,
        now: Instant,
        answer: Option<Renewal>,
    ) -> Renew {
        match answer {
            Some(Renewal::Renewed) => {
                self.renewed(sent);
                Renew::Held
            }
            Some(Renewal::Fenced) => Renew::Fenced,
            None => {
                self.failed(now);
                if self.expired(now) {
                    Renew::Expired
                } else {
                    Renew::Failed
                }
            }
        }
    }
}

/// How a renewal went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renew {
    /// The token still holds the run; the lease was extended.
    Held,
    /// Another token holds the run now.
    Fenced,
    /// The store did not answer, and lease is still surely left.
    Failed,
    /// The store did not answer and the lease may have run out.
    Expired,
}

/// What a running handler's lease has come to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Heartbeats go out on schedule.
    Renewing,
    /// There is no lease to renew: a claim-only store.
    Unleased,
    /// The store said another token holds the run.
    Fenced,
    /// No renewal for a whole lease: the runner gave the run up.
    LostContact,
}

impl Holding {
    /// A handler starting on a lease store (`leased`) or a claim-only one.
    pub(crate) fn start(leased: bool) -> Self {
        if leased {
            Holding::Renewing
        } else {
            Holding::Unleased
        }
    }

    /// Whether heartbeats still go out.
    pub(crate) fn renewing(self) -> bool {
        self == Holding::Renewing
    }

    /// Notes a renewal made while the handler runs. When it ends the
    /// renewing, the reason the handler is cancelled for.
    pub(crate) fn after(&mut self, renew: Renew) -> Option<CancelReason> {
        if !self.renewing() {
            return None;
        }
        match renew {
            Renew::Held | Renew::Failed => None,
            Renew::Fenced => {
                *self = Holding::Fenced;
                Some(CancelReason::Fenced)
            }
            Renew::Expired => {
                *self = Holding::LostContact;
                Some(CancelReason::LostContact)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(800);
    const EVERY: Duration = Duration::from_millis(200);

    #[test]
    fn the_first_renewal_is_due_a_heartbeat_after_the_claim_was_sent() {
        let sent = Instant::now();
        let clock = LeaseClock::new(sent, LEASE, EVERY);
        assert_eq!(clock.next_renewal(), sent + EVERY);
        assert_eq!(clock.deadline(), sent + LEASE);
        // A handler that starts late finds the renewal overdue, not a whole
        // heartbeat away.
        let late_start = sent + Duration::from_millis(700);
        assert!(clock.next_renewal() <= late_start);
        assert_eq!(clock.left(late_start), Duration::from_millis(100));
        assert!(!clock.expired(late_start));
        assert!(clock.expired(sent + LEASE));
    }

    #[test]
    fn a_renewal_counts_from_its_send_and_never_moves_back() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, LEASE, EVERY);
        let sent = start + Duration::from_millis(150);
        clock.renewed(sent);
        assert_eq!(clock.deadline(), sent + LEASE);
        assert_eq!(clock.next_renewal(), sent + EVERY);
        // An older renewal answered late does not shorten anything.
        clock.renewed(start + Duration::from_millis(100));
        assert_eq!(clock.deadline(), sent + LEASE);
    }

    #[test]
    fn after_a_failure_the_next_try_comes_a_heartbeat_later_but_by_the_deadline() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, LEASE, EVERY);
        clock.failed(start + Duration::from_millis(200));
        assert_eq!(clock.next_renewal(), start + Duration::from_millis(400));
        clock.failed(start + Duration::from_millis(700));
        assert_eq!(
            clock.next_renewal(),
            start + LEASE,
            "never after the deadline"
        );
        assert_eq!(clock.deadline(), start + LEASE, "a failure extends nothing");
    }

    #[test]
    fn a_heartbeat_answer_moves_the_clock_as_its_send_allows() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, LEASE, EVERY);
        let sent = start + Duration::from_millis(200);
        let answered = sent + Duration::from_millis(50);
        assert_eq!(
            clock.heartbeat_ended(sent, answered, Some(Renewal::Renewed)),
            Renew::Held
        );
        assert_eq!(clock.deadline(), sent + LEASE, "counted from the send");
        assert_eq!(clock.next_renewal(), sent + EVERY);

        // Fenced changes nothing on the clock.
        let before = (clock.deadline(), clock.next_renewal());
        assert_eq!(
            clock.heartbeat_ended(answered, answered, Some(Renewal::Fenced)),
            Renew::Fenced
        );
        assert_eq!((clock.deadline(), clock.next_renewal()), before);
    }

    #[test]
    fn an_unanswered_heartbeat_fails_until_the_lease_may_have_run_out() {
        let start = Instant::now();
        let mut clock = LeaseClock::new(start, LEASE, EVERY);
        let now = start + Duration::from_millis(300);
        assert_eq!(clock.heartbeat_ended(start, now, None), Renew::Failed);
        assert_eq!(
            clock.next_renewal(),
            now + EVERY,
            "tried again a heartbeat later"
        );
        assert_eq!(clock.deadline(), start + LEASE, "a failure extends nothing");
        let late = start + LEASE;
        assert_eq!(clock.heartbeat_ended(now, late, None), Renew::Expired);
    }

    #[test]
    fn a_lease_is_renewed_until_fenced_or_out_of_contact() {
        let mut holding = Holding::start(true);
        assert!(holding.renewing());
        assert_eq!(holding.after(Renew::Held), None);
        assert_eq!(holding.after(Renew::Failed), None);
        assert_eq!(holding, Holding::Renewing);
        assert_eq!(holding.after(Renew::Fenced), Some(CancelReason::Fenced));
        assert_eq!(holding, Holding::Fenced);
        assert!(!holding.renewing());
        // Ended stays ended, with its first reason.
        assert_eq!(holding.after(Renew::Expired), None);
        assert_eq!(holding, Holding::Fenced);

        let mut holding = Holding::start(true);
        assert_eq!(
            holding.after(Renew::Expired),
            Some(CancelReason::LostContact)
        );
        assert_eq!(holding, Holding::LostContact);
        assert!(!holding.renewing());
    }

    #[test]
    fn a_claim_only_run_has_no_lease_to_renew() {
        let mut holding = Holding::start(false);
        assert!(!holding.renewing());
        assert_eq!(holding.after(Renew::Fenced), None);
        assert_eq!(holding, Holding::Unleased);
    }

    #[test]
    fn a_stop_grace_gives_the_run_up_that_much_earlier() {
        let start = Instant::now();
        let grace = Duration::from_millis(300);
        let clock = LeaseClock::with_stop_grace(start, LEASE, EVERY, grace);
        assert_eq!(clock.deadline(), start + LEASE - grace);
        assert!(clock.expired(start + LEASE - grace));
        assert!(!clock.expired(start + LEASE - grace - Duration::from_millis(1)));
    }
}
