//! The settings tree: `DATABASE_URL` and `COURIER_*` variables from the environment (and a
//! `.env` file), each with a named default, validated once at start. An invalid value is an
//! error that names the setting and says why.

use std::time::Duration;

use thiserror::Error;

pub use crate::db::{
    DEFAULT_DB_CONNECT_TIMEOUT_SECS, DEFAULT_DB_MAX_CONNECTIONS, DEFAULT_DB_STATEMENT_TIMEOUT_SECS,
    redact_url,
};

/// Where courier keeps its state when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/courier";
/// Chain jobs one worker process executes at once.
pub const DEFAULT_WORKER_CONCURRENCY: usize = 16;
/// Chain jobs fetched from the queue in one statement.
pub const DEFAULT_QUEUE_BATCH_SIZE: usize = 16;
/// How often the queue is polled as a safety net: new jobs arrive by NOTIFY, and a job
/// scheduled for later is announced by a timer in the process that scheduled it.
pub const DEFAULT_QUEUE_POLL_MS: u64 = 10_000;
/// The longest the dispatcher sleeps: it is woken by NOTIFY and by a timer set for the
/// next moment something falls due, so this only bounds what nothing announces (a rule
/// enabled by plain SQL).
pub const DEFAULT_DISPATCH_INTERVAL_MS: u64 = 30_000;
/// A run whose heartbeat is older than this is reaped as stale.
pub const DEFAULT_CHAIN_STALE_AFTER_SECS: u64 = 600;
/// How often the reaper looks for stale runs.
pub const DEFAULT_REAPER_INTERVAL_SECS: u64 = 30;
/// Default `COURIER_DEPENDENCY_TIMEOUT_SECONDS`: a delivery whose `depends_on` is still not
/// delivered a day after it was enqueued ends `rejected`.
pub const DEFAULT_DEPENDENCY_TIMEOUT_SECS: u64 = 86_400;
/// Default `COURIER_WORKER_DEAD_AFTER_SECONDS`: a process silent this long is taken for dead
/// and its work resumes elsewhere.
pub const DEFAULT_WORKER_DEAD_AFTER_SECS: u64 = 15;
/// Consecutive unreachable failures that open a connection's circuit.
pub const DEFAULT_BREAKER_FAILURE_THRESHOLD: u32 = 5;
/// How long a circuit stays open the first time.
pub const DEFAULT_BREAKER_COOLDOWN_SECS: u64 = 30;
/// The longest a circuit stays open, however often it reopens.
pub const DEFAULT_BREAKER_MAX_COOLDOWN_SECS: u64 = 600;
/// How long a stopping worker waits for in-flight calls.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// The longest rate-limit wait a chain sits out instead of ending its run as throttled.
pub const DEFAULT_THROTTLE_MAX_WAIT_SECS: u64 = 300;
/// Default `COURIER_RETENTION_DAYS`: delivered and suppressed deliveries, their ledger
/// rows, finished runs and finished queue jobs are removed this many days after they ended.
pub const DEFAULT_RETENTION_DAYS: u64 = 7;
/// Default `COURIER_LOG`: the log filter (tracing `EnvFilter` syntax).
pub const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,apalis=warn";
/// Default `COURIER_HTTP_ADDR`: the worker's metrics and dashboard, on loopback only.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9187";
/// With `COURIER_HTTP_ADDR` unset, the ports a worker tries in turn: the default address's
/// and the ones after it (9187 to 9196), so several workers on one host each serve on a
/// port a Prometheus configuration can name in advance. Past them, any free port.
pub const DEFAULT_HTTP_PORTS: u16 = 10;

/// Where the worker serves `/metrics` and the dashboard (`COURIER_HTTP_ADDR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpAddr {
    /// Unset: [`DEFAULT_HTTP_ADDR`], or when another process holds it the next free of
    /// the [`DEFAULT_HTTP_PORTS`] ports from it, or past them any free port on the same
    /// interface. The address taken is logged and listed by `courier status`.
    Default,
    /// Set by the operator: this address, or the start fails naming it.
    Set(std::net::SocketAddr),
    /// Set empty: nothing is served.
    Off,
}

