//! Writers deliver records to one target. A writer declares the rate it may be called at
//! and how many calls it may have in flight; `write` answers with a [`Receipt`] or a typed
//! [`WriteError`] that says whether to retry and whether the target proved reachable.
//!
//! A call may carry several records of one rule (the rule's `records_per_call`, up to
//! what [`WriterKind::max_records_per_call`] allows): the writer puts a batch's records into calls
//! ([`Writer::group`]) and answers each call with one [`Written`], which holds the outcome
//! of every record it carried. A whole call refused with [`WriteError::Permanent`] says
//! that some record of it is bad without saying which: the call stage splits it in halves
//! and sends each again, down to single records (but for a refusal of the request itself,
//! 401, 403, 404, 405 or 407, which is every record's).
//!
//! One file per target: [`http`] is the generic HTTP JSON writer and holds the response
//! mapping every HTTP writer shares; [`usercom`] writes into a User.com workspace.

pub mod answer;
pub mod auth;
pub mod http;
pub mod job;
pub mod oauth;
pub mod request;
pub mod secrets;
pub mod usercom;

use std::{sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};

use crate::{model::Connection, ratelimit::signals::RateSignals};

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

/// What one call carries: records of one rule, made a call by [`Writer::group`].
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The records, at least one.
    pub records: &'a [Outgoing<'a>],
    /// Whether the rule sends several records per call (its `records_per_call` is above
    /// 1): its calls take the bulk form even when one carries a single record.
    pub bulk: bool,
    /// How the rule's answers name each record's fate (`http_json`); `None`: the generic
    /// per-item array.
    pub answer: Option<&'a answer::AnswerMap>,
    /// How the rule's requests are shaped (`http_json`); `None`: each payload by POST.
    pub request: Option<&'a request::RequestShape>,
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

/// A connection's writer: the generic HTTP JSON writer, whose targets are profiles (auth,
/// request shape, answer map, rate signals: data), or User.com's, whose operations are its
/// own. The one place a writer's name is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterKind {
    /// `http_json`: any HTTP JSON API, shaped by the rule's profile.
    HttpJson,
    /// `usercom`: a User.com workspace, one operation per rule.
    UserCom,
}

impl WriterKind {
    /// Every writer kind.
    pub const ALL: [WriterKind; 2] = [WriterKind::HttpJson, WriterKind::UserCom];

    /// Its name as stored.
    pub fn name(self) -> &'static str {
        match self {
            WriterKind::HttpJson => "http_json",
            WriterKind::UserCom => "usercom",
        }
    }

    /// The writer kind named `name`; the error names it and the kinds there are.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                format!("writer {name:?} is not one of {}", all.join(", "))
            })
    }

    /// Whether its connections and rules are shaped by data (auth kinds, request shapes,
    /// answer maps): the HTTP JSON writer's are; User.com's are its own.
    pub fn shaped_by_profile(self) -> bool {
        self == WriterKind::HttpJson
    }

    /// Whether its connections must name the variable holding a key.
    pub fn needs_key(self) -> bool {
        self == WriterKind::UserCom
    }

    /// Checks a rule's `path` against what the writer can do with it: for `usercom` it
    /// must name one of the operations; `http_json` takes any path. The error names the
    /// path and what would be accepted.
    pub fn check_path(self, path: &str) -> Result<(), String> {
        match self {
            WriterKind::UserCom => path.parse::<usercom::Operation>().map(|_| ()),
            WriterKind::HttpJson => Ok(()),
        }
    }

    /// The most records one call may carry on a rule of `path`, and why no more:
    /// `http_json` takes up to [`http::MAX_RECORDS_PER_CALL`]; `usercom` groups
    /// `user_attributes` into mass updates of up to [`usercom::MAX_IDS_PER_CALL`] and
    /// sends every other operation one record per call.
    pub fn max_records_per_call(self, path: &str) -> (usize, &'static str) {
        match self {
            WriterKind::UserCom => match path.parse::<usercom::Operation>() {
                Ok(usercom::Operation::UserAttributes) => (
                    usercom::MAX_IDS_PER_CALL,
                    "a User.com mass update takes at most that many ids",
                ),
                _ => (
                    1,
                    "only the user_attributes operation of User.com has a bulk endpoint",
                ),
            },
            WriterKind::HttpJson => (
                http::MAX_RECORDS_PER_CALL,
                "the generic HTTP writer sends at most that many records per call",
            ),
        }
    }
}

