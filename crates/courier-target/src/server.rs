//! The server: the accept loop (a hyper loop around an axum router, so a handler can ask
//! for its connection to be dropped), routing each request to the counters, the limits,
//! OAuth, a workspace, a job, the batch sink or the generic sink, and what every answer
//! shares (JSON replies, 429s, the accepted-write log).

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant, SystemTime},
};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::*;

/// Sets the limit of workspace `name` (all when `None`); answers how many it changed.
pub(crate) fn set_limits(s: &TargetState, name: Option<&str>, limit: u32) -> usize {
    let now = Instant::now();
    let mut inner = lock(&s.inner);
    let mut changed = 0;
    for (_, w) in inner
        .workspaces
        .iter_mut()
        .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
    {
        w.limiter.set_limit(limit, now);
        changed += 1;
    }
    changed
}

/// `GET`/`POST /_limit` and `/ws/<name>/_limit`: reads the limits in force, or sets them
/// from `{"limit": N}`.
fn limit_route(s: &TargetState, method: &Method, name: Option<&str>, body: &[u8]) -> Response {
    if *method == Method::POST || *method == Method::PUT {
        let limit = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("limit").and_then(serde_json::Value::as_u64));
        match limit {
            Some(limit @ 1..=1_000_000) => {
                set_limits(s, name, limit as u32);
            }
            _ => {
                return json_reply(
                    400,
                    serde_json::json!({"limit": ["must be a whole number from 1 to 1000000, as {\"limit\": N}"]}),
                );
            }
        }
    } else if *method != Method::GET {
        return json_reply(405, serde_json::json!({"detail": "GET or POST only."}));
    }
    let inner = lock(&s.inner);
    let limits: BTreeMap<&String, u32> = inner
        .workspaces
        .iter()
        .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
        .map(|(n, w)| (n, w.limiter.limit()))
        .collect();
    Json(limits).into_response()
}

/// Accepts connections and serves each with hyper, so that a response marked
/// [`DropConnection`] closes the connection without an answer.
pub(crate) async fn serve(listener: TcpListener, app: Router) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(error = %e, "target: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let mut app = app.clone();
                async move {
                    let response = match tower::Service::call(&mut app, req).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    };
                    if response.extensions().get::<DropConnection>().is_some() {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "injected connection reset",
                        ))
                    } else {
                        Ok(response)
                    }
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

pub(crate) fn snapshot(s: &TargetState) -> Counters {
    let (accepted_keys, duplicates) = {
        let accepted = lock(&s.accepted);
        (
            accepted.len(),
            accepted
                .values()
                .map(|&n| u64::from(n.saturating_sub(1)))
                .sum(),
        )
    };
    let inner = lock(&s.inner);
    Counters {
        requests: s.requests.load(Ordering::SeqCst),
        max_in_flight: s.max_in_flight.load(Ordering::SeqCst),
        accepted_keys,
        duplicates,
        paths: lock(&s.paths).clone(),
        throttled: inner.throttled,
        faults: inner.faults,
        peak_per_second: inner.peaks.per_second,
        peak_per_minute: inner.peaks.per_minute,
        workspaces: inner
            .workspaces
            .iter()
            .map(|(n, w)| (n.clone(), w.snapshot()))
            .collect(),
    }
}

/// Counts a request in flight until dropped (also when the client gives up and the
/// handler is cancelled).
pub(crate) struct InFlight<'a>(&'a TargetState);

