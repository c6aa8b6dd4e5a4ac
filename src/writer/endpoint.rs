//! The HTTP plumbing every HTTP writer shares: what it takes from its connection (an
//! [`Endpoint`]: the shared client, headers, timeout, secrets), how it sends a request, and
//! how an answer maps to an outcome: 2xx delivered; 429 rate-limited with the wait the
//! response names; 400, 401, 403, 404 and 422 (and other 4xx) permanent; 5xx, timeouts and
//! connection errors transient; a redirect is never followed.

use crate::invalid::Invalid;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::secrets::{Secrets, is_secret_header};
use super::wire::{Body, Receipt, WriteError, WriterConfigError, rate_limit_headers, read_capped};
use crate::{model::Connection, ratelimit::signals::RateSignals};

/// Longest response body kept in an error message.
const ERROR_BODY_LIMIT: usize = 300;
/// The most of a 2xx answer's body courier reads; a longer one cannot be read.
pub const ANSWER_LIMIT: usize = 16 * 1024 * 1024;
/// The most of an error answer's body courier reads (it keeps a snippet of it).
pub(crate) const ERROR_READ_LIMIT: usize = 64 * 1024;
/// What every HTTP writer takes from its connection: the shared client, the headers
/// (the connection's own plus authorization), the timeout and the in-flight bound; and
/// how it sends a request and maps the answer.
pub struct Endpoint {
    /// The connection's name: log lines about its credentials name it.
    pub connection: String,
    /// Shared client: one connection pool per process.
    pub client: reqwest::Client,
    /// The connection's extra headers plus `Authorization` (marked sensitive).
    pub headers: HeaderMap,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Calls in flight at once.
    pub max_in_flight: usize,
    /// The key and secret header values, hidden in every error text a target sends back.
    pub secrets: Secrets,
    /// What the target says about its rate beyond the standard headers.
    pub signals: RateSignals,
}

