#![doc = include_str!("../README.md")]

mod claim;
mod connection;
mod error;
mod finishes;
pub mod migrate;
mod options;
mod requests;
mod rows;
mod sql;
mod store;

pub use crate::error::{BACKEND, Error};
pub use crate::migrate::SCHEMA_VERSION;
pub use crate::options::{CLIENT_PARAMETERS, MAX_TABLE_NAME_LEN, PgOptions, TableName};
pub use crate::store::PgStore;

/// The sqlx types this crate's API uses ([`PgStore::from_pool`],
/// [`migrate::migrate_to`]).
pub use sqlx::{PgConnection, PgPool};
