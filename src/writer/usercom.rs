//! The User.com writer: one request per record into one workspace's public API
//! (`https://<app>.user.com/api/public/`), `Authorization: Token <key>`,
//! `Accept: */*; version=2`, JSON bodies. The rule's `path` names the [`Operation`]; the
//! delivery's payload is turned into that operation's request by [`build_request`], a pure
//! function, so a payload that cannot work is rejected before anything is sent.
//!
//! A `user_attributes` rule with `records_per_call` above 1 sends the deliveries that set
//! exactly one custom attribute (a consent change: `{"custom_id": "c1", "attributes":
//! {"email_consent": false}}`) grouped by attribute and value, as one
//! `PUT users-by-id/mass_update_custom_attributes/` per group of up to `records_per_call`
//! custom ids ([`mass_groups`]); its other deliveries go one by one. The answer's
//! `not_found` ids (users the workspace does not know) are rejected as a single call's 404
//! would be; a refusal of the whole call (an unknown attribute, a bad value) is every
//! record's, since they share attribute and value.
//!
//! Appending operations (`event`, `product_event`) carry the delivery's id in
//! `data.courier_delivery_id`: User.com has no idempotency key, so this is how a duplicate
//! left by a timed-out call can be found.

use std::str::FromStr;

use futures::{FutureExt, future::BoxFuture};
use reqwest::{
    Method, Url,
    header::{ACCEPT, HeaderValue},
};
use serde_json::{Map, Value};

use super::contract::{Call, Writer};
use super::endpoint::{Endpoint, invalid};
use super::wire::{Body, Outgoing, Receipt, WriteError, WriterConfigError, Written};
use crate::{model::Connection, ratelimit::signals::RateSignals};

/// The `Accept` header User.com's clients send to select API version 2.
pub const ACCEPT_VERSION_2: &str = "*/*; version=2";
/// The most custom ids one mass update carries (User.com documents no maximum).
pub const MAX_IDS_PER_CALL: usize = 100;
/// Where appending operations put the delivery id inside `data`.
pub const DELIVERY_ID_FIELD: &str = "courier_delivery_id";

/// What one record becomes in User.com: the rule's `path` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST users/update_or_create/`: the user object, matched on `custom_id`.
    UserUpsert,
    /// `POST users-by-id/{custom_id}/set_multiple_attributes/`.
    UserAttributes,
    /// `PUT users/mass_update_custom_attributes/` (User.com ids) or
    /// `PUT users-by-id/mass_update_custom_attributes/` (custom ids): one attribute, one
    /// value, many users in one request.
    MassUpdateCustomAttributes,
    /// `POST events/`: appends a timeline event.
    Event,
    /// `POST products-by-id/{product_custom_id}/product_event/`: appends a product event
    /// (price and stock changes travel here).
    ProductEvent,
    /// `POST deals/update_or_create/`: the deal object, matched on `custom_id`.
    DealUpsert,
}

impl Operation {
    /// Every operation, by the name a rule's `path` uses.
    pub const ALL: [(&'static str, Operation); 6] = [
        ("user_upsert", Operation::UserUpsert),
        ("user_attributes", Operation::UserAttributes),
        (
            "mass_update_custom_attributes",
            Operation::MassUpdateCustomAttributes,
        ),
        ("event", Operation::Event),
        ("product_event", Operation::ProductEvent),
        ("deal_upsert", Operation::DealUpsert),
    ];

    /// The name a rule's `path` uses.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, op)| *op == self)
            .map_or("?", |(n, _)| n)
    }

    /// Whether each call appends (repeating it leaves a duplicate).
    pub fn appends(self) -> bool {
        matches!(self, Operation::Event | Operation::ProductEvent)
    }
}

impl FromStr for Operation {
    type Err = String;

    /// Parses a rule's `path` (surrounding slashes and blanks ignored).
    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.trim().trim_matches('/');
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, op)| *op)
            .ok_or_else(|| {
                format!(
                    "unknown User.com operation {name:?} (the rule's path must be one of {})",
                    Self::ALL.map(|(n, _)| n).join(", ")
                )
            })
    }
}

/// One request to send: method, path segments under the base URL, JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// HTTP method.
    pub method: Method,
    /// Path segments under the base URL (escaped when joined; a trailing slash is added).
    pub segments: Vec<String>,
    /// JSON body.
    pub body: Value,
}

