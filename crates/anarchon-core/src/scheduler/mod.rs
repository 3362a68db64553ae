//! The scheduler: timers, claims, runs, heartbeats, backups and shutdown.
//!
//! One scheduler runs per process. It keeps all its jobs' next slots in one
//! timer queue, and when slots fall due it claims them together — one
//! [`LeaseStore::claim_many`] call on lease stores — so a thousand jobs due at
//! `:00` cost one round trip. What happens next depends on the answer:
//!
//! * `Won`: the handler runs in its own task; on lease stores a heartbeat
//!   renews the lease, and a fence or a lost store cancels the handler.
//! * `Running`: this instance becomes a backup. It sleeps until the lease
//!   ends (by the store's clock, turned into a local sleep), reads the run,
//!   and only claims when the lease has really run out.
//! * anything else: counted and logged.
//!
//! # Lease-only options
//!
//! `lease`, `heartbeat`, `overlap`, `max_attempts` and `catch_up` need a lease
//! store. On typed code they are methods of `impl<S: LeaseStore>` blocks, so
//! setting them on a claim-only store does not compile. Options read from
//! configuration go through [`JobBuilder::options`] and
//! [`SchedulerBuilder::options`], which return
//! [`ConfigError::UnsupportedOption`] for a claim-only store.

pub mod alerts;
mod calls;
mod context;
mod driver;
mod job;
mod lease_clock;
pub mod metrics;
mod requests;
mod run;
mod start_gate;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::alerts::{Alert, AlertHook, AlertKind};
pub use self::context::{BoxFuture, CancelReason, Handler, RunContext};
pub(crate) use self::job::JobSpec;
pub use self::job::{JobBuilder, JobOptions};
use self::metrics::Metrics;
pub use self::metrics::MetricsSnapshot;
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
use crate::ids::InstanceId;
use crate::name::JobName;
use crate::schedule::Schedule;
use crate::store::{BackendInfo, ClaimStore, LeaseStore};

/// The lease a scheduler asks for unless told otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The heartbeat interval unless told otherwise (a third of the default lease).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// How late a claim may be unless the job says otherwise.
pub const DEFAULT_MAX_LATE: Duration = Duration::from_secs(60);
/// How long shutdown waits for running handlers before handing their runs over.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How many missed slots of a job are caught up at start unless told
/// otherwise.
pub const DEFAULT_CATCH_UP_LIMIT: usize = 10;
/// How many caught-up runs one instance runs at once unless told
/// otherwise, over all its jobs.
pub const DEFAULT_CATCH_UP_CONCURRENCY: usize = 4;
/// How long a lease store keeps run records unless told otherwise.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Clock skew between instances that claim-only stores must absorb: their
/// memory must outlast `max_late` by this much.
pub const SKEW_MARGIN: Duration = Duration::from_secs(10);
/// How late a manual run may start after its request, on the store's
/// clock, when the job's own late window is shorter: long enough for an
/// instance that was down to come up and run it. A manual run no instance
/// claims in time is recorded `missed`.
pub const MANUAL_RUN_WINDOW: Duration = Duration::from_secs(300);
/// The longest catch-up window or late window we accept.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The store as the scheduler uses it: claim-only, or with leases.
#[derive(Clone)]
pub(crate) enum StoreHandle {
    Claim(Arc<dyn ClaimStore>),
    Lease(Arc<dyn LeaseStore>),
}

fn store_handle<S: ClaimStore + ?Sized>(store: &Arc<S>) -> StoreHandle
where
    Arc<S>: IntoDynClaim,
{
    let dynamic = store.clone().into_dyn_claim();
    match dynamic.clone().as_lease_store() {
        Some(lease) => StoreHandle::Lease(lease),
        None => StoreHandle::Claim(dynamic),
    }
}

/// Turns `Arc<S>` into `Arc<dyn ClaimStore>` for sized stores and for
/// `dyn ClaimStore` itself.
#[doc(hidden)]
pub trait IntoDynClaim {
    /// The conversion.
    fn into_dyn_claim(self) -> Arc<dyn ClaimStore>;
}

impl<S: ClaimStore> IntoDynClaim for Arc<S> {
    fn into_dyn_claim(self) -> Arc<dyn ClaimStore> {
        self
    }
}

impl IntoDynClaim for Arc<dyn ClaimStore> {
    fn into_dyn_claim(self) -> Arc<dyn ClaimStore> {
        self
    }
}

impl IntoDynClaim for Arc<dyn LeaseStore> {
    fn into_dyn_claim(self) -> Arc<dyn ClaimStore> {
        self
    }
}