impl<'a> InFlight<'a> {
    pub(crate) fn enter(s: &'a TargetState) -> Self {
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(s)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a request goes.
enum Route {
    /// Counters of the whole target or of one workspace.
    Counters(Option<String>),
    /// The limits of every workspace or of one.
    Limit(Option<String>),
    /// A workspace's API: its name and the path after the API's prefix.
    Workspace(String, String),
    /// `/ws/<name>/...` naming no workspace.
    UnknownWorkspace,
    /// Anything else: the generic JSON sink.
    Generic,
}

fn route(inner: &Inner, path: &str, host: Option<&str>) -> Route {
    if path == "/_counters" {
        return Route::Counters(None);
    }
    if path == "/_limit" {
        return Route::Limit(None);
    }
    if let Some(rest) = path.strip_prefix("/ws/") {
        let (name, rest) = rest.split_once('/').unwrap_or((rest, ""));
        if !inner.workspaces.contains_key(name) {
            return Route::UnknownWorkspace;
        }
        if rest == "_counters" {
            return Route::Counters(Some(name.to_owned()));
        }
        if rest == "_limit" {
            return Route::Limit(Some(name.to_owned()));
        }
        let prefix = operations::workspace_api().map_or("", |a| a.prefix.as_str());
        return match rest.strip_prefix(prefix).filter(|_| !prefix.is_empty()) {
            Some(api) => Route::Workspace(name.to_owned(), api.to_owned()),
            None => Route::Workspace(name.to_owned(), format!("/{rest}")),
        };
    }
    let subdomain = host
        .and_then(|h| h.split_once('.'))
        .map(|(first, _)| first)
        .filter(|name| inner.workspaces.contains_key(*name));
    let prefix = operations::workspace_api().map(|a| a.prefix.as_str());
    let api = prefix.and_then(|p| path.strip_prefix('/')?.strip_prefix(p));
    match (subdomain, api) {
        (Some(name), Some(api)) => Route::Workspace(name.to_owned(), api.to_owned()),
        _ => Route::Generic,
    }
}

pub(crate) fn json_reply(status: u16, body: serde_json::Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

/// The DRF throttle message.
fn throttled_detail(secs: u64) -> serde_json::Value {
    let unit = if secs == 1 { "second" } else { "seconds" };
    serde_json::json!({
        "detail": format!("Request was throttled. Expected available in {secs} {unit}.")
    })
}

/// A 429 for a wait of `wait`, in the given mode.
pub(crate) fn throttled_response(wait: Duration, mode: RetryAfterMode) -> Response {
    let body = throttled_detail(limiter::whole_seconds_up(wait));
    throttled_with(wait, mode, 429, body)
}

/// An answer of `status` and `body` to a call past a limit, for a wait of `wait`: its
/// `retry-after` in the given mode.
fn throttled_with(
    wait: Duration,
    mode: RetryAfterMode,
    status: u16,
    body: serde_json::Value,
) -> Response {
    let secs = limiter::whole_seconds_up(wait);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let body = Json(body);
    let header = match mode {
        RetryAfterMode::Seconds => Some(secs.to_string()),
        RetryAfterMode::HttpDate => {
            // The first whole second at or after the moment the limiter admits again, so
            // a client never computes a shorter wait than the real one.
            let at = SystemTime::now() + wait;
            let since = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            let up = Duration::from_secs(since.as_secs() + u64::from(since.subsec_nanos() > 0));
            Some(httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + up))
        }
        RetryAfterMode::None => None,
    };
    match header {
        Some(v) => (status, [("retry-after", v)], body).into_response(),
        None => (status, body).into_response(),
    }
}

pub(crate) async fn handle(
    State(s): State<Arc<TargetState>>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok());
    let path = uri.path().to_owned();
    let route = route(&lock(&s.inner), &path, host);
    if let Route::Counters(name) = &route {
        let counters = snapshot(&s);
        return match name {
            None => Json(counters).into_response(),
            Some(n) => {
                Json(counters.workspaces.get(n).cloned().unwrap_or_default()).into_response()
            }
        };
    }
    if let Route::Limit(name) = &route {
        return limit_route(&s, &method, name.as_deref(), &body);
    }

    if let Some(answer) = oauth(&s, &path, &headers, &body) {
        return answer;
    }
    let arrived = Instant::now();
    let workspace = match &route {
        Route::Workspace(name, _) => Some(name.clone()),
        _ => None,
    };
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    record_arrival(
        &s,
        workspace.as_deref(),
        &method,
        &path,
        &headers,
        &parsed,
        &body,
    );
    if let Some(faulted) = faults::injected(&s, workspace.as_deref()).await {
        return faulted;
    }
    match route {
        Route::Counters(_) | Route::Limit(_) => Json(snapshot(&s)).into_response(),
        Route::UnknownWorkspace => {
            json_reply(404, serde_json::json!({"detail": "Unknown workspace."}))
        }
        Route::Generic => {
            let r = jobs::Request {
                method: &method,
                path: &path,
                query: uri.query(),
                headers: &headers,
                body: &body,
                arrived,
            };
            outside_workspaces(&s, &r, parsed.as_ref())
        }
        Route::Workspace(name, api) => {
            let call = WorkspaceCall {
                method: &method,
                api: &api,
                headers: &headers,
                body: parsed.as_ref(),
                empty: body.is_empty(),
                arrived,
            };
            workspace_call(&s, &name, call)
        }
    }
}

/// The answer to a request outside the workspaces: past a spent path limit, a 429; else
/// as an emulated job, the batch sink or the generic sink answers it.
fn outside_workspaces(
    s: &TargetState,
    r: &jobs::Request<'_>,
    parsed: Option<&serde_json::Value>,
) -> Response {
    if let Some(wait) = path_limited(s, r.path) {
        lock(&s.inner).throttled += 1;
        return throttled_response(wait, RetryAfterMode::Seconds);
    }
    if let Some(answer) = jobs::answer(s, r) {
        return answer;
    }
    if let Some(answer) = erase_call(s, r, parsed) {
        return answer;
    }
    match parsed.and_then(|b| sink(s, r.path, b, r.headers)) {
        Some(batch) => batch.answer(s, r.arrived),
        None => generic(s, r.headers, parsed.is_some(), r.arrived),
    }
}

/// The answer to an emulated erase call ([`erase`]), or `None` when `r` is none: the
/// people it names removed from (or found in) the target's book, under its lock.
fn erase_call(
    s: &TargetState,
    r: &jobs::Request<'_>,
    parsed: Option<&serde_json::Value>,
) -> Option<Response> {
    let call = erase::EraseRequest {
        method: r.method.as_str(),
        path: r.path,
        query: r.query,
        body: parsed,
    };
    let reply = {
        let mut book = lock(&s.contacts);
        let mut limiters = lock(&s.erase_limiters);
        erase::answer(&mut book, &mut limiters, &call, Instant::now())?
    };
    Some(match reply {
        erase::EraseReply::Throttled(wait) => {
            lock(&s.inner).throttled += 1;
            throttled_response(wait, RetryAfterMode::Seconds)
        }
        erase::EraseReply::Answer(status, body) => maybe_empty(status, body),
    })
}

/// An answer of `status` with `body`, none when it is null.
fn maybe_empty(status: u16, body: serde_json::Value) -> Response {
    if body.is_null() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NO_CONTENT);
        return status.into_response();
    }
    json_reply(status, body)
}

