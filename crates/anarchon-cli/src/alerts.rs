//! Alert commands: what the daemon runs when a run ends `failed`,
//! `interrupted` or `missed`.
//!
//! The scheduler tells an end to exactly one instance of the fleet, the one
//! that recorded it (see `anarchon::scheduler::alerts`), so an alert command
//! runs once per end however many daemons share the store. The command gets
//! the daemon's environment plus the run's details in `ANARCHON_*`
//! variables — never the job's own `env` (an alert is not the job) and
//! never the store's URL. Its output is captured and logged; it is killed
//! when it outlives the crontab's `[alerts] timeout`. Shutdown waits for
//! the alerts still running, up to that timeout.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon::Alert;
use tokio::task::JoinSet;

use crate::config::{AlertRoute, Crontab};

/// The longest error text handed to an alert command in `ANARCHON_ERROR`.
const MAX_ERROR_BYTES: usize = 4096;

/// The daemon's alert commands, by job, and the ones still running.
#[derive(Debug)]
pub(crate) struct Alerts {
    routes: HashMap<String, AlertRoute>,
    timeout: Duration,
    running: Mutex<JoinSet<()>>,
}

impl Alerts {
    /// The alert routes of `crontab`'s jobs; `None` when no job has one.
    pub(crate) fn of(crontab: &Crontab) -> Option<Arc<Self>> {
        let routes: HashMap<String, AlertRoute> = crontab
            .jobs
            .iter()
            .filter_map(|job| Some((job.name.clone(), job.alert.clone()?)))
            .collect();
        (!routes.is_empty()).then(|| {
            Arc::new(Self {
                routes,
                timeout: crontab.alert_timeout,
                running: Mutex::new(JoinSet::new()),
            })
        })
    }

    /// Starts the alert command of `alert`'s job, if it has one for this
    /// end. Called by the scheduler; returns at once.
    pub(crate) fn raise(self: &Arc<Self>, alert: Alert) {
        let Some(route) = self.routes.get(alert.run.job.as_str()) else {
            return;
        };
        if !route.wants(alert.kind) {
            return;
        }
        let argv = route.command.argv();
        let timeout = self.timeout;
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // Reap the ones that ended, so the set holds only running commands.
        while running.try_join_next().is_some() {}
        running.spawn(run(argv, alert, timeout));
    }

    /// Waits for the alert commands still running, up to the alert
    /// timeout; the ones left are killed.
    pub(crate) async fn finish(&self) {
        let mut running =
            std::mem::take(&mut *self.running.lock().unwrap_or_else(|e| e.into_inner()));
        if running.is_empty() {
            return;
        }
        tracing::info!(
            running = running.len(),
            "waiting for alert commands to finish"
        );
        let all = async { while running.join_next().await.is_some() {} };
        if tokio::time::timeout(self.timeout, all).await.is_err() {
            tracing::warn!(
                "alert commands still running after {:?}; killed",
                self.timeout
            );
        }
    }
}

/// The `ANARCHON_*` variables an alert command gets.
pub(crate) fn variables(alert: &Alert) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("ANARCHON_ALERT", alert.kind.as_str().to_owned()),
        ("ANARCHON_JOB", alert.run.job.as_str().to_owned()),
        ("ANARCHON_SLOT", alert.run.slot.at().as_millis().to_string()),
        ("ANARCHON_SLOT_TIME", alert.run.slot.at().to_string()),
        ("ANARCHON_INSTANCE", alert.instance.as_str().to_owned()),
    ];
    if let Some(attempt) = alert.attempt {
        vars.push(("ANARCHON_ATTEMPT", attempt.to_string()));
    }
    if let Some(error) = &alert.error {
        vars.push(("ANARCHON_ERROR", cut(error, MAX_ERROR_BYTES).to_owned()));
    }
    vars
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Runs one alert command to its end (or its timeout) and logs how it went.
async fn run(argv: Vec<String>, alert: Alert, timeout: Duration) {
    let Some((program, args)) = argv.split_first() else {
        return;
    };
    let (job, slot, kind) = (alert.run.job.clone(), alert.run.slot, alert.kind);
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_remove("ANARCHON_FENCE")
        .envs(variables(&alert))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if alert.attempt.is_none() {
        command.env_remove("ANARCHON_ATTEMPT");
    }
    if alert.error.is_none() {
        command.env_remove("ANARCHON_ERROR");
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            tracing::error!(%job, %slot, %kind, program = %program, %error, "could not start the alert command");
            return;
        }
    };
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => {
            tracing::error!(%job, %slot, %kind, ?timeout, "the alert command outlived its timeout; killed");
        }
        Ok(Err(error)) => {
            tracing::error!(%job, %slot, %kind, %error, "the alert command could not be waited for");
        }
        Ok(Ok(output)) if output.status.success() => {
            tracing::info!(%job, %slot, %kind, "alert command ran");
        }
        Ok(Ok(output)) => {
            let said = String::from_utf8_lossy(&output.stderr);
            let said = said.trim();
            tracing::error!(%job, %slot, %kind, status = %output.status, stderr = cut(said, 2048), "the alert command failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use anarchon::{AlertKind, Attempt, InstanceId, JobName, RunKey, Slot};

    use super::*;

    fn alert(kind: AlertKind, error: Option<&str>) -> Alert {
        let run = RunKey::new(JobName::new("backup").unwrap(), Slot::from_millis(60_000));
        let alert = Alert::new(kind, run, InstanceId::new("host-1").unwrap());
        match error {
            Some(error) => alert.with_attempt(Attempt::FIRST).with_error(error),
            None => alert,
        }
    }

    #[test]
    fn an_alert_names_the_run_in_its_variables() {
        let vars: HashMap<_, _> = variables(&alert(AlertKind::Failed, Some("boom")))
            .into_iter()
            .collect();
        assert_eq!(vars["ANARCHON_ALERT"], "failed");
        assert_eq!(vars["ANARCHON_JOB"], "backup");
        assert_eq!(vars["ANARCHON_SLOT"], "60000");
        assert_eq!(vars["ANARCHON_INSTANCE"], "host-1");
        assert_eq!(vars["ANARCHON_ATTEMPT"], "1");
        assert_eq!(vars["ANARCHON_ERROR"], "boom");
        let missed: HashMap<_, _> = variables(&alert(AlertKind::Missed, None))
            .into_iter()
            .collect();
        assert_eq!(missed["ANARCHON_ALERT"], "missed");
        assert!(!missed.contains_key("ANARCHON_ATTEMPT"));
        assert!(!missed.contains_key("ANARCHON_ERROR"));
    }

    #[test]
    fn a_long_error_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = cut(&long, MAX_ERROR_BYTES - 1);
        assert!(cut.len() < MAX_ERROR_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
