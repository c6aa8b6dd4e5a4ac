//! The generic HTTP JSON writer (its HTTP plumbing is [`super::endpoint`]'s).
//!
//! A rule with `records_per_call` above 1 POSTs a JSON array of its payloads (or the body
//! its request shape names, such as `{"contacts": "{{records}}"}`) with one `Idempotency-Key` per call naming its
//! deliveries (`courier-12,13,17`). A rule's `answer` map says how its target's 2xx answer
//! names each record's fate ([`super::answer`]); without one, a 2xx whose body is an array
//! as long as the call is read per item ([`answer::item_outcome`]), a 207 without one accounts for
//! no record (each is sent again, never read as delivered), and any other 2xx delivers
//! every record. Any other answer is the whole call's. A rule that groups its records
//! ([`super::group`]) sends a group's call in the group's shape, and a refusal of it is
//! every record's.

use futures::{FutureExt, future::BoxFuture};

use super::answer::{self, item_outcome};
use super::contract::{Call, JobCalls, Writer};
use super::endpoint::{
    ANSWER_LIMIT, ERROR_READ_LIMIT, Endpoint, classify_transport, invalid, redirected, snippet,
};
use super::request::RequestShape;
use super::secrets::Secrets;
use super::template;
use super::wire::{Body, Outgoing, Receipt, WriteError, WriterConfigError, Written, read_capped};
use crate::{model::Connection, ratelimit::signals::RateSignals};

/// The longest URL courier sends (what common servers accept); a record whose filled path
/// makes a longer one is rejected.
pub const MAX_URL_LEN: usize = 8 * 1024;

/// The most records one `http_json` call carries.
pub const MAX_RECORDS_PER_CALL: usize = 1000;