impl HttpAddr {
    /// The address asked for first (`None`: nothing served).
    pub fn first(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::Default => Some(DEFAULT_HTTP_ADDR.parse().expect("default address parses")),
            Self::Set(addr) => Some(*addr),
            Self::Off => None,
        }
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; colour only when the output is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// Every variable courier's settings are read from ([`Settings::from_lookup`] reads these
/// and no others; a unit test holds it to that). A `COURIER_*` variable in neither this
/// list nor [`TOOLING_VARIABLES`] is warned about at start ([`unknown_variables`]).
pub const KNOWN_VARIABLES: &[&str] = &[
    "DATABASE_URL",
    "COURIER_LOG",
    "COURIER_LOG_FORMAT",
    "COURIER_DB_MAX_CONNECTIONS",
    "COURIER_DB_CONNECT_TIMEOUT_SECONDS",
    "COURIER_DB_STATEMENT_TIMEOUT_SECONDS",
    "COURIER_WORKER_CONCURRENCY",
    "COURIER_QUEUE_BATCH_SIZE",
    "COURIER_QUEUE_POLL_MS",
    "COURIER_DISPATCH_INTERVAL_MS",
    "COURIER_CHAIN_STALE_AFTER_SECONDS",
    "COURIER_REAPER_INTERVAL_SECONDS",
    "COURIER_DEPENDENCY_TIMEOUT_SECONDS",
    "COURIER_WORKER_DEAD_AFTER_SECONDS",
    "COURIER_THROTTLE_MAX_WAIT_SECONDS",
    "COURIER_BREAKER_FAILURE_THRESHOLD",
    "COURIER_BREAKER_COOLDOWN_SECONDS",
    "COURIER_BREAKER_MAX_COOLDOWN_SECONDS",
    "COURIER_SHUTDOWN_TIMEOUT_SECONDS",
    "COURIER_HTTP_ADDR",
    "COURIER_HTTP_TOKEN",
    "COURIER_ERASURE_KEY",
    "COURIER_RETENTION_DAYS",
    "COURIER_RETENTION_SECONDS",
];

/// `COURIER_*` variables that are not settings but are read by courier's tooling: the
/// demo's and the benchmarks' API keys, the tests' server, `scripts/sqlx-prepare`'s server.
pub const TOOLING_VARIABLES: &[&str] = &[
    "COURIER_DEMO_USERCOM_KEY",
    "COURIER_BENCH_USERCOM_KEY",
    "COURIER_TEST_DATABASE_URL",
    "COURIER_TEST_USERCOM_KEY",
    "COURIER_ADMIN_URL",
];
/// The largest value any numeric setting takes (30 days in seconds; far beyond any sane
/// count or duration, and small enough that no time arithmetic overflows).
pub const MAX_SETTING: u64 = 2_592_000;
/// What a waiting chain's wake-up may lag behind its block's end (whole-second
/// scheduling, a busy worker): the wait bound must leave this much of the staleness window.
pub const WAKE_MARGIN: Duration = Duration::from_secs(30);

/// A setting that could not be accepted.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid setting {name}={value:?}: {reason}")]
pub struct ConfigError {
    /// The variable's name, e.g. `COURIER_WORKER_CONCURRENCY`.
    pub name: String,
    /// The value that was given.
    pub value: String,
    /// Why it was refused.
    pub reason: String,
}

/// Everything a courier process can be told from the environment.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `DATABASE_URL`: the PostgreSQL database holding courier's tables and apalis' queue.
    pub database_url: String,
    /// `COURIER_DB_MAX_CONNECTIONS`: size of the process's connection pool.
    pub db_max_connections: u32,
    /// `COURIER_DB_CONNECT_TIMEOUT_SECONDS`: the longest a connect to the database may take.
    pub db_connect_timeout: Duration,
    /// `COURIER_DB_STATEMENT_TIMEOUT_SECONDS`: PostgreSQL's `statement_timeout` on every
    /// connection of the pool.
    pub db_statement_timeout: Duration,
    /// `COURIER_LOG`: the log filter. The binary that installs the log subscriber checks
    /// its syntax and refuses an invalid one.
    pub log_filter: String,
    /// `COURIER_LOG_FORMAT`: `text` (colour only on a terminal) or `json` (one object per
    /// line, for log shippers).
    pub log_format: LogFormat,
    /// `COURIER_WORKER_CONCURRENCY`: chain jobs (one per rule) executed at once.
    pub worker_concurrency: usize,
    /// `COURIER_QUEUE_BATCH_SIZE`: chain jobs fetched per queue poll.
    pub queue_batch_size: usize,
    /// `COURIER_QUEUE_POLL_MS`: safety-net poll of the queue (jobs normally arrive by NOTIFY).
    pub queue_poll: Duration,
    /// `COURIER_DISPATCH_INTERVAL_MS`: the longest the dispatcher sleeps unwoken.
    pub dispatch_interval: Duration,
    /// `COURIER_CHAIN_STALE_AFTER_SECONDS`: heartbeat age at which a run is reaped.
    pub chain_stale_after: Duration,
    /// `COURIER_REAPER_INTERVAL_SECONDS`: how often stale runs are looked for.
    pub reaper_interval: Duration,
    /// `COURIER_DEPENDENCY_TIMEOUT_SECONDS`: how long a delivery waits for its `depends_on`
    /// (counted from its enqueue) before it ends `rejected`, naming the missing key.
    pub dependency_timeout: Duration,
    /// `COURIER_WORKER_DEAD_AFTER_SECONDS`: a worker process whose heartbeat is this old is
    /// taken for dead: the job it held resumes in another process. Processes beat five
    /// times per window; so does a running chain job on its run.
    pub worker_dead_after: Duration,
    /// `COURIER_THROTTLE_MAX_WAIT_SECONDS`: longest rate-limit wait a chain sits out.
    pub throttle_max_wait: Duration,
    /// Circuit breaker settings.
    pub breaker: BreakerSettings,
    /// `COURIER_SHUTDOWN_TIMEOUT_SECONDS`: how long in-flight calls may finish on stop.
    pub shutdown_timeout: Duration,
    /// How long finished rows are kept (see `maintenance::retention`): `COURIER_RETENTION_DAYS`
    /// (0 keeps everything: `None`), or `COURIER_RETENTION_SECONDS` when set (for benches
    /// and tests; it wins over the days).
    pub retention: Option<Duration>,
    /// `COURIER_HTTP_ADDR`: where the worker serves `/metrics` and the dashboard: unset,
    /// the default address or the next free port after it; an address, that one (taken:
    /// the start fails); empty, nothing.
    pub http_addr: HttpAddr,
    /// `COURIER_HTTP_TOKEN`: the bearer token the dashboard's actions require; without
    /// one the dashboard is read-only.
    pub http_token: Option<HttpToken>,
    /// `COURIER_ERASURE_KEY`: the secret an erased person's identities are remembered under
    /// (a keyed hash), the same for every process; without it a process can neither carry
    /// out an erasure nor check a delivery against the erased, and holds back deliveries
    /// once anyone is erased.
    pub erasure_key: Option<crate::erasure::ErasureKey>,
}

