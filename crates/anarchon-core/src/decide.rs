//! The lease flowchart as pure functions: what a lease store must answer
//! and write, given what it holds.
//!
//! Every lease store does the same few decisions; only how it reads and
//! writes atomically differs (a mutex, a transaction, a compare-and-swap, a
//! Lua script). The decisions live here once. A store reads the run's
//! record into a [`LeaseRecord`], asks [`claim`] (or [`heartbeat`],
//! [`finish`], [`release`], [`give_back`]) what to do, and applies the
//! answer inside its atomic step. `MemoryStore`, SQLite and NATS KV call
//! these functions; the Redis Lua script and the PostgreSQL function
//! mirror them in their own languages, and differential tests hold each
//! store to these functions' answers.
//!
//! [`claim`] takes the facts that are costly for some stores — the store's
//! clock, whether another run of the job holds a live lease, the pauses
//! that hold the job — as [`Facts`] that may be missing, and says which
//! one it needs when it was not given ([`Needs`]): a store that can answer
//! without its clock does not read it. [`claim_at`] is the same decision
//! for a store that has its clock and the pauses at hand.

use crate::control::Paused;
use crate::ids::{Attempt, Fence, Token};
use crate::retry::{AttemptEnd, PastAttempts, RetryPlan};
use crate::store::{
    ClaimOutcome, FinalState, LeaseClaim, Overlap, RecordState, Renewal, RunOutcome, Win,
};
use crate::time::Timestamp;

/// What a lease store holds for one run, as far as its decisions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The record's state.
    pub state: RecordState,
    /// The latest attempt (`None` for runs nobody ran).
    pub attempt: Option<Attempt>,
    /// The token of the claim that holds (or last held) the run; `None`
    /// when nobody ran it, or when the run was given back.
    pub holder: Option<Token>,
    /// The fence of the latest attempt.
    pub fence: Option<Fence>,
    /// When the holder's lease ends, by the store's clock.
    pub lease_until: Option<Timestamp>,
    /// For a failed run whose retry is pending: when it is due.
    pub retry_at: Option<Timestamp>,
}

impl LeaseRecord {
    /// Whether `token` holds the run now: it is running and `token` won it.
    pub fn held_by(&self, token: Token) -> bool {
        self.state == RecordState::Running && self.holder == Some(token)
    }

    /// Until when the run counts as going on for the overlap check: a
    /// running run until its lease ends, a failed one until its retry is
    /// due. `None` for a run that is over.
    pub fn live_until(&self) -> Option<Timestamp> {
        match self.state {
            RecordState::Running => self.lease_until,
            RecordState::Finished(FinalState::Failed) => self.retry_at,
            _ => None,
        }
    }
}

/// A fact [`claim`] needs before it can decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// The answer depends on the store's clock: read it and decide again
    /// with `now`.
    Now,
    /// The claim's job skips overlapping runs: find out whether a run of
    /// the job other than this one is live at `now` — holds a lease alive
    /// (`lease_until >= now`), or failed with a retry not yet due
    /// (`retry_at >= now`; see [`LeaseRecord::live_until`]) — and decide
    /// again with the answer.
    OverlapCheck,
    /// The slot could start: read the pauses of the job and of the
    /// namespace and decide again with them.
    Pauses,
    /// The claim's job buffers one slot ([`Overlap::BufferOne`]): find out
    /// whether a slot of the job other than this one is waiting at `now`
    /// (recorded `waiting`, its wait not over: `lease_until >= now`) and
    /// decide again with the answer.
    WaitingCheck,
}

/// What a store knows when it asks [`claim`]; `None` where it has not
/// found out (yet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The store's clock.
    pub now: Option<Timestamp>,
    /// Whether a run of the job other than this one is live at `now`
    /// ([`Needs::OverlapCheck`]).
    pub another_run_live: Option<bool>,
    /// The pauses of the job and of the namespace.
    pub paused: Option<Paused>,
    /// Whether a slot of the job other than this one is waiting at `now`
    /// ([`Needs::WaitingCheck`]).
    pub another_waiting: Option<bool>,
}

impl Facts {
    /// Nothing known yet.
    pub const NONE: Facts = Facts {
        now: None,
        another_run_live: None,
        paused: None,
        another_waiting: None,
    };

    /// Every fact known.
    pub fn all(
        now: Timestamp,
        another_run_live: bool,
        paused: Paused,
        another_waiting: bool,
    ) -> Self {
        Facts {
            now: Some(now),
            another_run_live: Some(another_run_live),
            paused: Some(paused),
            another_waiting: Some(another_waiting),
        }
    }

    /// The clock and the pauses known, the rest not yet.
    pub fn at(now: Timestamp, paused: Paused) -> Self {
        Facts {
            now: Some(now),
            paused: Some(paused),
            ..Facts::NONE
        }
    }
}

