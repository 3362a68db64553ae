//! The daemon's errors: a crontab that cannot be used, a store that cannot
//! be chosen or opened.

use std::path::PathBuf;

use anarchon::{ConfigError, OpenError};

/// Something the user has to fix before anything runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Error {
    /// The crontab file cannot be read.
    #[error("cannot read {path:?}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The crontab may be changed by users other than its owner.
    #[error(
        "{path:?} is writable by {who} (mode {mode:o}): anyone who can change it decides what this daemon runs; `chmod go-w` it, as cron requires of its crontabs"
    )]
    WritableByOthers {
        path: PathBuf,
        /// "group", "others" or "group and others".
        who: &'static str,
        mode: u32,
    },

    /// The TOML is malformed, a key is unknown or a value has the wrong type.
    #[error("{path}:{line}:{column}: {message}", path = path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    /// A job's settings do not fit together (no schedule, two schedules, …).
    #[error("{path}:{line}:{column}: job {job:?}: {message}", path = path.display())]
    Job {
        path: PathBuf,
        line: usize,
        column: usize,
        job: String,
        message: String,
    },

    /// The core refused a job or the scheduler's options.
    #[error(
        "{}{}{source}",
        at.as_ref().map(|a| format!("{a}: ")).unwrap_or_default(),
        job.as_ref().map(|j| format!("job {j:?}: ")).unwrap_or_default()
    )]
    Config {
        /// `file:line` of the job, or the file for scheduler options.
        at: Option<String>,
        job: Option<String>,
        #[source]
        source: Box<ConfigError>,
    },

    /// The store URL cannot be read, or the store cannot be opened (the
    /// library's error, which never shows the password).
    #[error(transparent)]
    Open(#[from] anarchon::OpenError),

    /// A store call failed.
    #[error(transparent)]
    Store(#[from] anarchon::StoreError),

    /// The `[http]` server cannot start.
    #[error("{0}")]
    Http(String),

    /// `anarchon audit` found slots that did not run or ended badly.
    #[error("{problems} slot(s) missing or failed (listed above)")]
    AuditFound {
        /// How many.
        problems: usize,
    },

    /// `anarchon history` on a SQLite file or PostgreSQL table that does
    /// not exist.
    #[error("{what}: nothing has run with this store yet (or pass --store / --config)")]
    NoDatabase {
        /// What is missing, e.g. `no database at "cron.db"`.
        what: String,
    },

    /// `anarchon history` on a PostgreSQL table of an older schema.
    #[error(
        "the table {table:?} is at schema version {found}, but this anarchon reads version {latest}: `anarchon run` with this version migrates it"
    )]
    SchemaOutdated {
        table: String,
        found: u32,
        latest: u32,
    },

    /// `anarchon history` on a claim-only store.
    #[error(
        "the `{backend}` store is claim-only and keeps no history: it can only tell which instance was first to claim a run, not record how runs ended. The commands' output and exit statuses are in the daemons' logs; for `anarchon history` use a lease store (sqlite://, postgres://, redis:// with strategy=lease, or nats-kv://)"
    )]
    NoHistory {
        /// The backend, e.g. `rabbitmq`.
        backend: &'static str,
    },

    /// `pause`, `resume` or `status` on a claim-only store.
    #[error(
        "the `{backend}` store is claim-only: it keeps no state between claims, so there is nothing a pause or a manual-run request could be written to or read from. Pause, resume, trigger and status need a lease store (sqlite://, postgres://, redis:// with strategy=lease, or nats-kv://)"
    )]
    NoControl {
        /// The backend, e.g. `rabbitmq`.
        backend: &'static str,
    },

    /// A command names a job the crontab does not have.
    #[error("{path}: has no job {job:?} (jobs: {known})", path = path.display())]
    UnknownJob {
        path: PathBuf,
        job: String,
        /// The crontab's job names, comma-separated.
        known: String,
    },

    /// The store refused a pause (its end has passed on the store's clock,
    /// a note too long): nothing was written.
    #[error("the pause was refused, nothing was written: {0}")]
    PauseRefused(#[source] anarchon::StoreError),

    /// A time on the command line that is not RFC 3339.
    #[error("{text:?} is not a time: write it in RFC 3339, e.g. 2026-12-24T06:00:00Z")]
    BadTime { text: String },

    /// A manual-run request the store cannot keep (a bad id or author):
    /// nothing was written.
    #[error("the request was refused, nothing was written: {0}")]
    RequestRefused(String),

    /// `trigger --wait`: the manual run ended other than `succeeded`.
    #[error("the manual run {slot} of job {job} ended {state}{}", error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    RunEnded {
        job: String,
        /// The run's slot, as shown.
        slot: String,
        /// Its final state, e.g. `failed`.
        state: &'static str,
        /// The handler's error, for a failed run.
        error: Option<String>,
    },

    /// `trigger --wait`: no instance started the manual run in time.
    #[error(
        "no instance started the manual run {slot} of job {job} within {window}: is an `anarchon run` with this job up, and is the job paused?"
    )]
    NotStarted {
        job: String,
        slot: String,
        /// How long a manual run may wait to start, e.g. `5m`.
        window: String,
    },

    /// `backfill --wait` without a crontab to read the job's slots from.
    #[error("backfill --wait needs --config: the crontab gives the job's slots to wait for")]
    WaitNeedsConfig,

    /// `pause` or `resume` with a job and `--all`, or with neither.
    #[error("name one job, or pass --all for every job of the store (not both)")]
    Scope,
}

impl Error {
    /// The core refused something; `at` is `file:line` or the file.
    pub(crate) fn config(at: Option<String>, job: Option<String>, source: ConfigError) -> Self {
        Error::Config {
            at,
            job,
            source: Box::new(source),
        }
    }

    /// Whether this is the user's configuration (exit status 2) rather than
    /// a failure at run time (exit status 1).
    pub(crate) fn is_configuration(&self) -> bool {
        match self {
            Error::Read { .. }
            | Error::WritableByOthers { .. }
            | Error::Parse { .. }
            | Error::Job { .. }
            | Error::Config { .. }
            | Error::NoHistory { .. }
            | Error::NoControl { .. }
            | Error::UnknownJob { .. }
            | Error::Scope
            | Error::BadTime { .. }
            | Error::RequestRefused(_)
            | Error::WaitNeedsConfig
            | Error::PauseRefused(_) => true,
            Error::Open(e) => match e {
                OpenError::Store(_) | OpenError::Missing { .. } => false,
                e => !e.is_temporary(),
            },
            Error::Store(_)
            | Error::AuditFound { .. }
            | Error::Http(_)
            | Error::NoDatabase { .. }
            | Error::SchemaOutdated { .. }
            | Error::RunEnded { .. }
            | Error::NotStarted { .. } => false,
        }
    }
}