impl std::fmt::Display for WriterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
        }
    }

    /// The HTTP status behind the error, if any.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            WriteError::RateLimited { .. } => Some(429),
            WriteError::Permanent { status, .. } | WriteError::Transient { status, .. } => *status,
        }
    }
}

/// Delivers records to one target connection.
pub trait Writer: Send + Sync {
    /// The connection's secrets: every answer passes [`Secrets::seal`] before the call
    /// stage keeps any of it.
    fn secrets(&self) -> &secrets::Secrets;
    /// How many calls may be in flight at once.
    fn max_in_flight(&self) -> usize;
    /// What the target says about its rate beyond the standard headers (the connection's
    /// `rate_signals`), read by the pacer from every answer.
    fn rate_signals(&self) -> &RateSignals;
    /// Delivers one record. Each call is exactly one request to the target.
    fn write<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Result<Receipt, WriteError>>;

    /// Puts the records of a batch (their payloads, in the batch's order) into calls of at
    /// most `per_call` records each, as indexes into `payloads`; every record is in exactly
    /// one call. By default, in order, `per_call` at a time.
    fn group(
        &self,
        path: &str,
        payloads: &[&serde_json::Value],
        per_call: usize,
    ) -> Vec<Vec<usize>> {
        let _ = path;
        (0..payloads.len())
            .collect::<Vec<_>>()
            .chunks(per_call.max(1))
            .map(<[usize]>::to_vec)
            .collect()
    }

