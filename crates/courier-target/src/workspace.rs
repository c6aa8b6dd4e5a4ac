//! One workspace of the local target: its configuration, its token, its limiter, its
//! counters and what its API stored. Its API is the emulation file's `workspace`
//! ([`crate::operations`]); [`Workspace::apply`] answers one authenticated, admitted
//! call and does no I/O, so its tests call it directly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    emulation::WorkspaceApi,
    limiter::{Limiter, PeakMeter, RateHeaders},
    operations::{self, Reply, WorkspaceData},
};

/// One workspace the target serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceConfig {
    /// Its name: the Host subdomain (`<name>.localhost`) or the path prefix
    /// (`/ws/<name>/`) that selects it.
    pub name: String,
    /// The API key a request must send as `Authorization: Token <token>`.
    pub token: String,
    /// Fields the workspace declares (custom attributes); `None` accepts any name. Writing
    /// one not listed is refused where the API checks it (`declared`).
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
    /// Accepted writes per record key (as the operation's `accepted` names them).
    pub accepted: BTreeMap<String, u32>,
    /// Records in each store and entries in each log, by name.
    #[serde(flatten)]
    pub stored: BTreeMap<String, usize>,
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
    /// What its API stored.
    pub data: WorkspaceData,
    /// The API it serves, if an emulation file describes one.
    api: Option<&'static WorkspaceApi>,
}

impl Workspace {
    /// A fresh, empty workspace serving the emulated workspace API
    /// ([`operations::workspace_api`]).
    pub fn new(config: WorkspaceConfig, limiter: Limiter) -> Self {
        let api = operations::workspace_api();
        Self {
            config,
            limiter,
            rate_headers: RateHeaders::None,
            peaks: PeakMeter::default(),
            counters: WorkspaceCounters::default(),
            data: api.map(WorkspaceData::of).unwrap_or_default(),
            api,
        }
    }

    /// Checks an `Authorization` header value: `None` when it carries the workspace token,
    /// else the API's answer to a token missing or wrong.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<Reply> {
        let missing = match authorization {
            None => true,
            Some(v) => match v.trim().strip_prefix("Token ") {
                Some(t) if t.trim() == self.config.token => return None,
                _ => false,
            },
        };
        Some(match (self.api, missing) {
            (None, _) => operations::detail(401, "no valid token"),
            (Some(api), true) => operations::answer(&api.errors.missing_token, &Default::default()),
            (Some(api), false) => {
                operations::answer(&api.errors.invalid_token, &Default::default())
            }
        })
    }

    /// The API's answer to a call past the limit, for a wait of `secs` whole seconds.
    pub fn throttled(&self, secs: u64) -> Option<Reply> {
        let api = self.api?;
        let plural = if secs == 1 { "" } else { "s" };
        let vars = operations::vars([("seconds", secs.into()), ("plural_s", plural.into())]);
        Some(operations::answer(&api.errors.throttled, &vars))
    }

    /// The API's answer to a body that is not JSON.
    pub fn not_json(&self) -> Reply {
        match self.api {
            Some(api) => operations::answer(&api.errors.not_json, &Default::default()),
            None => operations::detail(400, "the body is not JSON"),
        }
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
        let stores = self.data.stores.iter().map(|(n, r)| (n.clone(), r.len()));
        let logs = self.data.logs.iter().map(|(n, l)| (n.clone(), l.len()));
        c.stored = stores.chain(logs).collect();
        c
    }

    /// Answers one authenticated, admitted call: `path` is the part after the API's
    /// prefix.
    pub fn apply(&mut self, method: &str, path: &str, body: &Value) -> Reply {
        let Some(api) = self.api else {
            return operations::detail(404, "Not found.");
        };
        let declared = self.config.custom_attributes.as_ref();
        let reply = operations::apply(api, &mut self.data, declared, method, path, body);
        for key in &reply.accepted {
            *self.counters.accepted.entry(key.clone()).or_default() += 1;
        }
        reply
    }

    /// Keeps a record of `key` in `store` with no fields, unless it has one: the state
    /// a change of existing records starts from.
    pub fn seed(&mut self, store: &str, key: &str) {
        if let Some(api) = self.api {
            self.data.seed(api, store, key);
        }
    }

    /// The path prefix of its API (`""` when it serves none).
    pub fn prefix(&self) -> &'static str {
        self.api.map_or("", |a| a.prefix.as_str())
    }
}

