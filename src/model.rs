//! The target model: a connection (where records go, how the key is presented, its limits
//! and rate signals) and a rule (what goes there, how calls are shaped and answers read), as
//! stored and as given. The catalog saves and lists them; the writers build from them; both
//! use this module, and it uses neither.

use serde::{Deserialize, Serialize};

use crate::ratelimit::limits::{self, Limit};

/// A new target connection.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewConnection {
    /// Unique name, used by rules and the CLI.
    pub name: String,
    /// Writer kind: `http_json`.
    pub writer: String,
    /// Base URL of the target account, e.g. `https://shop.user.com/api/public/`.
    pub base_url: String,
    /// Name of the environment variable holding the API key (never the key itself).
    pub api_key_env: Option<String>,
    /// How the key is presented ([`crate::writer::auth::Auth`]; absent: a bearer token).
    #[serde(default)]
    pub auth: Option<serde_json::Value>,
    /// Extra request headers (not secrets: they are stored in plain text).
    #[serde(default)]
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// Declared requests per minute; `None` takes the writer's own declaration.
    pub requests_per_minute: Option<i32>,
    /// Calls in flight at once against this connection.
    pub max_in_flight: Option<i32>,
    /// Per-request timeout in milliseconds.
    pub timeout_ms: Option<i32>,
    /// Connections naming the same key (e.g. the workspace) share one budget and one block.
    #[serde(default)]
    pub budget_key: Option<String>,
    /// Declared limits (`10/s`, `300/min`, `100000/day`); empty: `requests_per_minute`
    /// (or the writer's declaration) is the one limit.
    #[serde(default)]
    pub limits: Vec<Limit>,
    /// Percent of each window of a minute or longer kept for other clients (`10%`).
    #[serde(default)]
    pub reserve: Option<String>,
    /// What the target says about its rate beyond the standard headers
    /// ([`crate::ratelimit::signals::RateSignals`]; absent: the standard headers only).
    #[serde(default)]
    pub rate_signals: Option<serde_json::Value>,
    /// How its target is told to forget a person ([`crate::writer::erase::EraseShape`];
    /// absent: an erasure reports the target as not told).
    #[serde(default)]
    pub erase: Option<serde_json::Value>,
}

/// A stored connection.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Connection {
    /// Primary key.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// Writer kind.
    pub writer: String,
    /// Base URL of the target account.
    pub base_url: String,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// How the key is presented (`None`: a bearer token).
    pub auth: Option<serde_json::Value>,
    /// Extra request headers.
    pub headers: serde_json::Value,
    /// Declared requests per minute, if overridden.
    pub requests_per_minute: Option<i32>,
    /// Calls in flight at once.
    pub max_in_flight: i32,
    /// Per-request timeout in milliseconds.
    pub timeout_ms: i32,
    /// The budget (and block) it spends from: its own `connection:<id>` or a shared key
    /// (in a chain job: the rule's own key, if it has one).
    pub budget_key: String,
    /// Declared limits as stored (`N/window`).
    pub limits: Vec<String>,
    /// Percent of each long window kept for other clients.
    pub reserve_percent: i16,
    /// Paused by an operator: none of its rules gets a run.
    pub paused: bool,
    /// Its rate signals as stored ([`crate::ratelimit::signals::RateSignals`]).
    pub rate_signals: Option<serde_json::Value>,
}

/// A connection's requests per minute as stored (`requests_per_minute`), else
/// [`DEFAULT_REQUESTS_PER_MINUTE`](limits::DEFAULT_REQUESTS_PER_MINUTE).
pub fn rpm_or_default(stored: Option<i32>) -> u32 {
    stored.map_or(limits::DEFAULT_REQUESTS_PER_MINUTE, |r| r.max(1) as u32)
}

impl Connection {
    /// The requests per minute it allows when it declares no limit ([`rpm_or_default`]).
    pub fn rpm(&self) -> u32 {
        rpm_or_default(self.requests_per_minute)
    }

    /// The limits its budget keeps: those declared, else [`Connection::rpm`] per minute. A
    /// stored limit courier cannot read is skipped (the schema's check refuses malformed
    /// ones).
    pub fn declared_limits(&self) -> Vec<Limit> {
        let declared: Vec<Limit> = self.limits.iter().filter_map(|l| l.parse().ok()).collect();
        if declared.is_empty() {
            return vec![Limit::per_minute(self.rpm())];
        }
        limits::check(declared).unwrap_or_default()
    }