/// The batch sink's answer to a call on `path`, the people it wrote kept in the target's
/// book (under its lock, so calls naming the same person apply in turn).
fn sink(
    s: &TargetState,
    path: &str,
    body: &serde_json::Value,
    headers: &HeaderMap,
) -> Option<crate::BatchReply> {
    let mut book = lock(&s.contacts);
    let reply = batch_sink(path, body, headers, &book)?;
    for (store, key, item) in &reply.stored {
        book.put(store, key, item.clone());
    }
    Some(reply)
}

/// The wait before `path` may be called again, when a path limit it falls under is spent
/// ([`TargetConfig::path_limits`]); `None`: it may go (and is counted).
fn path_limited(s: &TargetState, path: &str) -> Option<Duration> {
    let now = Instant::now();
    let mut limiters = lock(&s.path_limiters);
    let (_, limiters) = limiters
        .iter_mut()
        .find(|(pattern, _)| vendors::path_matches(pattern, path))?;
    // Every window must admit it; one that refuses counts nothing in the others.
    let mut probe = limiters.clone();
    let wait = probe.iter_mut().filter_map(|l| l.check(now).err()).max();
    if wait.is_none() {
        *limiters = probe;
    }
    wait
}

/// Counts a request that is not the target's own (counters, limits) and keeps it in the
/// log: per path, per workspace, the peaks.
fn record_arrival(
    s: &TargetState,
    workspace: Option<&str>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    parsed: &Option<serde_json::Value>,
    body: &[u8],
) {
    s.requests.fetch_add(1, Ordering::SeqCst);
    *lock(&s.paths).entry(path.to_owned()).or_default() += 1;
    let now = Instant::now();
    let mut inner = lock(&s.inner);
    inner.peaks.record(now);
    if let Some(w) = workspace.and_then(|n| inner.workspaces.get_mut(n)) {
        w.peaks.record(now);
        w.counters.requests += 1;
    }
    if inner.log.len() >= REQUEST_LOG_LIMIT {
        inner.log.pop_front();
    }
    inner.log.push_back(RecordedRequest {
        workspace: workspace.map(str::to_owned),
        method: method.to_string(),
        path: path.to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: parsed
            .clone()
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned().into()),
    });
}

/// One API call to a workspace, as it arrived.
struct WorkspaceCall<'a> {
    method: &'a Method,
    /// The path after `api/public/`.
    api: &'a str,
    headers: &'a HeaderMap,
    /// The body, when it is JSON.
    body: Option<&'a serde_json::Value>,
    /// Whether it came without a body (a `DELETE`): its operation sees a null one.
    empty: bool,
    arrived: Instant,
}