    /// Sends one request of a job (its open and close, a poll, a page of its errors) to
    /// `path` (under the connection's base URL, or an absolute URL at the same origin) with
    /// the connection's credentials, `body` as JSON; the receipt holds the answer's body.
    fn ask<'a>(
        &'a self,
        method: reqwest::Method,
        path: &'a str,
        body: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        let _ = (method, path, body);
        futures::future::ready(Err(WriteError::Permanent {
            status: None,
            message: "this writer reads no job".into(),
        }))
        .boxed()
    }

    /// Delivers the records of one call made by [`Writer::group`]: exactly one request to
    /// the target. An error is the answer of the whole call; [`WriteError::Permanent`] for
    /// several records means some of them are bad, which the caller finds by splitting.
    /// By default a call carries one record, written by [`Writer::write`].
    fn write_many<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Written, WriteError>> {
        match call.records {
            [one] => self
                .write(*one)
                .map(|r| r.map(|receipt| Written::all(receipt, 1)))
                .boxed(),
            _ => futures::future::ready(Err(WriteError::Permanent {
                status: None,
                message: format!(
                    "this writer sends one record per call, not {}",
                    call.records.len()
                ),
            }))
            .boxed(),
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

/// Checks a connection's base URL: an absolute `http://` or `https://` URL with a host,
/// and no blank, line break or control character anywhere (the URL parser would quietly
/// drop some of them). The error says what is wrong; it never repeats the URL, which may
/// carry a password.
pub fn check_base_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("must start with http:// or https://".into());
    }
    if url.contains(['\r', '\n']) {
        return Err("holds a line break".into());
    }
    if url.chars().any(char::is_control) {
        return Err("holds a control character".into());
    }
    if url.chars().any(char::is_whitespace) {
        return Err("holds a blank (write it %20)".into());
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a valid URL: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("names no host".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("names a user or password (credentials belong in auth, never in a URL)".into());
    }
    Ok(())
}

/// Builds the writer a connection asks for, reading its API key from the environment.
pub fn build(
    conn: &Connection,
    client: &reqwest::Client,
) -> Result<Arc<dyn Writer>, WriterConfigError> {
    // The same check as when a connection is saved: one written by plain SQL past that
    // check fails its run once with the reason instead of failing every call.
    check_base_url(&conn.base_url).map_err(|reason| WriterConfigError::Invalid {
        connection: conn.name.clone(),
        reason: format!("base_url {reason}"),
    })?;
    let key = match &conn.api_key_env {
        None => None,
        Some(var) => Some(
            std::env::var(var).map_err(|_| WriterConfigError::MissingKey {
                connection: conn.name.clone(),
                var: var.clone(),
            })?,
        ),
    };
    let kind = WriterKind::parse(&conn.writer).map_err(|reason| WriterConfigError::Invalid {
        connection: conn.name.clone(),
        reason,
    })?;
    match kind {
        WriterKind::HttpJson => Ok(Arc::new(http::HttpJsonWriter::new(conn, client, key)?)),
        WriterKind::UserCom => Ok(Arc::new(usercom::UserComWriter::new(conn, client, key)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receipt_keeps_the_standard_rate_limit_headers_and_those_the_signals_name() {
        let mut h = reqwest::header::HeaderMap::new();
        for name in [
            "ratelimit-policy",
            "x-ratelimit-remaining",
            "x-hubspot-ratelimit-max",
            "x-sib-ratelimit-reset",
            "sforce-limit-info",
            "date",
            "set-cookie",
            "authorization",
        ] {
            h.insert(
                reqwest::header::HeaderName::from_static(name),
                reqwest::header::HeaderValue::from_static("1"),
            );
        }
        let signals = crate::ratelimit::signals::RateSignals::parse(Some(&serde_json::json!({
            "quotas": [{"limit": "X-HubSpot-RateLimit-Max", "reset": "x-sib-ratelimit-reset"}],
            "usage": [{"header": "Sforce-Limit-Info", "pattern": "api-usage={used}/{limit}",
                       "window_seconds": 86400}]
        })))
        .unwrap();
        assert_eq!(rate_limit_headers(&h, &Default::default()).len(), 3);
        let kept = rate_limit_headers(&h, &signals);
        let mut names: Vec<&str> = kept.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "date",
                "ratelimit-policy",
                "sforce-limit-info",
                "x-hubspot-ratelimit-max",
                "x-ratelimit-remaining",
                "x-sib-ratelimit-reset"
            ]
        );
    }

    fn connection(base_url: &str, headers: serde_json::Value) -> Connection {
        Connection {
            id: 1,
            name: "crm".into(),
            writer: "http_json".into(),
            base_url: base_url.into(),
            api_key_env: None,
            headers,
            requests_per_minute: None,
            max_in_flight: 1,
            timeout_ms: 1_000,
            budget_key: "connection:1".into(),
            ..Connection::default()
        }
    }

    #[test]
    fn base_urls_must_be_absolute_http_with_a_host() {
        for good in [
            "https://crm.example.com/api/",
            "http://127.0.0.1:8080",
            "http://[::1]:1/x?y=1",
        ] {
            assert_eq!(check_base_url(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("http://", "host"),
            ("http://exa mple/", "blank"),
            ("http://exa\tmple/", "control"),
            ("https://crm.example.com/\r\n", "line break"),
            ("https://crm.example.com/\u{0}", "control"),
            ("HTTPS://crm.example.com/", "http:// or https://"),
            ("mailto:a@b", "http:// or https://"),
            ("/api/", "http:// or https://"),
            ("http://:80/", "host"),
            ("http://user:pw@[::1]:1/x?y=1", "user or password"),
            ("https://good@crm.example.com/", "user or password"),
        ] {
            let e = check_base_url(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_writer_refuses_what_the_door_refuses() {
        let client = reqwest::Client::new();
        for writer in ["http_json", "usercom"] {
            let mut conn = connection("http://", serde_json::json!({}));
            conn.writer = writer.into();
            let e = build(&conn, &client).err().expect("refused").to_string();
            assert!(e.contains("\"crm\"") && e.contains("base_url"), "{e}");
            let mut conn = connection("http://h/", serde_json::json!({"X-Key": "a\nSECRET"}));
            conn.writer = writer.into();
            // A variable every environment has: the key is read before the headers.
            conn.api_key_env = Some("PATH".into());
            let e = build(&conn, &client).err().expect("refused").to_string();
            assert!(e.contains("X-Key") && e.contains("line break"), "{e}");
            assert!(!e.contains("SECRET"), "{e}");
        }
    }
}