/// Scheduler options read from configuration (a file, the CLI): the
/// run-time path, checked against the store when the scheduler starts.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// Lease length (lease stores only).
    pub lease: Option<Duration>,
    /// Heartbeat interval (lease stores only).
    pub heartbeat: Option<Duration>,
    /// How long shutdown waits for handlers.
    pub shutdown_grace: Option<Duration>,
    /// How long a handler cancelled for lost contact may take to stop
    /// (lease stores only).
    pub stop_grace: Option<Duration>,
    /// How many caught-up runs this instance runs at once (lease stores
    /// only).
    pub catch_up_concurrency: Option<u32>,
    /// This instance's id.
    pub instance_id: Option<String>,
}

/// The scheduler-wide options once checked.
struct Settled {
    lease: Duration,
    heartbeat: Duration,
    stop_grace: Duration,
    catch_up_concurrency: usize,
}

/// Builds a [`Scheduler`] over a store of type `S`.
///
/// Created by [`Scheduler::builder`]. Setters never fail; what they are given
/// is checked when a job is added ([`JobBuilder::run`]) or when the
/// scheduler starts ([`SchedulerBuilder::start`]).
pub struct SchedulerBuilder<S: ClaimStore + ?Sized> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    instance: Option<InstanceId>,
    /// An instance id from configuration that was refused, kept to be
    /// reported by `check` and `start`.
    bad_instance_id: Option<String>,
    lease: Option<Duration>,
    heartbeat: Option<Duration>,
    stop_grace: Option<Duration>,
    catch_up_concurrency: Option<u32>,
    shutdown_grace: Duration,
    history_retention: Duration,
    alert: Option<AlertHook>,
    jobs: Vec<Arc<JobSpec>>,
    names: HashSet<JobName>,
}

impl<S: ClaimStore + ?Sized> fmt::Debug for SchedulerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulerBuilder")
            .field("jobs", &self.names)
            .finish_non_exhaustive()
    }
}