    /// The reserve kept on long windows, in percent.
    pub fn reserve(&self) -> u8 {
        self.reserve_percent
            .clamp(0, i16::from(limits::MAX_RESERVE)) as u8
    }
}

/// A new rule.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewRule {
    /// Unique name, used by `courier enqueue --rule`.
    pub name: String,
    /// Name of the connection it delivers into.
    pub connection: String,
    /// Path appended to the connection's base URL.
    #[serde(default)]
    pub path: String,
    /// Deliveries per chain job.
    pub batch_size: Option<i32>,
    /// Attempts before a transiently failing delivery is exhausted.
    pub max_attempts: Option<i32>,
    /// First retry delay in milliseconds; doubles per attempt, with jitter.
    pub backoff_base_ms: Option<i32>,
    /// Cap on the retry delay in milliseconds.
    pub backoff_max_ms: Option<i32>,
    /// Whether the dispatcher starts runs for it.
    pub enabled: Option<bool>,
    /// Its share of the connection's budget against other rules with a backlog.
    pub weight: Option<i32>,
    /// The most deliveries one call carries (default 1), up to what the writer allows: a
    /// target's bulk endpoint (see
    /// [`WriterKind::max_records_per_call`](crate::writer::WriterKind::max_records_per_call)).
    pub records_per_call: Option<i32>,
    /// A budget of its own (an endpoint the target limits apart), overriding its
    /// connection's; its 429s block this budget only.
    #[serde(default)]
    pub budget_key: Option<String>,
    /// The limits of its own budget, as the vendor states them for its endpoint (`75/s`,
    /// `700/min`); empty: its connection's. Only with a `budget_key` of its own.
    #[serde(default)]
    pub limits: Vec<Limit>,
    /// For `http_json`: how the target's answers name each record's fate (see
    /// [`writer::answer::AnswerMap`]); absent, the generic per-item array.
    #[serde(default)]
    pub answer: Option<serde_json::Value>,
    /// For `http_json`: how its requests are shaped (see
    /// [`writer::request::RequestShape`]); absent, each payload by POST.
    #[serde(default)]
    pub request: Option<serde_json::Value>,
    /// For `http_json`: how it delivers through the target's asynchronous jobs (see
    /// [`writer::job::JobShape`]); absent, its calls are synchronous.
    #[serde(default)]
    pub job: Option<serde_json::Value>,
    /// Where a person's identities sit in its payloads: kind (`email`, `phone`,
    /// `external_id`) -> JSON pointer; an erasure finds and suppresses the person's records
    /// by them (and by record key).
    #[serde(default)]
    pub identities: Option<serde_json::Value>,
}

/// A stored rule.
#[derive(Clone, Debug, Serialize)]
pub struct Rule {
    /// Primary key.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// The connection it delivers into.
    pub connection_id: i64,
    /// Path or operation.
    pub path: String,
    /// Whether runs are started for it.
    pub enabled: bool,
    /// Deliveries per chain job.
    pub batch_size: i32,
    /// Attempts before exhaustion.
    pub max_attempts: i32,
    /// First retry delay in milliseconds.
    pub backoff_base_ms: i32,
    /// Cap on the retry delay in milliseconds.
    pub backoff_max_ms: i32,
    /// Share of the connection's budget.
    pub weight: i32,
    /// The most deliveries one call carries.
    pub records_per_call: i32,
    /// Its own budget key, if it has one.
    pub budget_key: Option<String>,
    /// Its own budget's limits as stored (`N/window`); empty: its connection's.
    pub limits: Vec<String>,
    /// How its answers name each record's fate, if stated.
    pub answer: Option<serde_json::Value>,
    /// How its requests are shaped, if stated.
    pub request: Option<serde_json::Value>,
    /// How it delivers through the target's jobs, if it does.
    pub job: Option<serde_json::Value>,
    /// Paused by an operator: it gets no run.
    pub paused: bool,
}

/// What the schema accepts as `api_key_env` (and [`crate::writer::auth::Auth`] as `user_env` and
/// `client_id_env`): `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn is_variable_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
