//! From a crontab to a scheduler, on the core's run-time path.
//!
//! Options read from the file go through [`JobBuilder::options`] and
//! [`SchedulerBuilder::options`] over an `Arc<dyn ClaimStore>`, so the
//! core itself refuses what the chosen store cannot honour (lease-only
//! options on a claim-only store) with its typed
//! [`ConfigError::UnsupportedOption`].
//!
//! [`JobBuilder::options`]: anarchon::JobBuilder::options
//! [`SchedulerBuilder::options`]: anarchon::SchedulerBuilder::options

use std::sync::Arc;

use anarchon::{ClaimStore, ConfigError, Scheduler, SchedulerBuilder};

use crate::alerts::Alerts;
use crate::config::Crontab;
use crate::error::Error;
use crate::runner::{self, Orphans, Spec};

/// A scheduler builder with every job of `crontab` added, over `store`.
///
/// # Errors
///
/// [`Error::Config`] naming the job the core refused.
pub(crate) fn build(
    crontab: &Crontab,
    store: Arc<dyn ClaimStore>,
    orphans: &Arc<Orphans>,
    alerts: Option<Arc<Alerts>>,
) -> Result<SchedulerBuilder<dyn ClaimStore>, Error> {
    let mut options = crontab.scheduler.clone();
    if store.clone().as_lease_store().is_some() {
        // A command is stopped with SIGTERM, then SIGKILL after the kill
        // grace: the runner gives a run up that long before its lease could
        // end, so the command is dead before a backup may start the run.
        options.stop_grace = Some(crontab.kill_grace);
    }
    let mut builder = Scheduler::builder(store).options(&options);
    if let Some(keep) = crontab.history_retention {
        builder = builder.history_retention(keep);
    }
    if let Some(alerts) = alerts {
        builder = builder.on_alert(move |alert| alerts.raise(alert));
    }
    for job in &crontab.jobs {
        let in_job = |source: ConfigError| {
            Error::config(
                Some(format!("{}:{}", crontab.path.display(), job.line)),
                Some(job.name.clone()),
                source,
            )
        };
        let spec = Arc::new(Spec {
            command: job.command.clone(),
            env: job.env.clone(),
            clean_env: job.clean_env,
            working_dir: job.working_dir.clone(),
            kill_grace: crontab.kill_grace,
        });
        let orphans = orphans.clone();
        builder
            .job(&job.name, job.schedule.clone())
            .map_err(in_job)?
            .options(&job.options)
            .run(move |ctx| runner::run(ctx, spec.clone(), orphans.clone()))
            .map_err(in_job)?;
    }
    Ok(builder)
}

/// Builds and starts the scheduler on the current runtime.
///
/// # Errors
///
/// As [`build`], and the scheduler-wide options the core refuses.
pub(crate) fn start(
    crontab: &Crontab,
    store: Arc<dyn ClaimStore>,
    orphans: &Arc<Orphans>,
    alerts: Option<Arc<Alerts>>,
) -> Result<Scheduler, Error> {
    build(crontab, store, orphans, alerts)?
        .start()
        .map_err(|source| Error::config(Some(crontab.path.display().to_string()), None, source))
}

