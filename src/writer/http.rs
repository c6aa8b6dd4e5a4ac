//! The generic HTTP JSON writer, and the response mapping every HTTP writer shares:
//! 2xx delivered; 429 rate-limited with the wait the response names; 400, 401, 403, 404
//! and 422 (and other 4xx) permanent; 5xx, timeouts and connection errors transient.
//!
//! A rule with `records_per_call` above 1 POSTs a JSON array of its payloads (or the body
//! its request shape names, such as `{"contacts": "{{records}}"}`) with one `Idempotency-Key` per call naming its
//! deliveries (`courier-12,13,17`). A rule's `answer` map says how its target's 2xx answer
//! names each record's fate ([`super::answer`]); without one, a 2xx whose body is an array
//! as long as the call is read per item ([`item_outcome`]), a 207 without one accounts for
//! no record (each is sent again, never read as delivered), and any other 2xx delivers
//! every record. Any other answer is the whole call's.

use std::time::{Duration, SystemTime};

use futures::{FutureExt, future::BoxFuture};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::answer;
use super::contract::{Call, JobCalls, Writer};
use super::request::{self, RequestShape};
use super::secrets::{Secrets, is_secret_header};
use super::wire::{
    Body, Outgoing, Receipt, WriteError, WriterConfigError, Written, rate_limit_headers,
    read_capped,
};
use crate::{model::Connection, ratelimit::signals::RateSignals};

/// Longest response body kept in an error message.
const ERROR_BODY_LIMIT: usize = 300;
/// The most of a 2xx answer's body courier reads; a longer one cannot be read.
pub const ANSWER_LIMIT: usize = 16 * 1024 * 1024;
/// The most of an error answer's body courier reads (it keeps a snippet of it).
const ERROR_READ_LIMIT: usize = 64 * 1024;
/// The longest URL courier sends (what common servers accept); a record whose filled path
/// makes a longer one is rejected.
pub const MAX_URL_LEN: usize = 8 * 1024;

/// The most records one `http_json` call carries.
pub const MAX_RECORDS_PER_CALL: usize = 1000;

