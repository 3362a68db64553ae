//! The daemon's errors: a crontab that cannot be used, a store that cannot
//! be chosen or opened.

use std::path::PathBuf;

use anarchon::ConfigError;

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

    /// The store URL names no backend this build has.
    #[error("unsupported store URL {url}: {reason}")]
    StoreUrl {
        /// Redacted.
        url: String,
        reason: String,
    },

    /// The SQLite store could not be opened.
    #[error(transparent)]
    Sqlite(#[from] anarchon::sqlite::Error),

    /// A store call failed.
    #[error(transparent)]
    Store(#[from] anarchon::StoreError),

    /// `anarchon history` on a database file that does not exist.
    #[error(
        "no database at {path:?}: nothing has run with this store yet (or pass --store / --config)"
    )]
    NoDatabase { path: PathBuf },
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
            | Error::Parse { .. }
            | Error::Job { .. }
            | Error::Config { .. }
            | Error::StoreUrl { .. } => true,
            Error::Sqlite(e) => !e.is_temporary(),
            Error::Store(_) | Error::NoDatabase { .. } => false,
        }
    }
}
