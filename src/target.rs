//! A local HTTP target on loopback, for the demo, the tests and benchmarks. It accepts JSON
//! POSTs on any path and answers with a status chosen at run time (200 by default), after an
//! optional latency; it counts requests, the highest concurrency seen and accepted writes
//! per `Idempotency-Key`, and reports them at `GET /_counters`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::Serialize;
use tokio::net::TcpListener;

/// Shared state of a running target.
#[derive(Default)]
pub struct TargetState {
    /// Status code every request is answered with (0 means 200).
    status: AtomicU16,
    /// `retry-after` value sent with a 429 (empty: no header).
    retry_after: Mutex<String>,
    /// Latency added to every answer, in milliseconds.
    latency_ms: AtomicU64,
    /// Requests received.
    requests: AtomicU64,
    /// Requests in progress, and the most seen at once.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Accepted (2xx) writes per `Idempotency-Key` and per path.
    accepted: Mutex<HashMap<String, u32>>,
    paths: Mutex<HashMap<String, u64>>,
}

/// What `GET /_counters` reports.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Counters {
    /// Requests received.
    pub requests: u64,
    /// Most requests in progress at once.
    pub max_in_flight: usize,
    /// Distinct keys accepted.
    pub accepted_keys: usize,
    /// Accepted writes beyond the first per key.
    pub duplicates: u64,
    /// Requests per path.
    pub paths: HashMap<String, u64>,
}

/// A target listening on a loopback port.
#[derive(Clone)]
pub struct Target {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state, shared with the server task.
    pub state: Arc<TargetState>,
}

impl Target {
    /// Starts a target on `127.0.0.1:port` (0 picks a free port).
    pub async fn start(port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(TargetState::default());
        let app = Router::new()
            .route("/_counters", get(counters))
            .fallback(write)
            .with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, state })
    }

    /// The base URL to give a connection.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Answers every following request with `status` (429s carry `retry_after` if given).
    pub fn respond_with(&self, status: u16, retry_after: Option<&str>) {
        self.state.status.store(status, Ordering::SeqCst);
        *self.state.retry_after.lock().unwrap() = retry_after.unwrap_or_default().to_owned();
    }

    /// Adds `latency` before every answer.
    pub fn set_latency(&self, latency: Duration) {
        self.state
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        snapshot(&self.state)
    }

    /// How many times the write with this idempotency key was accepted.
    pub fn accepted(&self, key: &str) -> u32 {
        self.state
            .accepted
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

fn snapshot(s: &TargetState) -> Counters {
    let accepted = s.accepted.lock().unwrap();
    Counters {
        requests: s.requests.load(Ordering::SeqCst),
        max_in_flight: s.max_in_flight.load(Ordering::SeqCst),
        accepted_keys: accepted.len(),
        duplicates: accepted
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum(),
        paths: s.paths.lock().unwrap().clone(),
    }
}

async fn counters(State(s): State<Arc<TargetState>>) -> Json<Counters> {
    Json(snapshot(&s))
}

async fn write(
    State(s): State<Arc<TargetState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    *s.paths
        .lock()
        .unwrap()
        .entry(uri.path().to_owned())
        .or_default() += 1;
    let latency = s.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let status = match s.status.load(Ordering::SeqCst) {
        0 => StatusCode::OK,
        n => StatusCode::from_u16(n).unwrap_or(StatusCode::OK),
    };
    let response = if serde_json::from_slice::<serde_json::Value>(&body).is_err() {
        (StatusCode::BAD_REQUEST, "body is not JSON").into_response()
    } else if status.is_success() {
        if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
            *s.accepted
                .lock()
                .unwrap()
                .entry(key.to_owned())
                .or_default() += 1;
        }
        (status, Json(serde_json::json!({"ok": true}))).into_response()
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after = s.retry_after.lock().unwrap().clone();
        let body = Json(serde_json::json!({"detail": "Request was throttled."}));
        if retry_after.is_empty() {
            (status, body).into_response()
        } else {
            (status, [("retry-after", retry_after)], body).into_response()
        }
    } else {
        (
            status,
            Json(serde_json::json!({"detail": "injected failure"})),
        )
            .into_response()
    };
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}