/// The most records one call submitting an asynchronous job carries (Klaviyo's profile
/// bulk import takes 10,000).
pub const MAX_RECORDS_PER_JOB: usize = 10_000;

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
        let mut headers = header_map(&conn.headers).map_err(invalid)?;
        let signals = RateSignals::parse(conn.rate_signals.as_ref()).map_err(invalid)?;
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
pub fn header_map(headers: &serde_json::Value) -> Result<HeaderMap, String> {
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

/// POSTs each payload as JSON to the connection's base URL joined with the rule's path.
pub struct HttpJsonWriter {
    /// Client, headers, timeout, rate.
    endpoint: Endpoint,
    /// Base URL, ending in `/` so rule paths join under it.
    base_url: String,
    /// Where its OAuth tokens come from (auth kind `oauth`).
    oauth: Option<super::oauth::TokenSource>,
}

impl HttpJsonWriter {
    /// Builds the writer for `conn`; `key` is the API key read from its environment variable
    /// and is sent as its `auth` says (`Authorization: Bearer <key>` unless told otherwise).
    pub fn new(
        conn: &Connection,
        client: &reqwest::Client,
        key: Option<String>,
    ) -> Result<Self, WriterConfigError> {
        let mut base_url = conn.base_url.clone();
        if !base_url.ends_with('/') {
            base_url.push('/');
        }
        let auth = super::auth::Auth::parse(conn.auth.as_ref()).map_err(|e| invalid(conn, e))?;
        let authorization = key
            .as_deref()
            .map(|k| auth.header(k))
            .transpose()
            .map_err(|e| invalid(conn, e))?
            .flatten();
        let oauth = match (&key, &auth) {
            (Some(k), super::auth::Auth::Oauth { .. }) => auth
                .token_source(&conn.name, k)
                .map_err(|e| invalid(conn, e))?,
            (None, super::auth::Auth::Oauth { .. }) => {
                return Err(invalid(
                    conn,
                    "auth oauth needs api_key_env (the variable holding the client secret)".into(),
                ));
            }
            _ => None,
        };
        let endpoint = Endpoint::new(conn, client, authorization, key.as_deref())?;
        Ok(Self {
            endpoint,
            base_url,
            oauth,
        })
    }

    /// Sends one request made by `make` (given the bearer token, for OAuth): with OAuth,
    /// the token in force, and once more with a fresh one when the target answers 401.
    async fn send(
        &self,
        make: impl Fn(&str, Option<&str>) -> reqwest::RequestBuilder,
        read_body: bool,
    ) -> Result<Receipt, WriteError> {
        let Some(source) = &self.oauth else {
            return self
                .endpoint
                .send_reading(make(&self.base_url, None), read_body)
                .await;
        };
        let client = &self.endpoint.client;
        let mut refused: Option<String> = None;
        loop {
            let token = source.token(client, refused.as_deref()).await?;
            // Hidden from here on, in this answer and any later one that echoes it.
            self.endpoint.secrets.add_token(&token.access);
            let base = match &token.instance_url {
                Some(instance) => with_origin(&self.base_url, instance),
                None => self.base_url.clone(),
            };
            let answer = self
                .endpoint
                .send_reading(make(&base, Some(&token.access)), read_body)
                .await;
            match answer {
                Err(WriteError::Permanent {
                    status: Some(401), ..
                }) if refused.is_none() => refused = Some(token.access),
                other => return other,
            }
        }
    }
}

impl Writer for HttpJsonWriter {
    fn secrets(&self) -> &Secrets {
        &self.endpoint.secrets
    }

    fn max_in_flight(&self) -> usize {
        self.endpoint.max_in_flight
    }

    fn rate_signals(&self) -> &RateSignals {
        &self.endpoint.signals
    }

    fn write_many<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Written, WriteError>> {
        async move {
            let n = call.records.len();
            let Some(first) = call.records.first() else {
                return Ok(Written::all(Receipt::default(), 0));
            };
            let shape = call.request.unwrap_or(&PLAIN);
            // Each record as sent; one whose payload lacks a field its template names is
            // refused alone, the others of the call go on.
            let mut items: Vec<Option<WriteError>> = vec![None; n];
            let mut sent: Vec<(usize, serde_json::Value)> = Vec::with_capacity(n);
            for (i, r) in call.records.iter().enumerate() {
                match shape
                    .item(record(r))
                    .and_then(|item| shape.sendable(&item).map(|()| item))
                {
                    Ok(item) => sent.push((i, item)),
                    Err(e) => items[i] = Some(refused(e)),
                }
            }
            if sent.is_empty() {
                return Ok(Written {
                    receipt: Receipt::default(),
                    items,
                });
            }
            let path = match request::fill_path(first.path, record(first)) {
                Ok(p) => p,
                Err(e) => return Err(refused(e)),
            };
            let path = path.trim_start_matches('/');
            // A URL that cannot be built is the record's, never a transient failure.
            url(&self.base_url, path).map_err(refused)?;
            let ids: Vec<String> = sent
                .iter()
                .map(|(i, _)| call.records[*i].delivery_id.to_string())
                .collect();
            let outgoing: Vec<Outgoing<'_>> = sent.iter().map(|(i, _)| call.records[*i]).collect();
            let body = match call.bulk {
                true => shape.encode(sent.into_iter().map(|(_, v)| v).collect()),
                false => serde_json::to_vec(&sent.pop().map(|(_, v)| v).unwrap_or_default())
                    .expect("JSON serializes"),
            };
            let key = format!("courier-{}", ids.join(","));
            let make = |base: &str, token: Option<&str>| {
                let request = self
                    .endpoint
                    .client
                    .request(shape.method(), format!("{base}{path}"))
                    .header("Idempotency-Key", &key)
                    .header(reqwest::header::CONTENT_TYPE, shape.content_type())
                    .body(body.clone());
                match token {
                    Some(t) => request.bearer_auth(t),
                    None => request,
                }
            };
            let receipt = self.send(make, call.bulk).await?;
            let answered = answered(&call, &outgoing, &receipt).into_iter();
            // The records sent are those not refused before sending, in the same order.
            for (slot, fate) in items.iter_mut().filter(|s| s.is_none()).zip(answered) {
                *slot = fate;
            }
            Ok(Written { receipt, items })
        }
        .boxed()
    }

    fn jobs(&self) -> Option<&dyn JobCalls> {
        Some(self)
    }
}

impl JobCalls for HttpJsonWriter {
    fn ask<'a>(
        &'a self,
        method: reqwest::Method,
        path: &'a str,
        body: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        async move {
            // A link the target gave (a next page) may be absolute: it is followed only at
            // the connection's own origin, where its credentials may go.
            let absolute = path.contains("://");
            if absolute && origin(path) != origin(&self.base_url) {
                return Err(WriteError::Permanent {
                    status: None,
                    message: format!(
                        "the target links to another origin ({}); courier sends the \
                         connection's credentials to its base URL's origin only",
                        origin(path)
                    ),
                });
            }
            // From the origin on: the base (an OAuth instance URL may replace its origin).
            let rest = match absolute {
                true => path[origin(path).len()..].to_owned(),
                false => format!(
                    "{}{}",
                    &self.base_url[origin(&self.base_url).len()..],
                    path.trim_start_matches('/')
                ),
            };
            url(origin(&self.base_url), &rest).map_err(refused)?;
            let body = body.map(|b| serde_json::to_vec(b).expect("JSON serializes"));
            let make = |base: &str, token: Option<&str>| {
                let url = format!("{}{rest}", origin(base));
                let request = self.endpoint.client.request(method.clone(), url);
                let request = match &body {
                    Some(b) => request
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(b.clone()),
                    None => request,
                };
                match token {
                    Some(t) => request.bearer_auth(t),
                    None => request,
                }
            };
            self.send(make, true).await
        }
        .boxed()
    }

    fn fetch<'a>(&'a self, url: &'a reqwest::Url) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        async move {
            // The bare client: none of the endpoint's headers (its credentials among them).
            let request = self.endpoint.client.get(url.clone());
            let response = request
                .timeout(self.endpoint.timeout)
                .send()
                .await
                .map_err(classify_transport)?;
            let status = response.status().as_u16();
            if response.status().is_redirection() {
                return Err(redirected(status, response.headers()));
            }
            if !response.status().is_success() {
                let body = match read_capped(response, ERROR_READ_LIMIT).await {
                    Ok(b) | Err((b, _)) => snippet(&String::from_utf8_lossy(&b)),
                };
                let message = format!("the file host answered {status}: {body}");
                return Err(match (400..500).contains(&status) && status != 429 {
                    true => WriteError::Permanent {
                        status: Some(status),
                        message,
                    },
                    false => WriteError::Transient {
                        status: Some(status),
                        message,
                    },
                });
            }
            let body = match read_capped(response, ANSWER_LIMIT).await {
                Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Body::Empty,
                Ok(bytes) => String::from_utf8(bytes).map_or_else(
                    |_| Body::Unreadable("the file is not UTF-8".into()),
                    Body::Text,
                ),
                Err((_, why)) => Body::Unreadable(why),
            };
            Ok(Receipt {
                http_status: Some(status),
                body,
                ..Receipt::default()
            })
        }
        .boxed()
    }
}

