//! `courier target`: a local HTTP server that behaves like the CRM targets its emulation
//! files describe (`presets/<name>.target.json`), for the demo, the tests and benchmarks.
//! It binds to loopback by default.
//!
//! - **Workspaces** (tenants) are told apart by the Host subdomain (`shop.localhost`
//!   serves `/<prefix>...` of workspace `shop`) or by a path prefix (`/ws/shop/<prefix>...`),
//!   where the prefix and the API are an emulation file's `workspace` ([`operations`]).
//!   Each checks `Authorization: Token <token>` (401 as the API answers it), has its own
//!   rate limiter ([`limiter`], default 10 requests/s: a fixed or sliding window, GCRA
//!   with no burst, or a token bucket) answering 429 with `retry-after` in whole seconds
//!   rounded up (or an HTTP-date, or no header), optionally states what it has left in
//!   rate-limit headers ([`RateHeaders`]: the IETF draft's, `X-RateLimit-*`, or those an
//!   emulation file names), and keeps what its API stored ([`workspace`]).
//! - The **limit changes while running**, as when another client starts using the
//!   workspace: on a schedule ([`TargetConfig::limit_schedule`]), from Rust
//!   ([`Target::set_limit`]) or over HTTP (`POST /_limit` or `/ws/<name>/_limit` with
//!   `{"limit": N}`; `GET` reads the limits in force).
//! - Any other path keeps the generic behaviour the `http_json` writer's tests rely on: a
//!   JSON POST is accepted and counted per `Idempotency-Key`.
//! - A **batch sink** ([`batch_sink`]): a call of many records (a JSON array, or an
//!   object with one array field) on a path a batch endpoint serves, at the root or in a
//!   workspace (then behind its token and limiter), answered as that endpoint answers:
//!   the sink's own styles under `batch/<style>/` (`per-item`, `all-or-nothing`, `keyed`,
//!   `positional`, `indexed`, `unmapped`, `limit-exceeded`) or a vendor's, as each
//!   preset's `presets/<name>.target.json` says ([`vendors`]). An item with
//!   `"invalid": true` is refused. Accepted items count per delivery, from the call's
//!   `Idempotency-Key` (`courier-12,13,17`).
//! - **Faults** on demand, for every path: a share of 500/502/504, a uniform latency
//!   range, hangs past the client's timeout, connection resets (the connection is closed
//!   without an answer). [`Target::respond_with`] forces one status for every request.
//! - **Counters** at `GET /_counters` and `GET /ws/<name>/_counters` (JSON).
//!
//! # Layout
//! - this file: configuration, the state, the [`Target`] handle and its counters.
//! - `server`: the accept loop (a hyper loop around an axum router, so a handler can ask
//!   for its connection to be dropped), routing, what every answer shares.
//! - [`faults`]: the faults injected on demand (errors, latency, hangs, resets, a forced
//!   status), as a proxy in front of the app would add them.
//! - [`limiter`]: the rate limiter kinds, the rate-limit headers and the peak meter, with
//!   time as a parameter.
//! - [`workspace`]: one workspace: its token, limiter, counters and stored data.
//! - [`operations`]: a workspace's API, answered as the emulation file's `workspace` says.
//! - [`emulation`]: the emulation files' format (data), parsed once.
//! - [`vendors`]: the batch sink, answering as the emulation files say.
//! - [`jobs`]: asynchronous bulk jobs, run as the emulation files' `jobs` say.
//! - [`erase`]: a vendor's erasure of a person (and the lookup of the id it erases by),
//!   done on the people its endpoints keep, as the emulation files' `erase` say.

pub mod emulation;
pub mod erase;
pub mod faults;
pub mod jobs;
pub mod limiter;
pub mod operations;
mod server;
pub mod vendors;
pub mod workspace;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::Router;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

pub use faults::{Faults, parse_latency_ms};
pub use limiter::{
    Budget, Limiter, PathLimit, PeakMeter, RateHeaders, Window, parse_limit_schedule,
};
pub use operations::{DELIVERY_ID_FIELD, Reply, WorkspaceData};
pub use vendors::{BatchReply, ContactBook, batch_sink};
pub use workspace::{WorkspaceConfig, WorkspaceCounters};