impl Request {
    /// The path as sent, relative to the base URL, e.g. `users-by-id/c%201/set_attribute/`.
    pub fn relative_path(&self, base: &Url) -> Result<Url, String> {
        let mut url = base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| "the base URL cannot take a path".to_owned())?;
            path.pop_if_empty();
            path.extend(&self.segments);
            path.push("");
        }
        Ok(url)
    }
}

/// Turns a delivery into the request of `op`. A payload that lacks a required field (or
/// has one of the wrong type) is an error naming the field.
pub fn build_request(op: Operation, out: &Outgoing<'_>) -> Result<Request, String> {
    let payload = out
        .payload
        .as_object()
        .ok_or_else(|| format!("{}: the payload must be a JSON object", op.name()))?;
    let fields = Fields { op, payload };
    let req = |method: Method, segments: &[&str], body: Value| Request {
        method,
        segments: segments.iter().map(|s| (*s).to_owned()).collect(),
        body,
    };
    match op {
        Operation::UserUpsert => {
            fields.string("custom_id")?;
            Ok(req(
                Method::POST,
                &["users", "update_or_create"],
                out.payload.clone(),
            ))
        }
        Operation::DealUpsert => {
            fields.string("custom_id")?;
            Ok(req(
                Method::POST,
                &["deals", "update_or_create"],
                out.payload.clone(),
            ))
        }
        Operation::UserAttributes => {
            let custom_id = fields.string("custom_id")?;
            let attributes = fields.attributes()?;
            Ok(req(
                Method::POST,
                &["users-by-id", &custom_id, "set_multiple_attributes"],
                attributes,
            ))
        }
        Operation::MassUpdateCustomAttributes => fields.mass_update(),
        Operation::Event => {
            fields.string("name")?;
            need_user(op, payload)?;
            let body = with_delivery_id(op, payload, out.delivery_id)?;
            Ok(req(Method::POST, &["events"], body))
        }
        Operation::ProductEvent => {
            let product = fields.string("product_custom_id")?;
            fields.string("event_type")?;
            need_user(op, payload)?;
            let mut body = with_delivery_id(op, payload, out.delivery_id)?;
            if let Value::Object(m) = &mut body {
                m.remove("product_custom_id");
            }
            Ok(req(
                Method::POST,
                &["products-by-id", &product, "product_event"],
                body,
            ))
        }
    }
}

/// A payload read for operation `op`: each error names the operation and the field.
struct Fields<'a> {
    op: Operation,
    payload: &'a Map<String, Value>,
}

impl Fields<'_> {
    /// A required non-empty string (or a number, as its text).
    fn string(&self, field: &str) -> Result<String, String> {
        match self.payload.get(field) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(_) => Err(format!(
                "{}: field {field:?} must be a non-empty string",
                self.op.name()
            )),
            None => Err(format!(
                "{}: missing required field {field:?}",
                self.op.name()
            )),
        }
    }

    /// `attributes`, a non-empty object.
    fn attributes(&self) -> Result<Value, String> {
        match self.payload.get("attributes") {
            Some(Value::Object(m)) if !m.is_empty() => Ok(Value::Object(m.clone())),
            Some(_) => Err(format!(
                "{}: field \"attributes\" must be a non-empty object",
                self.op.name()
            )),
            None => Err(format!(
                "{}: missing required field \"attributes\"",
                self.op.name()
            )),
        }
    }

    /// The mass update a payload names: `custom_ids` (or User.com's `ids`), `attribute`,
    /// `value`.
    fn mass_update(&self) -> Result<Request, String> {
        let name = self.op.name();
        let attribute = self.string("attribute")?;
        let value = self
            .payload
            .get("value")
            .ok_or_else(|| format!("{name}: missing required field \"value\""))?;
        let (resource, ids) = match (self.payload.get("custom_ids"), self.payload.get("ids")) {
            (Some(ids), None) => ("users-by-id", ids),
            (None, Some(ids)) => ("users", ids),
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{name}: give either \"custom_ids\" or \"ids\", not both"
                ));
            }
            (None, None) => {
                return Err(format!(
                    "{name}: missing required field \"custom_ids\" (or \"ids\")"
                ));
            }
        };
        if ids.as_array().is_none_or(|a| a.is_empty()) {
            return Err(format!("{name}: the user ids must be a non-empty array"));
        }
        Ok(Request {
            method: Method::PUT,
            segments: vec![resource.into(), "mass_update_custom_attributes".into()],
            body: serde_json::json!({"ids": ids, "attribute": attribute, "value": value}),
        })
    }
}

