//! The batch sink: what a target's batch endpoint answers a call of many records. How each
//! answers is data, not code: the sink's own styles under `batch/<style>/`
//! (`crates/courier-target/styles.json`) and, beside each preset of the engine,
//! `presets/<name>.target.json`, built in ([`EMULATIONS`](crate::emulation::EMULATIONS)). Pure: a call's path, body and
//! headers in, a [`BatchReply`] out; the server counts what it accepted.
//!
//! An emulation file lists endpoints, each with the paths it serves (segments; `*` one,
//! `**` any number) and its answers: `ok` when no record of the call is invalid, `partial`
//! (default: `ok`) when some is (a record marked `"invalid": true`, on the item or one level
//! down). An answer is a status, a body template and what it accepts (`valid`, the
//! default; `none`; `all`). In a template, `{"$each": "accepted" | "refused", "$as": T}` is
//! an array of `T` for each accepted or refused record, `{"$each": "item", "$accepted": T,
//! "$refused": T}` one for every record in order; a string names what fills it:
//! `{{index}}` (the record's position), `{{trace}}` (its `objectWriteTraceId`, else its
//! delivery id), `{{item/<pointer>}}` (a field of the record; null when absent),
//! `{{count}}`, `{{accepted_count}}`, `{{refused_count}}`, `{{first_refused}}`. A whole
//! string is replaced by the value; one inside a longer string by its text.

use axum::http::HeaderMap;
use serde_json::Value;

use crate::emulation::{Accepts, Endpoint, emulations};

/// Whether `path`'s segments match `pattern`'s (`*` one segment, `**` any number).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    fn go(p: &[&str], s: &[&str]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(&"**"), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    go(&p, &s)
}

/// The endpoint serving `path`, if any emulation has one.
fn endpoint(path: &str) -> Option<&'static Endpoint> {
    emulations()
        .iter()
        .flat_map(|(_, e)| &e.endpoints)
        .find(|ep| ep.paths.iter().any(|p| path_matches(p, path)))
}

/// The records of a batch body: the body if it is an array, else its first array found
/// depth first (an envelope at any depth, beside constant fields).
fn batch_items(body: &Value) -> Option<&Vec<Value>> {
    match body {
        Value::Array(items) => Some(items),
        Value::Object(m) => m.values().find_map(batch_items),
        _ => None,
    }
}

/// What the batch sink answers one call, and the keys it accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchReply {
    /// HTTP status.
    pub status: u16,
    /// JSON body (null: none).
    pub body: Value,
    /// Keys of the accepted items: `courier-<delivery id>` from the call's
    /// `Idempotency-Key`, else `<key or "batch">#<position>`.
    pub accepted: Vec<String>,
}

/// The batch sink's answer to a call on `path`, or `None` when no emulation serves it.
pub fn batch_sink(path: &str, body: &Value, headers: &HeaderMap) -> Option<BatchReply> {
    let endpoint = endpoint(path)?;
    let Some(items) = batch_items(body) else {
        return Some(BatchReply {
            status: 400,
            body: serde_json::json!({"detail": "expected a JSON array of records, or an object with one array field"}),
            accepted: Vec::new(),
        });
    };
    let (keys, ids) = record_keys(headers, items.len(), "batch");
    let b = Batch {
        items,
        keys,
        invalid: items.iter().map(invalid).collect(),
        vars: serde_json::Map::new(),
        refused_page: None,
        trace: (0..items.len())
            .map(|j| {
                items[j]
                    .get("objectWriteTraceId")
                    .cloned()
                    .or_else(|| ids.get(j).map(|id| Value::from(*id)))
                    .unwrap_or_else(|| Value::from(j.to_string()))
            })
            .collect(),
    };
    let answer = match b.invalid.contains(&true) {
        true => endpoint.partial.as_ref().unwrap_or(&endpoint.ok),
        false => &endpoint.ok,
    };
    Some(BatchReply {
        status: answer.status,
        body: answer
            .body
            .as_ref()
            .map_or(Value::Null, |t| b.fill(t, None)),
        accepted: (0..items.len())
            .filter(|&j| match answer.accepts {
                Accepts::Valid => !b.invalid[j],
                Accepts::None => false,
                Accepts::All => true,
            })
            .map(|j| b.keys[j].clone())
            .collect(),
    })
}

