//! One User.com-like workspace of the local target: its configuration, its limiter, its
//! counters and the state its endpoints keep (users and deals upserted by `custom_id`,
//! events and product events appended). [`Workspace::apply`] answers one authenticated,
//! admitted API call; it does no I/O, so its tests call it directly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::limiter::{Limiter, PeakMeter, RateHeaders};

/// Where courier's User.com writer puts the delivery id inside an appended entry's `data`
/// (`courier::writer::usercom::DELIVERY_ID_FIELD`; the engine's tests assert both are
/// equal, since this crate does not depend on the engine). Appended entries are counted
/// per delivery id, and the field is not copied into a product's attributes.
pub const DELIVERY_ID_FIELD: &str = "courier_delivery_id";

/// Standard user attributes User.com knows without declaring them.
pub const STANDARD_USER_ATTRIBUTES: &[&str] = &[
    "custom_id",
    "email",
    "first_name",
    "last_name",
    "phone_number",
    "gender",
    "status",
    "unsubscribed",
    "country",
    "region",
    "city",
    "company",
    "timezone",
    "note",
    "score",
    "facebook_url",
    "linkedin_url",
    "twitter_url",
    "google_url",
];
/// The most ids one mass update takes (User.com documents no maximum; courier's writer
/// sends at most `courier::writer::usercom::MAX_IDS_PER_CALL`, asserted equal by the
/// engine's tests). More answer 400.
pub const MAX_MASS_UPDATE_IDS: usize = 100;
/// User.com caps first and last names at this many characters.
pub const MAX_NAME_CHARS: usize = 40;
/// The product event types User.com accepts.
pub const PRODUCT_EVENT_TYPES: &[&str] = &[
    "add to cart",
    "purchase",
    "liking",
    "add to observation",
    "order",
    "reservation",
    "return",
    "view",
    "click",
    "detail",
    "add",
    "remove",
    "checkout",
    "refund",
];

/// One workspace the target serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceConfig {
    /// Its name: the Host subdomain (`<name>.localhost`) or the path prefix
    /// (`/ws/<name>/api/public/`) that selects it.
    pub name: String,
    /// The API key a request must send as `Authorization: Token <token>`.
    pub token: String,
    /// Custom user attributes that exist in the workspace; `None` accepts any name. Writing
    /// one not listed answers 400, as User.com does for attributes never created.
    pub custom_attributes: Option<BTreeSet<String>>,
}

impl WorkspaceConfig {
    /// A workspace accepting any custom attribute.
    pub fn new(name: &str, token: &str) -> Self {
        Self {
            name: name.into(),
            token: token.into(),
            custom_attributes: None,
        }
    }

    /// Parses `NAME:TOKEN` or `NAME:TOKEN:attr1,attr2` (the CLI's `--workspace`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = s.splitn(3, ':');
        let name = parts.next().unwrap_or_default().trim();
        let token = parts.next().unwrap_or_default().trim();
        if name.is_empty() || token.is_empty() || name.contains('/') || name.contains('.') {
            return Err(format!(
                "workspace {s:?} must be NAME:TOKEN[:attr,attr...] (a name without / or .)"
            ));
        }
        let custom_attributes = parts.next().map(|a| {
            a.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect()
        });
        Ok(Self {
            name: name.into(),
            token: token.into(),
            custom_attributes,
        })
    }
}

/// What the workspace's endpoints stored: users and deals by `custom_id`, events and
/// product events in arrival order, products by their custom id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceData {
    /// Users by `custom_id`, each with its numeric `id` and every attribute written.
    pub users: BTreeMap<String, Value>,
    /// Deals by `custom_id`.
    pub deals: BTreeMap<String, Value>,
    /// Events, each as posted.
    pub events: Vec<Value>,
    /// Product events, each as posted plus `product_custom_id`.
    pub product_events: Vec<Value>,
    /// Products by custom id, with the attributes product events carried in `data`.
    pub products: BTreeMap<String, Value>,
}

