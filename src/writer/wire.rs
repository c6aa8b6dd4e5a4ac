//! What crosses between the chain and a writer: the records a call carries, the answer it
//! gets back (its receipt, its body, each record's fate) and why a write or a writer failed.

use std::time::Duration;

use crate::ratelimit::signals::RateSignals;

/// What a writer is asked to deliver.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The delivery's id (appending operations carry it so duplicates can be found).
    pub delivery_id: i64,
    /// The record's identity in the shop.
    pub record_key: &'a str,
    /// The rule's path or operation.
    pub path: &'a str,
    /// The record.
    pub payload: &'a serde_json::Value,
}

/// Proof of a delivery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Receipt {
    /// The HTTP status the target answered with.
    pub http_status: Option<u16>,
    /// The response's rate-limit headers ([`rate_limit_headers`]), read by the pacer.
    pub rate_headers: reqwest::header::HeaderMap,
    /// The response's body, read only for calls that carry several records (whose
    /// answer may speak of each).
    pub body: Body,
    /// The answer's `Location` header, if any (a 202's status monitor: a job's id).
    pub location: Option<String>,
}

/// A 2xx answer's body as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Body {
    /// Not read, or empty.
    #[default]
    Empty,
    /// JSON, read whole.
    Json(serde_json::Value),
    /// Text, read whole: an answer whose content type is `text/csv` (a job's results).
    Text(String),
    /// Something that cannot be read whole: cut off, too long, not JSON. Why, in words.
    Unreadable(String),
}

impl Body {
    /// The JSON, if the body was read whole as JSON.
    pub fn json(&self) -> Option<&serde_json::Value> {
        match self {
            Body::Json(v) => Some(v),
            _ => None,
        }
    }
}

/// The answer to a call that reached the target and was not refused as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The response.
    pub receipt: Receipt,
    /// One per record of the call, in the call's order: `None` delivered, or why that
    /// record was not.
    pub items: Vec<Option<WriteError>>,
}

impl Written {
    /// Every record of the call delivered.
    pub fn all(receipt: Receipt, records: usize) -> Self {
        Self {
            receipt,
            items: vec![None; records],
        }
    }
}

/// The rate-limit headers of a response (`RateLimit*`, `X-RateLimit-*` and those the
/// connection's `signals` name), the only ones a receipt keeps: what the target states
/// about its budget.
pub fn rate_limit_headers(
    headers: &reqwest::header::HeaderMap,
    signals: &RateSignals,
) -> reqwest::header::HeaderMap {
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            // `date`: the target's clock, which an absolute reset is read against.
            n.starts_with("ratelimit")
                || n.starts_with("x-ratelimit")
                || n == "date"
                || signals.names(n)
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// Why a write did not deliver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The target asked us to slow down (HTTP 429): not a failure of the record.
    #[error("rate limited (wait {wait:?})")]
    RateLimited {
        /// The wait the response asked for, capped at
        /// [`MAX_RATE_LIMIT_WAIT`](crate::ratelimit::limits::MAX_RATE_LIMIT_WAIT); `None` when
        /// it named none.
        wait: Option<Duration>,
        /// The raw header value that named the wait, for the operator.
        raw: Option<String>,
        /// The response's rate-limit headers ([`rate_limit_headers`]), boxed: an error
        /// stays small.
        rate_headers: Box<reqwest::header::HeaderMap>,
    },
    /// Retrying will not help (400, 401, 403, 404, 422, ...).
    #[error("permanent failure{}: {message}", status_suffix(*.status))]
    Permanent {
        /// HTTP status, when the target answered.
        status: Option<u16>,
        /// What went wrong (never contains credentials).
        message: String,
    },
    /// Worth retrying later (5xx, timeouts, connection errors).
    #[error("transient failure{}: {message}", status_suffix(*.status))]
    Transient {
        /// HTTP status, when the target answered.
        status: Option<u16>,
        /// What went wrong (never contains credentials).
        message: String,
    },
    /// The target answered the call but not for this record (a 207 courier cannot map, an
    /// answer naming failures it cannot place): never read as delivered, sent again like a
    /// transient failure; a call the answer decides no record of is split like a refused
    /// one.
    #[error("unaccounted for{}: {message}; sent again", status_suffix(Some(*.status)))]
    Unaccounted {
        /// The answer's HTTP status.
        status: u16,
        /// Why the answer does not account for it.
        message: String,
    },
}

fn status_suffix(status: Option<u16>) -> String {
    status.map(|s| format!(" (HTTP {s})")).unwrap_or_default()
}

impl WriteError {
    /// Whether the error shows the target answered: the circuit breaker counts such an
    /// error as a successful interaction. A 4xx (including 429) does; a 5xx, a timeout or a
    /// refused connection does not.
    pub fn proves_reachable(&self) -> bool {
        match self {
            WriteError::RateLimited { .. } => true,
            WriteError::Permanent { status, .. } => status.is_some(),
            WriteError::Transient { .. } => false,
            WriteError::Unaccounted { .. } => true,
        }
    }

    /// The HTTP status behind the error, if any.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            WriteError::RateLimited { .. } => Some(429),
            WriteError::Permanent { status, .. } | WriteError::Transient { status, .. } => *status,
            WriteError::Unaccounted { status, .. } => Some(*status),
        }
    }
}

/// Why a connection's writer could not be built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriterConfigError {
    /// The connection names an environment variable that is not set.
    #[error("connection {connection:?}: environment variable {var} (its API key) is not set")]
    MissingKey {
        /// Connection name.
        connection: String,
        /// The variable it names.
        var: String,
    },
    /// The configuration is unusable for another reason.
    #[error("connection {connection:?}: {reason}")]
    Invalid {
        /// Connection name.
        connection: String,
        /// Why.
        reason: String,
    },
}

/// A response's body, up to `cap` bytes; a body cut off (the connection closed early, a
/// length it did not keep) or longer than `cap` is an error saying so, with what was read.
pub async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, (Vec<u8>, String)> {
    let over = |n: u64| format!("the answer's body of {n} bytes is over the {cap} courier reads");
    if let Some(n) = response.content_length().filter(|n| *n > cap as u64) {
        return Err((Vec::new(), over(n)));
    }
    let mut out = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if out.len() + chunk.len() > cap => {
                let why = over((out.len() + chunk.len()) as u64);
                return Err((out, why));
            }
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            Ok(None) => return Ok(out),
            Err(e) => {
                let why = format!("the answer's body was cut off ({})", e.without_url());
                return Err((out, why));
            }
        }
    }
}

/// The methods a rule's calls may use (its own, its group's, a job step's).
pub const METHODS: [&str; 3] = ["POST", "PUT", "PATCH"];

/// Checks a stated method; the error, after `at` (the field's place, e.g. `request: `),
/// names it and the methods there are.
pub(super) fn check_method(at: &str, name: Option<&str>) -> Result<(), String> {
    match name {
        Some(m) if !METHODS.contains(&m) => Err(format!(
            "{at}method {m:?} is not one of {}",
            METHODS.join(", ")
        )),
        _ => Ok(()),
    }
}

/// A stated method (checked when the rule was saved): `PUT`, `PATCH`, else `POST`.
pub(super) fn method(name: Option<&str>) -> reqwest::Method {
    match name {
        Some("PUT") => reqwest::Method::PUT,
        Some("PATCH") => reqwest::Method::PATCH,
        _ => reqwest::Method::POST,
    }
}
