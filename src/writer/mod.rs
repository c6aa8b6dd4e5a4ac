//! Writers deliver one record to one target. A writer declares the rate it may be called at
//! and how many calls it may have in flight; `write` answers with a [`Receipt`] or a typed
//! [`WriteError`] that says whether to retry and whether the target proved reachable.
//!
//! One file per target: [`http`] is the generic HTTP JSON writer and holds the response
//! mapping every HTTP writer shares; [`usercom`] writes into a User.com workspace.

pub mod http;
pub mod secrets;
pub mod usercom;

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;

use crate::catalog::Connection;

/// Requests per minute a writer declares when it knows nothing better.
pub const DEFAULT_REQUESTS_PER_MINUTE: u32 = 600;
/// The longest a rate-limit response may block a connection.
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(86_400);
/// The block a rate-limit response sets when it names no wait.
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The HTTP status the target answered with.
    pub http_status: Option<u16>,
}

/// Why a write did not deliver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The target asked us to slow down (HTTP 429): not a failure of the record.
    #[error("rate limited (wait {wait:?})")]
    RateLimited {
        /// The wait the response asked for, capped at [`MAX_RATE_LIMIT_WAIT`]; `None` when
        /// it named none.
        wait: Option<Duration>,
        /// The raw header value that named the wait, for the operator.
        raw: Option<String>,
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
    /// The rate the target allows, in requests per minute.
    fn requests_per_minute(&self) -> u32;
    /// How many calls may be in flight at once.
    fn max_in_flight(&self) -> usize;
    /// Delivers one record. Each call is exactly one request to the target.
    fn write<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Result<Receipt, WriteError>>;
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

/// Checks a rule's `path` against what writer kind `writer` can do with it: for `usercom`
/// it must name one of the operations; `http_json` takes any path. The error names the
/// path and what would be accepted.
pub fn check_path(writer: &str, path: &str) -> Result<(), String> {
    match writer {
        "usercom" => path.parse::<usercom::Operation>().map(|_| ()),
        _ => Ok(()),
    }
}

/// Builds the writer a connection asks for, reading its API key from the environment.
pub fn build(
    conn: &Connection,
    client: &reqwest::Client,
) -> Result<Arc<dyn Writer>, WriterConfigError> {
    let key = match &conn.api_key_env {
        None => None,
        Some(var) => Some(
            std::env::var(var).map_err(|_| WriterConfigError::MissingKey {
                connection: conn.name.clone(),
                var: var.clone(),
            })?,
        ),
    };
    match conn.writer.as_str() {
        "http_json" => Ok(Arc::new(http::HttpJsonWriter::new(conn, client, key)?)),
        "usercom" => Ok(Arc::new(usercom::UserComWriter::new(conn, client, key)?)),
        other => Err(WriterConfigError::Invalid {
            connection: conn.name.clone(),
            reason: format!("unknown writer {other:?}"),
        }),
    }
}