impl<S: ClaimStore + ?Sized> SchedulerBuilder<S>
where
    Arc<S>: IntoDynClaim,
{
    fn new(store: Arc<S>) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            instance: None,
            bad_instance_id: None,
            lease: None,
            heartbeat: None,
            stop_grace: None,
            catch_up_concurrency: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            history_retention: DEFAULT_HISTORY_RETENTION,
            alert: None,
            jobs: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// The wall clock the timers follow (the system clock by default).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// This instance's id (default `host-pid-random`).
    pub fn instance_id(mut self, id: InstanceId) -> Self {
        self.instance = Some(id);
        self
    }

    /// How long shutdown waits for running handlers before it cancels them
    /// and hands their runs over (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a lease store keeps run records, at least (default 7 days;
    /// always at least the longest late window plus a margin).
    pub fn history_retention(mut self, keep: Duration) -> Self {
        self.history_retention = keep;
        self
    }

    /// Calls `hook` with every run this instance records as ended
    /// `failed`, `interrupted` or `missed` (see [`alerts`] for who records
    /// what): across a fleet, each such end is told by exactly one
    /// instance. The hook runs on the scheduler's task and must not block.
    pub fn on_alert(mut self, hook: impl Fn(Alert) + Send + Sync + 'static) -> Self {
        self.alert = Some(Arc::new(hook));
        self
    }

    /// Applies options read from configuration.
    ///
    /// Lease-only options on a claim-only store make [`Self::start`] fail
    /// with [`ConfigError::UnsupportedOption`].
    pub fn options(mut self, options: &SchedulerOptions) -> Self {
        if let Some(lease) = options.lease {
            self.lease = Some(lease);
        }
        if let Some(heartbeat) = options.heartbeat {
            self.heartbeat = Some(heartbeat);
        }
        if let Some(grace) = options.shutdown_grace {
            self.shutdown_grace = grace;
        }
        if let Some(grace) = options.stop_grace {
            self.stop_grace = Some(grace);
        }
        if let Some(n) = options.catch_up_concurrency {
            self.catch_up_concurrency = Some(n);
        }
        if let Some(id) = &options.instance_id {
            match InstanceId::new(id) {
                Ok(id) => self.instance = Some(id),
                Err(_) => self.bad_instance_id = Some(id.clone()),
            }
        }
        self
    }

    /// Starts describing a job named `name` on `schedule`; finish with
    /// [`JobBuilder::run`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidJobName`] or [`ConfigError::DuplicateJob`].
    pub fn job(
        &mut self,
        name: impl AsRef<str>,
        schedule: Schedule,
    ) -> Result<JobBuilder<'_, S>, ConfigError> {
        let name = JobName::new(name.as_ref())?;
        if self.names.contains(&name) {
            return Err(ConfigError::DuplicateJob {
                name: name.to_string(),
            });
        }
        Ok(JobBuilder {
            builder: self,
            name,
            schedule,
            options: JobOptions::default(),
        })
    }

    /// The store's name and memory.
    pub fn backend(&self) -> BackendInfo {
        self.store.info()
    }

    /// Checks the scheduler-wide options as [`Self::start`] will, without
    /// starting anything: what a configuration checker calls. Jobs were
    /// checked when they were added.
    ///
    /// # Errors
    ///
    /// As [`Self::start`].
    pub fn check(&self) -> Result<(), ConfigError> {
        self.settle().map(drop)
    }

    /// The scheduler-wide options checked, with their defaults filled in.
    fn settle(&self) -> Result<Settled, ConfigError> {
        if let Some(id) = &self.bad_instance_id {
            InstanceId::new(id)?;
        }
        let info = self.store.info();
        let is_lease = matches!(store_handle(&self.store), StoreHandle::Lease(_));
        if !is_lease {
            for (set, option) in [
                (self.lease.is_some(), "lease"),
                (self.heartbeat.is_some(), "heartbeat"),
                (self.stop_grace.is_some(), "stop_grace"),
                (self.catch_up_concurrency.is_some(), "catch_up_concurrency"),
            ] {
                if set {
                    return Err(unsupported(option, info));
                }
            }
        }
        let catch_up_concurrency = match self.catch_up_concurrency {
            Some(0) => {
                return Err(ConfigError::OutOfRange {
                    option: "catch_up_concurrency",
                    reason: "it must be at least 1 (leave catch_up out to catch nothing up)".into(),
                });
            }
            Some(n) => usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
            None => DEFAULT_CATCH_UP_CONCURRENCY,
        };
        let lease = self.lease.unwrap_or(DEFAULT_LEASE);
        let heartbeat = self
            .heartbeat
            .unwrap_or_else(|| DEFAULT_HEARTBEAT.min(lease / 3));
        positive("lease", lease)?;
        positive("heartbeat", heartbeat)?;
        if heartbeat >= lease {
            return Err(ConfigError::HeartbeatNotShorterThanLease { heartbeat, lease });
        }
        let stop_grace = self.stop_grace.unwrap_or_default();
        if heartbeat + stop_grace >= lease {
            return Err(ConfigError::StopGraceTooLong {
                stop_grace,
                heartbeat,
                lease,
            });
        }
        Ok(Settled {
            lease,
            heartbeat,
            stop_grace,
            catch_up_concurrency,
        })
    }

    /// Checks everything and starts the scheduler's tasks on the current
    /// tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: zero durations, `heartbeat >= lease`, lease-only
    /// options on a claim-only store, an invalid instance id.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn start(self) -> Result<Scheduler, ConfigError> {
        let Settled {
            lease,
            heartbeat,
            stop_grace,
            catch_up_concurrency,
        } = self.settle()?;
        let handle = store_handle(&self.store);
        let info = self.store.info();
        let instance = self.instance.unwrap_or_else(InstanceId::generate);
        let longest_window = self
            .jobs
            .iter()
            .map(|j| j.window())
            .max()
            .unwrap_or_default();
        let inner = Arc::new(Inner {
            store: handle,
            backend: info,
            clock: self.clock,
            instance,
            lease,
            heartbeat,
            stop_grace,
            keep: self
                .history_retention
                .max(longest_window + Duration::from_secs(3600)),
            jobs: self.jobs,
            alert: self.alert,
            catch_up_permits: Arc::new(tokio::sync::Semaphore::new(catch_up_concurrency)),
            metrics: Metrics::default(),
            stop: CancellationToken::new(),
            hand_over: CancellationToken::new(),
            tasks: TaskTracker::new(),
            claim_ahead_ms: std::sync::atomic::AtomicU64::new(
                calls::FIRST_CLAIM_AHEAD.as_millis() as u64
            ),
            claim_ahead_grew: tokio::sync::Notify::new(),
            starts: start_gate::StartGate::default(),
        });
        let driver = tokio::spawn(driver::drive(inner.clone()));
        Ok(Scheduler {
            inner,
            driver: Some(driver),
            shutdown_grace: self.shutdown_grace,
        })
    }
}