/// Requests per period a workspace allows unless configured (10 a second).
pub const DEFAULT_RATE: u32 = 10;
/// The limiter's period.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);
/// How long a hanging request hangs unless configured: past any sane client timeout.
pub const DEFAULT_HANG: Duration = Duration::from_secs(120);
/// Requests kept in the log [`Target::requests`] returns (the oldest are dropped).
pub const REQUEST_LOG_LIMIT: usize = 10_000;
/// Accepted writes kept in the log [`Target::accepted_log`] returns (the oldest are
/// dropped).
pub const ACCEPTED_LOG_LIMIT: usize = 200_000;

/// What a 429 says about when to come back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryAfterMode {
    /// `retry-after: N`, whole seconds rounded up (as Django REST Framework's throttle).
    #[default]
    Seconds,
    /// `retry-after: <HTTP-date>` of the moment the limiter admits again (rounded up).
    HttpDate,
    /// No header at all.
    None,
}

impl std::str::FromStr for RetryAfterMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "seconds" => Ok(Self::Seconds),
            "http-date" => Ok(Self::HttpDate),
            "none" => Ok(Self::None),
            other => Err(format!(
                "retry-after must be seconds, http-date or none, not {other:?}"
            )),
        }
    }
}

/// How a target is set up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetConfig {
    /// Address to bind: loopback unless told otherwise.
    pub bind: IpAddr,
    /// Port (0 picks a free one).
    pub port: u16,
    /// The workspaces it serves.
    pub workspaces: Vec<WorkspaceConfig>,
    /// Requests per period each workspace allows.
    pub rate: u32,
    /// The limiter's period.
    pub period: Duration,
    /// The limiter's kind.
    pub window: Window,
    /// The burst of a GCRA or token bucket limiter (`None`: GCRA none, token bucket one
    /// period's worth).
    pub burst: Option<u32>,
    /// Changes of every workspace's limit, each `(after, limit)`: from `after` since the
    /// start, `limit` per period.
    pub limit_schedule: Vec<(Duration, u32)>,
    /// The rate-limit headers every workspace's answers carry.
    pub rate_headers: RateHeaders,
    /// What a 429 says about when to come back.
    pub retry_after: RetryAfterMode,
    /// Faults injected from the start.
    pub faults: Faults,
    /// Limits of paths outside the workspaces, each answered 429 with `Retry-After` in
    /// whole seconds when spent.
    pub path_limits: Vec<PathLimit>,
}

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            workspaces: Vec::new(),
            rate: DEFAULT_RATE,
            period: DEFAULT_PERIOD,
            window: Window::Fixed,
            burst: None,
            limit_schedule: Vec::new(),
            rate_headers: RateHeaders::None,
            retry_after: RetryAfterMode::Seconds,
            faults: Faults::default(),
            path_limits: Vec::new(),
        }
    }
}

/// One request as the target received it (for tests to assert on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The workspace it addressed, if any.
    pub workspace: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Path as received (still percent-encoded).
    pub path: String,
    /// Headers, names lowercased (the target's tokens are fake, so they are kept).
    pub headers: BTreeMap<String, String>,
    /// The body, parsed when it is JSON, else as a string.
    pub body: serde_json::Value,
}

/// One accepted (2xx) write: its key and when its request arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedWrite {
    /// When the request arrived (before any injected latency).
    pub arrived: Instant,
    /// The key it was accepted under (see [`Target::accepted`]).
    pub key: String,
}

/// Shared state of a running target.
pub struct TargetState {
    /// Status code every request is answered with (0 means: handle normally).
    status: AtomicU16,
    /// `retry-after` value sent with a forced 429 (empty: no header).
    retry_after: Mutex<String>,
    /// Latency added to every answer, in milliseconds.
    latency_ms: AtomicU64,
    /// Requests received.
    requests: AtomicU64,
    /// Requests in progress.
    in_flight: AtomicUsize,
    /// The most requests in progress at once.
    max_in_flight: AtomicUsize,
    /// Accepted (2xx) writes per key: `Idempotency-Key` on generic paths, record keys of
    /// the workspaces' endpoints.
    accepted: Mutex<HashMap<String, u32>>,
    /// Every accepted write in arrival order, with its arrival time.
    accepted_log: Mutex<VecDeque<AcceptedWrite>>,
    /// Requests per path.
    paths: Mutex<HashMap<String, u64>>,
    /// Faults in force.
    faults: Mutex<Faults>,
    /// Workspaces, peaks and the request log, behind one lock (held only briefly).
    inner: Mutex<Inner>,
    /// What workspace 429s say about when to come back.
    retry_after_mode: Mutex<RetryAfterMode>,
    /// OAuth 2 tokens granted by `/oauth/token` so far, and the first still valid (those
    /// granted before a revocation are not).
    tokens: Mutex<(u64, u64)>,
    /// Asynchronous bulk jobs submitted ([`jobs`]).
    jobs: Mutex<jobs::Jobs>,
    /// The limiters of [`TargetConfig::path_limits`], by pattern.
    path_limiters: Mutex<Vec<(String, Vec<Limiter>)>>,
    /// Polls of a job's status answered.
    job_polls: AtomicU64,
    /// The people the vendors' emulated endpoints keep ([`vendors::ContactBook`]).
    contacts: Mutex<vendors::ContactBook>,
    /// The limiters of the erase calls that state limits of their own ([`erase`]).
    erase_limiters: Mutex<erase::EraseLimiters>,
}

