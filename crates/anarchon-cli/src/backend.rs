//! What the daemon does with a store URL besides opening it: a stand-in
//! store for checking the crontab before the store is opened, and opening
//! a store to read its history.
//!
//! Which schemes there are, what their parameters mean and how each store
//! is opened is the library's business ([`anarchon::StoreUrl`]): nothing
//! here names a backend, so a new one needs no change in the daemon.

use std::sync::Arc;

use anarchon::{
    BackendInfo, ClaimOutcome, ClaimRequest, ClaimStore, JobName, LeaseStore, MemoryStore,
    OpenError, Opened, StoreError, StoreUrl,
};

use crate::config::Crontab;
use crate::error::Error;

/// A store of the same kind (lease or claim-only), name and memory as the
/// one `url` names, that touches nothing, so the core can check the
/// crontab's options against this backend before it is opened (and
/// `anarchon check` without opening it).
pub(crate) fn stand_in(url: &StoreUrl) -> Arc<dyn ClaimStore> {
    if url.is_lease() {
        Arc::new(MemoryStore::new())
    } else {
        Arc::new(ClaimOnlyStandIn { info: url.info() })
    }
}

/// Opens the lease store `url` names to read its history, creating
/// nothing (see [`StoreUrl::open_existing`]).
///
/// # Errors
///
/// [`Error::NoHistory`] for a claim-only store; [`Error::NoDatabase`] for
/// a store nothing has created yet; [`Error::SchemaOutdated`] for a table
/// of an older schema; [`Error::Open`] for the rest.
pub(crate) async fn open_for_history(url: &StoreUrl) -> Result<Opened, Error> {
    url.open_existing().await.map_err(|e| match e {
        OpenError::ClaimOnly { backend } => Error::NoHistory { backend },
        OpenError::Missing { what } => Error::NoDatabase { what },
        OpenError::SchemaOutdated {
            table,
            found,
            latest,
        } => Error::SchemaOutdated {
            table,
            found,
            latest,
        },
        other => Error::Open(other),
    })
}

/// A claim-only store that touches nothing: reports the name and memory of
/// the store a URL names. It is only built on, never started.
#[derive(Debug)]
struct ClaimOnlyStandIn {
    info: BackendInfo,
}

#[anarchon::async_trait]
impl ClaimStore for ClaimOnlyStandIn {
    async fn claim(&self, _req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Err(StoreError::invalid(
            self.info.name,
            "a stand-in for checking options claims nothing",
        ))
    }

    fn info(&self) -> BackendInfo {
        self.info
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Err(StoreError::invalid(
            self.info.name,
            "a stand-in for checking options asks nothing",
        ))
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

/// The jobs `history` and `status` show: the one named, else the
/// crontab's, else every job of the store's job index.
///
/// # Errors
///
/// [`Error::Config`] for a crontab job name the core refuses; the store's
/// error reading its index.
pub(crate) async fn jobs_to_show(
    named: Option<JobName>,
    crontab: Option<&Crontab>,
    opened: &Opened,
) -> Result<Vec<JobName>, Error> {
    if let Some(job) = named {
        return Ok(vec![job]);
    }
    if let Some(crontab) = crontab {
        return crontab
            .jobs
            .iter()
            .map(|j| JobName::new(&j.name))
            .collect::<Result<_, _>>()
            .map_err(|source| {
                Error::config(Some(crontab.path.display().to_string()), None, source)
            });
    }
    Ok(opened.jobs().await?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use anarchon::Memory;

    use super::*;

    /// What `check` and the pre-start validation assume about a URL's
    /// store — its name, its kind, how long it remembers a run — is what
    /// the library says of the URL (which its own tests compare with the
    /// store opened on a real server).
    #[test]
    fn stand_ins_report_what_the_url_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("never.db");
        let sqlite = format!("sqlite://{}", path.display());
        for (url, name, memory) in [
            (sqlite.as_str(), "sqlite", None),
            ("postgres://app:s3cret@db/cron", "postgres", None),
            (
                "redis://:s3cret@h:6379/2?prefix=team.a",
                "redis-lease",
                None,
            ),
            ("nats-kv://tok3n@h:4222", "nats-kv", None),
            (
                "redis://h?strategy=stream-id",
                "redis-stream-id",
                Some(Memory::Forever),
            ),
            (
                "redis://h?strategy=script&window_ms=120000",
                "redis-script",
                Some(Memory::Window(Duration::from_secs(120))),
            ),
            (
                "redis://h?strategy=idmp&duration_ms=3600000&protocol=resp2",
                "redis-idmp",
                Some(Memory::Window(Duration::from_secs(3600))),
            ),
            (
                "amqp://guest:s3cret@127.0.0.1:5672/%2f?prefix=billing&slot_ttl_ms=90000",
                "rabbitmq",
                Some(Memory::Window(Duration::from_secs(90))),
            ),
            (
                "nats://tok3n@127.0.0.1:4222?prefix=billing&duplicate_window_ms=600000",
                "nats",
                Some(Memory::Window(Duration::from_secs(600))),
            ),
        ] {
            let parsed = StoreUrl::parse(url).unwrap();
            assert_eq!(parsed.backend(), name, "{url}");
            let stand_in = stand_in(&parsed);
            match memory {
                None => {
                    assert!(parsed.is_lease(), "{url}");
                    assert!(stand_in.as_lease_store().is_some(), "{url}");
                }
                Some(memory) => {
                    assert!(!parsed.is_lease(), "{url}");
                    assert_eq!(stand_in.info().name, name, "{url}");
                    assert_eq!(stand_in.info().memory, memory, "{url}");
                    assert!(stand_in.as_lease_store().is_none(), "{url}");
                }
            }
        }
        assert!(!path.exists(), "reading a URL must not create the file");
    }

    #[test]
    fn url_errors_are_configuration_errors() {
        for url in [
            "mysql://app:s3cret@db/cron",
            "postgres://app:s3cret@db/cron?tabel=x",
            "redis://:s3cret@h?strategy=leases",
            "amqp://u:s3cret@h/%2f?bogus=1",
            "nats://u:s3cret@h?bogus=1",
            "sqlite://cron.db?bogus=1",
        ] {
            let err = Error::from(StoreUrl::parse(url).unwrap_err());
            assert!(err.is_configuration(), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[tokio::test]
    async fn history_of_a_claim_only_store_is_refused_before_connecting() {
        let url = StoreUrl::parse("amqp://u:s3cret@127.0.0.1:9/%2f").unwrap();
        let err = open_for_history(&url).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NoHistory {
                    backend: "rabbitmq"
                }
            ),
            "{err}"
        );
        assert!(err.is_configuration());
        let dir = tempfile::tempdir().unwrap();
        let missing = StoreUrl::parse(&format!(
            "sqlite://{}",
            dir.path().join("none.db").display()
        ))
        .unwrap();
        let err = open_for_history(&missing).await.unwrap_err();
        assert!(matches!(err, Error::NoDatabase { .. }), "{err}");
        assert!(!err.is_configuration());
    }
}