/// What `anarchon check` checks: every job and the scheduler-wide options,
/// by the core's own checks, without starting anything.
///
/// # Errors
///
/// As [`start`].
pub(crate) fn check(crontab: &Crontab, store: Arc<dyn ClaimStore>) -> Result<(), Error> {
    build(crontab, store, &Arc::default(), None)?
        .check()
        .map_err(|source| Error::config(Some(crontab.path.display().to_string()), None, source))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use anarchon_testkit::ClaimOnlyStore;

    use super::*;

    fn crontab(text: &str) -> Crontab {
        Crontab::parse(Path::new("test.toml"), text).unwrap()
    }

    fn claim_only() -> Arc<dyn ClaimStore> {
        Arc::new(ClaimOnlyStore::default())
    }

    fn unsupported(err: Error) -> (Option<String>, &'static str, &'static str) {
        match err {
            Error::Config { job, source, .. } => match *source {
                ConfigError::UnsupportedOption { option, backend } => (job, option, backend),
                other => panic!("expected UnsupportedOption, got {other:?}"),
            },
            other => panic!("expected UnsupportedOption, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn lease_only_job_options_are_refused_on_a_claim_only_store_at_start_and_by_check() {
        for (line, option) in [
            ("overlap = \"skip\"", "overlap"),
            ("overlap = \"replace\"", "overlap"),
            ("overlap = \"buffer-one\"", "overlap"),
            ("max_attempts = 2", "max_attempts"),
            ("catch_up = \"1h\"", "catch_up"),
            ("retries = 2", "retries"),
            ("retries = 2\nretry_backoff = \"10s\"", "retries"),
        ] {
            let tab = crontab(&format!(
                "[[job]]\nname = \"nightly\"\nschedule = \"0 3 * * *\"\ncommand = \"true\"\n{line}\n"
            ));
            let err = build(&tab, claim_only(), &Arc::default(), None).unwrap_err();
            let text = err.to_string();
            assert_eq!(
                unsupported(err),
                (Some("nightly".into()), option, "claim-only-test"),
                "{text}"
            );
            assert!(text.starts_with("test.toml:2: job \"nightly\": "), "{text}");
            // `anarchon check` refuses it the same way.
            let err = check(&tab, claim_only()).unwrap_err();
            assert_eq!(
                unsupported(err),
                (Some("nightly".into()), option, "claim-only-test")
            );
            // The same crontab suits a lease store.
            let lease: Arc<dyn ClaimStore> = Arc::new(anarchon::MemoryStore::new());
            build(&tab, lease, &Arc::default(), None).unwrap();
        }
    }

    #[tokio::test]
    async fn lease_only_scheduler_options_are_refused_at_start_and_by_check() {
        for (line, option) in [
            ("lease = \"10s\"", "lease"),
            ("heartbeat = \"1s\"", "heartbeat"),
            ("catch_up_concurrency = 2", "catch_up_concurrency"),
        ] {
            let tab = crontab(&format!(
                "[scheduler]\n{line}\n[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n"
            ));
            let err = start(&tab, claim_only(), &Arc::default(), None).unwrap_err();
            assert_eq!(unsupported(err), (None, option, "claim-only-test"));
            let err = check(&tab, claim_only()).unwrap_err();
            assert_eq!(unsupported(err), (None, option, "claim-only-test"));
        }
    }

    #[tokio::test]
    async fn a_plain_crontab_starts_on_a_claim_only_store() {
        let tab = crontab(
            "[[job]]\nname = \"a\"\nevery = \"1h\"\ncommand = \"true\"\nmax_late = \"30s\"\njitter = \"5s\"\ntimeout = \"1m\"\n",
        );
        check(&tab, claim_only()).unwrap();
        let scheduler = start(&tab, claim_only(), &Arc::default(), None).unwrap();
        assert_eq!(scheduler.backend().name, "claim-only-test");
        scheduler.shutdown().await;
    }

    #[tokio::test]
    async fn the_core_names_the_job_it_refuses() {
        let tab = crontab("[[job]]\nname = \"no spaces\"\nevery = \"1m\"\ncommand = \"true\"\n");
        let err = build(&tab, claim_only(), &Arc::default(), None).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Config { source, .. } if matches!(**source, ConfigError::InvalidJobName { .. })
            ),
            "{err:?}"
        );
        let tab = crontab(
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n[[job]]\nname = \"a\"\nevery = \"2m\"\ncommand = \"true\"\n",
        );
        let err = build(&tab, claim_only(), &Arc::default(), None).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Config { source, .. } if matches!(**source, ConfigError::DuplicateJob { .. })
            ),
            "{err:?}"
        );
        let tab = crontab(
            "[scheduler]\nlease = \"3s\"\nheartbeat = \"3s\"\n[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = \"true\"\n",
        );
        let lease: Arc<dyn ClaimStore> = Arc::new(anarchon::MemoryStore::new());
        let by_check = check(&tab, lease.clone()).unwrap_err();
        let by_start = start(&tab, lease, &Arc::default(), None).unwrap_err();
        assert_eq!(by_check.to_string(), by_start.to_string());
        assert!(
            matches!(
                by_start,
                Error::Config { ref source, .. } if matches!(**source, ConfigError::HeartbeatNotShorterThanLease { .. })
            ),
            "{by_start:?}"
        );
    }
}
