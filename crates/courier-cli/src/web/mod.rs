//! The worker's HTTP side on `COURIER_HTTP_ADDR` (unset: the default address, or the next
//! free port after it, see [`start_default`]): Prometheus metrics at `/metrics` and a
//! live dashboard at `/`, server-rendered, with a little embedded JavaScript that refreshes
//! it from `/api/state` every two seconds. Everything it serves is compiled into the
//! binary (no front-end build, no CDN).
//!
//! Read-only unless `COURIER_HTTP_TOKEN` is set: then the POST endpoints under
//! `/api/rules/...` and `/api/connections/...` act for a request that sends
//! `Authorization: Bearer <token>` (compared in constant time, never logged nor echoed).
//! A header, not a cookie, carries it, so another site cannot make a browser send it.

mod page;
mod state;

pub use state::{BudgetView, CHART_STEP_SECS, CHART_WINDOW_SECS, DashboardState, read_state};

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::{get, post},
};
use chrono::{DateTime, Utc};
use courier::{
    config,
    engine::Engine,
    ledger::Outcome,
    metrics,
    ops::{self, HistoryEntry, OpsError},
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

/// Who the ledger names for a retry asked from the dashboard.
pub const ACTOR: &str = "courier dashboard";

/// A running HTTP server: where it listens.
#[derive(Debug)]
pub struct Server {
    /// The bound address (the real port when 0 was asked for).
    pub addr: SocketAddr,
    /// The server task; it ends when the engine's shutdown is cancelled.
    pub task: tokio::task::JoinHandle<()>,
}

/// Binds `addr` and serves metrics and the dashboard for `engine` until its shutdown.
/// A bind failure is an error naming the address.
pub async fn start(engine: Arc<Engine>, addr: SocketAddr) -> anyhow::Result<Server> {
    let listener = TcpListener::bind(addr).await.with_context(|| busy(addr))?;
    serve(engine, listener)
}

/// What a bind failure of `addr` says.
fn busy(addr: SocketAddr) -> String {
    format!(
        "cannot serve metrics and the dashboard on {addr} (COURIER_HTTP_ADDR; set it to \
         another address, or empty to serve nothing)"
    )
}

/// The default when `COURIER_HTTP_ADDR` is unset: binds the default address or, when
/// another process holds it (several workers on one host), the next free of the
/// [`DEFAULT_HTTP_PORTS`](config::DEFAULT_HTTP_PORTS) ports after it, so a Prometheus
/// configuration can name every worker of a host in advance; past them, any free port on
/// the same interface, so the worker still starts (its address is logged and listed by
/// `courier status` either way). Any bind error but "in use" fails the start.
pub async fn start_default(engine: Arc<Engine>) -> anyhow::Result<Server> {
    let first = config::HttpAddr::Default
        .first()
        .expect("the default serves");
    let ports = (0..config::DEFAULT_HTTP_PORTS)
        .map(|i| first.port() + i)
        .chain([0]);
    for port in ports {
        let addr = SocketAddr::new(first.ip(), port);
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                if port != first.port() {
                    tracing::info!(
                        default = %first,
                        "another process serves on the default address; this one takes the next free port"
                    );
                }
                return serve(engine, listener);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(anyhow::Error::new(e).context(busy(addr))),
        }
    }
    unreachable!("port 0 is never in use")
}

/// Serves metrics and the dashboard on `listener` until `engine`'s shutdown.
fn serve(engine: Arc<Engine>, listener: TcpListener) -> anyhow::Result<Server> {
    let addr = listener.local_addr()?;
    let stop = engine.shutdown.clone();
    let app = router(engine);
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics and dashboard server stopped");
        }
    });
    Ok(Server { addr, task })
}

/// The routes.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics_text))
        .route("/api/state", get(state_json))
        .route("/api/history", get(history_json))
        .route("/api/rules/{name}/retry", post(retry_rule))
        .route("/api/rules/{name}/pause", post(pause_rule))
        .route("/api/rules/{name}/resume", post(resume_rule))
        .route("/api/connections/{name}/pause", post(pause_connection))
        .route("/api/connections/{name}/resume", post(resume_connection))
        .route("/api/connections/{name}/unblock", post(unblock_connection))
        .with_state(engine)
}

