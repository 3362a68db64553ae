#![doc = include_str!("../README.md")]

mod claim;
mod connection;
mod error;
mod lease;
mod options;
mod tls;
mod url;

pub use crate::claim::{
    ClaimOptions, ClaimStats, DEFAULT_DUPLICATE_WINDOW, DEFAULT_PREFIX, INSTANCE_HEADER,
    MAX_DUPLICATE_WINDOW, MAX_STREAM_NAME_LEN, MIN_DUPLICATE_WINDOW, NatsClaimStore,
    RETENTION_MARGIN, TOKEN_HEADER,
};
pub use crate::error::Error;
pub use crate::lease::{
    CLOCK_KEY, DEFAULT_BUCKET, LEASE_BACKEND, LeaseStats, MAX_BUCKET_NAME_LEN, MAX_HISTORY,
    NatsLeaseOptions, NatsLeaseStore, PAUSE_ALL_KEY, PAUSE_JOB_PREFIX, is_wrong_last_sequence,
};
pub use crate::options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, MAX_PREFIX_LEN, NatsOptions, Storage,
};
pub use crate::url::{CLAIM_SCHEMES, LEASE_SCHEMES};

/// The claim store's name in [`BackendInfo`](anarchon_core::BackendInfo),
/// logs and errors.
pub const BACKEND: &str = "nats";