#[cfg(test)]
mod tests {
    //! The workspace API built in (`presets/usercom.target.json`) through the operations.
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn ws(attrs: Option<&[&str]>) -> Workspace {
        let mut c = WorkspaceConfig::new("shop", "t0k");
        c.custom_attributes = attrs.map(|a| a.iter().map(|s| s.to_string()).collect());
        Workspace::new(
            c,
            Limiter::new(10, Duration::from_secs(1), crate::Window::Fixed),
        )
    }

    fn users(w: &Workspace) -> &BTreeMap<String, Value> {
        w.data.store("users")
    }

    #[test]
    fn users_upsert_by_custom_id_and_unknown_attributes_are_refused() {
        let mut w = ws(Some(&["email_consent"]));
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c1", "email": "a@b", "email_consent": true}),
        );
        assert_eq!(
            (r.status, r.body.clone()),
            (200, json!({"created": true, "id": 1, "custom_id": "c1"}))
        );
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c1", "first_name": "Ann"}),
        );
        assert_eq!(r.body["created"], json!(false));
        assert_eq!(users(&w)["c1"]["email_consent"], json!(true));
        assert_eq!(users(&w)["c1"]["first_name"], json!("Ann"));
        assert_eq!(users(&w)["c1"]["id"], json!(1));
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c2", "loyalty": 3}),
        );
        assert_eq!(r.status, 400);
        assert_eq!(
            r.body,
            json!({"loyalty": ["Attribute \"loyalty\" does not exist in this app."]})
        );
        let r = w.apply(
            "POST",
            "users/update_or_create/",
            &json!({"custom_id": "c2", "first_name": "x".repeat(41)}),
        );
        assert_eq!(
            (r.status, r.body),
            (
                400,
                json!({"first_name": ["Ensure this field has no more than 40 characters."]})
            )
        );
        let r = w.apply("POST", "users/update_or_create/", &json!({"email": "a@b"}));
        assert_eq!(r.body, json!({"custom_id": ["This field is required."]}));
        let r = w.apply("POST", "users/update_or_create/", &json!([1]));
        assert_eq!(
            r.body,
            json!({"non_field_errors": ["Invalid data. Expected an object."]})
        );
        assert_eq!(w.snapshot().accepted["user:c1"], 2);
        assert_eq!(w.snapshot().duplicates, 1);
        assert_eq!(w.snapshot().stored["users"], 1);
    }

    #[test]
    fn attributes_need_an_existing_user() {
        let mut w = ws(None);
        let r = w.apply(
            "POST",
            "users-by-id/c%201/set_multiple_attributes/",
            &json!({"sms_consent": false}),
        );
        assert_eq!((r.status, r.body), (404, json!({"detail": "Not found."})));
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
        assert_eq!(
            (r.status, r.body),
            (200, json!({"id": 1, "custom_id": "c 1"}))
        );
        assert_eq!(r.accepted, ["user_attributes:c 1"]);
        assert_eq!(users(&w)["c 1"]["sms_consent"], json!(false));
        let r = w.apply(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            &json!({"ids": ["c 1", "nobody"], "attribute": "vip", "value": 1}),
        );
        assert_eq!((r.status, r.body["updated"].clone()), (200, json!(1)));
        assert_eq!(users(&w)["c 1"]["vip"], json!(1));
        let r = w.apply(
            "PUT",
            "users/mass_update_custom_attributes/",
            &json!({"ids": [1, 2], "attribute": "vip", "value": 2}),
        );
        assert_eq!(
            r.body,
            json!({"status": "ok", "updated": 1, "not_found": [2]})
        );
        assert_eq!(users(&w)["c 1"]["vip"], json!(2));
        let r = w.apply("GET", "users/update_or_create/", &Value::Null);
        assert_eq!(
            (r.status, r.body),
            (405, json!({"detail": "Method \"GET\" not allowed."}))
        );
        assert_eq!(w.apply("POST", "nothing/", &json!({})).status, 404);
    }

    #[test]
    fn appends_are_counted_per_delivery_id() {
        let mut w = ws(None);
        let pe = json!({"user_custom_id": "c1", "event_type": "view",
                        "data": {"price": 9.5, "courier_delivery_id": 7}});
        let path = "products-by-id/sku1/product_event/";
        assert_eq!(w.apply("POST", path, &pe).status, 200);
        assert_eq!(w.apply("POST", path, &pe).body, json!({"status": "ok"}));
        assert_eq!(
            w.data.store("products")["sku1"],
            json!({"custom_id": "sku1", "price": 9.5})
        );
        assert_eq!(w.data.log("product_events")[0]["product_custom_id"], "sku1");
        assert_eq!(w.snapshot().accepted["product_event:7"], 2);
        let bad = json!({"user_custom_id": "c1", "event_type": "teleport"});
        let r = w.apply("POST", path, &bad);
        assert_eq!(
            (r.status, r.body),
            (
                400,
                json!({"event_type": ["\"teleport\" is not a valid choice."]})
            )
        );
        let r = w.apply("POST", path, &json!({"event_type": "view"}));
        assert_eq!(r.body, json!({"user_id": ["This field is required."]}));
        let ev = json!({"user_custom_id": "c1", "name": "x"});
        let r = w.apply("POST", "events/", &ev);
        assert_eq!(
            (r.status, r.body),
            (
                400,
                json!({"user_custom_id": ["User with custom_id \"c1\" does not exist."]})
            )
        );
        let r = w.apply("POST", "events/", &json!({"user_id": 5, "name": "x"}));
        assert_eq!(
            r.body,
            json!({"user_id": ["Invalid pk \"5\" - object does not exist."]})
        );
        w.seed("users", "c1");
        let r = w.apply("POST", "events/", &json!({"user_id": 1, "name": "x"}));
        assert_eq!(
            (r.status, r.accepted.clone()),
            (200, vec!["event:#0".to_owned()])
        );
        let r = w.apply("POST", "events/", &ev);
        assert_eq!(r.accepted, ["event:#1"]);
        assert_eq!(w.snapshot().stored["events"], 2);
        let r = w.apply("POST", "deals/update_or_create/", &json!({"custom_id": 9}));
        assert_eq!(r.body, json!({"created": true, "id": 2, "custom_id": "9"}));
        assert_eq!(r.accepted, ["deal:9"]);
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
        w.seed("users", "c1");
        let path = "users-by-id/mass_update_custom_attributes/";
        let r = w.apply(
            "PUT",
            path,
            &json!({"ids": ["c1", "nobody"], "attribute": "email_consent", "value": false}),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.body["not_found"], json!(["nobody"]));
        assert_eq!(r.accepted, ["mass_update:email_consent:c1"]);
        assert_eq!(users(&w)["c1"]["email_consent"], json!(false));
        let ids: Vec<String> = (0..=100).map(|i| format!("c{i}")).collect();
        let r = w.apply(
            "PUT",
            path,
            &json!({"ids": ids, "attribute": "email_consent", "value": true}),
        );
        assert_eq!(
            (r.status, r.body),
            (
                400,
                json!({"ids": ["Ensure this field has no more than 100 elements."]})
            )
        );
        let r = w.apply(
            "PUT",
            path,
            &json!({"ids": ["c1"], "attribute": "nope", "value": true}),
        );
        assert_eq!(r.status, 400);
        for (field, body) in [
            ("attribute", json!({"ids": [], "value": 1})),
            ("value", json!({"ids": [], "attribute": "vip"})),
            ("ids", json!({"attribute": "vip", "value": 1})),
        ] {
            let r = w.apply("PUT", path, &body);
            assert_eq!(r.body, json!({ field: ["This field is required."] }));
        }
    }
}
