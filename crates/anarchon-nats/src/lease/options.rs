//! The options of the lease store: its bucket and how a new one is made.

use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy};

use crate::error::Error;
use crate::options::{NatsOptions, Storage, StreamOptions, read_store_url, validate_replicas};

/// The KV bucket unless told otherwise.
pub const DEFAULT_BUCKET: &str = "anarchon-leases";
/// The longest bucket name accepted (its stream is `KV_<bucket>`).
pub const MAX_BUCKET_NAME_LEN: usize = 120;
/// The most revisions per key a new bucket may keep.
pub const MAX_HISTORY: i64 = 64;

/// The KV bucket of a [`NatsLeaseStore`](crate::NatsLeaseStore).
///
/// ```
/// use anarchon_nats::{NatsLeaseOptions, Storage};
///
/// let leases = NatsLeaseOptions::new().with_bucket("billing-cron").with_history(4);
/// assert_eq!(leases.stream_name(), "KV_billing-cron");
///
/// let (connection, leases) = NatsLeaseOptions::from_url(
///     "nats://nats.internal:4222?bucket=billing-cron&storage=file&replicas=3&timeout_ms=2000",
/// )?;
/// assert_eq!(leases.bucket(), "billing-cron");
/// assert_eq!(leases.replicas(), 3);
/// # Ok::<(), anarchon_nats::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsLeaseOptions {
    bucket: String,
    history: i64,
    storage: Storage,
    replicas: usize,
}

impl Default for NatsLeaseOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl NatsLeaseOptions {
    /// The defaults: bucket `anarchon-leases`, one revision per key, file
    /// storage, one replica.
    pub fn new() -> Self {
        Self {
            bucket: DEFAULT_BUCKET.to_owned(),
            history: 1,
            storage: Storage::File,
            replicas: 1,
        }
    }

    /// Reads a store URL: a NATS URL (`nats://`, or `tls://` for TLS)
    /// whose query may carry `bucket`, `history`, `storage` (`file` or
    /// `memory`), `replicas`, `timeout_ms`, and for TLS `tls=true` (TLS
    /// with a `nats://` URL), `tls_ca_file=<path>` (a private certificate
    /// authority, %-escaped) and `tls_first=true`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for an unknown parameter or a bad value; the
    /// options' own errors as [`Self::validate`] and
    /// [`NatsOptions::validate`] report them.
    pub fn from_url(url: &str) -> Result<(NatsOptions, Self), Error> {
        read_store_url(url, "bucket, history", Self::new(), |leases, param| {
            match param.key {
                "bucket" => leases.bucket = param.value.to_owned(),
                "history" => {
                    leases.history = i64::try_from(param.number()?)
                        .map_err(|_| param.invalid("history is too large".into()))?;
                }
                _ => return Ok(false),
            }
            Ok(true)
        })
    }

    /// The KV bucket (default `anarchon-leases`): 1 to 120 characters of
    /// `[A-Za-z0-9_-]`. One bucket serves any number of jobs and schedulers;
    /// give separate fleets separate buckets.
    pub fn with_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = bucket.into();
        self
    }

    /// How many revisions per key a new bucket keeps (default 1, at most
    /// 64). The store needs only the latest; more let an operator read a
    /// run's past with `nats kv history`.
    pub fn with_history(mut self, history: i64) -> Self {
        self.history = history;
        self
    }

    /// Where a new bucket keeps its data (default on disk). With
    /// [`Storage::Memory`] a server restart forgets every run and resets
    /// the fence counters.
    pub fn with_storage(mut self, storage: Storage) -> Self {
        self.storage = storage;
        self
    }

    /// How many replicas a new bucket has in a cluster (default 1).
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The history a new bucket gets.
    pub fn history(&self) -> i64 {
        self.history
    }

    /// The storage a new bucket gets.
    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// The replicas a new bucket gets.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The bucket's stream: `KV_<bucket>`.
    pub fn stream_name(&self) -> String {
        format!("KV_{}", self.bucket)
    }

    /// The bucket's subjects: `$KV.<bucket>.>`.
    pub fn subject_filter(&self) -> String {
        format!("$KV.{}.>", self.bucket)
    }

    /// Checks the options without touching the server.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBucketName`] or [`Error::InvalidOption`].
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason: String| Error::InvalidBucketName {
            bucket: self.bucket.chars().take(140).collect(),
            reason,
        };
        if self.bucket.is_empty() {
            return Err(bad("it is empty".into()));
        }
        if self.bucket.len() > MAX_BUCKET_NAME_LEN {
            return Err(bad(format!("it is {} bytes long", self.bucket.len())));
        }
        if let Some(c) = self
            .bucket
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(bad(format!("it contains {c:?}")));
        }
        if !(1..=MAX_HISTORY).contains(&self.history) {
            return Err(Error::InvalidOption {
                option: "history",
                reason: format!("it must be between 1 and {MAX_HISTORY}"),
            });
        }
        validate_replicas(self.replicas)
    }

    /// The stream of a new bucket: what `nats kv add` would make, with no
    /// age limit (records and fence counters must not expire).
    pub(crate) fn stream_config(&self) -> Config {
        Config {
            name: self.stream_name(),
            description: Some(
                "anarchon leases: a document per job (live runs, fence), a record per ended run"
                    .into(),
            ),
            subjects: vec![self.subject_filter()],
            retention: RetentionPolicy::Limits,
            max_messages_per_subject: self.history,
            max_age: Duration::ZERO,
            storage: self.storage.stream_type(),
            num_replicas: self.replicas,
            allow_rollup: true,
            deny_delete: true,
            deny_purge: false,
            allow_direct: true,
            discard: DiscardPolicy::New,
            ..Default::default()
        }
    }

    /// Checks that an existing bucket serves the store.
    pub(crate) fn verify(&self, config: &Config) -> Result<(), Error> {
        let mismatch = |reason: String| Error::BucketMismatch {
            bucket: self.bucket.clone(),
            reason,
        };
        let filter = self.subject_filter();
        if config.subjects != [filter.clone()] {
            return Err(mismatch(format!(
                "its subjects are {:?}, not [{filter:?}]",
                config.subjects
            )));
        }
        if config.mirror.is_some() || config.sealed {
            return Err(mismatch(
                "it is a mirror or sealed: the store must write to it".into(),
            ));
        }
        if config.max_messages_per_subject == 0 {
            return Err(mismatch(
                "it keeps no revision per key (history 0): it is not a KV bucket".into(),
            ));
        }
        if !config.max_age.is_zero() {
            return Err(mismatch(format!(
                "its entries expire after {:?}: a job's document holds its fence counter and live runs, which must never expire (garbage collection removes old records instead)",
                config.max_age
            )));
        }
        if config.retention != RetentionPolicy::Limits {
            return Err(mismatch(format!(
                "its retention is {:?}, not limits",
                config.retention
            )));
        }
        if config.deny_purge {
            return Err(mismatch(
                "it denies purges: garbage collection purges old run records".into(),
            ));
        }
        if config.discard == DiscardPolicy::Old && (config.max_messages > 0 || config.max_bytes > 0)
        {
            return Err(mismatch(
                "it drops its oldest entries when full: that could drop a job's document and reset its fence".into(),
            ));
        }
        Ok(())
    }
}