/// What a claim makes a lease store do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Write nothing; answer this.
    Answer(ClaimOutcome),
    /// No record: write one in state `missed` (finished now, nobody's);
    /// answer [`ClaimOutcome::Missed`].
    RecordMissed,
    /// Write a record in state `skipped` (finished now, nobody's) in place
    /// of whatever was there; answer [`ClaimOutcome::Overlap`].
    RecordSkipped,
    /// No record (or a `waiting` one) and the job is paused: write one in
    /// state `paused` (finished now, nobody's) in place of whatever was
    /// there; answer [`ClaimOutcome::Done`]`(Paused)`.
    RecordPaused,
    /// [`Overlap::BufferOne`]: another run of the job is live and no other
    /// slot waits. Write a record in state `waiting` (nobody's) whose
    /// `lease_until` is `until`, the end of its wait; answer
    /// [`ClaimOutcome::Running`] with `look_again` as the lease's end, so
    /// the claimant watches it as a backup.
    RecordWaiting {
        /// The end of the wait: the slot plus the claim's `max_late`.
        until: Timestamp,
        /// When to ask again: the store's `now` plus the claim's lease.
        look_again: Timestamp,
        /// The store's `now`.
        store_now: Timestamp,
    },
    /// [`Overlap::Replace`]: as [`Self::Start`], and every other run of the
    /// job still going — running (whatever its lease), or failed and
    /// waiting for its retry — ends `replaced`, finished now (its retry
    /// cleared, its holder kept, so its runner is fenced).
    StartReplacing,
    /// Start the run: a new record in state `running`, attempt 1, held by
    /// the claim's token and instance, a new fence from the job's counter,
    /// started now, its lease ending the claim's lease after now. Answer
    /// [`ClaimOutcome::Won`] with that attempt and fence.
    Start,
    /// Take the run over: the record keeps running with `attempt`, the
    /// claim's token and instance, a new fence from the job's counter, and a
    /// lease ending the claim's lease after now. Answer
    /// [`ClaimOutcome::Won`] with that attempt and fence.
    TakeOver {
        /// The attempt the new holder runs: the next one, or the same one
        /// when the run was given back before its handler started.
        attempt: Attempt,
    },
    /// The lease ran out with no attempts left: the record ends
    /// `interrupted`, finished now. Answer [`ClaimOutcome::Interrupted`].
    Interrupt,
    /// The run failed and its retry is due: the record runs again with
    /// `attempt`, the claim's token and instance, a new fence and a lease
    /// ending the claim's lease after now; its due time, finish time and
    /// error are cleared, and the failed attempt joins its past attempts.
    /// Answer [`ClaimOutcome::Won`] with that attempt and fence.
    Retry {
        /// The retry's attempt: the one after the failed one.
        attempt: Attempt,
    },
    /// The claim's own token holds the run (the same claim sent again):
    /// change nothing; answer [`ClaimOutcome::Won`] with the record's
    /// attempt and fence.
    Resent {
        /// The record's attempt.
        attempt: Attempt,
        /// The record's fence.
        fence: Option<Fence>,
    },
}

impl ClaimDecision {
    /// The answer to send once the decision is applied; `fence` is the one
    /// handed out for [`Self::Start`], [`Self::TakeOver`] and
    /// [`Self::Retry`], and `past` the run's past attempts as the decision
    /// left them (they tell a win how its attempt came to run).
    pub fn outcome(self, fence: Option<Fence>, past: &PastAttempts) -> ClaimOutcome {
        match self {
            ClaimDecision::Answer(outcome) => outcome,
            ClaimDecision::RecordMissed => ClaimOutcome::Missed,
            ClaimDecision::RecordSkipped => ClaimOutcome::Overlap,
            ClaimDecision::RecordPaused => ClaimOutcome::Done(FinalState::Paused),
            ClaimDecision::RecordWaiting {
                look_again,
                store_now,
                ..
            } => ClaimOutcome::Running {
                lease_until: look_again,
                store_now,
            },
            ClaimDecision::Start | ClaimDecision::StartReplacing => {
                ClaimOutcome::Won(Win::first(fence))
            }
            ClaimDecision::TakeOver { attempt } | ClaimDecision::Retry { attempt } => {
                ClaimOutcome::Won(past.win(attempt, fence))
            }
            ClaimDecision::Resent { attempt, fence } => ClaimOutcome::Won(past.win(attempt, fence)),
            ClaimDecision::Interrupt => ClaimOutcome::Interrupted,
        }
    }

    /// Whether applying the decision hands out a new fence.
    pub fn needs_fence(&self) -> bool {
        matches!(
            self,
            ClaimDecision::Start
                | ClaimDecision::StartReplacing
                | ClaimDecision::TakeOver { .. }
                | ClaimDecision::Retry { .. }
        )
    }

    /// How the record's latest attempt ended, if applying the decision
    /// ends it and starts another: a retry follows a failed attempt, a
    /// takeover with the next attempt one whose lease ran out. (A run
    /// given back before its handler started runs the same attempt again,
    /// which ended nothing.)
    pub fn ends_attempt(&self, record: Option<&LeaseRecord>) -> Option<AttemptEnd> {
        match (self, record.and_then(|r| r.attempt)) {
            (ClaimDecision::Retry { .. }, _) => Some(AttemptEnd::Failed),
            (ClaimDecision::TakeOver { attempt }, Some(was)) if *attempt != was => {
                Some(AttemptEnd::TakenOver)
            }
            _ => None,
        }
    }
}

