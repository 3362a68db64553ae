#![doc = include_str!("../README.md")]

mod cluster;
mod connection;
mod error;
#[cfg(test)]
mod fake_cluster;
mod idmp;
mod keys;
mod lease;
mod options;
mod script;
mod server;
mod stream_id;
mod tls;

use std::time::Duration;

pub use crate::error::Error;
pub use crate::idmp::{IDMP_MIN_VERSION, RedisIdmpStore};
pub use crate::keys::job_key;
pub use crate::lease::RedisLeaseStore;
pub use crate::options::{
    EvictionCheck, KeyPrefix, MAX_PREFIX_LEN, RedisOptions, ReplicaWait, Strategy,
};
pub use crate::script::RedisScriptStore;
pub use crate::server::{EvictionFinding, ServerInfo, Version};
pub use crate::stream_id::RedisStreamIdStore;

/// The shortest memory (script window, IDMP duration) a claim-only
/// strategy accepts: the scheduler's clock-skew margin, the least any job
/// needs on top of its `max_late`.
pub const MIN_MEMORY: Duration = anarchon_core::scheduler::SKEW_MARGIN;