async fn metrics_text(State(engine): State<Arc<Engine>>) -> Response {
    let now = engine.clock.now();
    match metrics::scrape::render(&engine.metrics, &engine.pool, now).await {
        Ok(text) => (
            [(header::CONTENT_TYPE, metrics::scrape::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics scrape failed");
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

/// The query of `/` and `/api/history`.
#[derive(Debug, Default, Deserialize)]
pub struct KeyQuery {
    /// A record key whose history to show.
    pub key: Option<String>,
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "dashboard could not read the database");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the database did not answer: {e}\n"),
    )
        .into_response()
}

async fn dashboard(State(engine): State<Arc<Engine>>, Query(q): Query<KeyQuery>) -> Response {
    let state = match read_state(&engine).await {
        Ok(s) => s,
        Err(e) => return unavailable(e),
    };
    let key = q.key.filter(|k| !k.trim().is_empty());
    let history = match &key {
        Some(k) => match ops::history(&engine.pool, k).await {
            Ok(h) => Some(h),
            Err(e) => return unavailable(e),
        },
        None => None,
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (
        headers,
        Html(page::render(&state, key.as_deref(), history.as_deref())),
    )
        .into_response()
}

async fn state_json(State(engine): State<Arc<Engine>>) -> Response {
    match read_state(&engine).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => unavailable(e),
    }
}

/// The history of one record key.
#[derive(Debug, Serialize)]
pub struct HistoryView {
    /// The key asked for.
    pub key: String,
    /// Its deliveries, each followed by its ledger rows, oldest first.
    pub lines: Vec<HistoryEntry>,
}

async fn history_json(State(engine): State<Arc<Engine>>, Query(q): Query<KeyQuery>) -> Response {
    let Some(key) = q.key.filter(|k| !k.trim().is_empty()) else {
        return (StatusCode::BAD_REQUEST, "give the record key as ?key=\n").into_response();
    };
    match ops::history(&engine.pool, &key).await {
        Ok(lines) => Json(HistoryView { key, lines }).into_response(),
        Err(e) => unavailable(e),
    }
}

/// Why the request may not act (`None`: it may): a token is configured and the request sends it as
/// `Authorization: Bearer <token>`. The answer never repeats what was sent.
fn denied(engine: &Engine, headers: &HeaderMap) -> Option<Response> {
    let Some(token) = &engine.settings.http_token else {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "actions are disabled: the worker has no COURIER_HTTP_TOKEN\n",
            )
                .into_response(),
        );
    };
    let offered = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match offered {
        Some(t) if token.matches(t) => None,
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "send the worker's COURIER_HTTP_TOKEN as Authorization: Bearer <token>\n",
            )
                .into_response(),
        ),
    }
}

/// An action's answer: what it changed, or why it could not.
fn answer(what: String, result: Result<String, OpsError>) -> Response {
    match result {
        Ok(done) => {
            tracing::info!(action = %what, result = %done, "dashboard action");
            format!("{what}: {done}\n").into_response()
        }
        Err(e @ OpsError::NotFound { .. }) => {
            (StatusCode::NOT_FOUND, format!("{e}\n")).into_response()
        }
        Err(e @ OpsError::Invalid(_)) => {
            (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
        }
        Err(e) => unavailable(e),
    }
}

/// The query of a retry: which outcome (`exhausted`, the default, or `rejected`), and
/// optionally only those that ended at or after `since` (RFC 3339).
#[derive(Debug, Default, Deserialize)]
pub struct RetryQuery {
    /// `exhausted` or `rejected`.
    pub outcome: Option<String>,
    /// Only deliveries that ended at or after this time.
    pub since: Option<DateTime<Utc>>,
}

async fn retry_rule(
    State(engine): State<Arc<Engine>>,
    Path(name): Path<String>,
    Query(q): Query<RetryQuery>,
    headers: HeaderMap,
) -> Response {
    if let Some(denied) = denied(&engine, &headers) {
        return denied;
    }
    let outcome = match q.outcome.as_deref().unwrap_or("exhausted") {
        "exhausted" => Outcome::Exhausted,
        "rejected" => Outcome::Rejected,
        other => {
            return (
                StatusCode::BAD_REQUEST,
                format!("outcome must be exhausted or rejected, not {other:?}\n"),
            )
                .into_response();
        }
    };
    let done = ops::retry_as(&engine.pool, &name, &[outcome], q.since, ACTOR)
        .await
        .map(|n| format!("{n} {} deliveries made pending again", outcome.as_str()));
    answer(format!("rule {name}"), done)
}

async fn pause(
    engine: &Engine,
    headers: &HeaderMap,
    rule: Option<&str>,
    connection: Option<&str>,
    paused: bool,
) -> Response {
    if let Some(denied) = denied(engine, headers) {
        return denied;
    }
    match (rule, connection) {
        (Some(r), _) => answer(
            format!("rule {r}"),
            ops::set_rule_paused(&engine.pool, r, paused)
                .await
                .map(|c| c.to_string()),
        ),
        (_, Some(c)) => answer(
            format!("connection {c}"),
            ops::set_connection_paused(&engine.pool, c, paused)
                .await
                .map(|c| c.to_string()),
        ),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn pause_rule(
    State(e): State<Arc<Engine>>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Response {
    pause(&e, &h, Some(&name), None, true).await
}

async fn resume_rule(
    State(e): State<Arc<Engine>>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Response {
    pause(&e, &h, Some(&name), None, false).await
}

async fn pause_connection(
    State(e): State<Arc<Engine>>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Response {
    pause(&e, &h, None, Some(&name), true).await
}

async fn resume_connection(
    State(e): State<Arc<Engine>>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Response {
    pause(&e, &h, None, Some(&name), false).await
}

async fn unblock_connection(
    State(engine): State<Arc<Engine>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(denied) = denied(&engine, &headers) {
        return denied;
    }
    let done = ops::unblock_connection(&engine.pool, &name)
        .await
        .map(|n| match n {
            0 => "no block in force".to_owned(),
            _ => "block lifted".to_owned(),
        });
    answer(format!("connection {name}"), done)
}
