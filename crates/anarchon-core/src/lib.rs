#![doc = include_str!("../README.md")]

pub mod clock;
pub mod control;
pub mod decide;
pub mod error;
pub mod group_commit;
pub mod hand_over;
pub mod ids;
pub mod layer;
pub mod memory;
pub mod name;
pub mod request;
pub mod retry;
pub mod schedule;
pub mod scheduler;
pub mod store;
pub mod stored;
pub mod time;
#[cfg(feature = "tls")]
pub mod tls;
pub mod url;

pub use crate::clock::{Clock, SystemClock};
pub use crate::control::{
    Control, FleetStatus, JobStatus, Pause, PauseEnd, PauseRefused, PauseRequest, PauseScope,
    Paused, Pauses, Until,
};
pub use crate::error::{BoxError, ConfigError, StoreError, StoreErrorKind};
pub use crate::hand_over::{HandOvers, Listener};
pub use crate::ids::{Attempt, Fence, InstanceId, MaxAttempts, Token};
pub use crate::memory::MemoryStore;
pub use crate::name::JobName;
pub use crate::request::{Backfill, RequestId, RunRequest, RunRequests, TriggerRequest};
pub use crate::retry::{
    AttemptCause, AttemptEnd, PastAttempt, PastAttempts, RetryPlan, RetryPolicy,
};
pub use crate::schedule::Schedule;
pub use crate::scheduler::{
    Alert, AlertHook, AlertKind, CancelReason, Handler, JobBuilder, JobOptions, MetricsSnapshot,
    RunContext, Scheduler, SchedulerBuilder, SchedulerOptions, ShutdownReport,
};
pub use crate::store::{
    BackendInfo, ClaimAnswers, ClaimOutcome, ClaimRequest, ClaimStore, FinalState, LeaseClaim,
    LeaseStore, Memory, Overlap, RecordState, Renewal, RunKey, RunOutcome, RunRecord, RunState,
    RunView, Win,
};
pub use crate::time::{Slot, Timestamp};
pub use async_trait::async_trait;