/// The lease flowchart for one claim.
///
/// `record` is the run's record as the store holds it (`None`: no
/// record); `facts` what the store has found out so far. In order:
///
/// 1. A finished run answers `Done` with how it ended — except one
///    recorded `paused` when the claim may re-run paused slots (a
///    backfill, [`LeaseClaim::rerun_paused`]), which goes on as a `missed`
///    one does in steps 5 and 6, and a `failed` one whose retry is pending:
///    before its due time (`now < retry_at`) it answers `Running` with the
///    due time as the lease's end, from then on the retry starts with the
///    next attempt. A retry is neither late nor paused: it belongs to a
///    run that started.
/// 2. A running run held by the claim's own token (the same claim sent
///    again) answers `Won` with the record's attempt and fence, and changes
///    nothing.
/// 3. A running run whose lease is alive (`lease_until >= now`) answers
///    `Running` with the lease's end and the store's `now`.
/// 4. A running run whose lease ran out is taken over with the next
///    attempt if the claim's `max_attempts` allows one — or with the same
///    attempt if the run was given back (no holder) — and otherwise ends
///    `interrupted`, answering `Interrupted` to the claim that ended it.
/// 5. No record, or a `missed` one, while a pause of the job or of every
///    job holds at `now`: with no record, records `paused` and answers
///    `Done(Paused)`; a `missed` record stays so and answers `Late`, a
///    `paused` one stays so and answers `Done(Paused)`.
/// 6. No record, or a `missed` (or re-runnable `paused`) one: a claim later
///    than its `max_late` (`now - slot > max_late`) records `missed` and
///    answers `Missed` if there was no record, and answers `Late` if there
///    was; a claim with `Overlap::Skip`
///    while another run of the job is live (a live lease, or a retry not
///    yet due) records `skipped`; otherwise the run starts.
///
/// # Errors
///
/// The fact it needs next when `facts` lacks it.
pub fn claim(
    record: Option<&LeaseRecord>,
    facts: Facts,
    req: &LeaseClaim,
) -> Result<ClaimDecision, Needs> {
    match record.map(|r| (r, r.state)) {
        Some((_, RecordState::Finished(FinalState::Paused))) if req.rerun_paused => {
            not_yet_run(record, true, facts, req)
        }
        Some((rec, RecordState::Finished(FinalState::Failed))) if rec.retry_at.is_some() => {
            let now = facts.now.ok_or(Needs::Now)?;
            let retry_at = rec.retry_at.unwrap_or(now);
            Ok(if now < retry_at {
                ClaimDecision::Answer(ClaimOutcome::Running {
                    lease_until: retry_at,
                    store_now: now,
                })
            } else {
                ClaimDecision::Retry {
                    attempt: rec.attempt.unwrap_or(Attempt::FIRST).next(),
                }
            })
        }
        Some((_, RecordState::Finished(state))) => {
            Ok(ClaimDecision::Answer(ClaimOutcome::Done(state)))
        }
        Some((rec, RecordState::Running)) => {
            let attempt = rec.attempt.unwrap_or(Attempt::FIRST);
            if rec.holder == Some(req.claim.token) {
                return Ok(ClaimDecision::Resent {
                    attempt,
                    fence: rec.fence,
                });
            }
            let now = facts.now.ok_or(Needs::Now)?;
            let lease_until = rec.lease_until.unwrap_or(now);
            if lease_until >= now {
                return Ok(ClaimDecision::Answer(ClaimOutcome::Running {
                    lease_until,
                    store_now: now,
                }));
            }
            let given_back = rec.holder.is_none();
            Ok(if given_back {
                ClaimDecision::TakeOver { attempt }
            } else if req.max_attempts.allows_after(attempt) {
                ClaimDecision::TakeOver {
                    attempt: attempt.next(),
                }
            } else {
                ClaimDecision::Interrupt
            })
        }
        None | Some((_, RecordState::Missed | RecordState::Waiting)) => {
            not_yet_run(record, false, facts, req)
        }
    }
}