/// A workspace's answer: its token, then its limiter (the rate-limit headers state what
/// it has left at the instant it admits or refuses, so they say exactly what the next
/// request meets), then the batch sink or the workspace's API ([`operations`]).
fn workspace_call(s: &TargetState, name: &str, call: WorkspaceCall<'_>) -> Response {
    let authorization = call
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let mode = *lock(&s.retry_after_mode);
    let mut inner = lock(&s.inner);
    let inner = &mut *inner;
    let Some(w) = inner.workspaces.get_mut(name) else {
        return json_reply(404, serde_json::json!({"detail": "Unknown workspace."}));
    };
    if let Some(reply) = w.authenticate(authorization) {
        w.counters.unauthorized += 1;
        let mut r = json_reply(reply.status, reply.body);
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Token"),
        );
        return r;
    }
    let now = Instant::now();
    let admitted = w.limiter.check(now);
    let stated = limiter::rate_headers(&w.limiter.budget(now), w.rate_headers, SystemTime::now());
    let mut response = if let Err(wait) = admitted {
        w.counters.throttled += 1;
        inner.throttled += 1;
        match w.throttled(limiter::whole_seconds_up(wait)) {
            Some(reply) => throttled_with(wait, mode, reply.status, reply.body),
            None => throttled_response(wait, mode),
        }
    } else if let Some(batch) = call.body.and_then(|b| sink(s, call.api, b, call.headers)) {
        for key in &batch.accepted {
            *w.counters.accepted.entry(key.clone()).or_default() += 1;
        }
        batch.answer(s, call.arrived)
    } else if let Some(body) = call.body.or(call.empty.then_some(&serde_json::Value::Null)) {
        let reply = w.apply(call.method.as_str(), call.api, body);
        for key in &reply.accepted {
            accept(s, key, call.arrived);
        }
        maybe_empty(reply.status, reply.body)
    } else {
        let reply = w.not_json();
        json_reply(reply.status, reply.body)
    };
    for (name, value) in stated {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::try_from(name),
            axum::http::HeaderValue::try_from(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// OAuth 2 client credentials: the token endpoint's answer, or a 401 to a path naming
/// `oauth-protected` without a token granted since the last revocation; `None` otherwise.
fn oauth(s: &TargetState, path: &str, headers: &HeaderMap, body: &[u8]) -> Option<Response> {
    if path.ends_with("/oauth/token") || path.ends_with("/oauth2/token") {
        return Some(token_grant(s, headers, body));
    }
    if !path.contains("/oauth-protected/") {
        return None;
    }
    let (granted, first_valid) = *lock(&s.tokens);
    let sent = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer tok-"))
        .and_then(|n| n.parse::<u64>().ok());
    if sent.is_some_and(|n| n >= first_valid && n <= granted) {
        return None;
    }
    s.requests.fetch_add(1, Ordering::SeqCst);
    Some(json_reply(
        401,
        serde_json::json!([{"errorCode": "INVALID_SESSION_ID", "message": "Session expired or invalid"}]),
    ))
}

/// `POST .../oauth/token` (or `.../oauth2/token`) with `grant_type=client_credentials`, a `client_id` and a
/// `client_secret` (form fields): a new token `tok-N`, valid an hour, and the instance's URL
/// (this target's, from its `Host`), as Salesforce answers.
fn token_grant(s: &TargetState, headers: &HeaderMap, body: &[u8]) -> Response {
    let form = String::from_utf8_lossy(body);
    let field = |name: &str| {
        form.split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
    };
    if field("grant_type").as_deref() != Some("client_credentials")
        || field("client_id").is_none()
        || field("client_secret").is_none()
    {
        return json_reply(400, serde_json::json!({"error": "invalid_request"}));
    }
    let n = {
        let mut t = lock(&s.tokens);
        t.0 += 1;
        t.0
    };
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1");
    json_reply(
        200,
        serde_json::json!({
            "access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": 3600,
            "instance_url": format!("http://{host}"),
        }),
    )
}

/// The generic sink: any JSON body is accepted and counted per `Idempotency-Key`.
fn generic(s: &TargetState, headers: &HeaderMap, is_json: bool, arrived: Instant) -> Response {
    if !is_json {
        return (StatusCode::BAD_REQUEST, "body is not JSON").into_response();
    }
    if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        accept(s, key, arrived);
    }
    (StatusCode::OK, Json(serde_json::json!({"ok": true}))).into_response()
}

impl BatchReply {
    fn answer(self, s: &TargetState, arrived: Instant) -> Response {
        for key in &self.accepted {
            accept(s, key, arrived);
        }
        if self.body.is_null() {
            let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::NO_CONTENT);
            return status.into_response();
        }
        json_reply(self.status, self.body)
    }
}

/// Counts an accepted write under `key` and logs when its request arrived.
pub(crate) fn accept(s: &TargetState, key: &str, arrived: Instant) {
    *lock(&s.accepted).entry(key.to_owned()).or_default() += 1;
    let mut log = lock(&s.accepted_log);
    if log.len() >= ACCEPTED_LOG_LIMIT {
        log.pop_front();
    }
    log.push_back(AcceptedWrite {
        arrived,
        key: key.to_owned(),
    });
}