/// Appending operations name their user by `user_custom_id` or `user_id`.
fn need_user(op: Operation, payload: &Map<String, Value>) -> Result<(), String> {
    let present = |f: &str| {
        payload
            .get(f)
            .is_some_and(|v| v.as_str().is_some_and(|s| !s.is_empty()) || v.is_number())
    };
    if present("user_custom_id") || present("user_id") {
        Ok(())
    } else {
        Err(format!(
            "{}: missing required field \"user_custom_id\" (or \"user_id\")",
            op.name()
        ))
    }
}

/// The payload with `data.courier_delivery_id` set (creating `data` when absent).
fn with_delivery_id(
    op: Operation,
    payload: &Map<String, Value>,
    delivery_id: i64,
) -> Result<Value, String> {
    let mut body = payload.clone();
    let data = body
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(data) = data else {
        return Err(format!("{}: field \"data\" must be an object", op.name()));
    };
    data.insert(DELIVERY_ID_FIELD.into(), delivery_id.into());
    Ok(Value::Object(body))
}

/// What a `user_attributes` payload that sets exactly one custom attribute asks: its
/// custom id, the attribute and the value; `None` for any other shape.
pub fn single_attribute(payload: &Value) -> Option<(String, &str, &Value)> {
    let custom_id = match payload.get("custom_id")? {
        Value::String(s) if !s.trim().is_empty() => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let attributes = payload.get("attributes")?.as_object()?;
    let mut only = attributes.iter();
    let (name, value) = only.next()?;
    only.next()
        .is_none()
        .then_some((custom_id, name.as_str(), value))
}

/// Puts a batch of `user_attributes` payloads into calls: those that set one attribute
/// grouped by attribute and value, `per_call` at most to a call, in the order each group
/// first appears; every other payload a call of its own.
pub fn mass_groups(payloads: &[&Value], per_call: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<((&str, &Value), Vec<usize>)> = Vec::new();
    let mut calls = Vec::new();
    for (i, payload) in payloads.iter().enumerate() {
        let Some((_, name, value)) = single_attribute(payload).filter(|_| per_call > 1) else {
            calls.push(vec![i]);
            continue;
        };
        match groups.iter_mut().find(|(k, _)| *k == (name, value)) {
            Some((_, members)) => members.push(i),
            None => groups.push(((name, value), vec![i])),
        }
    }
    for (_, members) in groups {
        calls.extend(members.chunks(per_call).map(<[usize]>::to_vec));
    }
    calls
}

/// Writes records into one User.com workspace.
pub struct UserComWriter {
    /// Client, headers (`Authorization: Token`, `Accept`, the connection's), timeout, rate.
    endpoint: Endpoint,
    /// The workspace's API root, e.g. `https://shop.user.com/api/public/`.
    base_url: Url,
}

impl UserComWriter {
    /// Builds the writer for `conn`; `key` is the API key read from the environment
    /// variable the connection names (User.com needs one).
    pub fn new(
        conn: &Connection,
        client: &reqwest::Client,
        key: Option<String>,
    ) -> Result<Self, WriterConfigError> {
        let key = key.ok_or_else(|| {
            invalid(
                conn,
                "a User.com connection needs api_key_env (the variable holding its key)".into(),
            )
        })?;
        let mut base = conn.base_url.clone();
        if !base.ends_with('/') {
            base.push('/');
        }
        let base_url =
            Url::parse(&base).map_err(|e| invalid(conn, format!("base URL is not a URL: {e}")))?;
        if base_url.cannot_be_a_base() {
            return Err(invalid(conn, "base URL cannot take a path".into()));
        }
        let mut endpoint = Endpoint::new(
            conn,
            client,
            Some((
                reqwest::header::AUTHORIZATION,
                format!("Token {}", key.trim()),
            )),
            Some(key.trim()),
        )?;
        endpoint
            .headers
            .insert(ACCEPT, HeaderValue::from_static(ACCEPT_VERSION_2));
        Ok(Self { endpoint, base_url })
    }
}

impl UserComWriter {
    /// Delivers one record: exactly one request to the target.
    pub fn write<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        async move {
            let permanent = |message: String| WriteError::Permanent {
                status: None,
                message,
            };
            let op: Operation = out.path.parse().map_err(permanent)?;
            let request = build_request(op, &out).map_err(permanent)?;
            let url = request.relative_path(&self.base_url).map_err(permanent)?;
            let builder = self
                .endpoint
                .client
                .request(request.method, url)
                .json(&request.body);
            self.endpoint.send(builder).await
        }
        .boxed()
    }
}