/// Each of a call's `n` records' keys for the accepted-write log, and the delivery ids its
/// `Idempotency-Key` names (`courier-12,13,17`): `courier-<id>` when it names one per
/// record, else `<key or fallback>#<position>`.
pub(crate) fn record_keys<'h>(
    headers: &'h HeaderMap,
    n: usize,
    fallback: &str,
) -> (Vec<String>, Vec<&'h str>) {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let ids: Vec<&str> = key
        .and_then(|k| k.strip_prefix("courier-"))
        .map(|ids| ids.split(',').collect())
        .unwrap_or_default();
    let keys = (0..n)
        .map(|j| match ids.len() == n {
            true => format!("courier-{}", ids[j]),
            false => format!("{}#{j}", key.unwrap_or(fallback)),
        })
        .collect();
    (keys, ids)
}

/// Whether a record is marked invalid (`"invalid": true`), on itself or one level down (a
/// template's `properties` or `attributes`).
pub(crate) fn invalid(record: &Value) -> bool {
    let marked = |v: &Value| v.get("invalid") == Some(&Value::Bool(true));
    marked(record) || record.as_object().is_some_and(|o| o.values().any(marked))
}

/// One batch call (or job) as the sink sees it: what a template is filled from.
pub(crate) struct Batch<'a> {
    /// The records.
    pub items: &'a [Value],
    /// Each record's key for the accepted-write log.
    pub keys: Vec<String>,
    /// Whether each record is marked invalid.
    pub invalid: Vec<bool>,
    /// Each record's trace id: its own `objectWriteTraceId`, else its delivery id.
    pub trace: Vec<Value>,
    /// Further placeholders by name (a job's `id`, `state`, ...); `{{name/<pointer>}}`
    /// reads into one.
    pub vars: serde_json::Map<String, Value>,
    /// Which of the refused records `$each: refused` lists (skip, take); `None`: all.
    pub refused_page: Option<(usize, usize)>,
}

impl Batch<'_> {
    /// Template `t` filled for the call, or for its record `j`.
    pub fn fill(&self, t: &Value, j: Option<usize>) -> Value {
        match t {
            Value::Object(m) if m.contains_key("$each") => self.each(m, j),
            Value::Object(m) => m
                .iter()
                .map(|(k, v)| (k.clone(), self.fill(v, j)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            Value::Array(a) => a.iter().map(|v| self.fill(v, j)).collect(),
            Value::String(s) => self.text(s, j),
            other => other.clone(),
        }
    }

    /// An `$each` template: one value per record of the subset it names.
    fn each(&self, m: &serde_json::Map<String, Value>, j: Option<usize>) -> Value {
        let all = 0..self.items.len();
        let template = |name: &str| m.get(name).unwrap_or(&Value::Null);
        let out: Vec<Value> = match m.get("$each").and_then(Value::as_str) {
            Some("accepted") => all
                .filter(|&i| !self.invalid[i])
                .map(|i| self.fill(template("$as"), Some(i)))
                .collect(),
            Some("refused") => {
                let (skip, take) = self.refused_page.unwrap_or((0, usize::MAX));
                all.filter(|&i| self.invalid[i])
                    .skip(skip)
                    .take(take)
                    .map(|i| self.fill(template("$as"), Some(i)))
                    .collect()
            }
            Some("item") => all
                .map(|i| match self.invalid[i] {
                    true => self.fill(template("$refused"), Some(i)),
                    false => self.fill(template("$accepted"), Some(i)),
                })
                .collect(),
            other => return Value::String(format!("unknown $each {other:?} (at {j:?})")),
        };
        Value::Array(out)
    }

    /// A string template: a whole placeholder is its value, others are filled as text.
    fn text(&self, s: &str, j: Option<usize>) -> Value {
        if let Some(name) = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}"))
            && !name.contains("{{")
        {
            return self.value(name, j);
        }
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("{{") {
            let Some(len) = rest[start..].find("}}") else {
                break;
            };
            out.push_str(&rest[..start]);
            match self.value(&rest[start + 2..start + len], j) {
                Value::String(v) => out.push_str(&v),
                v => out.push_str(&v.to_string()),
            }
            rest = &rest[start + len + 2..];
        }
        out.push_str(rest);
        Value::String(out)
    }

    /// What placeholder `name` stands for.
    fn value(&self, name: &str, j: Option<usize>) -> Value {
        let refused = self.invalid.iter().filter(|&&i| i).count();
        match (name, j) {
            ("count", _) => self.items.len().into(),
            ("accepted_count", _) => (self.items.len() - refused).into(),
            ("refused_count", _) => refused.into(),
            ("first_refused", _) => self.invalid.iter().position(|&i| i).into(),
            ("index", Some(j)) => j.into(),
            ("line", Some(j)) => (j + 2).into(),
            ("item", Some(j)) => self.items[j].clone(),
            ("trace", Some(j)) => self.trace[j].clone(),
            (field, Some(j)) if field.starts_with("item/") => self.items[j]
                .pointer(&field["item".len()..])
                .cloned()
                .unwrap_or(Value::Null),
            _ => self
                .var(name)
                .unwrap_or_else(|| Value::String(format!("{{{{{name}}}}}"))),
        }
    }
}

