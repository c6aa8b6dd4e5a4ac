//! Records grouped into calls by a value (a rule's `request.group`): a target whose bulk
//! endpoint takes many records that share something (one attribute set to one value for
//! many users, User.com's mass update) is sent each batch's records grouped by that value,
//! one call per group of up to `records_per_call`, and every other record alone.
//!
//! ```json
//! {"group": {"key": "{{payload/attributes | entry}}",
//!            "path": "users-by-id/mass_update_custom_attributes/", "method": "PUT",
//!            "item": "{{payload/custom_id}}",
//!            "body": {"ids": "{{records}}", "attribute": "{{group/name}}",
//!                     "value": "{{group/value}}"}}}
//! ```
//!
//! - `key`: a template filled for each record (the item's language: its payload, delivery
//!   id and key). Records whose keys are equal share calls, in the order each key first
//!   appears in the batch. A record whose key, or whose item in the group's call, cannot be
//!   made (a field absent, a filter refusing it: `entry` of an object with two fields), or
//!   that lacks a field the rule requires, goes alone.
//! - `path` and `method`: the group's call's (its path names no record's field).
//! - `item`: each record as the group's call carries it (default: its payload).
//! - `body`: the group's call's body, holding `"{{records}}"` once and the key's fields as
//!   `"{{group/...}}"` (default: the bare list of items).
//!
//! A record alone, and a group that holds one record, is sent as the rule's own request
//! shape sends one record (its `path`, `method` and `item`, which may name the record's
//! fields). The group's call is answered like any bulk call (the rule's `answer`); a
//! refusal of the whole call for its content is every record's, never split: its records
//! share the key, which is what the call says beyond naming them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::template::{Place, Record, Scope, Template, path_slots};

/// How a rule's records are grouped into calls, and how a group's call is shaped.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupShape {
    /// The value records are grouped by, filled for each record.
    pub key: Template,
    /// The group's call's path under the base URL.
    pub path: String,
    /// Its method: `POST` (the default), `PUT` or `PATCH`.
    #[serde(default)]
    pub method: Option<String>,
    /// Each record as the group's call carries it (default: its payload).
    #[serde(default)]
    pub item: Option<Template>,
    /// The group's call's body around its items (default: the bare list).
    #[serde(default)]
    pub body: Option<Template>,
}

impl GroupShape {
    /// Checks every template and the path when the rule is saved; the error names the
    /// field (`request: group: ...`).
    pub(super) fn check(&self) -> Result<(), String> {
        self.key.check("group: key", Place::Item)?;
        if let Some(item) = &self.item {
            item.check("group: item", Place::Item)?;
        }
        if let Some(body) = &self.body {
            let n = body.check("group: body", Place::GroupBody)?;
            if n != 1 {
                return Err(format!(
                    "request: group: body must hold \"{{{{records}}}}\" exactly once, not {n} \
                     times"
                ));
            }
        }
        super::wire::check_method("request: group: ", self.method.as_deref())?;
        let slots = path_slots(&self.path).map_err(|e| format!("request: group: {e}"))?;
        if !slots.is_empty() {
            return Err(format!(
                "request: group: path {:?} names a record's field, and a group's call \
                 carries many records",
                self.path
            ));
        }
        if self.path.trim().is_empty() {
            return Err("request: group: path is empty".into());
        }
        Ok(())
    }

    /// The key of record `r`, and whether it can join a group (its item can be made).
    pub(super) fn key(&self, r: Record<'_>) -> Option<Value> {
        let key = self.key.fill(Scope::Record(r)).ok()?;
        self.item(r).ok().map(|_| key)
    }

    /// Record `r` as the group's call carries it.
    pub(super) fn item(&self, r: Record<'_>) -> Result<Value, String> {
        match &self.item {
            Some(t) => t.fill(Scope::Record(r)),
            None => Ok(r.payload.clone()),
        }
    }