/// `COURIER_ERASURE_KEY`: blank is unset; a key shorter than 32 characters is refused
/// (it is never echoed).
fn erasure_key(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<crate::erasure::ErasureKey>, ConfigError> {
    let Some(v) = get("COURIER_ERASURE_KEY").filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    crate::erasure::ErasureKey::new(v.trim())
        .map(Some)
        .map_err(|reason| ConfigError {
            name: "COURIER_ERASURE_KEY".into(),
            value: "(not shown)".into(),
            reason,
        })
}

/// The dashboard's action token: compared in constant time, never printed (its `Debug`
/// says `HttpToken(..)`).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpToken(String);

impl HttpToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// Whether `offered` is this token, compared in time independent of where they differ.
    pub fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        // The length may show; the content is compared without an early exit.
        if a.len() != b.len() {
            return false;
        }
        let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for HttpToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpToken(..)")
    }
}

/// When a connection's circuit opens and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    /// `COURIER_BREAKER_FAILURE_THRESHOLD`: consecutive unreachable failures that open it.
    pub failure_threshold: u32,
    /// `COURIER_BREAKER_COOLDOWN_SECONDS`: first open period; doubles on each reopening.
    pub cooldown: Duration,
    /// `COURIER_BREAKER_MAX_COOLDOWN_SECONDS`: cap on the open period.
    pub max_cooldown: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_threshold: DEFAULT_BREAKER_FAILURE_THRESHOLD,
            cooldown: Duration::from_secs(DEFAULT_BREAKER_COOLDOWN_SECS),
            max_cooldown: Duration::from_secs(DEFAULT_BREAKER_MAX_COOLDOWN_SECS),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            db_max_connections: DEFAULT_DB_MAX_CONNECTIONS,
            db_connect_timeout: Duration::from_secs(DEFAULT_DB_CONNECT_TIMEOUT_SECS),
            db_statement_timeout: Duration::from_secs(DEFAULT_DB_STATEMENT_TIMEOUT_SECS),
            log_filter: DEFAULT_LOG_FILTER.to_owned(),
            log_format: LogFormat::Text,
            worker_concurrency: DEFAULT_WORKER_CONCURRENCY,
            queue_batch_size: DEFAULT_QUEUE_BATCH_SIZE,
            queue_poll: Duration::from_millis(DEFAULT_QUEUE_POLL_MS),
            dispatch_interval: Duration::from_millis(DEFAULT_DISPATCH_INTERVAL_MS),
            chain_stale_after: Duration::from_secs(DEFAULT_CHAIN_STALE_AFTER_SECS),
            reaper_interval: Duration::from_secs(DEFAULT_REAPER_INTERVAL_SECS),
            worker_dead_after: Duration::from_secs(DEFAULT_WORKER_DEAD_AFTER_SECS),
            dependency_timeout: Duration::from_secs(DEFAULT_DEPENDENCY_TIMEOUT_SECS),
            throttle_max_wait: Duration::from_secs(DEFAULT_THROTTLE_MAX_WAIT_SECS),
            breaker: BreakerSettings::default(),
            shutdown_timeout: Duration::from_secs(DEFAULT_SHUTDOWN_TIMEOUT_SECS),
            http_addr: HttpAddr::Default,
            http_token: None,
            erasure_key: None,
            retention: Some(Duration::from_secs(DEFAULT_RETENTION_DAYS * 86_400)),
        }
    }
}

