//! A connection's erase operation: how its target is told to forget a person, as data (the
//! connection's `erase`, stated by its preset), read once into typed values.
//!
//! ```json
//! {"identity": ["email", "phone"],
//!  "method": "POST",
//!  "path": "crm/v3/objects/contacts/gdpr-delete",
//!  "body": {"objectId": "{{payload/email}}", "idProperty": "email"},
//!  "content_type": "application/json",
//!  "limits": ["3/s", "60/min"],
//!  "answers": {"202": "queued", "404": "unknown"}}
//! ```
//!
//! A target that takes several people per call (Braze's `users/delete`, up to 50) states
//! `batch_size` and each person's `item`, which its body holds as `{{records}}` (`"item":
//! "{{payload/email}}", "body": {"email_addresses": "{{records}}"}`); its path names nobody
//! and it has no lookup; one answer is every person's of the call.
//!
//! `identity` lists the kinds the call can name a person by, in order of preference: the
//! first the erasure has is used, and a person with none of them is reported so. In its
//! templates `payload` is the person as the call names them: that one identity (`{"email":
//! ...}`, an e-mail lower-cased, a phone number as `+` and its digits), so a body may hold
//! `"{{payload/email?}}"` and `"{{payload/phone?}}"` and send the one used; and `found`, the
//! target's own id of them when a `lookup` found one (a GET of its `path`, the id at its
//! JSON pointer `found`: a target that deletes by its own id). An
//! answer's status reads as `answers` says (`erased`, `unknown`: the target does not know
//! the person, which is done too; `queued`: the target took it with no way to confirm);
//! any other 2xx is `erased`, a 429 and a 5xx are tried again, anything else failed.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::template::{self, Place, Record, Scope, Template};
use crate::invalid::Invalid;
use crate::ratelimit::limits::{self, Limit};

/// The identity kinds a person may be known by in a target.
pub const KINDS: [&str; 3] = ["email", "phone", "external_id"];
/// The methods an erase call may use.
const METHODS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "GET"];

/// What an erase call's answer says of the person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Said {
    /// Erased.
    Erased,
    /// The target does not know the person: nothing to erase, done.
    Unknown,
    /// Queued by the target, with no way to confirm.
    Queued,
}

impl Said {
    /// As stored (`erasure_targets.outcome`).
    pub fn as_str(self) -> &'static str {
        match self {
            Said::Erased => "erased",
            Said::Unknown => "unknown",
            Said::Queued => "queued",
        }
    }
}

/// A connection's erase operation, read.
#[derive(Clone, Debug)]
pub struct EraseShape {
    /// The identity kinds it can name a person by, in order of preference.
    pub identity: Vec<String>,
    /// Its method.
    pub method: reqwest::Method,
    /// Its path (a template filled URL-encoded).
    pub path: String,
    /// Its body, if any.
    pub body: Option<Template>,
    /// People per call: above 1, the body holds `{{records}}`, each person's `item`.
    pub batch_size: usize,
    /// A person's item in a batch's body.
    pub item: Option<Template>,
    /// The body's content type (`application/json` when unstated).
    pub content_type: Option<String>,
    /// A lookup of the target's own id of the person, first.
    pub lookup: Option<Lookup>,
    /// The delete endpoint's own limits (its budget), if it has any.
    pub limits: Option<Vec<Limit>>,
    /// What an answer's status says.
    pub answers: BTreeMap<u16, Said>,
}

/// A lookup of the target's id of a person.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// The GET's path (a template).
    pub path: String,
    /// Where the id is in its answer (a JSON pointer).
    pub found: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    identity: Vec<String>,
    #[serde(default)]
    method: Option<String>,
    path: String,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    item: Option<Value>,
    #[serde(default)]
    batch_size: Option<usize>,
    #[serde(default)]
    lookup: Option<RawLookup>,
    #[serde(default)]
    limits: Option<Vec<String>>,
    #[serde(default)]
    answers: BTreeMap<String, Said>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLookup {
    path: String,
    found: String,
}

