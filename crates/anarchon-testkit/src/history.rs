//! A Jepsen-style history of store calls, and a checker for it.
//!
//! [`Recorder`] wraps a lease store and logs every call: who made it, when
//! it was invoked and when it completed (on the test's monotonic clock), and
//! what came back — ok with the answer, failed, or unknown (the call gave no
//! answer). [`check`] then asserts, for every run, what "exactly one runner"
//! means, using only facts that follow from the store processing each call
//! somewhere between its invocation and its completion:
//!
//! 1. at most one token wins each attempt of a run (a token's retries aside,
//!    and a winner after one that gave the run back unstarted, which runs
//!    the same attempt again);
//! 2. attempts of a run increase with each new winner (or stay, after a
//!    give-back);
//! 3. a takeover completes only after the previous holder's lease could
//!    have ended: at least `lease` after the invocation of that holder's
//!    last successful renewal, or of its first claim try — otherwise the
//!    store handed out a live lease;
//! 4. no holder is renewed (heartbeat or finish answered `Renewed`) in a call
//!    invoked after another token's win of the same run completed: at any
//!    store instant at most one runner holds the run;
//! 5. no win of a run is invoked after a claim of it completed with `Done`;
//! 6. no two handlers of a run run at once: handlers record their own start
//!    and end ([`History::handler_started`]), and each starts only after
//!    the one before it ended — the promise itself, seen from the handlers.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::layer::LeaseLayer;
use anarchon_core::{
    Attempt, ClaimAnswers, ClaimOutcome, ClaimRequest, LeaseClaim, LeaseStore, Renewal, RunContext,
    RunKey, RunOutcome, StoreError, Token,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::time::Instant;

/// What a call was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A claim (plain, lease or one element of a batch) with its token and lease.
    Claim {
        /// The claim's token.
        token: Token,
        /// The lease asked for.
        lease: Duration,
    },
    /// A heartbeat.
    Heartbeat {
        /// The token.
        token: Token,
        /// The lease asked for.
        lease: Duration,
    },
    /// A finish.
    Finish {
        /// The token.
        token: Token,
    },
    /// A release.
    Release {
        /// The token.
        token: Token,
    },
    /// A give-back: a release before the handler started, which does not
    /// use up the attempt.
    GiveBack {
        /// The token.
        token: Token,
    },
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The claim's outcome.
    Claimed(ClaimOutcome),
    /// A heartbeat's, finish's or release's answer.
    Renewal(Renewal),
    /// The call failed; the store may or may not have done it.
    Failed(String),
}

/// One call in the history.
#[derive(Clone, Debug)]
pub struct Event {
    /// Which recorder (instance) made it.
    pub instance: usize,
    /// The run.
    pub run: RunKey,
    /// The call.
    pub call: Call,
    /// When it was invoked.
    pub invoked: Instant,
    /// When it completed; `None` if it never did (dropped).
    pub completed: Option<Instant>,
    /// What came back.
    pub answer: Option<Answer>,
}

/// One handler's run, as the handler saw it.
#[derive(Clone, Debug)]
pub struct HandlerRun {
    /// Which instance ran it.
    pub instance: usize,
    /// The run.
    pub run: RunKey,
    /// The attempt it was told.
    pub attempt: Attempt,
    /// When the handler started.
    pub started: Instant,
    /// When it returned; `None` while it runs (or if it never returned).
    pub ended: Option<Instant>,
}

/// Records a handler's end when dropped (returned, cancelled or panicked).
#[derive(Debug)]
pub struct HandlerGuard {
    history: History,
    index: usize,
}

impl Drop for HandlerGuard {
    fn drop(&mut self) {
        let mut handlers = self.history.handlers();
        if let Some(h) = handlers.get_mut(self.index) {
            h.ended = Some(Instant::now());
        }
    }
}