/// The counters of one workspace, as `GET /_counters` reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceCounters {
    /// Requests addressed to the workspace (every answer included).
    pub requests: u64,
    /// 429s it answered.
    pub throttled: u64,
    /// 401s it answered.
    pub unauthorized: u64,
    /// Injected faults (5xx, resets, hangs) on its requests.
    pub faults: u64,
    /// The limit per period in force (as of its last request, for a scheduled change).
    pub limit: u32,
    /// Most requests seen in any sliding second.
    pub peak_per_second: u64,
    /// Most requests seen in any sliding minute.
    pub peak_per_minute: u64,
    /// Distinct record keys written.
    pub accepted_keys: usize,
    /// Accepted writes beyond the first per key.
    pub duplicates: u64,
    /// Accepted writes per record key (`user:<custom_id>`, `event:<delivery id>`, ...).
    pub accepted: BTreeMap<String, u32>,
    /// Users stored.
    pub users: usize,
    /// Deals stored.
    pub deals: usize,
    /// Events appended.
    pub events: usize,
    /// Product events appended.
    pub product_events: usize,
}

/// The answer to one API call, before it becomes an HTTP response.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: Value,
    /// Record keys this call wrote (empty unless it succeeded).
    pub accepted: Vec<String>,
}

impl Reply {
    fn ok(body: Value, accepted: Vec<String>) -> Self {
        Self {
            status: 200,
            body,
            accepted,
        }
    }

    fn error(status: u16, body: Value) -> Self {
        Self {
            status,
            body,
            accepted: Vec::new(),
        }
    }

    fn not_found() -> Self {
        Self::error(404, json!({"detail": "Not found."}))
    }

    fn field(field: &str, message: String) -> Self {
        Self::error(400, json!({ field: [message] }))
    }
}

/// A workspace while the target runs.
#[derive(Debug)]
pub struct Workspace {
    /// Its configuration.
    pub config: WorkspaceConfig,
    /// Its own rate limiter.
    pub limiter: Limiter,
    /// The rate-limit headers its answers carry.
    pub rate_headers: RateHeaders,
    /// Its peak request rates.
    pub peaks: PeakMeter,
    /// Its counters (peaks and per-key counts are filled in at snapshot time).
    pub counters: WorkspaceCounters,
    /// What its endpoints stored.
    pub data: WorkspaceData,
    /// The numeric id the next new user or deal gets.
    next_id: u64,
}

impl Workspace {
    /// A fresh, empty workspace.
    pub fn new(config: WorkspaceConfig, limiter: Limiter) -> Self {
        Self {
            config,
            limiter,
            rate_headers: RateHeaders::None,
            peaks: PeakMeter::default(),
            counters: WorkspaceCounters::default(),
            data: WorkspaceData::default(),
            next_id: 1,
        }
    }