/// The most records one call submitting an asynchronous job carries (Klaviyo's profile
/// bulk import takes 10,000).
pub const MAX_RECORDS_PER_JOB: usize = 10_000;

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
        let auth =
            super::auth::Auth::parse(conn.auth.as_ref()).map_err(|e| invalid(conn, e.reason))?;
        let authorization = key
            .as_deref()
            .map(|k| auth.header(k))
            .transpose()
            .map_err(|e| invalid(conn, e.reason))?
            .flatten();
        let oauth = match (&key, &auth) {
            (Some(k), super::auth::Auth::Oauth { .. }) => {
                auth.token_source(k).map_err(|e| invalid(conn, e.reason))?
            }
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

impl HttpJsonWriter {
    /// Deletes record `r` as `shape`'s `delete` says: one request, its path filled from the
    /// record, its body if the shape has one. A 2xx, or a status the shape reads as gone,
    /// delivers it; any other answer is the call's, as for any call.
    async fn delete(&self, shape: &RequestShape, r: &Outgoing<'_>) -> Result<Written, WriteError> {
        let Some(delete) = &shape.delete else {
            return Err(refused(
                "the rule states no request.delete: a delete cannot be sent".into(),
            ));
        };
        let path = delete.path(record(r)).map_err(refused)?;
        let path = path.trim_start_matches('/').to_owned();
        url(&self.base_url, &path).map_err(refused)?;
        let body = delete.body(record(r)).map_err(refused)?;
        let body = body.map(|b| serde_json::to_vec(&b).expect("JSON serializes"));
        let content_type = shape.content_type.as_deref().unwrap_or("application/json");
        let key = format!("courier-{}", r.delivery_id);
        let method = delete.method();
        let make = |base: &str, token: Option<&str>| {
            let request = self
                .endpoint
                .client
                .request(method.clone(), format!("{base}{path}"))
                .header("Idempotency-Key", &key);
            let request = match &body {
                Some(b) => request
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .body(b.clone()),
                None => request,
            };
            match token {
                Some(t) => request.bearer_auth(t),
                None => request,
            }
        };
        match self.send(make, false).await {
            Ok(receipt) => Ok(Written::all(receipt, 1)),
            Err(WriteError::Permanent {
                status: Some(status),
                ..
            }) if delete.gone(status) => {
                let receipt = Receipt {
                    http_status: Some(status),
                    ..Receipt::default()
                };
                Ok(Written::all(receipt, 1))
            }
            Err(e) => Err(e),
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
            let Some(first) = call.records.first() else {
                return Ok(Written::all(Receipt::default(), 0));
            };
            let shape = call.request.unwrap_or(&PLAIN);
            if call.delete {
                return self.delete(shape, first).await;
            }
            // A group's call (a bulk call of a rule that groups) takes the group's shape.
            let group = shape.group.as_ref().filter(|_| call.bulk);
            let (mut items, sent) = items(&call, shape);
            let Some(&(last, _)) = sent.last() else {
                return Ok(Written {
                    receipt: Receipt::default(),
                    items,
                });
            };
            let path = match group {
                Some(g) => g.path.clone(),
                None => template::fill_path(first.path, record(first)).map_err(refused)?,
            };
            let path = path.trim_start_matches('/').to_owned();
            // A URL that cannot be built is the record's, never a transient failure.
            url(&self.base_url, &path).map_err(refused)?;
            let ids: Vec<String> = sent
                .iter()
                .map(|(i, _)| call.records[*i].delivery_id.to_string())
                .collect();
            let outgoing: Vec<Outgoing<'_>> = sent.iter().map(|(i, _)| call.records[*i]).collect();
            let values = sent.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
            let (method, content_type, body) = encoded(&call, shape, &call.records[last], values)?;
            let key = format!("courier-{}", ids.join(","));
            let make = |base: &str, token: Option<&str>| {
                let request = self
                    .endpoint
                    .client
                    .request(method.clone(), format!("{base}{path}"))
                    .header("Idempotency-Key", &key)
                    .header(reqwest::header::CONTENT_TYPE, &content_type)
                    .body(body.clone());
                match token {
                    Some(t) => request.bearer_auth(t),
                    None => request,
                }
            };
            let receipt = match self.send(make, call.bulk).await {
                // A group's records share all the call says beyond naming them: its
                // refusal is each one's, never split.
                Err(e @ WriteError::Permanent { .. }) if group.is_some() => {
                    return Ok(refused_together(e, items));
                }
                other => other?,
            };
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
        content_type: Option<&'a str>,
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
                        .header(
                            reqwest::header::CONTENT_TYPE,
                            content_type.unwrap_or("application/json"),
                        )
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
    require: Vec::new(),
    group: None,
    delete: None,
};

/// A call's method, content type and body around the `items` it sends: a group's (the
/// key of `last`, a record of it, is the group's), a bulk call's, or one record's.
fn encoded(
    call: &Call<'_>,
    shape: &RequestShape,
    last: &Outgoing<'_>,
    items: Vec<serde_json::Value>,
) -> Result<(reqwest::Method, String, Vec<u8>), WriteError> {
    let json = |v: &serde_json::Value| serde_json::to_vec(v).expect("JSON serializes");
    Ok(match (shape.group.as_ref(), call.bulk) {
        (Some(g), true) => {
            let key = shape.group_key(record(last));
            let key = key.ok_or_else(|| refused("the group's key cannot be made".into()))?;
            let body = g.body(&key, items).map_err(refused)?;
            (g.method(), "application/json".into(), json(&body))
        }
        (None, true) => (shape.method(), shape.content_type(), shape.encode(items)),
        (_, false) => (
            shape.method(),
            shape.content_type(),
            json(&items.into_iter().next_back().unwrap_or_default()),
        ),
    })
}

/// A group's call refused as a whole: the refusal `e` of each record sent (the others
/// keep theirs).
fn refused_together(e: WriteError, mut items: Vec<Option<WriteError>>) -> Written {
    let status = e.http_status();
    for slot in items.iter_mut().filter(|s| s.is_none()) {
        *slot = Some(e.clone());
    }
    let receipt = Receipt {
        http_status: status,
        ..Receipt::default()
    };
    Written { receipt, items }
}

/// Each record of `call` as sent (its index and item), and the refusal of each that
/// cannot be: one whose payload lacks a field its template names is refused alone, the
/// others of the call go on.
#[allow(clippy::type_complexity)]
fn items(
    call: &Call<'_>,
    shape: &RequestShape,
) -> (Vec<Option<WriteError>>, Vec<(usize, serde_json::Value)>) {
    let group = shape.group.as_ref().filter(|_| call.bulk);
    let mut items: Vec<Option<WriteError>> = vec![None; call.records.len()];
    let mut sent = Vec::with_capacity(call.records.len());
    for (i, r) in call.records.iter().enumerate() {
        let item = match group {
            Some(g) => g.item(record(r)),
            None => shape
                .item(record(r))
                .and_then(|item| shape.sendable(&item).map(|()| item)),
        };
        match item {
            Ok(item) => sent.push((i, item)),
            Err(e) => items[i] = Some(refused(e)),
        }
    }
    (items, sent)
}

/// A record as the request's templates see it.
fn record<'r>(r: &Outgoing<'r>) -> template::Record<'r> {
    template::Record {
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