impl Endpoint {
    /// Reads `conn`'s settings and headers; `authorization` is the header carrying the
    /// key and its full value (e.g. `Authorization: Bearer <key>`), never logged; `key`
    /// is the key itself, a secret in whatever form it is presented.
    pub fn new(
        conn: &Connection,
        client: &reqwest::Client,
        authorization: Option<(HeaderName, String)>,
        key: Option<&str>,
    ) -> Result<Self, WriterConfigError> {
        let invalid = |reason: String| invalid(conn, reason);
        let mut headers = header_map(&conn.headers).map_err(|e| invalid(e.reason))?;
        let signals =
            RateSignals::parse(conn.rate_signals.as_ref()).map_err(|e| invalid(e.reason))?;
        let secrets = Secrets::default();
        if let Some(key) = key {
            secrets.add(key);
        }
        for (name, value) in conn.headers.as_object().into_iter().flatten() {
            if let Some(value) = value.as_str().filter(|_| is_secret_header(name)) {
                secrets.add(value);
            }
        }
        if let Some((name, authorization)) = authorization {
            secrets.add(&authorization);
            let mut value = HeaderValue::try_from(authorization)
                .map_err(|_| invalid("the API key holds characters a header cannot".into()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Self {
            connection: conn.name.clone(),
            client: client.clone(),
            headers,
            timeout: Duration::from_millis(conn.timeout_ms.max(1) as u64),
            max_in_flight: conn.max_in_flight.max(1) as usize,
            secrets,
            signals,
        })
    }

    /// Sends `request` with the endpoint's headers and timeout and maps the answer.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Receipt, WriteError> {
        self.send_reading(request, false).await
    }

    /// As [`Endpoint::send`]; with `read_body`, a successful answer's JSON body is kept in
    /// the receipt.
    pub async fn send_reading(
        &self,
        request: reqwest::RequestBuilder,
        read_body: bool,
    ) -> Result<Receipt, WriteError> {
        let response = request
            .headers(self.headers.clone())
            .timeout(self.timeout)
            .send()
            .await;
        // What the target says is sealed by the call stage ([`Secrets::seal`]).
        match response {
            Ok(r) => classify_response(r, &self.signals, &self.connection, read_body).await,
            Err(e) => Err(classify_transport(e)),
        }
    }
}

/// A connection's extra headers (a JSON object of strings) as HTTP headers. The same
/// function checks them when a connection is saved and builds them for its writer, so what
/// is accepted is what can be sent. An error names the header and what is wrong with it,
/// never its value (it may be a secret). Secret headers (see [`is_secret_header`]) are
/// marked sensitive. A header courier or HTTP sets itself ([`super::auth::OWNED_HEADERS`]:
/// `Idempotency-Key`, `Content-Type`, `Host`, ...) is refused, and so is one named twice in
/// different case (`X-Dup` and `x-dup`: the second would silently replace the first).
pub fn header_map(headers: &serde_json::Value) -> Result<HeaderMap, Invalid> {
    header_map_or_why(headers).map_err(Invalid::at("headers"))
}

fn header_map_or_why(headers: &serde_json::Value) -> Result<HeaderMap, String> {
    let map = headers
        .as_object()
        .ok_or("headers must be a JSON object of names and string values")?;
    let mut out = HeaderMap::with_capacity(map.len());
    for (name, value) in map {
        let header = HeaderName::try_from(name.as_str()).map_err(|_| {
            format!(
                "header name {name:?} is not a valid HTTP header name (letters, digits and \
                 !#$%&'*+-.^_`|~ only, not empty)"
            )
        })?;
        if let Some((owned, why)) = super::auth::owned_header(name) {
            return Err(format!("header {owned} cannot be set: {why}"));
        }
        if out.contains_key(&header) {
            let first = map
                .keys()
                .find(|k| *k != name && k.eq_ignore_ascii_case(name))
                .unwrap_or(name);
            return Err(format!(
                "headers {first:?} and {name:?} are the same header (names ignore case): \
                 give it once"
            ));
        }
        let value = value
            .as_str()
            .ok_or_else(|| format!("header {name:?}: its value must be a string"))?;
        let mut value = HeaderValue::try_from(value).map_err(|_| {
            let what = if value.contains(['\r', '\n']) {
                "a line break"
            } else {
                "a control character"
            };
            format!("header {name:?}: its value holds {what} (only tabs are allowed)")
        })?;
        value.set_sensitive(is_secret_header(name));
        out.insert(header, value);
    }
    Ok(out)
}

/// A configuration error about `conn`.
pub fn invalid(conn: &Connection, reason: String) -> WriterConfigError {
    WriterConfigError::Invalid {
        connection: conn.name.clone(),
        reason,
    }
}

/// Notes whether `connection`'s credentials are being refused; returns true when that
/// changed (the moment to log it).
fn refused_credentials(connection: &str, refused: bool) -> bool {
    static REFUSED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut list = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    let at = list.iter().position(|c| c == connection);
    match (at, refused) {
        (None, true) => {
            list.push(connection.to_owned());
            true
        }
        (Some(i), false) => {
            list.swap_remove(i);
            true
        }
        _ => false,
    }
}

/// Maps a response to an outcome. `signals` name the target's own headers (a reset in
/// seconds gives a 429's wait when `Retry-After` is absent; every one is kept for the
/// pacer) and the answers other than 429 that mean "rate limited". `connection` is the
/// connection's name, for the warning a refused credential (401, 403) logs; the key itself
/// is never logged.
pub async fn classify_response(
    response: reqwest::Response,
    signals: &RateSignals,
    connection: &str,
    read_body: bool,
) -> Result<Receipt, WriteError> {
    let status = response.status().as_u16();
    if response.status().is_success() {
        if refused_credentials(connection, false) {
            tracing::info!(
                connection,
                "target accepts the credentials of this connection again"
            );
        }
        let rate_headers = rate_limit_headers(response.headers(), signals);
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_owned);
        let body = match read_body {
            true => read_answer(response).await,
            false => Body::Empty,
        };
        return Ok(Receipt {
            http_status: Some(status),
            rate_headers,
            body,
            location,
        });
    }
    if status == 429 {
        // An HTTP-date is on the target's clock: read against its answer's `Date`.
        let answered = crate::ratelimit::headers::answered_at(response.headers())
            .map_or_else(SystemTime::now, SystemTime::from);
        let (wait, raw) = crate::ratelimit::headers::rate_limit_wait(
            response.headers(),
            signals.reset_seconds_headers(),
            answered,
        );
        return Err(WriteError::RateLimited {
            wait,
            raw,
            rate_headers: Box::new(rate_limit_headers(response.headers(), signals)),
        });
    }
    if response.status().is_redirection() {
        return Err(redirected(status, response.headers()));
    }
    Err(error_answer(status, response, signals, connection).await)
}