impl StreamOptions for NatsLeaseOptions {
    fn stream_shape(&mut self) -> (&mut Storage, &mut usize) {
        (&mut self.storage, &mut self.replicas)
    }

    fn check(&self) -> Result<(), Error> {
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        assert!(NatsLeaseOptions::new().validate().is_ok());
        for bad in [
            NatsLeaseOptions::new().with_bucket(""),
            NatsLeaseOptions::new().with_bucket("a.b"),
            NatsLeaseOptions::new().with_bucket("a b"),
            NatsLeaseOptions::new().with_bucket("x".repeat(121)),
            NatsLeaseOptions::new().with_history(0),
            NatsLeaseOptions::new().with_history(65),
            NatsLeaseOptions::new().with_replicas(0),
            NatsLeaseOptions::new().with_replicas(6),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn from_url_splits_connection_and_bucket() {
        let (connection, leases) = NatsLeaseOptions::from_url(
            "nats://u:pw@h:4222?bucket=B_1&history=5&storage=memory&replicas=3&timeout_ms=1500",
        )
        .expect("valid");
        assert_eq!(connection.timeout(), Duration::from_millis(1500));
        assert_eq!(leases.bucket(), "B_1");
        assert_eq!(leases.history(), 5);
        assert_eq!(leases.storage(), Storage::Memory);
        assert_eq!(leases.replicas(), 3);
        for bad in [
            "nats://u:pw@h:4222?bogus=1",
            "nats://u:pw@h:4222?history=x",
            "nats://u:pw@h:4222?storage=tape",
            "nats://u:pw@h:4222?bucket=a.b",
        ] {
            let err = NatsLeaseOptions::from_url(bad).expect_err(bad);
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
        let (_, defaults) = NatsLeaseOptions::from_url("nats://h:4222").expect("valid");
        assert_eq!(defaults, NatsLeaseOptions::new());
    }

    #[test]
    fn buckets_that_do_not_fit_are_named() {
        let leases = NatsLeaseOptions::new().with_bucket("b");
        let good = leases.stream_config();
        leases.verify(&good).expect("its own config fits");
        let mut aging = good.clone();
        aging.max_age = Duration::from_secs(3600);
        let err = leases.verify(&aging).expect_err("expiring entries");
        assert!(err.to_string().contains("\"b\""), "{err}");
        assert!(err.to_string().contains("fence"), "{err}");
        let mut other = good.clone();
        other.subjects = vec!["$KV.c.>".into()];
        assert!(leases.verify(&other).is_err());
        let mut no_purge = good.clone();
        no_purge.deny_purge = true;
        assert!(leases.verify(&no_purge).is_err());
        let mut dropping = good.clone();
        dropping.discard = DiscardPolicy::Old;
        dropping.max_bytes = 1 << 20;
        assert!(leases.verify(&dropping).is_err());
        let mut longer = good;
        longer.max_messages_per_subject = 10;
        leases.verify(&longer).expect("more history is fine");
    }
}