    /// The group's call's body: its `items` around the `key` they share.
    pub(super) fn body(&self, key: &Value, items: Vec<Value>) -> Result<Value, String> {
        let records = Value::Array(items);
        match &self.body {
            Some(t) => t.fill(Scope::Call {
                records: &records,
                group: Some(key),
            }),
            None => Ok(records),
        }
    }

    /// The method of a group's call.
    pub fn method(&self) -> reqwest::Method {
        super::wire::method(self.method.as_deref())
    }
}

/// Puts a batch's records (`n` of them, each given by `record`) into calls: those whose
/// key `key` makes grouped by it, `per_call` at most to a call, in the order each key
/// first appears; every other record a call of its own, first.
pub fn calls<'a>(
    n: usize,
    record: impl Fn(usize) -> Record<'a>,
    key: impl Fn(Record<'a>) -> Option<Value>,
    per_call: usize,
) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Value, Vec<usize>)> = Vec::new();
    let mut calls = Vec::new();
    for i in 0..n {
        let Some(k) = key(record(i)).filter(|_| per_call > 1) else {
            calls.push(vec![i]);
            continue;
        };
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    for (_, members) in groups {
        calls.extend(members.chunks(per_call).map(<[usize]>::to_vec));
    }
    calls
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn usercom() -> GroupShape {
        let examples = crate::doc_examples::of(include_str!("group.rs"));
        serde_json::from_value(examples[0]["group"].clone()).expect("the example parses")
    }

    #[test]
    fn single_attribute_changes_group_by_attribute_and_value() {
        let shape = usercom();
        shape.check().unwrap();
        let p = [
            json!({"custom_id": "a", "attributes": {"email_consent": true}}),
            json!({"custom_id": "b", "attributes": {"email_consent": false}}),
            json!({"custom_id": "c", "attributes": {"email_consent": true, "sms": true}}),
            json!({"custom_id": 7, "attributes": {"email_consent": true}}),
            json!({"attributes": {"email_consent": true}}),
            json!({"custom_id": "d", "attributes": {"email_consent": true}}),
            json!({"custom_id": "e", "attributes": {"sms_consent": true}}),
        ];
        let record = |i: usize| Record {
            delivery_id: i as i64,
            record_key: "k",
            payload: &p[i],
        };
        let key = |r: Record<'_>| shape.key(r);
        // Two attributes and no custom id go alone; the rest by (attribute, value), at
        // most two a call, in the order each group first appears.
        assert_eq!(
            calls(p.len(), record, key, 2),
            [vec![2], vec![4], vec![0, 3], vec![5], vec![1], vec![6]]
        );
        assert_eq!(
            calls(p.len(), record, key, 1),
            (0..7).map(|i| vec![i]).collect::<Vec<_>>()
        );
        let items = [0, 3].map(|i| shape.item(record(i)).unwrap()).to_vec();
        let k = shape.key(record(0)).unwrap();
        assert_eq!(
            shape.body(&k, items).unwrap(),
            json!({"ids": ["a", 7], "attribute": "email_consent", "value": true})
        );
        assert_eq!(shape.method(), reqwest::Method::PUT);
    }

    #[test]
    fn what_a_group_cannot_do_is_refused_when_the_rule_is_saved() {
        for (change, words) in [
            (
                json!({"path": "users/{payload/id}/"}),
                "names a record's field",
            ),
            (json!({"body": {"ids": "{{payload}}"}}), "is a record's"),
            (json!({"body": {"a": 1}}), "exactly once, not 0"),
            (json!({"key": "{{records}}"}), "belongs in the body"),
            (
                json!({"item": "{{group/name}}"}),
                "only the body of a group's call",
            ),
            (json!({"method": "GET"}), "method \"GET\""),
            (json!({"path": " "}), "path is empty"),
        ] {
            let mut v = serde_json::to_value(usercom()).unwrap();
            for (k, x) in change.as_object().unwrap() {
                v[k] = x.clone();
            }
            let shape: GroupShape = serde_json::from_value(v).unwrap();
            let e = shape.check().unwrap_err();
            assert!(e.contains(words) && e.contains("group"), "{change}: {e}");
        }
    }
}