/// A 3xx: no redirect is followed. Credentials go only to the origin configured, and a POST
/// turned into a GET elsewhere would deliver nothing.
pub(crate) fn redirected(status: u16, headers: &reqwest::header::HeaderMap) -> WriteError {
    let location = headers
        .get(reqwest::header::LOCATION)
        .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
    WriteError::Transient {
        status: Some(status),
        message: format!(
            "the target answered {status}, redirecting to {}; courier follows no \
             redirect (check the base URL)",
            location
                .as_deref()
                .map_or("nowhere".into(), |l| format!("{l:?}"))
        ),
    }
}

/// Any other answer that is neither a 2xx nor a 429 nor a redirect: a limit answer the
/// connection's signals name, a 4xx (permanent) or a 5xx (transient), with a snippet of
/// its body.
async fn error_answer(
    status: u16,
    response: reqwest::Response,
    signals: &RateSignals,
    connection: &str,
) -> WriteError {
    let rate_headers = rate_limit_headers(response.headers(), signals);
    let body = match read_capped(response, ERROR_READ_LIMIT).await {
        Ok(b) | Err((b, _)) => String::from_utf8_lossy(&b).into_owned(),
    };
    // An answer the connection's signals name as "rate limited" (Salesforce's 403
    // `REQUEST_LIMIT_EXCEEDED`): a statement about the target's rate, not about the record
    // or the credentials.
    if let Some(signal) = signals.limited(status, &body) {
        return WriteError::RateLimited {
            wait: None,
            raw: Some(signal),
            rate_headers: Box::new(rate_headers),
        };
    }
    let message = snippet(&body);
    if !(400..500).contains(&status) {
        return WriteError::Transient {
            status: Some(status),
            message,
        };
    }
    // Said once per process when it starts (and once when it ends), not per call.
    if matches!(status, 401 | 403) && refused_credentials(connection, true) {
        tracing::warn!(
            connection,
            status,
            "target refused the credentials of this connection: check its API key variable"
        );
    }
    WriteError::Permanent {
        status: Some(status),
        message,
    }
}

/// A 2xx answer's body, read whole as JSON (as text when its content type says CSV), empty,
/// or why it cannot be read.
async fn read_answer(response: reqwest::Response) -> Body {
    let csv = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/csv"));
    match read_capped(response, ANSWER_LIMIT).await {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Body::Empty,
        Ok(bytes) if csv => match String::from_utf8(bytes) {
            Ok(text) => Body::Text(text),
            Err(_) => Body::Unreadable("the CSV answer is not UTF-8".into()),
        },
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => Body::Json(v),
            Err(e) => Body::Unreadable(format!("the answer is not JSON ({e})")),
        },
        Err((_, why)) => Body::Unreadable(why),
    }
}

/// Maps a transport error (no response) to a transient failure.
pub fn classify_transport(e: reqwest::Error) -> WriteError {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    // reqwest's Display carries the URL, never headers: no key can leak here.
    WriteError::Transient {
        status: None,
        message: format!("{kind}: {}", e.without_url()),
    }
}

pub(crate) fn snippet(body: &str) -> String {
    let mut s: String = body.chars().take(ERROR_BODY_LIMIT).collect();
    if body.chars().count() > ERROR_BODY_LIMIT {
        s.push('…');
    }
    s
}