/// The parts of the state changed together.
struct Inner {
    /// Workspaces by name.
    workspaces: BTreeMap<String, workspace::Workspace>,
    /// Peak rates over every request.
    peaks: PeakMeter,
    /// 429s answered (forced or by a limiter).
    throttled: u64,
    /// Faults injected.
    faults: u64,
    /// The most recent requests.
    log: VecDeque<RecordedRequest>,
}

/// What `GET /_counters` reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
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
    /// 429s answered.
    pub throttled: u64,
    /// Faults injected (5xx, resets, hangs).
    pub faults: u64,
    /// Most requests seen in any sliding second.
    pub peak_per_second: u64,
    /// Most requests seen in any sliding minute.
    pub peak_per_minute: u64,
    /// Per workspace.
    pub workspaces: BTreeMap<String, WorkspaceCounters>,
}

/// Set on a response to make the server close the connection instead of answering.
#[derive(Clone, Copy, Debug)]
struct DropConnection;

/// A target listening on a loopback port.
#[derive(Clone)]
pub struct Target {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state, shared with the server task.
    pub state: Arc<TargetState>,
}

impl Target {
    /// Starts a target with no workspaces on `127.0.0.1:port` (0 picks a free port).
    pub async fn start(port: u16) -> std::io::Result<Self> {
        Self::start_with(TargetConfig {
            port,
            ..TargetConfig::default()
        })
        .await
    }

    /// Starts a target as configured.
    pub async fn start_with(config: TargetConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind((config.bind, config.port)).await?;
        let addr = listener.local_addr()?;
        let started = Instant::now();
        let workspaces = config
            .workspaces
            .iter()
            .map(|w| {
                let limiter = Limiter::new(config.rate, config.period, config.window)
                    .with_burst(config.burst)
                    .with_schedule(
                        config
                            .limit_schedule
                            .iter()
                            .map(|&(after, limit)| (started + after, limit)),
                    );
                let mut workspace = workspace::Workspace::new(w.clone(), limiter);
                workspace.rate_headers = config.rate_headers;
                (w.name.clone(), workspace)
            })
            .collect();
        let state = Arc::new(TargetState {
            status: AtomicU16::new(0),
            retry_after: Mutex::new(String::new()),
            latency_ms: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            accepted: Mutex::new(HashMap::new()),
            accepted_log: Mutex::new(VecDeque::new()),
            paths: Mutex::new(HashMap::new()),
            faults: Mutex::new(config.faults.clone()),
            inner: Mutex::new(Inner {
                workspaces,
                peaks: PeakMeter::default(),
                throttled: 0,
                faults: 0,
                log: VecDeque::new(),
            }),
            retry_after_mode: Mutex::new(config.retry_after),
            tokens: Mutex::new((0, 1)),
            jobs: Mutex::new(jobs::Jobs::default()),
            path_limiters: Mutex::new(
                config
                    .path_limits
                    .iter()
                    .map(|p| (p.pattern.clone(), p.limiters()))
                    .collect(),
            ),
            job_polls: AtomicU64::new(0),
            contacts: Mutex::new(vendors::ContactBook::default()),
            erase_limiters: Mutex::new(erase::EraseLimiters::default()),
        });
        let app = Router::new()
            .fallback(server::handle)
            .with_state(state.clone());
        tokio::spawn(server::serve(listener, app));
        Ok(Self { addr, state })
    }

    /// The base URL to give an `http_json` connection.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The base URL of workspace `name`'s API (path-prefix form).
    pub fn workspace_url(&self, name: &str) -> String {
        let prefix = operations::workspace_api().map_or("", |a| a.prefix.as_str());
        format!("http://{}/ws/{name}/{prefix}", self.addr)
    }