impl Writer for UserComWriter {
    fn secrets(&self) -> &super::secrets::Secrets {
        &self.endpoint.secrets
    }

    fn max_in_flight(&self) -> usize {
        self.endpoint.max_in_flight
    }

    /// User.com documents no `X-RateLimit-*` headers (its 429 carries `retry-after` only):
    /// should it send a reset, it is read as a delta, and an epoch would be far beyond the
    /// longest reset read, so ignored rather than misread.
    fn rate_signals(&self) -> &RateSignals {
        &self.endpoint.signals
    }

    fn group(&self, path: &str, payloads: &[&Value], per_call: usize) -> Vec<Vec<usize>> {
        match path.parse() {
            Ok(Operation::UserAttributes) => mass_groups(payloads, per_call),
            _ => payloads.iter().enumerate().map(|(i, _)| vec![i]).collect(),
        }
    }

    fn write_many<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Written, WriteError>> {
        async move {
            let [first, ..] = call.records else {
                return Ok(Written::all(Receipt::default(), 0));
            };
            if call.records.len() == 1 {
                return self.write(*first).await.map(|r| Written::all(r, 1));
            }
            let refused = |message: String| WriteError::Permanent {
                status: None,
                message,
            };
            let mut ids = Vec::with_capacity(call.records.len());
            let mut shared = None;
            for out in call.records {
                let (id, name, value) = single_attribute(out.payload).ok_or_else(|| {
                    refused("a mass update carries only payloads that set one attribute".into())
                })?;
                if shared.get_or_insert((name, value)) != &(name, value) {
                    return Err(refused(
                        "a mass update carries one attribute and one value".into(),
                    ));
                }
                ids.push(id);
            }
            let (attribute, value) = shared.expect("at least one record");
            let request = Request {
                method: Method::PUT,
                segments: vec!["users-by-id".into(), "mass_update_custom_attributes".into()],
                body: serde_json::json!({"ids": ids, "attribute": attribute, "value": value}),
            };
            let url = request.relative_path(&self.base_url).map_err(refused)?;
            let builder = self
                .endpoint
                .client
                .request(request.method, url)
                .json(&request.body);
            match self
                .endpoint
                .send_reading(builder, true)
                .await
            {
                Ok(receipt) => {
                    let items = match &receipt.body {
                        // An answer that cannot be read whole accounts for nobody.
                        Body::Unreadable(why) => super::answer::unaccounted(
                            receipt.http_status.unwrap_or(200),
                            ids.len(),
                            why,
                        ),
                        body => {
                            let unknown = not_found(body.json());
                            ids.iter()
                                .map(|id| {
                                    unknown.contains(&id.as_str()).then(|| WriteError::Permanent {
                                        status: Some(404),
                                        message: format!(
                                            "mass update: no user with custom_id {id:?} in the workspace"
                                        ),
                                    })
                                })
                                .collect()
                        }
                    };
                    Ok(Written { receipt, items })
                }
                // Attribute and value are every record's: so is their refusal.
                Err(e @ WriteError::Permanent { .. }) => Ok(Written {
                    receipt: Receipt {
                        http_status: e.http_status(),
                        ..Receipt::default()
                    },
                    items: vec![Some(e); ids.len()],
                }),
                Err(e) => Err(e),
            }
        }
        .boxed()
    }
}