    /// Checks an `Authorization` header value: `None` when it carries the workspace token.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<Reply> {
        let detail = match authorization {
            None => "Authentication credentials were not provided.",
            Some(v) => match v.trim().strip_prefix("Token ") {
                Some(t) if t.trim() == self.config.token => return None,
                _ => "Invalid token.",
            },
        };
        Some(Reply::error(401, json!({ "detail": detail })))
    }

    /// The counters, with the derived fields filled in.
    pub fn snapshot(&self) -> WorkspaceCounters {
        let mut c = self.counters.clone();
        c.peak_per_second = self.peaks.per_second;
        c.peak_per_minute = self.peaks.per_minute;
        c.limit = self.limiter.limit();
        c.accepted_keys = c.accepted.len();
        c.duplicates = c
            .accepted
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum();
        c.users = self.data.users.len();
        c.deals = self.data.deals.len();
        c.events = self.data.events.len();
        c.product_events = self.data.product_events.len();
        c
    }

    /// Answers one authenticated, admitted call: `path` is the part after `api/public/`.
    pub fn apply(&mut self, method: &str, path: &str, body: &Value) -> Reply {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let reply = match (method, segments.as_slice()) {
            ("POST", ["users", "update_or_create"]) => self.user_upsert(body),
            ("POST", ["users-by-id", id, "set_multiple_attributes"]) => {
                self.set_attributes(&percent_decode(id), body)
            }
            (
                "PUT",
                [
                    resource @ ("users" | "users-by-id"),
                    "mass_update_custom_attributes",
                ],
            ) => self.mass_update(*resource == "users-by-id", body),
            ("POST", ["events"]) => self.event(body),
            ("POST", ["products-by-id", id, "product_event"]) => {
                self.product_event(&percent_decode(id), body)
            }
            ("POST", ["deals", "update_or_create"]) => self.deal_upsert(body),
            (
                _,
                ["users", "update_or_create"]
                | ["users-by-id", _, "set_multiple_attributes"]
                | [_, "mass_update_custom_attributes"]
                | ["events"]
                | ["products-by-id", _, "product_event"]
                | ["deals", "update_or_create"],
            ) => Reply::error(
                405,
                json!({ "detail": format!("Method \"{method}\" not allowed.") }),
            ),
            _ => Reply::not_found(),
        };
        for key in &reply.accepted {
            *self.counters.accepted.entry(key.clone()).or_default() += 1;
        }
        reply
    }

    fn check_attributes<'a>(&self, names: impl Iterator<Item = &'a String>) -> Option<Reply> {
        let allowed = self.config.custom_attributes.as_ref()?;
        for name in names {
            if !STANDARD_USER_ATTRIBUTES.contains(&name.as_str()) && !allowed.contains(name) {
                return Some(Reply::field(
                    name,
                    format!("Attribute \"{name}\" does not exist in this app."),
                ));
            }
        }
        None
    }

    fn check_user_fields(&self, fields: &Map<String, Value>) -> Option<Reply> {
        for name in ["first_name", "last_name"] {
            if let Some(v) = fields.get(name).and_then(Value::as_str)
                && v.chars().count() > MAX_NAME_CHARS
            {
                return Some(Reply::field(
                    name,
                    format!("Ensure this field has no more than {MAX_NAME_CHARS} characters."),
                ));
            }
        }
        self.check_attributes(fields.keys())
    }

    fn user_upsert(&mut self, body: &Value) -> Reply {
        let (fields, custom_id) = match keyed_object(body) {
            Ok(v) => v,
            Err(reply) => return reply,
        };
        if let Some(r) = self.check_user_fields(fields) {
            return r;
        }
        let (id, created) = self.upsert(true, &custom_id, fields);
        Reply::ok(
            json!({"created": created, "id": id, "custom_id": custom_id}),
            vec![format!("user:{custom_id}")],
        )
    }

    fn deal_upsert(&mut self, body: &Value) -> Reply {
        let (fields, custom_id) = match keyed_object(body) {
            Ok(v) => v,
            Err(reply) => return reply,
        };
        let (id, created) = self.upsert(false, &custom_id, fields);
        Reply::ok(
            json!({"created": created, "id": id, "custom_id": custom_id}),
            vec![format!("deal:{custom_id}")],
        )
    }

    /// Merges `fields` into the user (or deal) `custom_id`; answers its id and whether it
    /// was created.
    fn upsert(&mut self, user: bool, custom_id: &str, fields: &Map<String, Value>) -> (u64, bool) {
        let store = if user {
            &mut self.data.users
        } else {
            &mut self.data.deals
        };
        let created = !store.contains_key(custom_id);
        let entry = store.entry(custom_id.to_owned()).or_insert_with(|| {
            let id = self.next_id;
            self.next_id += 1;
            json!({"id": id, "custom_id": custom_id})
        });
        let obj = entry.as_object_mut().expect("stored as objects");
        for (k, v) in fields {
            if k != "id" {
                obj.insert(k.clone(), v.clone());
            }
        }
        obj.insert("custom_id".into(), custom_id.into());
        (obj["id"].as_u64().unwrap_or_default(), created)
    }

    /// Stores a user with `custom_id` and no attributes, unless it exists.
    pub fn add_user(&mut self, custom_id: &str) {
        if !self.data.users.contains_key(custom_id) {
            self.upsert(true, custom_id, &Map::new());
        }
    }

    fn set_attributes(&mut self, custom_id: &str, body: &Value) -> Reply {
        let Some(fields) = body.as_object() else {
            return Reply::field(
                "non_field_errors",
                "Invalid data. Expected an object.".into(),
            );
        };
        if !self.data.users.contains_key(custom_id) {
            return Reply::not_found();
        }
        if let Some(r) = self.check_user_fields(fields) {
            return r;
        }
        let (id, _) = self.upsert(true, custom_id, fields);
        Reply::ok(
            json!({"id": id, "custom_id": custom_id}),
            vec![format!("user_attributes:{custom_id}")],
        )
    }

    /// One attribute, one value, many users. Ids the workspace does not know are left
    /// out and named in the answer's `not_found` (as given), beside the `updated` count.
    fn mass_update(&mut self, by_custom_id: bool, body: &Value) -> Reply {
        let Some(attribute) = body.get("attribute").and_then(Value::as_str) else {
            return Reply::field("attribute", "This field is required.".into());
        };
        let Some(value) = body.get("value") else {
            return Reply::field("value", "This field is required.".into());
        };
        let Some(ids) = body.get("ids").and_then(Value::as_array) else {
            return Reply::field("ids", "This field is required.".into());
        };
        if ids.len() > MAX_MASS_UPDATE_IDS {
            return Reply::field(
                "ids",
                format!("Ensure this field has no more than {MAX_MASS_UPDATE_IDS} elements."),
            );
        }
        let attribute = attribute.to_owned();
        if let Some(r) = self.check_attributes(std::iter::once(&attribute)) {
            return r;
        }
        let mut accepted = Vec::new();
        let mut not_found = Vec::new();
        for id in ids {
            let custom_id = if by_custom_id {
                id_string(Some(id)).filter(|c| self.data.users.contains_key(c))
            } else {
                self.data
                    .users
                    .iter()
                    .find(|(_, u)| Some(&u["id"]) == Some(id))
                    .map(|(c, _)| c.clone())
            };
            match custom_id.and_then(|c| Some((self.data.users.get_mut(&c)?.as_object_mut()?, c))) {
                Some((user, c)) => {
                    user.insert(attribute.clone(), value.clone());
                    accepted.push(format!("mass_update:{attribute}:{c}"));
                }
                None => not_found.push(id.clone()),
            }
        }
        Reply::ok(
            json!({"status": "ok", "updated": accepted.len(), "not_found": not_found}),
            accepted,
        )
    }

    fn user_ref(&self, fields: &Map<String, Value>, must_exist: bool) -> Result<(), Reply> {
        if let Some(c) = id_string(fields.get("user_custom_id")) {
            if must_exist && !self.data.users.contains_key(&c) {
                return Err(Reply::field(
                    "user_custom_id",
                    format!("User with custom_id \"{c}\" does not exist."),
                ));
            }
            return Ok(());
        }
        match fields.get("user_id") {
            Some(id) if id.is_u64() => {
                if must_exist && !self.data.users.values().any(|u| &u["id"] == id) {
                    return Err(Reply::field(
                        "user_id",
                        format!("Invalid pk \"{id}\" - object does not exist."),
                    ));
                }
                Ok(())
            }
            _ => Err(Reply::field("user_id", "This field is required.".into())),
        }
    }

    fn event(&mut self, body: &Value) -> Reply {
        let Some(fields) = body.as_object() else {
            return Reply::field(
                "non_field_errors",
                "Invalid data. Expected an object.".into(),
            );
        };
        if fields
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Reply::field("name", "This field is required.".into());
        }
        if let Err(r) = self.user_ref(fields, true) {
            return r;
        }
        let key = append_key("event", fields, self.data.events.len());
        self.data.events.push(body.clone());
        Reply::ok(json!({"status": "ok"}), vec![key])
    }

    fn product_event(&mut self, product: &str, body: &Value) -> Reply {
        let Some(fields) = body.as_object() else {
            return Reply::field(
                "non_field_errors",
                "Invalid data. Expected an object.".into(),
            );
        };
        match fields.get("event_type").and_then(Value::as_str) {
            None => return Reply::field("event_type", "This field is required.".into()),
            Some(t) if !PRODUCT_EVENT_TYPES.contains(&t) => {
                return Reply::field("event_type", format!("\"{t}\" is not a valid choice."));
            }
            Some(_) => {}
        }
        // Product events name their user, but the local target does not require it to
        // exist (a price change is about the product).
        if let Err(r) = self.user_ref(fields, false) {
            return r;
        }
        let key = append_key("product_event", fields, self.data.product_events.len());
        let stored = self
            .data
            .products
            .entry(product.to_owned())
            .or_insert_with(|| json!({"custom_id": product}));
        if let (Some(obj), Some(data)) = (
            stored.as_object_mut(),
            fields.get("data").and_then(Value::as_object),
        ) {
            for (k, v) in data {
                if k != DELIVERY_ID_FIELD {
                    obj.insert(k.clone(), v.clone());
                }
            }
        }
        let mut event = fields.clone();
        event.insert("product_custom_id".into(), product.into());
        self.data.product_events.push(Value::Object(event));
        Reply::ok(json!({"status": "ok"}), vec![key])
    }
}

