//! The daemon's HTTP side (`[http] listen`): Prometheus metrics, a health
//! check, the fleet's status as JSON, and a read-only status page.
//!
//! Everything here reads; nothing changes the store. The page and the JSON
//! are built from the same store reads as `anarchon status` and `anarchon
//! history`, rendered on the server: no script, no build step. Stored text
//! (errors, instance ids) is HTML-escaped, and no store URL is ever shown,
//! so no password can leak through the page.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anarchon::{
    ClaimStore, Control, JobName, LeaseStore, RecordState, RunRecord, Schedule, Timestamp,
};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use chrono::SecondsFormat;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

use crate::config::Crontab;
use crate::error::Error;

/// How long `/healthz` waits for the store.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// How many recent slots the page shows per job.
const TIMELINE: usize = 30;
/// How often the exporter's histograms are tidied.
const UPKEEP: Duration = Duration::from_secs(5);
/// Histogram buckets, in seconds: lateness of milliseconds, runs of hours.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// What the routes read.
struct Shared {
    metrics: PrometheusHandle,
    /// What `/healthz` asks, whatever kind of store it is.
    claims: Arc<dyn ClaimStore>,
    /// Where the status routes read; `None` on a claim-only store.
    store: Option<Arc<dyn LeaseStore>>,
    jobs: Vec<(JobName, Schedule)>,
    backend: &'static str,
}

/// Installs the Prometheus recorder for the whole process: from then on
/// the scheduler's metrics (see `anarchon_core::scheduler::metrics::names`)
/// are kept for `/metrics`.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, Error> {
    PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| Error::Http(format!("cannot keep the metrics: {e}")))
}

/// A running server: stop it with [`Server::stop`].
pub(crate) struct Server {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops taking connections, lets the open ones finish, and returns.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves the routes until [`Server::stop`].
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    claims: Arc<dyn ClaimStore>,
    store: Option<Arc<dyn LeaseStore>>,
    crontab: &Crontab,
    backend: &'static str,
) -> Result<Server, Error> {
    let mut jobs = Vec::with_capacity(crontab.jobs.len());
    for job in &crontab.jobs {
        let name = JobName::new(&job.name).map_err(|source| Error::config(None, None, source))?;
        jobs.push((name, job.schedule.clone()));
    }
    let shared = Arc::new(Shared {
        metrics,
        claims,
        store,
        jobs,
        backend,
    });
    let app = Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/api/status", get(api_status))
        .route("/api/history", get(api_history))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Http(format!("cannot listen on {addr}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Http(format!("cannot listen on {addr}: {e}")))?;
    let (stop, mut stopped) = watch::channel(false);
    let mut upkeep_stopped = stop.subscribe();
    let task = tokio::spawn(async move {
        let upkeep = async {
            let mut tick = tokio::time::interval(UPKEEP);
            loop {
                tokio::select! {
                    _ = tick.tick() => shared.metrics.run_upkeep(),
                    _ = upkeep_stopped.changed() => return,
                }
            }
        };
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.changed().await;
        });
        let (served, ()) = tokio::join!(server.into_future(), upkeep);
        if let Err(error) = served {
            tracing::error!(%error, "the HTTP server stopped");
        }
    });
    tracing::info!(%addr, "serving /metrics, /healthz, /api/status, /api/history and the status page");
    Ok(Server { stop, task })
}

async fn metrics_text(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(),
    )
        .into_response()
}

/// 200 when the store answers [`ClaimStore::ping`] within
/// [`HEALTH_TIMEOUT`]; 503 with the reason (the store's error, which never
/// holds a password) when not.
async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    match tokio::time::timeout(HEALTH_TIMEOUT, shared.claims.ping()).await {
        Ok(Ok(_)) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(error)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store does not answer: {error}\n"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer within {HEALTH_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

/// Without a lease store there is no history to show.
fn no_history(shared: &Shared) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "{} is a claim-only store: it keeps no history, so there is no status to show\n",
            shared.backend
        ),
    )
        .into_response()
}

async fn api_status(State(shared): State<Arc<Shared>>) -> Response {
    let Some(store) = &shared.store else {
        return no_history(&shared);
    };
    let names: Vec<JobName> = shared.jobs.iter().map(|(n, _)| n.clone()).collect();
    match Control::new(store.clone()).status(&names, 20).await {
        Ok(status) => {
            let next = |job: &JobName| next_slot(&shared, job, status.store_now);
            json(crate::control::status_json(
                &status.jobs,
                status.store_now,
                &next,
            ))
        }
        Err(error) => unavailable(&error),
    }
}

/// `?job=NAME&limit=N` of `/api/history`.
#[derive(serde::Deserialize)]
struct HistoryQuery {
    job: String,
    #[serde(default)]
    limit: Option<usize>,
}

async fn api_history(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HistoryQuery>,
) -> Response {
    let Some(store) = &shared.store else {
        return no_history(&shared);
    };
    let Ok(job) = JobName::new(&query.job) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a job name\n", query.job),
        )
            .into_response();
    };
    match store
        .history(&job, query.limit.unwrap_or(20).min(1000))
        .await
    {
        Ok(runs) => json(crate::show::history_json(&runs)),
        Err(error) => unavailable(&error),
    }
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn unavailable(error: &anarchon::StoreError) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the store does not answer: {error}\n"),
    )
        .into_response()
}