/// A shared, append-only history.
#[derive(Clone, Default)]
pub struct History {
    events: Arc<Mutex<Vec<Event>>>,
    handlers: Arc<Mutex<Vec<HandlerRun>>>,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "History({} events)", self.len())
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many calls were recorded.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the events.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handlers(&self) -> std::sync::MutexGuard<'_, Vec<HandlerRun>> {
        self.handlers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that a handler of `run`, told `attempt`, starts now on
    /// `instance`; the guard records its end when dropped. Call it first
    /// thing in the handler and keep the guard until it returns.
    pub fn handler_started(&self, instance: usize, run: RunKey, attempt: Attempt) -> HandlerGuard {
        let mut handlers = self.handlers();
        handlers.push(HandlerRun {
            instance,
            run,
            attempt,
            started: Instant::now(),
            ended: None,
        });
        HandlerGuard {
            history: self.clone(),
            index: handlers.len() - 1,
        }
    }

    /// A handler for `instance` that records its run here (see
    /// [`Self::handler_started`]) and works for `work`, or stops early with
    /// an error when cancelled: the job of a randomized history test.
    pub fn working_handler(
        &self,
        instance: usize,
        work: Duration,
    ) -> impl Fn(RunContext) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
        let history = self.clone();
        move |ctx| {
            let running = history.handler_started(
                instance,
                RunKey::new(ctx.job().clone(), ctx.slot()),
                ctx.attempt(),
            );
            Box::pin(async move {
                let _running = running;
                tokio::select! {
                    () = tokio::time::sleep(work) => Ok(()),
                    () = ctx.cancelled() => Err("stopped early".to_owned()),
                }
            })
        }
    }

    /// A copy of the handler runs.
    pub fn handler_runs(&self) -> Vec<HandlerRun> {
        self.handlers().clone()
    }

    /// Appends `event` as given: for building a history by hand, to show
    /// that [`check`] objects to it.
    pub fn push(&self, event: Event) {
        self.lock().push(event);
    }

    /// Appends a handler run as given, like [`Self::push`].
    pub fn push_handler(&self, run: HandlerRun) {
        self.handlers().push(run);
    }

    fn begin(&self, instance: usize, run: RunKey, call: Call) -> usize {
        let mut events = self.lock();
        events.push(Event {
            instance,
            run,
            call,
            invoked: Instant::now(),
            completed: None,
            answer: None,
        });
        events.len() - 1
    }

    fn end(&self, index: usize, answer: Answer) {
        let mut events = self.lock();
        if let Some(e) = events.get_mut(index) {
            e.completed = Some(Instant::now());
            e.answer = Some(answer);
        }
    }
}

/// A lease store that records every run-level call into a [`History`].
pub struct Recorder<S: ?Sized> {
    inner: Arc<S>,
    instance: usize,
    history: History,
}

impl<S: ?Sized> fmt::Debug for Recorder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl<S: LeaseStore + ?Sized> Recorder<S> {
    /// Records `inner`'s calls as instance `instance` into `history`.
    pub fn new(inner: Arc<S>, instance: usize, history: History) -> Arc<Self> {
        Arc::new(Self {
            inner,
            instance,
            history,
        })
    }
}

impl<S: LeaseStore + ?Sized> Recorder<S> {
    /// Records `call` of `run` around `renewal`: the inner store's answer
    /// to it, not yet started.
    async fn record_renewal(
        &self,
        run: &RunKey,
        call: Call,
        renewal: impl Future<Output = Result<Renewal, StoreError>>,
    ) -> Result<Renewal, StoreError> {
        let i = self.history.begin(self.instance, run.clone(), call);
        let answer = renewal.await;
        self.history.end(
            i,
            match &answer {
                Ok(r) => Answer::Renewal(*r),
                Err(e) => failed(e),
            },
        );
        answer
    }
}

fn failed(e: &StoreError) -> Answer {
    Answer::Failed(e.to_string())
}