impl Settings {
    /// How often a process (and a running chain job) beats: five times per
    /// `worker_dead_after` window.
    pub fn heartbeat_every(&self) -> Duration {
        self.worker_dead_after / 5
    }

    /// How this process's database pool is set up: its size and timeouts.
    pub fn pool(&self) -> crate::db::PoolSettings {
        crate::db::PoolSettings {
            max_connections: self.db_max_connections,
            connect_timeout: self.db_connect_timeout,
            statement_timeout: self.db_statement_timeout,
        }
    }

    /// Reads `.env` (if present) and the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        // A missing .env is normal; a malformed one is reported by the variables it breaks.
        let _ = dotenvy::dotenv();
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds the settings from any source of variables (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let d = Self::default();
        let secs = |name: &str, default: Duration, min: u64| {
            number(&get, name, default.as_secs(), min).map(Duration::from_secs)
        };
        let millis = |name: &str, default: Duration, min: u64| {
            number(&get, name, default.as_millis() as u64, min).map(Duration::from_millis)
        };
        let settings = Self {
            database_url: database_url(&get, d.database_url)?,
            db_max_connections: number(
                &get,
                "COURIER_DB_MAX_CONNECTIONS",
                d.db_max_connections.into(),
                2,
            )? as u32,
            db_connect_timeout: secs(
                "COURIER_DB_CONNECT_TIMEOUT_SECONDS",
                d.db_connect_timeout,
                1,
            )?,
            db_statement_timeout: secs(
                "COURIER_DB_STATEMENT_TIMEOUT_SECONDS",
                d.db_statement_timeout,
                1,
            )?,
            // Blank means unset; the syntax is checked where the subscriber is built.
            log_filter: get("COURIER_LOG")
                .filter(|v| !v.trim().is_empty())
                .unwrap_or(d.log_filter),
            log_format: log_format(&get)?,
            worker_concurrency: number(
                &get,
                "COURIER_WORKER_CONCURRENCY",
                d.worker_concurrency as u64,
                1,
            )? as usize,
            queue_batch_size: number(
                &get,
                "COURIER_QUEUE_BATCH_SIZE",
                d.queue_batch_size as u64,
                1,
            )? as usize,
            queue_poll: millis("COURIER_QUEUE_POLL_MS", d.queue_poll, 10)?,
            dispatch_interval: millis("COURIER_DISPATCH_INTERVAL_MS", d.dispatch_interval, 10)?,
            chain_stale_after: secs("COURIER_CHAIN_STALE_AFTER_SECONDS", d.chain_stale_after, 1)?,
            reaper_interval: secs("COURIER_REAPER_INTERVAL_SECONDS", d.reaper_interval, 1)?,
            worker_dead_after: secs("COURIER_WORKER_DEAD_AFTER_SECONDS", d.worker_dead_after, 2)?,
            dependency_timeout: secs(
                "COURIER_DEPENDENCY_TIMEOUT_SECONDS",
                d.dependency_timeout,
                1,
            )?,
            throttle_max_wait: secs("COURIER_THROTTLE_MAX_WAIT_SECONDS", d.throttle_max_wait, 0)?,
            breaker: breaker(&get, &d.breaker)?,
            shutdown_timeout: secs("COURIER_SHUTDOWN_TIMEOUT_SECONDS", d.shutdown_timeout, 0)?,
            http_addr: http_addr(&get, d.http_addr)?,
            // Blank means unset; the value is never echoed.
            http_token: get("COURIER_HTTP_TOKEN")
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(HttpToken),
            erasure_key: erasure_key(&get)?,
            retention: retention(&get)?,
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Checks the rules that tie settings together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.throttle_max_wait + WAKE_MARGIN >= self.chain_stale_after {
            return Err(ConfigError {
                name: "COURIER_THROTTLE_MAX_WAIT_SECONDS".into(),
                value: self.throttle_max_wait.as_secs().to_string(),
                reason: format!(
                    "must stay at least {} s below COURIER_CHAIN_STALE_AFTER_SECONDS ({}), or a \
                     chain waiting out a rate limit could be reaped as stale",
                    WAKE_MARGIN.as_secs(),
                    self.chain_stale_after.as_secs()
                ),
            });
        }
        if self.breaker.max_cooldown < self.breaker.cooldown {
            return Err(ConfigError {
                name: "COURIER_BREAKER_MAX_COOLDOWN_SECONDS".into(),
                value: self.breaker.max_cooldown.as_secs().to_string(),
                reason: format!(
                    "must be at least COURIER_BREAKER_COOLDOWN_SECONDS ({})",
                    self.breaker.cooldown.as_secs()
                ),
            });
        }
        Ok(())
    }
}

/// `DATABASE_URL`: a `postgres://` or `postgresql://` URL (never echoed: it may carry a
/// password).
fn database_url(
    get: &impl Fn(&str) -> Option<String>,
    default: String,
) -> Result<String, ConfigError> {
    match get("DATABASE_URL") {
        None => Ok(default),
        Some(v) if v.starts_with("postgres://") || v.starts_with("postgresql://") => Ok(v),
        Some(v) => Err(ConfigError {
            name: "DATABASE_URL".into(),
            value: redact_url(&v),
            reason: "must start with postgres:// or postgresql://".into(),
        }),
    }
}

/// `COURIER_LOG_FORMAT`: `text` (or unset, blank) or `json`.
fn log_format(get: &impl Fn(&str) -> Option<String>) -> Result<LogFormat, ConfigError> {
    match get("COURIER_LOG_FORMAT").as_deref().map(str::trim) {
        None | Some("") | Some("text") => Ok(LogFormat::Text),
        Some("json") => Ok(LogFormat::Json),
        Some(other) => Err(ConfigError {
            name: "COURIER_LOG_FORMAT".into(),
            value: other.to_owned(),
            reason: "must be text or json".into(),
        }),
    }
}

/// The breaker's `COURIER_BREAKER_*` settings over `d`.
fn breaker(
    get: &impl Fn(&str) -> Option<String>,
    d: &BreakerSettings,
) -> Result<BreakerSettings, ConfigError> {
    let secs = |name: &str, default: Duration| {
        number(get, name, default.as_secs(), 1).map(Duration::from_secs)
    };
    Ok(BreakerSettings {
        failure_threshold: number(
            get,
            "COURIER_BREAKER_FAILURE_THRESHOLD",
            d.failure_threshold.into(),
            1,
        )? as u32,
        cooldown: secs("COURIER_BREAKER_COOLDOWN_SECONDS", d.cooldown)?,
        max_cooldown: secs("COURIER_BREAKER_MAX_COOLDOWN_SECONDS", d.max_cooldown)?,
    })
}

/// `COURIER_HTTP_ADDR`: unset takes `default`, blank serves nothing, else an address.
fn http_addr(
    get: &impl Fn(&str) -> Option<String>,
    default: HttpAddr,
) -> Result<HttpAddr, ConfigError> {
    match get("COURIER_HTTP_ADDR") {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(HttpAddr::Off),
        Some(v) => v
            .trim()
            .parse()
            .map(HttpAddr::Set)
            .map_err(|_| ConfigError {
                name: "COURIER_HTTP_ADDR".into(),
                value: v.clone(),
                reason: "must be an IP address and port, such as 127.0.0.1:9187, or empty to \
                     serve no metrics and no dashboard"
                    .into(),
            }),
    }
}

/// `COURIER_RETENTION_SECONDS` if set, else `COURIER_RETENTION_DAYS` (0: keep forever).
fn retention(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Duration>, ConfigError> {
    let days = number(get, "COURIER_RETENTION_DAYS", DEFAULT_RETENTION_DAYS, 0)?;
    let seconds = get("COURIER_RETENTION_SECONDS")
        .map(|_| number(get, "COURIER_RETENTION_SECONDS", 0, 1))
        .transpose()?;
    Ok(match (seconds, days) {
        (Some(s), _) => Some(Duration::from_secs(s)),
        (None, 0) => None,
        (None, d) => Some(Duration::from_secs(d * 86_400)),
    })
}

fn number(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u64,
    min: u64,
) -> Result<u64, ConfigError> {
    let Some(raw) = get(name) else {
        return Ok(default);
    };
    let err = |reason: String| ConfigError {
        name: name.to_owned(),
        value: raw.clone(),
        reason,
    };
    let n: u64 = raw
        .trim()
        .parse()
        .map_err(|_| err("not a whole non-negative number".into()))?;
    if n < min {
        return Err(err(format!("must be at least {min}")));
    }
    if n > MAX_SETTING {
        return Err(err(format!("must be at most {MAX_SETTING}")));
    }
    Ok(n)
}

/// One warning for every `COURIER_*` name in `names` that courier does not know (neither a
/// setting, [`KNOWN_VARIABLES`], nor read by its tooling, [`TOOLING_VARIABLES`]), naming
/// the nearest known name: a typo is ignored otherwise, silently.
pub fn unknown_variables<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut unknown: Vec<String> = names
        .into_iter()
        .map(|n| n.as_ref().to_owned())
        .filter(|n| n.starts_with("COURIER_"))
        .filter(|n| {
            !KNOWN_VARIABLES.contains(&n.as_str()) && !TOOLING_VARIABLES.contains(&n.as_str())
        })
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
        .into_iter()
        .map(|name| {
            let (nearest, distance) = KNOWN_VARIABLES
                .iter()
                .map(|k| (*k, edit_distance(&name, k)))
                .min_by_key(|(_, d)| *d)
                .expect("the list is not empty");
            // A few edits per ten characters of the part after `COURIER_`, or a known
            // name cut short (`..._TIMEOUT` for `..._TIMEOUT_SECONDS`), is a typo; further
            // away it is more likely a variable of the user's own (an API key a
            // connection's `api_key_env` names).
            let suffix = name.len().saturating_sub("COURIER_".len());
            if distance <= (suffix / 4).max(2) || nearest.starts_with(&name) {
                format!("unknown setting {name} is ignored: did you mean {nearest}?")
            } else {
                format!(
                    "{name} is not a courier setting and is ignored (the nearest is {nearest}); \
                     fine if a connection's api_key_env names it"
                )
            }
        })
        .collect()
}

/// Levenshtein distance: single-character insertions, deletions and substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = load(&[]).unwrap();
        assert_eq!(s.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(s.chain_stale_after, Duration::from_secs(600));
        assert_eq!(s.breaker.failure_threshold, 5);
    }