fn next_slot(shared: &Shared, job: &JobName, now: Timestamp) -> Option<Timestamp> {
    shared
        .jobs
        .iter()
        .find(|(n, _)| n == job)
        .and_then(|(_, s)| s.next_after(now))
        .map(|slot| slot.at())
}

/// The status page: per job its schedule, next slot, pause and a timeline
/// of its latest slots, one cell each, coloured by state.
async fn page(State(shared): State<Arc<Shared>>) -> Response {
    let Some(store) = &shared.store else {
        return no_history(&shared);
    };
    let names: Vec<JobName> = shared.jobs.iter().map(|(n, _)| n.clone()).collect();
    let status = match Control::new(store.clone()).status(&names, TIMELINE).await {
        Ok(status) => status,
        Err(error) => return unavailable(&error),
    };
    let schedules: BTreeMap<&JobName, &Schedule> =
        shared.jobs.iter().map(|(n, s)| (n, s)).collect();
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>anarchon</h1><p class=\"meta\">{} store · store clock {}</p>",
        escape(shared.backend),
        utc(status.store_now)
    );
    for job in &status.jobs {
        let schedule = schedules
            .get(&job.job)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let next =
            next_slot(&shared, &job.job, status.store_now).map_or_else(|| "none".into(), utc);
        let pause = job.pause.as_ref().map_or_else(
            || "<span class=\"ok\">not paused</span>".to_owned(),
            |p| {
                format!(
                    "<span class=\"paused\">paused{}</span>",
                    p.reason
                        .as_deref()
                        .map(|r| format!(": {}", escape(r)))
                        .unwrap_or_default()
                )
            },
        );
        let _ = write!(
            body,
            "<section class=\"job\" data-job=\"{name}\"><h2>{name}</h2>\
             <p class=\"meta\">schedule <code>{schedule}</code> · next slot {next} · {pause}</p>\
             <div class=\"timeline\">",
            name = escape(job.job.as_str()),
            schedule = escape(&schedule),
        );
        // Oldest first, left to right.
        for run in job.recent.iter().rev() {
            let state = cell_state(run);
            let _ = write!(
                body,
                "<span class=\"cell {state}\" data-state=\"{state}\" data-slot=\"{slot}\" title=\"{title}\"></span>",
                slot = utc(run.run.slot.at()),
                title = escape(&tooltip(run)),
            );
        }
        body.push_str("</div></section>");
    }
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>anarchon</title>\
         <style>{STYLE}</style></head><body>{body}{LEGEND}</body></html>"
    ))
    .into_response()
}

/// The state a cell shows: the record's state, with a failed run whose
/// retry is pending shown as going.
fn cell_state(run: &RunRecord) -> &'static str {
    match (run.state, run.retry_at) {
        (RecordState::Running | RecordState::Waiting, _) => "running",
        (RecordState::Finished(anarchon::FinalState::Failed), Some(_)) => "retrying",
        (state, _) => state.as_str(),
    }
}

/// What hovering over a cell says: slot, state, attempt, instance, duration.
fn tooltip(run: &RunRecord) -> String {
    let mut text = format!("{} · {}", utc(run.run.slot.at()), run.state.as_str());
    if let Some(attempt) = run.attempt {
        let _ = write!(text, " · attempt {attempt}");
    }
    if let Some(instance) = &run.instance {
        let _ = write!(text, " · {}", instance.as_str());
    }
    if let (Some(start), Some(end)) = (run.started_at, run.finished_at) {
        let _ = write!(
            text,
            " · {}",
            humantime::format_duration(Duration::from_millis(
                u64::try_from(end.as_millis() - start.as_millis()).unwrap_or(0)
            ))
        );
    }
    if let Some(error) = &run.error {
        let _ = write!(text, " · {error}");
    }
    text
}

fn utc(at: Timestamp) -> String {
    at.to_datetime().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Text made safe to put in HTML, attributes included.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}\
h1{font-size:1.4rem}h2{font-size:1.1rem;margin:1.2rem 0 .3rem}.meta{color:#555;margin:.2rem 0}\
.timeline{display:flex;gap:3px;flex-wrap:wrap}.cell{width:16px;height:24px;border-radius:3px;display:inline-block}\
.succeeded{background:#2e9e44}.failed{background:#d73a3a}.interrupted{background:#a0306e}\
.missed{background:#f0a020}.skipped{background:#9aa4ad}.paused{background:#5b7bd5}\
.replaced{background:#7a5bd5}.running{background:#3fb6d6}.retrying{background:#e07b39}\
.ok{color:#2e9e44}.legend{margin-top:2rem}.legend .cell{vertical-align:middle;margin:0 .3rem 0 1rem}";

const LEGEND: &str = "<p class=\"legend\">\
<span class=\"cell succeeded\"></span>ran \
<span class=\"cell failed\"></span>failed \
<span class=\"cell retrying\"></span>retry pending \
<span class=\"cell interrupted\"></span>interrupted \
<span class=\"cell missed\"></span>missed \
<span class=\"cell skipped\"></span>skipped \
<span class=\"cell paused\"></span>paused \
<span class=\"cell replaced\"></span>replaced \
<span class=\"cell running\"></span>running</p>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_cannot_become_markup() {
        assert_eq!(
            escape("<script>\"x\" & 'y'</script>\n"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt; "
        );
    }
}