/// The run-level calls are recorded; `peek`, `wait_for_hand_over`,
/// `history`, `collect_garbage` and `info` forward unrecorded.
#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseLayer for Recorder<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    /// A plain claim is recorded as the lease claim a lease store makes of it.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        LeaseLayer::claim_lease(self, &LeaseClaim::from_plain(req)).await
    }

    async fn claim_lease(&self, req: &LeaseClaim) -> Result<ClaimOutcome, StoreError> {
        let i = self.history.begin(
            self.instance,
            req.run().clone(),
            Call::Claim {
                token: req.claim.token,
                lease: req.lease,
            },
        );
        let answer = self.inner.claim_lease(req).await;
        self.history.end(
            i,
            match &answer {
                Ok(o) => Answer::Claimed(o.clone()),
                Err(e) => failed(e),
            },
        );
        answer
    }

    async fn claim_many(&self, reqs: &[LeaseClaim]) -> Result<ClaimAnswers, StoreError> {
        let indices: Vec<usize> = reqs
            .iter()
            .map(|r| {
                self.history.begin(
                    self.instance,
                    r.run().clone(),
                    Call::Claim {
                        token: r.claim.token,
                        lease: r.lease,
                    },
                )
            })
            .collect();
        let answer = self.inner.claim_many(reqs).await;
        for (n, i) in indices.into_iter().enumerate() {
            self.history.end(
                i,
                match &answer {
                    Ok(answers) => match answers.iter().nth(n) {
                        Some(Ok(o)) => Answer::Claimed(o.clone()),
                        Some(Err(e)) => failed(e),
                        None => Answer::Failed("missing from the batch answer".into()),
                    },
                    Err(e) => failed(e),
                },
            );
        }
        answer
    }

    async fn heartbeat(
        &self,
        run: &RunKey,
        token: Token,
        lease: Duration,
    ) -> Result<Renewal, StoreError> {
        let call = Call::Heartbeat { token, lease };
        let renewal = self.inner.heartbeat(run, token, lease);
        self.record_renewal(run, call, renewal).await
    }

    async fn finish(
        &self,
        run: &RunKey,
        token: Token,
        outcome: RunOutcome,
    ) -> Result<Renewal, StoreError> {
        let call = Call::Finish { token };
        let renewal = self.inner.finish(run, token, outcome);
        self.record_renewal(run, call, renewal).await
    }

    async fn release(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let call = Call::Release { token };
        let renewal = self.inner.release(run, token);
        self.record_renewal(run, call, renewal).await
    }

    async fn give_back(&self, run: &RunKey, token: Token) -> Result<Renewal, StoreError> {
        let call = Call::GiveBack { token };
        let renewal = self.inner.give_back(run, token);
        self.record_renewal(run, call, renewal).await
    }
}

/// What the checker found wrong, one line per violation.
#[derive(Debug, Default)]
pub struct Violations(pub Vec<String>);

/// Counts from a checked history.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Runs that appear in the history.
    pub runs: usize,
    /// Distinct winning tokens.
    pub wins: usize,
    /// Of those, takeovers (attempt > 1).
    pub takeovers: usize,
    /// Calls that failed or never completed.
    pub uncertain: usize,
    /// Handler runs recorded.
    pub handlers: usize,
}