impl<S: LeaseStore + ?Sized> SchedulerBuilder<S>
where
    Arc<S>: IntoDynClaim,
{
    /// How long a lease lasts unless renewed (default 30 s). A runner that
    /// dies is taken over within about this long.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How often a runner renews its lease (default a third of the lease,
    /// at most 10 s). Must be shorter than the lease.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// How long a handler may take to stop once it is cancelled because
    /// its runner could not renew the lease (default 0: a handler that
    /// stops at once). The runner gives the run up this long before its
    /// lease could end on the store, so the handler has stopped before any
    /// backup may start the run. `heartbeat + stop_grace` must be shorter
    /// than the lease. A daemon that stops commands with SIGTERM and then
    /// SIGKILL sets it to its kill grace.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = Some(grace);
        self
    }

    /// How many caught-up runs this instance runs at once, over all its
    /// jobs (default [`DEFAULT_CATCH_UP_CONCURRENCY`]).
    ///
    /// A caught-up run is one whose slot is already older than its job's
    /// `max_late` when it is claimed: only `catch_up` lets it run. Such
    /// slots wait, oldest first across jobs, until one of these places is
    /// free, and hold it until their handler ends; slots on time never
    /// wait. A slot that waits past its catch-up window is recorded
    /// missed by the store. The bound is per instance: a fleet of `k`
    /// instances runs up to `k` times as many.
    pub fn catch_up_concurrency(mut self, n: u32) -> Self {
        self.catch_up_concurrency = Some(n);
        self
    }
}

fn unsupported(option: &'static str, info: BackendInfo) -> ConfigError {
    ConfigError::UnsupportedOption {
        option,
        backend: info.name,
    }
}

fn positive(option: &'static str, d: Duration) -> Result<Duration, ConfigError> {
    if d.is_zero() {
        Err(ConfigError::ZeroDuration { option })
    } else {
        Ok(d)
    }
}

pub(crate) struct Inner {
    pub(crate) store: StoreHandle,
    pub(crate) backend: BackendInfo,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) instance: InstanceId,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    /// How long before its lease could end a runner gives a run up.
    pub(crate) stop_grace: Duration,
    pub(crate) keep: Duration,
    pub(crate) jobs: Vec<Arc<JobSpec>>,
    /// Told of the runs this instance records as failed, interrupted or
    /// missed.
    pub(crate) alert: Option<AlertHook>,
    /// One per caught-up run this instance may run at once.
    pub(crate) catch_up_permits: Arc<tokio::sync::Semaphore>,
    pub(crate) metrics: Metrics,
    /// Stop firing and watching: the first step of shutdown.
    pub(crate) stop: CancellationToken,
    /// The grace period is over: cancel handlers and release their leases.
    pub(crate) hand_over: CancellationToken,
    pub(crate) tasks: TaskTracker,
    /// The head start of claims before their fire time, in ms (see
    /// `driver::claim_ahead`).
    pub(crate) claim_ahead_ms: std::sync::atomic::AtomicU64,
    /// Wakes the timer when the head start grew, so that the next slot's
    /// claim goes out with it rather than at the time the timer chose with
    /// the shorter one.
    pub(crate) claim_ahead_grew: tokio::sync::Notify,
    /// The handler starts due: runs that end wait for them before they
    /// record their outcome.
    pub(crate) starts: start_gate::StartGate,
}

/// A running scheduler.
///
/// Call [`Scheduler::shutdown`] to stop it gracefully. Dropping it stops it
/// at once: no new claims, and running handlers are cancelled and their
/// leases released, without a grace period.
#[must_use = "dropping a Scheduler stops it at once"]
pub struct Scheduler {
    inner: Arc<Inner>,
    driver: Option<JoinHandle<()>>,
    shutdown_grace: Duration,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.inner.stop.cancel();
        self.inner.hand_over.cancel();
    }
}

/// What [`Scheduler::shutdown`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Runs whose handlers had not finished within the grace period and
    /// whose leases were released to a backup.
    pub handed_over: u64,
}

impl Scheduler {
    /// Starts building a scheduler over `store`.
    pub fn builder<S: ClaimStore + ?Sized>(store: Arc<S>) -> SchedulerBuilder<S>
    where
        Arc<S>: IntoDynClaim,
    {
        SchedulerBuilder::new(store)
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &InstanceId {
        &self.inner.instance
    }

    /// The counters so far.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// The store's name and memory.
    pub fn backend(&self) -> BackendInfo {
        self.inner.backend
    }

    /// Stops firing, waits up to the grace period for running handlers,
    /// then cancels the rest and releases their leases so a backup takes
    /// over at once.
    pub async fn shutdown(mut self) -> ShutdownReport {
        let inner = self.inner.clone();
        inner.stop.cancel();
        if let Some(driver) = self.driver.take() {
            let _ = driver.await;
        }
        inner.tasks.close();
        if tokio::time::timeout(self.shutdown_grace, inner.tasks.wait())
            .await
            .is_err()
        {
            inner.hand_over.cancel();
            inner.tasks.wait().await;
        }
        ShutdownReport {
            handed_over: inner.metrics.snapshot().handed_over,
        }
    }
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("instance", &self.inner.instance)
            .field("backend", &self.inner.backend.name)
            .field("jobs", &self.inner.jobs.len())
            .finish()
    }
}