/// The custom ids a mass update's answer names as unknown (`not_found`).
fn not_found(body: Option<&Value>) -> Vec<&str> {
    body.and_then(|b| b.get("not_found"))
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(op: &str, payload: Value) -> Result<Request, String> {
        let out = Outgoing {
            delivery_id: 42,
            record_key: "k",
            path: op,
            payload: &payload,
        };
        build_request(op.parse()?, &out)
    }

    #[test]
    fn operations_parse_by_name_and_unknown_ones_are_named() {
        assert_eq!(
            "/user_upsert/".parse::<Operation>(),
            Ok(Operation::UserUpsert)
        );
        for (name, op) in Operation::ALL {
            assert_eq!(op.name(), name);
        }
        let e = "users/".parse::<Operation>().unwrap_err();
        assert!(e.contains("\"users\"") && e.contains("user_upsert"), "{e}");
    }

    #[test]
    fn appends_carry_the_delivery_id_in_data() {
        let r = build(
            "event",
            json!({"user_custom_id": "c1", "name": "order", "data": {"total": 5}}),
        )
        .unwrap();
        assert_eq!(
            r.body["data"],
            json!({"total": 5, "courier_delivery_id": 42})
        );
        let r = build(
            "product_event",
            json!({"product_custom_id": "sku 1/2", "user_custom_id": "c1", "event_type": "view"}),
        )
        .unwrap();
        assert_eq!(r.segments, ["products-by-id", "sku 1/2", "product_event"]);
        assert_eq!(r.body["data"]["courier_delivery_id"], 42);
        assert!(r.body.get("product_custom_id").is_none());
        let base = Url::parse("http://x/api/public/").unwrap();
        assert_eq!(
            r.relative_path(&base).unwrap().as_str(),
            "http://x/api/public/products-by-id/sku%201%2F2/product_event/"
        );
    }

    #[test]
    fn missing_fields_are_named() {
        let cases = [
            ("user_upsert", json!({"email": "a@b"}), "\"custom_id\""),
            (
                "user_attributes",
                json!({"custom_id": "c"}),
                "\"attributes\"",
            ),
            (
                "user_attributes",
                json!({"attributes": {"a": 1}}),
                "\"custom_id\"",
            ),
            (
                "mass_update_custom_attributes",
                json!({"attribute": "x", "value": 1}),
                "\"custom_ids\"",
            ),
            (
                "mass_update_custom_attributes",
                json!({"attribute": "x", "value": 1, "custom_ids": []}),
                "non-empty array",
            ),
            ("event", json!({"user_custom_id": "c"}), "\"name\""),
            ("event", json!({"name": "n"}), "\"user_custom_id\""),
            (
                "event",
                json!({"name": "n", "user_id": 1, "data": [1]}),
                "\"data\"",
            ),
            (
                "product_event",
                json!({"user_custom_id": "c", "event_type": "view"}),
                "\"product_custom_id\"",
            ),
            ("deal_upsert", json!({"name": "order 1"}), "\"custom_id\""),
            ("deal_upsert", json!([1, 2]), "JSON object"),
        ];
        for (op, payload, needle) in cases {
            let e = build(op, payload).unwrap_err();
            assert!(e.contains(needle) && e.starts_with(op), "{op}: {e}");
        }
    }

    #[test]
    fn mass_update_picks_the_resource_by_id_kind() {
        let r = build(
            "mass_update_custom_attributes",
            json!({"custom_ids": ["a", "b"], "attribute": "email_consent", "value": true}),
        )
        .unwrap();
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.segments, ["users-by-id", "mass_update_custom_attributes"]);
        assert_eq!(
            r.body,
            json!({"ids": ["a", "b"], "attribute": "email_consent", "value": true})
        );
        let r = build(
            "mass_update_custom_attributes",
            json!({"ids": [1, 2], "attribute": "email_consent", "value": false}),
        )
        .unwrap();
        assert_eq!(r.segments, ["users", "mass_update_custom_attributes"]);
    }

    #[test]
    fn single_attribute_changes_group_by_attribute_and_value() {
        let p = [
            json!({"custom_id": "a", "attributes": {"email_consent": true}}),
            json!({"custom_id": "b", "attributes": {"email_consent": false}}),
            json!({"custom_id": "c", "attributes": {"email_consent": true, "sms": true}}),
            json!({"custom_id": 7, "attributes": {"email_consent": true}}),
            json!({"custom_id": "", "attributes": {"email_consent": true}}),
            json!({"custom_id": "d", "attributes": {"email_consent": true}}),
            json!({"custom_id": "e", "attributes": {"sms_consent": true}}),
        ];
        let refs: Vec<&Value> = p.iter().collect();
        // Two attributes and an empty custom id go alone; the rest by (attribute, value),
        // at most two a call, in the order each group first appears.
        assert_eq!(
            mass_groups(&refs, 2),
            [vec![2], vec![4], vec![0, 3], vec![5], vec![1], vec![6]]
        );
        assert_eq!(
            mass_groups(&refs, 1),
            (0..7).map(|i| vec![i]).collect::<Vec<_>>()
        );
        assert_eq!(single_attribute(&p[3]).map(|(id, ..)| id), Some("7".into()));
    }
}