/// The record key of an appended entry: its courier delivery id when `data` carries one,
/// else its position (never a duplicate).
fn append_key(kind: &str, fields: &Map<String, Value>, position: usize) -> String {
    match fields.get("data").and_then(|d| d.get(DELIVERY_ID_FIELD)) {
        Some(id) => format!("{kind}:{id}"),
        None => format!("{kind}:#{position}"),
    }
}

/// A string or number id as a string; `None` when absent or empty.
/// An update-or-create body: an object with a `custom_id`, or the 400 User.com answers.
fn keyed_object(body: &Value) -> Result<(&Map<String, Value>, String), Reply> {
    let Some(fields) = body.as_object() else {
        return Err(Reply::field(
            "non_field_errors",
            "Invalid data. Expected an object.".into(),
        ));
    };
    let Some(custom_id) = id_string(fields.get("custom_id")) else {
        return Err(Reply::field("custom_id", "This field is required.".into()));
    };
    Ok((fields, custom_id))
}

fn id_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Decodes `%XX` escapes of a path segment (invalid escapes are kept as they are).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ws(attrs: Option<&[&str]>) -> Workspace {
        let mut c = WorkspaceConfig::new("shop", "t0k");
        c.custom_attributes = attrs.map(|a| a.iter().map(|s| s.to_string()).collect());
        Workspace::new(
            c,
            Limiter::new(10, Duration::from_secs(1), super::super::Window::Fixed),
        )
    }

    #[test]
    fn users_upsert_by_custom_id_and_unknown_attributes_are_refused() {
        let mut w = ws(Some(&["email_consent"]));
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c1", "email": "a@b", "email_consent": true}),
        );
        assert_eq!((r.status, r.body["created"].clone()), (200, json!(true)));
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c1", "first_name": "Ann"}),
        );
        assert_eq!(r.body["created"], json!(false));
        assert_eq!(w.data.users["c1"]["email_consent"], json!(true));
        assert_eq!(w.data.users["c1"]["first_name"], json!("Ann"));
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c2", "loyalty": 3}),
        );
        assert_eq!(r.status, 400);
        assert!(
            r.body["loyalty"][0]
                .as_str()
                .unwrap()
                .contains("does not exist")
        );
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c2", "first_name": "x".repeat(41)}),
        );
        assert_eq!(r.status, 400);
        assert_eq!(w.snapshot().accepted["user:c1"], 2);
        assert_eq!(w.snapshot().duplicates, 1);
    }

    #[test]
    fn attributes_need_an_existing_user() {
        let mut w = ws(None);
        let r = w.apply(
            "POST",
            "users-by-id/c%201/set_multiple_attributes/",
            &json!({"sms_consent": false}),
        );
        assert_eq!(r.status, 404);
        w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c 1"}),
        );
        let r = w.apply(
            "POST",
            "users-by-id/c%201/set_multiple_attributes/",
            &json!({"sms_consent": false}),
        );
        assert_eq!(r.status, 200);
        assert_eq!(w.data.users["c 1"]["sms_consent"], json!(false));
        let r = w.apply(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            &json!({"ids": ["c 1", "nobody"], "attribute": "vip", "value": 1}),
        );
        assert_eq!((r.status, r.body["updated"].clone()), (200, json!(1)));
        assert_eq!(w.data.users["c 1"]["vip"], json!(1));
        let r = w.apply("GET", "users/update_or_create/", &Value::Null);
        assert_eq!(r.status, 405);
        assert_eq!(w.apply("POST", "nothing/", &json!({})).status, 404);
    }

    #[test]
    fn appends_are_counted_per_delivery_id() {
        let mut w = ws(None);
        let pe = json!({"user_custom_id": "c1", "event_type": "view",
                        "data": {"price": 9.5, "courier_delivery_id": 7}});
        assert_eq!(
            w.apply("POST", "products-by-id/sku1/product_event/", &pe)
                .status,
            200
        );
        assert_eq!(
            w.apply("POST", "products-by-id/sku1/product_event/", &pe)
                .status,
            200
        );
        assert_eq!(w.data.products["sku1"]["price"], json!(9.5));
        assert_eq!(w.snapshot().accepted["product_event:7"], 2);
        let bad = json!({"user_custom_id": "c1", "event_type": "teleport"});
        assert_eq!(
            w.apply("POST", "products-by-id/sku1/product_event/", &bad)
                .status,
            400
        );
        let ev = json!({"user_custom_id": "c1", "name": "x"});
        assert_eq!(w.apply("POST", "events/", &ev).status, 400, "no such user");
    }

    #[test]
    fn tokens_are_checked() {
        let w = ws(None);
        assert!(w.authenticate(Some("Token t0k")).is_none());
        assert_eq!(w.authenticate(None).unwrap().status, 401);
        let r = w.authenticate(Some("Bearer t0k")).unwrap();
        assert_eq!(r.body, json!({"detail": "Invalid token."}));
        assert!(
            WorkspaceConfig::parse("a:b:x, y")
                .unwrap()
                .custom_attributes
                .unwrap()
                .contains("y")
        );
        assert!(WorkspaceConfig::parse("a").is_err());
    }

    #[test]
    fn a_mass_update_names_unknown_ids_and_refuses_too_many() {
        let mut w = ws(Some(&["email_consent"]));
        w.add_user("c1");
        let r = w.apply(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            &json!({"ids": ["c1", "nobody"], "attribute": "email_consent", "value": false}),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.body["not_found"], json!(["nobody"]));
        assert_eq!(r.accepted, ["mass_update:email_consent:c1"]);
        assert_eq!(w.data.users["c1"]["email_consent"], json!(false));
        let ids: Vec<String> = (0..=MAX_MASS_UPDATE_IDS).map(|i| format!("c{i}")).collect();
        let r = w.apply(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            &json!({"ids": ids, "attribute": "email_consent", "value": true}),
        );
        assert_eq!(r.status, 400);
        assert!(
            r.body["ids"][0]
                .as_str()
                .unwrap()
                .contains("no more than 100")
        );
        let r = w.apply(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            &json!({"ids": ["c1"], "attribute": "nope", "value": true}),
        );
        assert_eq!(r.status, 400);
    }
}