    /// Answers every following request with `status` (429s carry `retry_after` if given);
    /// 0 or 200 goes back to normal handling.
    pub fn respond_with(&self, status: u16, retry_after: Option<&str>) {
        let status = if status == 200 { 0 } else { status };
        self.state.status.store(status, Ordering::SeqCst);
        *lock(&self.state.retry_after) = retry_after.unwrap_or_default().to_owned();
    }

    /// Keeps records of these keys in `store` of `workspace` (with no fields), as if
    /// created earlier: the state a bulk change of existing records starts from.
    pub fn seed_records(
        &self,
        workspace: &str,
        store: &str,
        keys: impl IntoIterator<Item = String>,
    ) {
        let mut inner = lock(&self.state.inner);
        if let Some(w) = inner.workspaces.get_mut(workspace) {
            for key in keys {
                w.seed(store, &key);
            }
        }
    }

    /// Keeps these people in a vendor's `store` (an emulation's `contacts.store`), each by key (an e-mail), as if
    /// created earlier: a customer the target already knows.
    pub fn seed_contacts(&self, store: &str, keys: impl IntoIterator<Item = String>) {
        let mut book = lock(&self.state.contacts);
        for key in keys {
            book.put(store, &key, serde_json::json!({}));
        }
    }

    /// The people a vendor's `store` holds: each key (lower case) and the last record
    /// written for them.
    pub fn contacts(&self, store: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
        lock(&self.state.contacts).people(store)
    }

    /// Adds `latency` before every answer.
    pub fn set_latency(&self, latency: Duration) {
        self.state
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Changes how the asynchronous jobs submitted from now on run.
    pub fn set_jobs(&self, config: jobs::JobsConfig) {
        lock(&self.state.jobs).config = config;
    }

    /// Polls of a job's status answered so far.
    pub fn job_polls(&self) -> u64 {
        self.state.job_polls.load(Ordering::SeqCst)
    }

    /// Replaces the faults in force.
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.state.faults) = faults;
    }

    /// Changes what workspace 429s say about when to come back.
    pub fn set_retry_after(&self, mode: RetryAfterMode) {
        *lock(&self.state.retry_after_mode) = mode;
    }

    /// Changes the limit per period of workspace `name` (every workspace when `None`) from
    /// now on; answers how many workspaces it changed.
    pub fn set_limit(&self, name: Option<&str>, limit: u32) -> usize {
        server::set_limits(&self.state, name, limit)
    }

    /// Changes which rate-limit headers workspace `name` (every workspace when `None`)
    /// sends; answers how many workspaces it changed.
    pub fn set_rate_headers(&self, name: Option<&str>, mode: RateHeaders) -> usize {
        let mut inner = lock(&self.state.inner);
        let mut changed = 0;
        for (_, w) in inner
            .workspaces
            .iter_mut()
            .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
        {
            w.rate_headers = mode;
            changed += 1;
        }
        changed
    }

    /// OAuth 2 tokens granted so far by `/oauth/token`.
    pub fn tokens_granted(&self) -> u64 {
        lock(&self.state.tokens).0
    }

    /// Revokes every token granted so far: paths naming `oauth-protected` answer 401 to
    /// them until a new one is granted.
    pub fn revoke_tokens(&self) {
        let mut t = lock(&self.state.tokens);
        t.1 = t.0 + 1;
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        server::snapshot(&self.state)
    }

    /// How many times the write with this key was accepted: an `Idempotency-Key` on a
    /// generic path, or a workspace record key such as `user:<custom_id>` or
    /// `event:<delivery id>`.
    pub fn accepted(&self, key: &str) -> u32 {
        lock(&self.state.accepted).get(key).copied().unwrap_or(0)
    }

    /// The most recent accepted writes (at most [`ACCEPTED_LOG_LIMIT`]), each with the time
    /// its request arrived, in the order they were accepted: when each record arrived, and
    /// when a duplicate did.
    pub fn accepted_log(&self) -> Vec<AcceptedWrite> {
        lock(&self.state.accepted_log).iter().cloned().collect()
    }

    /// Requests in progress now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// The most recent requests received, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.inner).log.iter().cloned().collect()
    }

    /// What workspace `name` stored so far.
    pub fn workspace_data(&self, name: &str) -> Option<WorkspaceData> {
        lock(&self.state.inner)
            .workspaces
            .get(name)
            .map(|w| w.data.clone())
    }
}

/// Locks a mutex, recovering from a poisoned one (a panicking handler must not stop the
/// target's counters).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