/// Steps 5 and 6 of [`claim`]: a run with no record, or one recorded
/// `missed` or `waiting` — or `paused` (`was_paused`) for a claim that may
/// re-run it.
fn not_yet_run(
    record: Option<&LeaseRecord>,
    was_paused: bool,
    facts: Facts,
    req: &LeaseClaim,
) -> Result<ClaimDecision, Needs> {
    let now = facts.now.ok_or(Needs::Now)?;
    let waiting = record.is_some_and(|r| r.state == RecordState::Waiting);
    if facts.paused.ok_or(Needs::Pauses)?.holds_at(now) {
        return Ok(match record {
            None => ClaimDecision::RecordPaused,
            Some(_) if waiting => ClaimDecision::RecordPaused,
            Some(_) if was_paused => ClaimDecision::Answer(ClaimOutcome::Done(FinalState::Paused)),
            Some(_) => ClaimDecision::Answer(ClaimOutcome::Late),
        });
    }
    if now.since(req.run().slot.at()) > req.claim.max_late {
        return Ok(if record.is_none() || waiting {
            ClaimDecision::RecordMissed
        } else {
            ClaimDecision::Answer(ClaimOutcome::Late)
        });
    }
    let live = || facts.another_run_live.ok_or(Needs::OverlapCheck);
    Ok(match req.overlap {
        Overlap::Allow => ClaimDecision::Start,
        Overlap::Skip if live()? => ClaimDecision::RecordSkipped,
        Overlap::Skip => ClaimDecision::Start,
        Overlap::Replace => ClaimDecision::StartReplacing,
        // The waiting slot itself starts once the live run has ended.
        Overlap::BufferOne if waiting && live()? => ClaimDecision::Answer(ClaimOutcome::Running {
            lease_until: now.saturating_add(req.lease),
            store_now: now,
        }),
        Overlap::BufferOne if waiting => ClaimDecision::Start,
        // One slot waits at most: a later one is skipped, even when the
        // live run has just ended and the waiting slot not started yet.
        Overlap::BufferOne if facts.another_waiting.ok_or(Needs::WaitingCheck)? => {
            ClaimDecision::RecordSkipped
        }
        Overlap::BufferOne if live()? => ClaimDecision::RecordWaiting {
            until: req.run().slot.at().saturating_add(req.claim.max_late),
            look_again: now.saturating_add(req.lease),
            store_now: now,
        },
        Overlap::BufferOne => ClaimDecision::Start,
    })
}

/// [`claim`] for a store that has its clock and the job's pauses, and can
/// tell at once whether another run of the job is live and whether another
/// slot of it is waiting (each asked only when the answer depends on it).
pub fn claim_at(
    record: Option<&LeaseRecord>,
    now: Timestamp,
    paused: Paused,
    req: &LeaseClaim,
    another_run_live: impl Fn() -> bool,
    another_waiting: impl Fn() -> bool,
) -> ClaimDecision {
    let mut facts = Facts::at(now, paused);
    // Each round learns one more fact; there are two to learn.
    for _ in 0..3 {
        match claim(record, facts, req) {
            Ok(decision) => return decision,
            Err(Needs::OverlapCheck) => facts.another_run_live = Some(another_run_live()),
            Err(Needs::WaitingCheck) => facts.another_waiting = Some(another_waiting()),
            Err(Needs::Now | Needs::Pauses) => break,
        }
    }
    ClaimDecision::Answer(ClaimOutcome::Unknown)
}

/// A heartbeat by `token`: `Renewed` (the store sets the lease to end the
/// heartbeat's lease after its `now`) if `token` holds the run, otherwise
/// `Fenced` and nothing changes.
pub fn heartbeat(record: Option<&LeaseRecord>, token: Token) -> Renewal {
    renewal(record.is_some_and(|r| r.held_by(token)))
}

/// What a finish makes a lease store do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishDecision {
    /// The record ends in `state`, finished now, with the outcome's error
    /// (if any); it keeps its holder. Answer `Renewed`.
    Finish {
        /// The state it ends in.
        state: FinalState,
        /// For a failure with a retry: when the retry is due (the record
        /// keeps it as its `retry_at`).
        retry_at: Option<Timestamp>,
        /// A failure whose retry was asked for but would have been due at
        /// or after the job's next slot: the record's error gets
        /// [`crate::retry::NOT_RETRIED`] added.
        not_retried: bool,
    },
    /// The same finish sent again by the token that finished the run:
    /// change nothing; answer `Renewed`.
    AlreadyFinished,
    /// `token` does not hold the run: change nothing; answer `Fenced`.
    Fenced,
}

impl FinishDecision {
    /// The answer to send.
    pub fn renewal(&self) -> Renewal {
        match self {
            FinishDecision::Finish { .. } | FinishDecision::AlreadyFinished => Renewal::Renewed,
            FinishDecision::Fenced => Renewal::Fenced,
        }
    }
}

/// A finish by `token` with `outcome`, at the store's `now`: a failure
/// whose runner asks for a retry ([`RetryPlan`]) is recorded with the
/// retry's due time, unless that would not be before the job's next slot.
pub fn finish(
    record: Option<&LeaseRecord>,
    token: Token,
    outcome: &RunOutcome,
    now: Timestamp,
) -> FinishDecision {
    let (state, plan): (FinalState, Option<&RetryPlan>) = match outcome {
        RunOutcome::Succeeded => (FinalState::Succeeded, None),
        RunOutcome::Failed { retry, .. } => (FinalState::Failed, retry.as_ref()),
    };
    let retry_at = plan.and_then(|p| p.due(now));
    match record {
        Some(r) if r.held_by(token) => FinishDecision::Finish {
            state,
            retry_at,
            not_retried: plan.is_some() && retry_at.is_none(),
        },
        Some(r) if r.holder == Some(token) && r.state == RecordState::Finished(state) => {
            FinishDecision::AlreadyFinished
        }
        _ => FinishDecision::Fenced,
    }
}

/// A release by `token`: `Renewed` (the store ends the lease — sets it to
/// one millisecond before its `now` — and keeps the holder, so the next
/// takeover runs the next attempt) if `token` holds the run, otherwise
/// `Fenced` and nothing changes.
pub fn release(record: Option<&LeaseRecord>, token: Token) -> Renewal {
    renewal(record.is_some_and(|r| r.held_by(token)))
}