    #[test]
    fn a_bad_number_names_the_setting() {
        let e = load(&[("COURIER_WORKER_CONCURRENCY", "lots")]).unwrap_err();
        assert_eq!(e.name, "COURIER_WORKER_CONCURRENCY");
        assert!(e.to_string().contains("COURIER_WORKER_CONCURRENCY"));
        let e = load(&[("COURIER_BREAKER_FAILURE_THRESHOLD", "0")]).unwrap_err();
        assert_eq!(e.name, "COURIER_BREAKER_FAILURE_THRESHOLD");
        assert!(e.reason.contains("at least 1"));
    }

    #[test]
    fn throttle_wait_must_stay_below_staleness_window() {
        let e = load(&[
            ("COURIER_THROTTLE_MAX_WAIT_SECONDS", "600"),
            ("COURIER_CHAIN_STALE_AFTER_SECONDS", "600"),
        ])
        .unwrap_err();
        assert_eq!(e.name, "COURIER_THROTTLE_MAX_WAIT_SECONDS");
        assert!(e.reason.contains("COURIER_CHAIN_STALE_AFTER_SECONDS"));
    }

    #[test]
    fn the_http_address_defaults_to_loopback_is_off_when_empty_and_checked() {
        let with = |addr: &'static str| {
            Settings::from_lookup(move |n| (n == "COURIER_HTTP_ADDR").then(|| addr.to_owned()))
        };
        let d = Settings::from_lookup(|_| None).unwrap();
        assert_eq!(d.http_addr, HttpAddr::Default);
        assert_eq!(d.http_addr.first().unwrap().to_string(), DEFAULT_HTTP_ADDR);
        assert!(d.http_addr.first().unwrap().ip().is_loopback());
        assert_eq!(with("").unwrap().http_addr, HttpAddr::Off);
        let set = with("0.0.0.0:80").unwrap().http_addr;
        assert_eq!(set, HttpAddr::Set("0.0.0.0:80".parse().unwrap()));
        assert_eq!(
            with(DEFAULT_HTTP_ADDR).unwrap().http_addr,
            HttpAddr::Set(DEFAULT_HTTP_ADDR.parse().unwrap()),
            "the default address set by hand is the operator's: no other port is tried"
        );
        let e = with("localhost").unwrap_err();
        assert_eq!(e.name, "COURIER_HTTP_ADDR");
    }

    #[test]
    fn the_http_token_matches_only_itself_and_never_prints() {
        let s = Settings::from_lookup(|n| (n == "COURIER_HTTP_TOKEN").then(|| "s3cret".into()))
            .unwrap();
        let t = s.http_token.clone().unwrap();
        assert!(t.matches("s3cret"));
        assert!(!t.matches("s3creT") && !t.matches("s3cre") && !t.matches(""));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn every_variable_the_settings_read_is_known() {
        let read = std::cell::RefCell::new(Vec::new());
        Settings::from_lookup(|name| {
            read.borrow_mut().push(name.to_owned());
            None
        })
        .unwrap();
        let read = read.into_inner();
        for name in &read {
            assert!(
                KNOWN_VARIABLES.contains(&name.as_str()),
                "{name} is not in KNOWN_VARIABLES"
            );
        }
        for name in KNOWN_VARIABLES {
            assert!(
                read.iter().any(|r| r == name),
                "{name} is listed but never read"
            );
        }
        assert!(unknown_variables(KNOWN_VARIABLES.iter().chain(TOOLING_VARIABLES)).is_empty());
    }

    #[test]
    fn an_unknown_variable_is_warned_about_with_the_nearest_name() {
        let warnings = unknown_variables([
            "COURIER_WORKER_CONCURENCY",
            "PATH",
            "COURIER_LOG",
            "COURIER_DB_STATEMENT_TIMEOUT",
            "COURIER_SHOP_CRM_API_KEY",
        ]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].contains("COURIER_DB_STATEMENT_TIMEOUT ")
                && warnings[0].contains("did you mean COURIER_DB_STATEMENT_TIMEOUT_SECONDS?"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("COURIER_SHOP_CRM_API_KEY is not a courier setting"),
            "{warnings:?}"
        );
        assert_eq!(
            warnings[2],
            "unknown setting COURIER_WORKER_CONCURENCY is ignored: did you mean \
             COURIER_WORKER_CONCURRENCY?"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn database_timeouts_and_log_filter_have_defaults_and_bounds() {
        let s = load(&[("COURIER_LOG", " ")]).unwrap();
        assert_eq!(s.log_filter, DEFAULT_LOG_FILTER);
        assert_eq!(s.db_connect_timeout, Duration::from_secs(10));
        assert_eq!(s.db_statement_timeout, Duration::from_secs(60));
        let s = load(&[("COURIER_DB_STATEMENT_TIMEOUT_SECONDS", "5")]).unwrap();
        assert_eq!(s.pool().statement_timeout, Duration::from_secs(5));
        let e = load(&[("COURIER_DB_CONNECT_TIMEOUT_SECONDS", "0")]).unwrap_err();
        assert_eq!(e.name, "COURIER_DB_CONNECT_TIMEOUT_SECONDS");
    }

    #[test]
    fn retention_is_days_or_seconds_or_off() {
        let day = Duration::from_secs(86_400);
        assert_eq!(load(&[]).unwrap().retention, Some(7 * day));
        assert_eq!(
            load(&[("COURIER_RETENTION_DAYS", "30")]).unwrap().retention,
            Some(30 * day)
        );
        assert_eq!(
            load(&[("COURIER_RETENTION_DAYS", "0")]).unwrap().retention,
            None
        );
        let s = load(&[
            ("COURIER_RETENTION_DAYS", "0"),
            ("COURIER_RETENTION_SECONDS", "5"),
        ])
        .unwrap();
        assert_eq!(s.retention, Some(Duration::from_secs(5)));
        let e = load(&[("COURIER_RETENTION_SECONDS", "0")]).unwrap_err();
        assert_eq!(e.name, "COURIER_RETENTION_SECONDS");
        let e = load(&[("COURIER_RETENTION_DAYS", "a week")]).unwrap_err();
        assert_eq!(e.name, "COURIER_RETENTION_DAYS");
    }

    #[test]
    fn database_url_password_is_not_echoed() {
        let e = load(&[("DATABASE_URL", "mysql://u:hunter2@h/db")]).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert_eq!(
            redact_url("postgres://u:pw@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
    }
}