/// The fate of each record of `outgoing` (those of `call` that were sent) from the
/// answer `receipt`: by the rule's answer map, else the generic per-item array. A body
/// that cannot be read whole accounts for nobody.
fn answered(
    call: &Call<'_>,
    outgoing: &[Outgoing<'_>],
    receipt: &Receipt,
) -> Vec<Option<WriteError>> {
    let status = receipt.http_status.unwrap_or(200);
    let m = outgoing.len();
    match (call.bulk, call.answer, &receipt.body) {
        (false, _, _) => vec![None; m],
        (true, Some(map), body) => map.read(status, body, outgoing),
        (true, None, Body::Unreadable(why)) => answer::unaccounted(status, m, why),
        (true, None, Body::Text(_)) => answer::unaccounted(status, m, "a CSV answer, not JSON"),
        (true, None, Body::Json(serde_json::Value::Array(items))) if items.len() == m => {
            items.iter().map(|i| item_outcome(status, i)).collect()
        }
        (true, None, Body::Json(serde_json::Value::Array(items))) => answer::unaccounted(
            status,
            m,
            &format!("{} answer items for {m} records", items.len()),
        ),
        (true, None, _) => answer::unnamed(status, m),
    }
}

/// The URL of a request: `base` (ending in `/`) and `path` joined, checked as one that
/// can be sent; the error names what is wrong, never the value.
fn url(base: &str, path: &str) -> Result<reqwest::Url, String> {
    let joined = format!("{base}{path}");
    if joined.len() > MAX_URL_LEN {
        return Err(format!(
            "the URL built from the rule's path is {} bytes, over the {MAX_URL_LEN} courier sends",
            joined.len()
        ));
    }
    let url = reqwest::Url::parse(&joined)
        .map_err(|e| format!("the URL built from the rule's path is not valid: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("the URL built from the rule's path is no http(s) URL with a host".into());
    }
    Ok(url)
}

/// The scheme and authority of `url` (`https://a.example.com:8443`), without a path.
fn origin(url: &str) -> &str {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            &url[..scheme.len() + 3 + end]
        }
        None => "",
    }
}