impl EraseShape {
    /// Reads a connection's `erase`; the error names what is wrong.
    pub fn parse(raw: &Value) -> Result<Self, Invalid> {
        Self::read(raw).map_err(|why| Invalid::new("erase", format!("erase: {why}")))
    }

    fn read(raw: &Value) -> Result<Self, String> {
        let raw: Raw = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        if raw.identity.is_empty() {
            return Err(format!("identity names no kind ({})", KINDS.join(", ")));
        }
        if let Some(k) = raw.identity.iter().find(|k| !KINDS.contains(&k.as_str())) {
            return Err(format!("identity {k:?} is not one of {}", KINDS.join(", ")));
        }
        let method = raw.method.as_deref().unwrap_or("POST");
        if !METHODS.contains(&method) {
            return Err(format!(
                "method {method:?} is not one of {}",
                METHODS.join(", ")
            ));
        }
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a listed method");
        check_path(&raw.path, raw.lookup.is_some())?;
        let body = raw.body.map(Template::new);
        if let Some(t) = &raw.content_type
            && reqwest::header::HeaderValue::from_str(t).is_err()
        {
            return Err(format!("content_type {t:?} is not a header value"));
        }
        let item = raw.item.map(Template::new);
        let batch_size = batch_size(
            &item,
            raw.batch_size,
            &body,
            &raw.path,
            raw.lookup.is_some(),
        )?;
        if let Some(l) = &raw.lookup {
            check_path(&l.path, false).map_err(|e| format!("lookup: {e}"))?;
            if !l.found.is_empty() && !l.found.starts_with('/') {
                return Err(format!("lookup: found {:?} is not a JSON pointer", l.found));
            }
        }
        let limits = raw.limits.map(|l| read_limits(&l)).transpose()?;
        let answers = read_answers(raw.answers)?;
        Ok(EraseShape {
            identity: raw.identity,
            method,
            path: raw.path,
            body,
            batch_size,
            item,
            content_type: raw.content_type,
            lookup: raw.lookup.map(|l| Lookup {
                path: l.path,
                found: l.found,
            }),
            limits,
            answers,
        })
    }

    /// The first of its identity kinds `person` has.
    pub fn identity_of<'p>(&self, person: &'p Value) -> Option<(&str, &'p str)> {
        self.identity
            .iter()
            .find_map(|k| Some((k.as_str(), person.get(k)?.as_str()?)))
    }

    /// The call's path for `person` (with `found`, a lookup's id, in it).
    pub fn path_for(&self, person: &Value) -> Result<String, String> {
        template::fill_path(&self.path, record(person))
    }

    /// The call's body for `person`, if it has one.
    pub fn body_for(&self, person: &Value) -> Result<Option<Value>, String> {
        self.body
            .as_ref()
            .map(|b| b.fill(Scope::Record(record(person))))
            .transpose()
    }

    /// A batch's body for `people` (each as the call names them): their items in its
    /// `{{records}}`; an item a person cannot fill is left out.
    pub fn batch_body(&self, people: &[&Value]) -> Value {
        let items: Vec<Value> = match &self.item {
            Some(item) => people
                .iter()
                .filter_map(|p| item.fill(Scope::Record(record(p))).ok())
                .collect(),
            None => Vec::new(),
        };
        match &self.body {
            Some(body) => body.fill_records(&Value::Array(items)),
            None => Value::Array(items),
        }
    }

    /// The lookup's path for `person`.
    pub fn lookup_path(&self, lookup: &Lookup, person: &Value) -> Result<String, String> {
        template::fill_path(&lookup.path, record(person))
    }

    /// The call in a line, as an operator reads it: `POST path (by email or phone)`, a
    /// lookup first when it has one.
    pub fn describe(&self) -> String {
        let lookup = self
            .lookup
            .as_ref()
            .map(|l| format!("GET {} then ", l.path))
            .unwrap_or_default();
        format!(
            "{lookup}{} {} (by {})",
            self.method,
            self.path,
            self.identity.join(" or ")
        )
    }

    /// What an answer with `status` says: as `answers` states, else any 2xx is erased;
    /// `None`: a failure.
    pub fn said(&self, status: u16) -> Option<Said> {
        match self.answers.get(&status) {
            Some(s) => Some(*s),
            None => (200..300).contains(&status).then_some(Said::Erased),
        }
    }
}