/// A give-back by `token`: `Renewed` (the store ends the lease as for
/// [`release`] and clears the holder, so the next takeover runs the same
/// attempt) if `token` holds the run, otherwise `Fenced` and nothing
/// changes.
pub fn give_back(record: Option<&LeaseRecord>, token: Token) -> Renewal {
    renewal(record.is_some_and(|r| r.held_by(token)))
}

fn renewal(held: bool) -> Renewal {
    if held {
        Renewal::Renewed
    } else {
        Renewal::Fenced
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ids::{InstanceId, MaxAttempts};
    use crate::name::JobName;
    use crate::store::{ClaimRequest, RunKey};
    use crate::time::Slot;

    const NOW: i64 = 1_000_000_000;

    /// The facts of a job nobody paused.
    fn f(now: Option<Timestamp>, another_run_live: Option<bool>) -> Facts {
        Facts {
            now,
            another_run_live,
            paused: Some(Paused::NONE),
            another_waiting: None,
        }
    }

    fn req(token: Token, slot_age_ms: i64, overlap: Overlap, max_attempts: u32) -> LeaseClaim {
        LeaseClaim {
            claim: ClaimRequest {
                run: RunKey::new(
                    JobName::new("j").unwrap(),
                    Slot::from_millis(NOW - slot_age_ms),
                ),
                token,
                instance: InstanceId::new("i").unwrap(),
                max_late: Duration::from_secs(60),
            },
            lease: Duration::from_secs(30),
            overlap,
            max_attempts: MaxAttempts::new(max_attempts).unwrap(),
            rerun_paused: false,
        }
    }

    fn running(holder: Option<Token>, attempt: u32, lease_left_ms: i64) -> LeaseRecord {
        LeaseRecord {
            state: RecordState::Running,
            attempt: Attempt::new(attempt),
            holder,
            fence: Some(Fence::new(7)),
            lease_until: Some(Timestamp::from_millis(NOW + lease_left_ms)),
            retry_at: None,
        }
    }

    fn ended(state: RecordState, holder: Option<Token>) -> LeaseRecord {
        LeaseRecord {
            state,
            attempt: None,
            holder,
            fence: None,
            lease_until: None,
            retry_at: None,
        }
    }

    const NOW_TS: Option<Timestamp> = Some(Timestamp::from_millis(NOW));

    #[test]
    fn a_fresh_slot_starts_a_late_one_is_missed_once() {
        let t = Token::generate();
        let fresh = req(t, 1_000, Overlap::Allow, 3);
        assert_eq!(claim(None, f(None, None), &fresh), Err(Needs::Now));
        assert_eq!(
            claim(None, f(NOW_TS, None), &fresh),
            Ok(ClaimDecision::Start)
        );
        let late = req(t, 61_000, Overlap::Allow, 3);
        assert_eq!(
            claim(None, f(NOW_TS, None), &late),
            Ok(ClaimDecision::RecordMissed)
        );
        let missed = ended(RecordState::Missed, None);
        assert_eq!(
            claim(Some(&missed), f(NOW_TS, None), &late),
            Ok(ClaimDecision::Answer(ClaimOutcome::Late))
        );
        // A later claim with a longer window may still run a missed slot.
        assert_eq!(
            claim(Some(&missed), f(NOW_TS, None), &fresh),
            Ok(ClaimDecision::Start)
        );
        // Exactly max_late late is still in time.
        let edge = req(t, 60_000, Overlap::Allow, 3);
        assert_eq!(
            claim(None, f(NOW_TS, None), &edge),
            Ok(ClaimDecision::Start)
        );
    }

    #[test]
    fn skip_asks_about_other_runs_and_records_skipped() {
        let skip = req(Token::generate(), 0, Overlap::Skip, 3);
        assert_eq!(
            claim(None, f(NOW_TS, None), &skip),
            Err(Needs::OverlapCheck)
        );
        assert_eq!(
            claim(None, f(NOW_TS, Some(true)), &skip),
            Ok(ClaimDecision::RecordSkipped)
        );
        assert_eq!(
            claim(None, f(NOW_TS, Some(false)), &skip),
            Ok(ClaimDecision::Start)
        );
        let now = Timestamp::from_millis(NOW);
        assert_eq!(
            claim_at(None, now, Paused::NONE, &skip, || true, || panic!("asked")),
            ClaimDecision::RecordSkipped
        );
        // Overlap::Allow never asks.
        let allow = req(Token::generate(), 0, Overlap::Allow, 3);
        assert_eq!(
            claim_at(
                None,
                now,
                Paused::NONE,
                &allow,
                || panic!("asked"),
                || panic!("asked")
            ),
            ClaimDecision::Start
        );
        // A late claim is late before it is an overlap.
        let late = req(Token::generate(), 61_000, Overlap::Skip, 3);
        assert_eq!(
            claim(None, f(NOW_TS, Some(true)), &late),
            Ok(ClaimDecision::RecordMissed)
        );
    }

    #[test]
    fn a_paused_job_records_its_fresh_slots_paused_and_starts_nothing() {
        use crate::control::PauseEnd;
        let paused = Paused {
            job: None,
            all: Some(PauseEnd::At(Timestamp::from_millis(NOW + 1))),
        };
        let facts = Facts {
            now: NOW_TS,
            another_run_live: None,
            paused: Some(paused),
            another_waiting: None,
        };
        let fresh = req(Token::generate(), 1_000, Overlap::Skip, 3);
        assert_eq!(
            claim(
                None,
                Facts {
                    paused: None,
                    ..facts
                },
                &fresh
            ),
            Err(Needs::Pauses)
        );
        // Paused before late or overlap: nothing else is asked.
        assert_eq!(claim(None, facts, &fresh), Ok(ClaimDecision::RecordPaused));
        let late = req(Token::generate(), 61_000, Overlap::Allow, 3);
        assert_eq!(claim(None, facts, &late), Ok(ClaimDecision::RecordPaused));
        assert_eq!(
            ClaimDecision::RecordPaused.outcome(None, &PastAttempts::NONE),
            ClaimOutcome::Done(FinalState::Paused)
        );
        // A missed slot stays missed.
        let missed = ended(RecordState::Missed, None);
        assert_eq!(
            claim(Some(&missed), facts, &fresh),
            Ok(ClaimDecision::Answer(ClaimOutcome::Late))
        );
        // A running run goes on: a live lease is still Running.
        let live = running(Some(Token::generate()), 1, 1_000);
        assert!(matches!(
            claim(Some(&live), facts, &fresh),
            Ok(ClaimDecision::Answer(ClaimOutcome::Running { .. }))
        ));
        // At its end the pause no longer holds.
        let ended_pause = Facts {
            now: Some(Timestamp::from_millis(NOW + 1)),
            another_run_live: Some(false),
            ..facts
        };
        assert_eq!(claim(None, ended_pause, &fresh), Ok(ClaimDecision::Start));
        assert_eq!(
            claim_at(
                None,
                Timestamp::from_millis(NOW),
                paused,
                &fresh,
                || panic!("asked"),
                || panic!("asked")
            ),
            ClaimDecision::RecordPaused
        );
    }

    #[test]
    fn a_backfill_may_start_a_paused_slot_as_a_missed_one() {
        let paused_rec = ended(RecordState::Finished(FinalState::Paused), None);
        let plain = req(Token::generate(), 0, Overlap::Skip, 3);
        let backfill = LeaseClaim {
            rerun_paused: true,
            ..plain.clone()
        };
        let quiet = f(NOW_TS, Some(false));
        assert_eq!(
            claim(Some(&paused_rec), quiet, &plain),
            Ok(ClaimDecision::Answer(ClaimOutcome::Done(
                FinalState::Paused
            ))),
            "the schedule's claims leave a paused slot alone"
        );
        assert_eq!(
            claim(Some(&paused_rec), quiet, &backfill),
            Ok(ClaimDecision::Start)
        );
        let busy = f(NOW_TS, Some(true));
        assert_eq!(
            claim(Some(&paused_rec), busy, &backfill),
            Ok(ClaimDecision::RecordSkipped)
        );
        let mut late = backfill.clone();
        late.claim.max_late = Duration::ZERO;
        late.claim.run.slot = Slot::from_millis(NOW - 1);
        assert_eq!(
            claim(Some(&paused_rec), quiet, &late),
            Ok(ClaimDecision::Answer(ClaimOutcome::Late)),
            "too late: it stays paused"
        );
        let still_paused = Facts {
            paused: Some(Paused {
                job: Some(crate::control::PauseEnd::OnResume),
                all: None,
            }),
            ..quiet
        };
        assert_eq!(
            claim(Some(&paused_rec), still_paused, &backfill),
            Ok(ClaimDecision::Answer(ClaimOutcome::Done(
                FinalState::Paused
            ))),
            "while the job is paused, it stays paused"
        );
        // Other finished runs are done for a backfill too.
        let ran = ended(RecordState::Finished(FinalState::Succeeded), None);
        assert_eq!(
            claim(Some(&ran), quiet, &backfill),
            Ok(ClaimDecision::Answer(ClaimOutcome::Done(
                FinalState::Succeeded
            )))
        );
    }

    #[test]
    fn replace_starts_and_ends_the_others_without_asking() {
        let replace = req(Token::generate(), 0, Overlap::Replace, 3);
        let now = Timestamp::from_millis(NOW);
        assert_eq!(
            claim_at(
                None,
                now,
                Paused::NONE,
                &replace,
                || panic!("asked"),
                || panic!("asked")
            ),
            ClaimDecision::StartReplacing
        );
        let d = ClaimDecision::StartReplacing;
        assert!(d.needs_fence());
        assert_eq!(
            d.outcome(Some(Fence::new(3)), &PastAttempts::NONE),
            ClaimOutcome::Won(Win::first(Some(Fence::new(3))))
        );
        // Late is still late, paused still paused.
        let late = req(Token::generate(), 61_000, Overlap::Replace, 3);
        assert_eq!(
            claim(None, f(NOW_TS, None), &late),
            Ok(ClaimDecision::RecordMissed)
        );
    }

    #[test]
    fn buffer_one_waits_one_slot_and_skips_the_next() {
        let now = Timestamp::from_millis(NOW);
        let buffer = req(Token::generate(), 1_000, Overlap::BufferOne, 3);
        let facts = |live, waiting| Facts {
            another_waiting: waiting,
            ..f(NOW_TS, live)
        };
        assert_eq!(
            claim(None, facts(None, None), &buffer),
            Err(Needs::WaitingCheck),
            "a later slot asks first whether one waits"
        );
        assert_eq!(
            claim(None, facts(None, Some(true)), &buffer),
            Ok(ClaimDecision::RecordSkipped)
        );
        assert_eq!(
            claim(None, facts(None, Some(false)), &buffer),
            Err(Needs::OverlapCheck)
        );
        let waits = claim(None, facts(Some(true), Some(false)), &buffer).unwrap();
        assert_eq!(
            waits,
            ClaimDecision::RecordWaiting {
                until: Timestamp::from_millis(NOW - 1_000 + 60_000),
                look_again: now.saturating_add(Duration::from_secs(30)),
                store_now: now,
            }
        );
        assert_eq!(
            waits.outcome(None, &PastAttempts::NONE),
            ClaimOutcome::Running {
                lease_until: now.saturating_add(Duration::from_secs(30)),
                store_now: now,
            }
        );
        assert_eq!(
            claim(None, facts(Some(false), Some(false)), &buffer),
            Ok(ClaimDecision::Start)
        );
        // The waiting slot: still waiting while the run is live, starts
        // after, and is missed past its max_late.
        let waiting = LeaseRecord {
            lease_until: Some(Timestamp::from_millis(NOW + 59_000)),
            ..ended(RecordState::Waiting, None)
        };
        assert!(matches!(
            claim(Some(&waiting), facts(Some(true), None), &buffer),
            Ok(ClaimDecision::Answer(ClaimOutcome::Running { .. }))
        ));
        assert_eq!(
            claim(Some(&waiting), facts(Some(false), None), &buffer),
            Ok(ClaimDecision::Start)
        );
        let too_late = req(Token::generate(), 61_000, Overlap::BufferOne, 3);
        assert_eq!(
            claim(Some(&waiting), facts(Some(true), None), &too_late),
            Ok(ClaimDecision::RecordMissed),
            "a slot that waited past its window is missed"
        );
        let paused = Facts {
            paused: Some(Paused {
                job: Some(crate::control::PauseEnd::OnResume),
                all: None,
            }),
            ..facts(Some(true), None)
        };
        assert_eq!(
            claim(Some(&waiting), paused, &buffer),
            Ok(ClaimDecision::RecordPaused),
            "a pause turns a waiting slot into a paused one"
        );
    }

    #[test]
    fn finished_runs_and_own_claims_need_no_clock() {
        let t = Token::generate();
        let r = req(t, 0, Overlap::Allow, 3);
        for state in [
            FinalState::Succeeded,
            FinalState::Failed,
            FinalState::Interrupted,
            FinalState::Skipped,
            FinalState::Paused,
            FinalState::Replaced,
        ] {
            let rec = ended(RecordState::Finished(state), Some(t));
            assert_eq!(
                claim(Some(&rec), f(None, None), &r),
                Ok(ClaimDecision::Answer(ClaimOutcome::Done(state)))
            );
        }
        let own = running(Some(t), 2, -5_000);
        assert_eq!(
            claim(Some(&own), f(None, None), &r),
            Ok(ClaimDecision::Resent {
                attempt: Attempt::new(2).unwrap(),
                fence: Some(Fence::new(7)),
            })
        );
    }

    #[test]
    fn a_live_lease_is_running_until_it_ends() {
        let r = req(Token::generate(), 0, Overlap::Allow, 3);
        let other = running(Some(Token::generate()), 1, 0);
        assert_eq!(claim(Some(&other), f(None, None), &r), Err(Needs::Now));
        // lease_until == now is still alive.
        assert_eq!(
            claim(Some(&other), f(NOW_TS, None), &r),
            Ok(ClaimDecision::Answer(ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(NOW),
                store_now: Timestamp::from_millis(NOW),
            }))
        );
    }

    #[test]
    fn a_run_out_lease_is_taken_over_given_back_or_interrupted() {
        let r = req(Token::generate(), 0, Overlap::Allow, 2);
        let first = running(Some(Token::generate()), 1, -1);
        assert_eq!(
            claim(Some(&first), f(NOW_TS, None), &r),
            Ok(ClaimDecision::TakeOver {
                attempt: Attempt::new(2).unwrap()
            })
        );
        assert_eq!(
            ClaimDecision::TakeOver {
                attempt: Attempt::new(2).unwrap()
            }
            .ends_attempt(Some(&first)),
            Some(AttemptEnd::TakenOver)
        );
        let last = running(Some(Token::generate()), 2, -1);
        assert_eq!(
            claim(Some(&last), f(NOW_TS, None), &r),
            Ok(ClaimDecision::Interrupt)
        );
        let given_back = running(None, 2, -1);
        let same = claim(Some(&given_back), f(NOW_TS, None), &r).unwrap();
        assert_eq!(
            same,
            ClaimDecision::TakeOver {
                attempt: Attempt::new(2).unwrap()
            }
        );
        assert_eq!(same.ends_attempt(Some(&given_back)), None);
    }

    #[test]
    fn only_the_holder_renews_finishes_releases_or_gives_back() {
        let t = Token::generate();
        let held = running(Some(t), 1, 1_000);
        let stranger = Token::generate();
        for decide in [heartbeat, release, give_back] {
            assert_eq!(decide(Some(&held), t), Renewal::Renewed);
            assert_eq!(decide(Some(&held), stranger), Renewal::Fenced);
            assert_eq!(decide(None, t), Renewal::Fenced);
            let done = ended(RecordState::Finished(FinalState::Succeeded), Some(t));
            assert_eq!(decide(Some(&done), t), Renewal::Fenced);
        }
        let ok = RunOutcome::Succeeded;
        let now = Timestamp::from_millis(NOW);
        assert_eq!(
            finish(Some(&held), t, &ok, now),
            FinishDecision::Finish {
                state: FinalState::Succeeded,
                retry_at: None,
                not_retried: false,
            }
        );
        assert_eq!(
            finish(Some(&held), stranger, &ok, now),
            FinishDecision::Fenced
        );
        let done = ended(RecordState::Finished(FinalState::Succeeded), Some(t));
        assert_eq!(
            finish(Some(&done), t, &ok, now),
            FinishDecision::AlreadyFinished
        );
        let failed = RunOutcome::Failed {
            error: "x".into(),
            retry: None,
        };
        assert_eq!(finish(Some(&done), t, &failed, now), FinishDecision::Fenced);
        assert_eq!(
            finish(Some(&done), stranger, &ok, now),
            FinishDecision::Fenced
        );
        assert_eq!(finish(None, t, &ok, now), FinishDecision::Fenced);
    }

    #[test]
    fn a_failure_with_a_plan_is_retried_when_due_and_not_past_the_next_slot() {
        let t = Token::generate();
        let held = running(Some(t), 1, 1_000);
        let now = Timestamp::from_millis(NOW);
        let plan = |after_ms: u64, before_ms: i64| RunOutcome::Failed {
            error: "boom".into(),
            retry: Some(RetryPlan {
                after: Duration::from_millis(after_ms),
                before: Timestamp::from_millis(NOW + before_ms),
            }),
        };
        assert_eq!(
            finish(Some(&held), t, &plan(500, 10_000), now),
            FinishDecision::Finish {
                state: FinalState::Failed,
                retry_at: Some(Timestamp::from_millis(NOW + 500)),
                not_retried: false,
            }
        );
        assert_eq!(
            finish(Some(&held), t, &plan(500, 500), now),
            FinishDecision::Finish {
                state: FinalState::Failed,
                retry_at: None,
                not_retried: true,
            },
            "due at the next slot: not made"
        );
        let pending = LeaseRecord {
            state: RecordState::Finished(FinalState::Failed),
            attempt: Attempt::new(1),
            holder: Some(t),
            fence: Some(Fence::new(7)),
            lease_until: None,
            retry_at: Some(Timestamp::from_millis(NOW + 500)),
        };
        assert_eq!(
            finish(Some(&pending), t, &plan(500, 10_000), now),
            FinishDecision::AlreadyFinished,
            "the same failure sent again"
        );
        assert_eq!(pending.live_until(), pending.retry_at);
        let other = req(Token::generate(), 0, Overlap::Allow, 3);
        assert_eq!(
            claim(Some(&pending), f(None, None), &other),
            Err(Needs::Now)
        );
        assert_eq!(
            claim(Some(&pending), f(NOW_TS, None), &other),
            Ok(ClaimDecision::Answer(ClaimOutcome::Running {
                lease_until: Timestamp::from_millis(NOW + 500),
                store_now: now,
            })),
            "before it is due, a pending retry is a run still going"
        );
        let due = Some(Timestamp::from_millis(NOW + 500));
        let decision = claim(Some(&pending), f(due, None), &other).unwrap();
        assert_eq!(
            decision,
            ClaimDecision::Retry {
                attempt: Attempt::new(2).unwrap()
            }
        );
        assert!(decision.needs_fence());
        assert_eq!(
            decision.ends_attempt(Some(&pending)),
            Some(AttemptEnd::Failed)
        );
        // Neither late nor paused stops a retry: it belongs to a started run.
        let late = req(Token::generate(), 3_600_000, Overlap::Allow, 3);
        let paused = Facts {
            now: due,
            another_run_live: None,
            paused: Some(Paused {
                job: Some(crate::control::PauseEnd::OnResume),
                all: None,
            }),
            another_waiting: None,
        };
        assert_eq!(
            claim(Some(&pending), paused, &late),
            Ok(ClaimDecision::Retry {
                attempt: Attempt::new(2).unwrap()
            })
        );
        let final_failure = LeaseRecord {
            retry_at: None,
            ..pending
        };
        assert_eq!(
            claim(Some(&final_failure), f(due, None), &other),
            Ok(ClaimDecision::Answer(ClaimOutcome::Done(
                FinalState::Failed
            )))
        );
        assert_eq!(final_failure.live_until(), None);
    }
}
