#![doc = include_str!("../README.md")]

mod error;
mod names;
mod options;
mod session;
mod store;
#[cfg(feature = "tls")]
mod tls;

pub use crate::error::Error;
pub use crate::names::{MAX_PREFIX_LEN, MAX_QUEUE_NAME_LEN, gate_queue_name, winner_mark_name};
pub use crate::options::{
    AmqpOptions, DEFAULT_MAX_CHANNELS, DEFAULT_PREFIX, DEFAULT_SLOT_TTL, DEFAULT_TIMEOUT,
    MAX_SLOT_TTL, MIN_SLOT_TTL,
};
pub use crate::store::{AmqpStats, AmqpStore};

/// The backend's name in [`BackendInfo`](anarchon_core::BackendInfo), logs
/// and errors.
pub const BACKEND: &str = "rabbitmq";