impl Batch<'_> {
    /// Placeholder `name` from [`Batch::vars`]: a var, or a pointer into one.
    fn var(&self, name: &str) -> Option<Value> {
        let (var, pointer) = name.split_once('/').map_or((name, ""), |(v, p)| (v, p));
        let value = self.vars.get(var)?;
        match pointer {
            "" => Some(value.clone()),
            p => Some(
                value
                    .pointer(&format!("/{p}"))
                    .cloned()
                    .unwrap_or(Value::Null),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_match_by_segment() {
        for (pattern, path, hit) in [
            ("**/lists/*", "lists/abc", true),
            ("**/lists/*", "3.0/lists/abc/", true),
            ("**/lists/*", "lists/abc/members", false),
            ("**/batch/keyed/**", "ws/shop/batch/keyed/", true),
            ("**/batch/keyed/**", "batch/keyed/x/y", true),
            ("**/batch/keyed/**", "batchx/keyed", false),
            (
                "**/objects/*/batch/upsert",
                "crm/v3/objects/contacts/batch/upsert",
                true,
            ),
            (
                "**/objects/*/batch/upsert",
                "crm/v3/objects/batch/upsert",
                false,
            ),
        ] {
            assert_eq!(path_matches(pattern, path), hit, "{pattern} {path}");
        }
    }

    #[test]
    fn every_emulation_reads_and_names_its_source() {
        assert!(emulations().len() > 1);
        for (name, e) in emulations() {
            let serves = !e.endpoints.is_empty() || !e.jobs.is_empty();
            assert!(!e.about.is_empty() && serves, "{name}");
        }
    }

    #[test]
    fn templates_fill_per_record_and_per_call() {
        let items = [
            json!({"email": "a@x"}),
            json!({"email": "b@x", "invalid": true}),
        ];
        let b = Batch {
            items: &items,
            keys: vec!["courier-1".into(), "courier-2".into()],
            invalid: vec![false, true],
            trace: vec![json!("1"), json!("2")],
            vars: json!({"id": "j-1", "body": {"object": "Contact"}})
                .as_object()
                .cloned()
                .unwrap(),
            refused_page: None,
        };
        let t = json!({
            "ok": {"$each": "accepted", "$as": "{{item/email}}"},
            "bad": {"$each": "refused", "$as": {"at": "{{index}}", "id": "x-{{trace}}"}},
            "all": {"$each": "item", "$accepted": 1, "$refused": 0},
            "n": "{{refused_count}} of {{count}}",
            "first": "{{first_refused}}",
            "missing": "{{item/nope}}",
            "job": "{{id}} of {{body/object}}",
            "whole": {"$each": "refused", "$as": "{{item}}"}
        });
        assert_eq!(
            b.fill(&t, None),
            json!({"ok": ["a@x"], "bad": [{"at": 1, "id": "x-2"}], "all": [1, 0],
                   "n": "1 of 2", "first": 1, "missing": "{{item/nope}}",
                   "job": "j-1 of Contact", "whole": [{"email": "b@x", "invalid": true}]})
        );
    }
}
