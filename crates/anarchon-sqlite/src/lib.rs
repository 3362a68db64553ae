#![doc = include_str!("../README.md")]

mod claim;
mod connection;
mod error;
mod finishes;
mod options;
mod requests;
mod rows;
mod sql;
mod store;

pub use crate::error::Error;
pub use crate::options::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_TABLE_PREFIX, MAX_PREFIX_LEN,
    SqliteOptions,
};
pub use crate::store::SqliteStore;

/// The backend's name in [`BackendInfo`](anarchon_core::BackendInfo), logs
/// and errors.
pub const BACKEND: &str = "sqlite";

/// The newest schema version this crate creates and understands.
pub fn schema_version() -> i64 {
    sql::Sql::latest_version()
}