/// People per call: 1, the body naming the person; or `size`, each person's `item` in the
/// body's `{{records}}`, the path naming nobody, no lookup.
fn batch_size(
    item: &Option<Template>,
    size: Option<usize>,
    body: &Option<Template>,
    path: &str,
    lookup: bool,
) -> Result<usize, String> {
    match (item, size) {
        (None, None) => {
            if let Some(body) = body {
                body.check("erase body", Place::Item)?;
            }
            Ok(1)
        }
        (Some(item), Some(size)) if (1..=1000).contains(&size) => {
            item.check("erase item", Place::Item)?;
            let records = match body {
                Some(body) => body.check("erase body", Place::Body)?,
                None => 0,
            };
            if records != 1 {
                return Err("a batch's body holds {{records}} once (its people's items)".into());
            }
            if lookup || !template::path_slots(path)?.is_empty() {
                return Err(
                    "a batch's path names nobody and it has no lookup (its people are in its \
                     body)"
                        .into(),
                );
            }
            Ok(size)
        }
        _ => Err(
            "item and batch_size go together: batch_size people per call (1..=1000), each as \
             item in the body's {{records}}"
                .into(),
        ),
    }
}

/// The endpoint's own limits (`3/s`, `60/min`), checked as a connection's are.
fn read_limits(stated: &[String]) -> Result<Vec<Limit>, String> {
    let parsed = stated
        .iter()
        .map(|s| {
            s.parse::<Limit>()
                .map_err(|e| format!("limits: {s:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    limits::check(parsed).map_err(|e| format!("limits: {e}"))
}

/// What each stated status says (a 429 is never the operation's to read).
fn read_answers(stated: BTreeMap<String, Said>) -> Result<BTreeMap<u16, Said>, String> {
    stated
        .into_iter()
        .map(|(status, said)| match status.parse::<u16>() {
            Ok(s) if (200..600).contains(&s) && s != 429 => Ok((s, said)),
            _ => Err(format!(
                "answers: {status:?} is not an HTTP status courier reads (200..599 but 429)"
            )),
        })
        .collect()
}

/// The person as a template's record: its payload.
fn record(person: &Value) -> Record<'_> {
    Record {
        delivery_id: 0,
        record_key: "",
        payload: person,
    }
}

/// Checks a path template: payload fields only (`found` only after a lookup).
fn check_path(path: &str, looked_up: bool) -> Result<(), String> {
    if path.contains("://") {
        return Err(format!(
            "path {path:?} is an absolute URL: it is relative to the connection's base_url"
        ));
    }
    for s in template::path_slots(path)? {
        match s {
            template::Slot::Payload(p) => {
                let field = p.trim_start_matches('/');
                let known = KINDS.contains(&field) || (looked_up && field == "found");
                if !known {
                    return Err(format!(
                        "path {path:?}: {{payload{p}}} is not a person's identity ({}{})",
                        KINDS.join(", "),
                        if looked_up { ", found" } else { "" }
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "path {path:?}: an erase path names the person's identities only \
                     ({{payload/email}}, ...)"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_modules_example_is_an_operation_the_parser_takes() {
        let examples = crate::doc_examples::of(include_str!("erase.rs"));
        assert_eq!(examples.len(), 1);
        for example in examples {
            EraseShape::parse(&example).unwrap();
        }
    }

    #[test]
    fn mailchimps_member_hash_is_filled_in_the_path() {
        let shape = EraseShape::parse(&json!({
            "identity": ["email"],
            "path": "lists/L1/members/{payload/email | lower | md5}/actions/delete-permanent",
            "answers": {"404": "unknown"}
        }))
        .unwrap();
        let person = json!({"email": "urist.mcvankab+3@freddiesjokes.com"});
        // The subscriber hash Mailchimp names a member by: the MD5 of the lower-cased address (RFC 1321).
        assert_eq!(
            shape.path_for(&person).unwrap(),
            "lists/L1/members/852aaa9532cb36adfb5e9fef7a4206a9/actions/delete-permanent"
        );
        assert_eq!(shape.said(404), Some(Said::Unknown));
        assert_eq!(shape.said(204), Some(Said::Erased));
        assert_eq!(shape.said(400), None);
    }

    #[test]
    fn the_first_identity_the_person_has_is_used() {
        let shape = EraseShape::parse(&json!({
            "identity": ["email", "phone"], "method": "POST", "path": "privacy",
            "body": {"profile": {"email": "{{payload/email?}}", "phone_number": "{{payload/phone?}}"}}
        }))
        .unwrap();
        let person = json!({"phone": "+48600100200"});
        assert_eq!(shape.identity_of(&person), Some(("phone", "+48600100200")));
        assert_eq!(
            shape.body_for(&person).unwrap(),
            Some(json!({"profile": {"phone_number": "+48600100200"}}))
        );
        assert_eq!(shape.identity_of(&json!({"external_id": "7"})), None);
    }

    #[test]
    fn a_batch_carries_each_persons_item_in_its_records() {
        let shape = EraseShape::parse(&json!({
            "identity": ["email"], "path": "users/delete", "batch_size": 50,
            "item": "{{payload/email}}", "body": {"email_addresses": "{{records}}"}
        }))
        .unwrap();
        assert_eq!(shape.batch_size, 50);
        let (ann, bob) = (
            json!({"email": "ann@x.test"}),
            json!({"email": "bob@x.test"}),
        );
        assert_eq!(
            shape.batch_body(&[&ann, &bob]),
            json!({"email_addresses": ["ann@x.test", "bob@x.test"]})
        );
    }

    #[test]
    fn bad_operations_are_refused_naming_what_is_wrong() {
        let bad = [
            (
                json!({"identity": ["email"], "path": "x", "batch_size": 5}),
                "item and batch_size",
            ),
            (
                json!({"identity": ["email"], "path": "x/{payload/email}", "batch_size": 5,
                       "item": "{{payload/email}}", "body": {"a": "{{records}}"}}),
                "names nobody",
            ),
            (
                json!({"identity": ["email"], "path": "x", "batch_size": 5,
                       "item": "{{payload/email}}", "body": {"a": 1}}),
                "{{records}} once",
            ),
            (json!({"path": "x"}), "identity"),
            (json!({"identity": ["mail"], "path": "x"}), "\"mail\""),
            (
                json!({"identity": ["email"], "path": "x", "method": "TRACE"}),
                "method",
            ),
            (
                json!({"identity": ["email"], "path": "x/{payload/name}"}),
                "{payload/name}",
            ),
            (
                json!({"identity": ["email"], "path": "x/{payload/found}"}),
                "found",
            ),
            (
                json!({"identity": ["email"], "path": "https://evil/x"}),
                "absolute",
            ),
            (
                json!({"identity": ["email"], "path": "x", "answers": {"429": "erased"}}),
                "429",
            ),
            (
                json!({"identity": ["email"], "path": "x", "answers": {"404": "gone"}}),
                "gone",
            ),
            (
                json!({"identity": ["email"], "path": "x", "limits": ["3/fortnight"]}),
                "limits",
            ),
            (
                json!({"identity": ["email"], "path": "x", "extra": 1}),
                "extra",
            ),
        ];
        for (raw, names) in bad {
            let err = EraseShape::parse(&raw).unwrap_err();
            assert_eq!(err.field, "erase");
            assert!(err.reason.contains(names), "{raw}: {}", err.reason);
        }
    }
}