/// The seed of a randomized history test: `ANARCHON_SEED` when it is set
/// (a replay), else a random one. The test prints it.
pub fn seed() -> u64 {
    std::env::var("ANARCHON_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Token::generate().as_u128() as u64)
}

/// [`check`] for a randomized test run with `seed`: prints the counts and
/// how many calls the history holds, and returns the counts; or panics
/// with the seed and every violation.
pub fn check_seeded(history: &History, seed: u64) -> Summary {
    match check(history) {
        Ok(summary) => {
            println!("seed {seed}: {summary:?} over {} calls", history.len());
            summary
        }
        Err(v) => panic!("seed {seed}: {} violations:\n{}", v.0.len(), v.0.join("\n")),
    }
}

impl Summary {
    /// Asserts that a randomized run with `seed` did what it is for: at
    /// least `at_least` wins and as many handler runs recorded, and faults
    /// that bit: a takeover happened and a call ended uncertain.
    pub fn assert_faults_bit(&self, seed: u64, at_least: usize) {
        for (count, least, what) in [
            (self.wins, at_least, "wins"),
            (self.handlers, at_least, "handler runs recorded"),
            (self.takeovers, 1, "takeovers caused by the faults"),
            (self.uncertain, 1, "calls the faults left uncertain"),
        ] {
            assert!(
                count >= least,
                "seed {seed}: expected at least {least} {what}: {self:?}"
            );
        }
    }
}

/// Checks the history; returns counts, or every violation found.
///
/// # Errors
///
/// [`Violations`] listing each broken property with the run and tokens.
pub fn check(history: &History) -> Result<Summary, Violations> {
    let events = history.events();
    let mut by_run: HashMap<RunKey, Vec<&Event>> = HashMap::new();
    for e in &events {
        by_run.entry(e.run.clone()).or_default().push(e);
    }
    let mut problems = Vec::new();
    let handlers = history.handler_runs();
    let mut summary = Summary {
        runs: by_run.len(),
        handlers: handlers.len(),
        uncertain: events
            .iter()
            .filter(|e| !matches!(e.answer, Some(Answer::Claimed(_) | Answer::Renewal(_))))
            .count(),
        ..Summary::default()
    };
    for (run, events) in &by_run {
        // Wins: token → (attempt, first completion).
        struct Win {
            token: Token,
            attempt: Attempt,
            invoked: Instant,
            completed: Instant,
            lease: Duration,
        }
        let mut wins: Vec<Win> = Vec::new();
        for e in events {
            if let (
                Call::Claim { token, lease },
                Some(Answer::Claimed(ClaimOutcome::Won(w))),
                Some(done),
            ) = (&e.call, &e.answer, e.completed)
            {
                match wins.iter_mut().find(|x| x.token == *token) {
                    Some(known) => {
                        if known.attempt != w.attempt {
                            problems.push(format!(
                                "{run}: token {token} was told two attempts, {} and {}",
                                known.attempt, w.attempt
                            ));
                        }
                        known.invoked = known.invoked.min(e.invoked);
                        known.completed = known.completed.min(done);
                    }
                    None => wins.push(Win {
                        token: *token,
                        attempt: w.attempt,
                        invoked: e.invoked,
                        completed: done,
                        lease: *lease,
                    }),
                }
            }
        }
        // A win may have been made by an earlier try of the same token whose
        // reply was lost: the lease can have started at the first try.
        for w in &mut wins {
            for e in events.iter() {
                if matches!(e.call, Call::Claim { token, .. } if token == w.token) {
                    w.invoked = w.invoked.min(e.invoked);
                }
            }
        }
        summary.wins += wins.len();
        summary.takeovers += wins.iter().filter(|w| w.attempt.get() > 1).count();
        // Tokens that gave the run back (the store may have done it unless
        // it answered `Fenced`): their attempt may be won again.
        let gave_back = |token: Token| {
            events.iter().any(|e| {
                matches!(e.call, Call::GiveBack { token: t } if t == token)
                    && e.answer != Some(Answer::Renewal(Renewal::Fenced))
            })
        };
        wins.sort_by_key(|w| (w.attempt, w.completed));
        // 1. One winner per attempt.
        for pair in wins.windows(2) {
            if pair[0].attempt == pair[1].attempt && !gave_back(pair[0].token) {
                problems.push(format!(
                    "{run}: attempt {} won by two tokens, {} and {}",
                    pair[0].attempt, pair[0].token, pair[1].token
                ));
            }
        }
        // 2. Attempts increase with each new winner, in completion order.
        let mut by_time: Vec<&Win> = wins.iter().collect();
        by_time.sort_by_key(|w| w.completed);
        for pair in by_time.windows(2) {
            let same_again = pair[1].attempt == pair[0].attempt && gave_back(pair[0].token);
            if pair[1].attempt <= pair[0].attempt
                && !same_again
                && pair[1].invoked > pair[0].completed
            {
                problems.push(format!(
                    "{run}: a later winner {} got attempt {} after {} got {}",
                    pair[1].token, pair[1].attempt, pair[0].token, pair[0].attempt
                ));
            }
        }
        // Successful renewals per token: invocation times.
        let renewed = |token: Token| {
            events.iter().filter(move |e| {
                matches!(e.call, Call::Heartbeat { token: t, .. } | Call::Finish { token: t } if t == token)
                    && e.answer == Some(Answer::Renewal(Renewal::Renewed))
            })
        };
        for pair in by_time.windows(2) {
            let (old, new) = (pair[0], pair[1]);
            let same_again = new.attempt == old.attempt && gave_back(old.token);
            if new.attempt < old.attempt || (new.attempt == old.attempt && !same_again) {
                continue;
            }
            // 3. A takeover only after the old lease could have ended.
            let finished = events.iter().any(|e| {
                matches!(e.call, Call::Finish { token } if token == old.token)
                    && e.answer == Some(Answer::Renewal(Renewal::Renewed))
            });
            let released = events.iter().any(|e| {
                matches!(e.call, Call::Release { token } | Call::GiveBack { token } if token == old.token)
                    && e.answer != Some(Answer::Renewal(Renewal::Fenced))
            });
            if !finished && !released {
                let last_renewal = renewed(old.token)
                    .filter(|e| matches!(e.call, Call::Heartbeat { .. }))
                    .map(|e| {
                        (
                            e.invoked,
                            match e.call {
                                Call::Heartbeat { lease, .. } => lease,
                                _ => old.lease,
                            },
                        )
                    })
                    .chain(std::iter::once((old.invoked, old.lease)))
                    .max_by_key(|(at, _)| *at);
                if let Some((at, lease)) = last_renewal
                    && new.completed < at + lease
                {
                    problems.push(format!(
                        "{run}: {} took over attempt {} only {:?} after {}'s renewal was sent, inside its {lease:?} lease",
                        new.token,
                        new.attempt,
                        new.completed.duration_since(at),
                        old.token
                    ));
                }
            }
            // 4. The old holder is never renewed after the new win completed.
            for e in renewed(old.token) {
                if e.invoked > new.completed {
                    problems.push(format!(
                        "{run}: {} was renewed after {} had won attempt {}",
                        old.token, new.token, new.attempt
                    ));
                }
            }
        }
        // 5. No win after Done.
        let done_at = events
            .iter()
            .filter(|e| matches!(e.answer, Some(Answer::Claimed(ClaimOutcome::Done(_)))))
            .filter_map(|e| e.completed)
            .min();
        if let Some(done_at) = done_at {
            for w in &wins {
                if w.invoked > done_at {
                    problems.push(format!("{run}: {} won after the run was done", w.token));
                }
            }
        }
    }
    // 6. Handlers of a run never overlap.
    let mut handlers_of: HashMap<&RunKey, Vec<&HandlerRun>> = HashMap::new();
    for h in &handlers {
        handlers_of.entry(&h.run).or_default().push(h);
    }
    for (run, mut spans) in handlers_of {
        spans.sort_by_key(|h| h.started);
        for pair in spans.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let overlap = match earlier.ended {
                None => true,
                Some(end) => later.started < end,
            };
            if overlap {
                problems.push(format!(
                    "{run}: two handlers ran at once: attempt {} on instance {} had not returned \
                     ({}) when attempt {} started on instance {}",
                    earlier.attempt,
                    earlier.instance,
                    earlier
                        .ended
                        .map_or("it never did".to_owned(), |end| format!(
                            "it returned {:?} later",
                            end.duration_since(later.started)
                        )),
                    later.attempt,
                    later.instance
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(summary)
    } else {
        Err(Violations(problems))
    }
}