/// `base` with its scheme and host replaced by `origin`'s (an OAuth instance URL).
fn with_origin(base: &str, origin: &str) -> String {
    let rest = base
        .split_once("://")
        .and_then(|(_, r)| r.find('/').map(|i| &r[i..]))
        .unwrap_or("/");
    format!("{}{rest}", origin.trim_end_matches('/'))
}

/// The shape of a rule that states none: each payload as it is, by POST as JSON.
static PLAIN: RequestShape = RequestShape {
    method: None,
    content_type: None,
    item: None,
    body: None,
    csv: None,
    max_bytes: None,
    multipart: None,
};

/// A record as the request's templates see it.
fn record<'r>(r: &Outgoing<'r>) -> request::Record<'r> {
    request::Record {
        delivery_id: r.delivery_id,
        record_key: r.record_key,
        payload: r.payload,
    }
}

/// A record the writer cannot send as its rule shapes it (never sent, so it says nothing
/// of the target).
fn refused(reason: String) -> WriteError {
    WriteError::Permanent {
        status: None,
        message: reason,
    }
}

/// What one item of a per-item answer says of its record: its `status` is an HTTP status
/// (absent: 200), and an `error` field makes it a failure classified like that status (a
/// 2xx with an error counts as 422). 5xx, 408 and 429 are transient, other 4xx
/// permanent; anything else delivered.
pub fn item_outcome(answer_status: u16, item: &serde_json::Value) -> Option<WriteError> {
    if !item.is_object() {
        return answer::unaccounted(answer_status, 1, "an answer item that is no object")
            .pop()
            .flatten();
    }
    let status = item
        .get("status")
        .and_then(serde_json::Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    let error = item.get("error").filter(|e| !e.is_null());
    let status = match (status, error) {
        (Some(s), None) if (200..400).contains(&s) => return None,
        (None, None) => return None,
        (Some(s), Some(_)) if (200..400).contains(&s) => 422,
        (None, Some(_)) => 422,
        (Some(s), _) => s,
    };
    let message = match error {
        Some(serde_json::Value::String(e)) => snippet(e),
        Some(e) => snippet(&e.to_string()),
        None => format!("the target answered {status} for this record"),
    };
    let status = Some(status);
    if status >= Some(500) || matches!(status, Some(408 | 429)) {
        Some(WriteError::Transient { status, message })
    } else {
        Some(WriteError::Permanent { status, message })
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
fn redirected(status: u16, headers: &reqwest::header::HeaderMap) -> WriteError {
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

fn snippet(body: &str) -> String {
    let mut s: String = body.chars().take(ERROR_BODY_LIMIT).collect();
    if body.chars().count() > ERROR_BODY_LIMIT {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_item_answers_read_status_and_error() {
        use serde_json::json;
        let status = |item| {
            item_outcome(200, &item)
                .map(|e| (e.http_status(), matches!(e, WriteError::Transient { .. })))
        };
        assert_eq!(status(json!({"status": 200})), None);
        assert_eq!(status(json!({})), None);
        assert_eq!(status(json!({"status": 201, "error": null})), None);
        assert_eq!(status(json!({"status": 400})), Some((Some(400), false)));
        assert_eq!(
            status(json!({"status": 200, "error": "bad"})),
            Some((Some(422), false))
        );
        assert_eq!(
            status(json!({"error": {"field": "x"}})),
            Some((Some(422), false))
        );
        assert_eq!(
            status(json!({"status": 503, "error": "later"})),
            Some((Some(503), true))
        );
        assert_eq!(status(json!({"status": 429})), Some((Some(429), true)));
        assert!(matches!(
            item_outcome(200, &json!("ok")),
            Some(WriteError::Unaccounted { .. })
        ));
        let e = item_outcome(200, &json!({"status": 409, "error": "duplicate sku"})).unwrap();
        assert!(e.to_string().contains("duplicate sku"), "{e}");
    }
}
