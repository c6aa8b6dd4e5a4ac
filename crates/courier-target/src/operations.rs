//! A workspace's API, answered as an emulation file's `workspace` says
//! ([`WorkspaceApi`]): records kept by key in stores, entries appended to logs, and the
//! operations on them, each a path, the checks a call must pass in order and one action
//! (an upsert, one field set on many records, an append). Pure: a call in, a [`Reply`]
//! out, the workspace's [`WorkspaceData`] changed; its tests call it directly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::emulation::{Action, Answer, Check, Kind, Operation, RefBy, RefField, WorkspaceApi};

/// Where courier puts the delivery id inside an appended entry's `data` (the engine's
/// `DELIVERY_ID_FIELD`; the engine's tests assert both are equal, since this crate does
/// not depend on the engine). The target counts appended entries by it
/// (`{{delivery_id}}`), and never merges it into a record.
pub const DELIVERY_ID_FIELD: &str = "courier_delivery_id";

/// What a workspace's operations stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceData {
    /// Each store's records by key.
    pub stores: BTreeMap<String, BTreeMap<String, Value>>,
    /// Each log's entries in arrival order.
    pub logs: BTreeMap<String, Vec<Value>>,
    /// The number the next new record of a store with ids gets.
    #[serde(default)]
    pub next_id: u64,
}

impl WorkspaceData {
    /// Empty stores and logs, as `api` has them.
    pub fn of(api: &WorkspaceApi) -> Self {
        Self {
            stores: api
                .stores
                .keys()
                .map(|s| (s.clone(), BTreeMap::new()))
                .collect(),
            logs: api.logs.iter().map(|l| (l.clone(), Vec::new())).collect(),
            next_id: 1,
        }
    }

    /// The records of `store` (none when it has no such store).
    pub fn store(&self, store: &str) -> &BTreeMap<String, Value> {
        static NONE: BTreeMap<String, Value> = BTreeMap::new();
        self.stores.get(store).unwrap_or(&NONE)
    }

    /// The entries of `log` (none when it has no such log).
    pub fn log(&self, log: &str) -> &[Value] {
        self.logs.get(log).map_or(&[], Vec::as_slice)
    }

    /// Keeps a record of `key` in `store` with no fields, unless it has one.
    pub fn seed(&mut self, api: &WorkspaceApi, store: &str, key: &str) {
        write(api, self, store, key, &Map::new());
    }
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
    /// A reply accepting nothing.
    pub fn error(status: u16, body: Value) -> Self {
        Self {
            status,
            body,
            accepted: Vec::new(),
        }
    }
}

/// One call as the operation sees it.
struct Call<'a> {
    api: &'a WorkspaceApi,
    op: &'a Operation,
    /// The path's `{key}`, percent-decoded.
    key: Option<String>,
    body: &'a Value,
    /// The fields the workspace declares; `None`: any.
    declared: Option<&'a BTreeSet<String>>,
}

/// Answers one call: `path` is the part after the API's prefix.
pub fn apply(
    api: &WorkspaceApi,
    data: &mut WorkspaceData,
    declared: Option<&BTreeSet<String>>,
    method: &str,
    path: &str,
    body: &Value,
) -> Reply {
    let matching: Vec<(&Operation, Option<String>)> = api
        .operations
        .iter()
        .filter_map(|op| Some((op, matched(&op.path, path)?)))
        .collect();
    let Some((op, key)) = matching.iter().find(|(op, _)| op.method == method) else {
        return match matching.is_empty() {
            true => answer(&api.errors.not_found, &Map::new()),
            false => answer(&api.errors.method, &vars([("method", method.into())])),
        };
    };
    let call = Call {
        api,
        op,
        key: key.clone(),
        body,
        declared,
    };
    if let Some(refused) = op.checks.iter().find_map(|c| check(&call, data, c)) {
        return refused;
    }
    act(&call, data)
}

/// The path's `{key}` (`Some(None)` for a match without one) if `path` is `pattern`.
fn matched(pattern: &str, path: &str) -> Option<Option<String>> {
    let p: Vec<&str> = pattern.trim_matches('/').split('/').collect();
    let s: Vec<&str> = path.trim_matches('/').split('/').collect();
    if p.len() != s.len() {
        return None;
    }
    let mut key = None;
    for (a, b) in p.iter().zip(&s) {
        match *a {
            "{key}" => key = Some(percent_decode(b)),
            a if a == *b => {}
            _ => return None,
        }
    }
    Some(key)
}

/// Placeholders from pairs.
pub(crate) fn vars<const N: usize>(pairs: [(&str, Value); N]) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// An answer filled with `vars`.
pub(crate) fn answer(a: &Answer, vars: &Map<String, Value>) -> Reply {
    let body = a.body.as_ref().map_or(Value::Null, |t| fill(t, vars));
    Reply::error(a.status, body)
}

/// A field refused with `message` (filled with `vars`).
fn field_error(api: &WorkspaceApi, field: &str, message: &str, v: &Map<String, Value>) -> Reply {
    let message = fill(&Value::String(message.to_owned()), v);
    answer(
        &api.errors.field,
        &vars([("field", field.into()), ("message", message)]),
    )
}

/// The first broken condition's answer, if `c` is broken.
fn check(call: &Call<'_>, data: &WorkspaceData, c: &Check) -> Option<Reply> {
    let api = call.api;
    let get = |f: &str| call.body.get(f);
    let none = Map::new();
    match c {
        Check::Object if !call.body.is_object() => {
            let (field, message) = &api.errors.not_object;
            Some(field_error(api, field, message, &none))
        }
        Check::Required { field, kind } if !holds(get(field), *kind) => {
            Some(field_error(api, field, &api.errors.required, &none))
        }
        Check::MaxChars {
            fields,
            max,
            message,
        } => fields
            .iter()
            .find(|f| {
                get(f)
                    .and_then(Value::as_str)
                    .is_some_and(|v| v.chars().count() > *max)
            })
            .map(|f| field_error(api, f, message, &vars([("max", (*max).into())]))),
        Check::MaxItems {
            field,
            max,
            message,
        } if get(field)
            .and_then(Value::as_array)
            .is_some_and(|a| a.len() > *max) =>
        {
            Some(field_error(
                api,
                field,
                message,
                &vars([("max", (*max).into())]),
            ))
        }
        Check::OneOf {
            field,
            values,
            message,
        } => match get(field).and_then(Value::as_str) {
            Some(v) if !values.iter().any(|a| a == v) => Some(field_error(
                api,
                field,
                message,
                &vars([("value", v.into())]),
            )),
            _ => None,
        },
        Check::Declared {
            store,
            names,
            message,
        } => undeclared(call, store, names)
            .map(|name| field_error(api, &name, message, &vars([("name", name.clone().into())]))),
        Check::Exists { store } => {
            let known = call
                .key
                .as_ref()
                .is_some_and(|k| data.store(store).contains_key(k));
            (!known).then(|| answer(&api.errors.not_found, &none))
        }
        Check::Reference {
            store,
            by,
            required,
            must_exist,
        } => reference(call, data, (store, by), required, *must_exist),
        _ => None,
    }
}

/// Whether a field holds what `kind` asks.
fn holds(v: Option<&Value>, kind: Kind) -> bool {
    match kind {
        Kind::Key => key_of(v).is_some(),
        Kind::Text => v.and_then(Value::as_str).is_some_and(|s| !s.is_empty()),
        Kind::String => v.is_some_and(Value::is_string),
        Kind::List => v.is_some_and(Value::is_array),
        Kind::Any => v.is_some(),
    }
}

/// The first field name of the call a store neither has as standard nor the workspace
/// declares: the body's fields (`names` empty) or the one the field `names` holds.
fn undeclared(call: &Call<'_>, store: &str, names: &str) -> Option<String> {
    let declared = call.declared?;
    let standard = &call.api.stores.get(store)?.standard;
    let known = |n: &String| standard.contains(n) || declared.contains(n);
    match names {
        "" => call.body.as_object()?.keys().find(|n| !known(n)).cloned(),
        field => {
            let name = call.body.get(field)?.as_str()?.to_owned();
            (!known(&name)).then_some(name)
        }
    }
}

/// The refusal of a call naming a record of `store` wrongly: by none of the fields, or
/// (when it must exist) one the store does not have.
fn reference(
    call: &Call<'_>,
    data: &WorkspaceData,
    (store, by): (&str, &[RefField]),
    required: &str,
    must_exist: bool,
) -> Option<Reply> {
    let api = call.api;
    for r in by {
        let v = call.body.get(&r.field);
        let (named, value) = match r.by {
            RefBy::Key => match key_of(v) {
                Some(k) => (data.store(store).contains_key(&k), k),
                None => continue,
            },
            RefBy::Id => match v.filter(|v| v.is_u64()) {
                Some(id) => (find_by_id(api, data, store, id).is_some(), id.to_string()),
                None => continue,
            },
        };
        return (must_exist && !named)
            .then(|| field_error(api, &r.field, &r.unknown, &vars([("value", value.into())])));
    }
    Some(field_error(
        api,
        required,
        &api.errors.required,
        &Map::new(),
    ))
}

/// The key of the record of `store` whose number is `id`.
fn find_by_id(api: &WorkspaceApi, data: &WorkspaceData, store: &str, id: &Value) -> Option<String> {
    let field = api.stores.get(store)?.id.as_deref()?;
    let records = data.store(store);
    records
        .iter()
        .find(|(_, r)| r.get(field) == Some(id))
        .map(|(k, _)| k.clone())
}

/// Does what the operation does and answers it.
fn act(call: &Call<'_>, data: &mut WorkspaceData) -> Reply {
    let op = call.op;
    let (v, accepted) = match &op.action {
        Action::Upsert { store, key } => {
            let key = match key.as_str() {
                "{key}" => call.key.clone().unwrap_or_default(),
                field => key_of(call.body.get(field)).unwrap_or_default(),
            };
            let fields = call.body.as_object().cloned().unwrap_or_default();
            let (id, created) = write(call.api, data, store, &key, &fields);
            let v = vars([("key", key.into()), ("id", id), ("created", created.into())]);
            let accepted = text(&op.accepted, &v);
            (v, vec![accepted])
        }
        Action::SetMany {
            store,
            ids,
            by,
            attribute,
            value,
        } => set_many(call, data, store, (ids, *by), (attribute, value)),
        Action::Delete { store } => {
            let key = call.key.clone().unwrap_or_default();
            if let Some(records) = data.stores.get_mut(store) {
                records.remove(&key);
            }
            let v = vars([("key", key.into())]);
            let accepted = text(&op.accepted, &v);
            (v, vec![accepted])
        }
        Action::Append { log, add, merge } => append(call, data, log, add, merge.as_ref()),
    };
    Reply {
        status: op.ok.status,
        body: op.ok.body.as_ref().map_or(Value::Null, |t| fill(t, &v)),
        accepted,
    }
}

/// Writes `fields` into the record `key` of `store`, created if new (with a number
/// where the store gives them); answers its number and whether it was created.
fn write(
    api: &WorkspaceApi,
    data: &mut WorkspaceData,
    store: &str,
    key: &str,
    fields: &Map<String, Value>,
) -> (Value, bool) {
    let Some(s) = api.stores.get(store) else {
        return (Value::Null, false);
    };
    let next_id = &mut data.next_id;
    let records = data.stores.entry(store.to_owned()).or_default();
    let created = !records.contains_key(key);
    let record = records.entry(key.to_owned()).or_insert_with(|| {
        let mut r = Map::new();
        if let Some(id) = &s.id {
            r.insert(id.clone(), (*next_id).into());
            *next_id += 1;
        }
        r.insert(s.key.clone(), key.into());
        Value::Object(r)
    });
    let obj = record.as_object_mut().expect("records are objects");
    for (k, v) in fields {
        if Some(k) != s.id.as_ref() {
            obj.insert(k.clone(), v.clone());
        }
    }
    obj.insert(s.key.clone(), key.into());
    let id = s.id.as_ref().and_then(|f| obj.get(f).cloned());
    (id.unwrap_or(Value::Null), created)
}

/// Sets one field to one value in the records the call names; those the store does not
/// have are named back.
fn set_many(
    call: &Call<'_>,
    data: &mut WorkspaceData,
    store: &str,
    (ids, by): (&str, RefBy),
    (attribute, value): (&str, &str),
) -> (Map<String, Value>, Vec<String>) {
    let attribute = call
        .body
        .get(attribute)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let value = call.body.get(value).cloned().unwrap_or(Value::Null);
    let ids = call
        .body
        .get(ids)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut accepted = Vec::new();
    let mut not_found = Vec::new();
    for id in &ids {
        let key = match by {
            RefBy::Key => key_of(Some(id)).filter(|k| data.store(store).contains_key(k)),
            RefBy::Id => find_by_id(call.api, data, store, id),
        };
        let record = key
            .as_ref()
            .and_then(|k| data.stores.get_mut(store)?.get_mut(k));
        match (key.as_ref(), record.and_then(Value::as_object_mut)) {
            (Some(k), Some(record)) => {
                record.insert(attribute.to_owned(), value.clone());
                let v = vars([("attribute", attribute.into()), ("key", k.clone().into())]);
                accepted.push(text(&call.op.accepted, &v));
            }
            _ => not_found.push(id.clone()),
        }
    }
    let v = vars([
        ("updated_count", accepted.len().into()),
        ("not_found", not_found.into()),
    ]);
    (v, accepted)
}

/// Appends the call's body to `log` with the `add` fields; where it says so, merges one
/// object field of the body into the record of the path's key.
fn append(
    call: &Call<'_>,
    data: &mut WorkspaceData,
    log: &str,
    add: &Map<String, Value>,
    merge: Option<&(String, String)>,
) -> (Map<String, Value>, Vec<String>) {
    let key = call.key.clone().unwrap_or_default();
    let delivery = call.body.get("data").and_then(|d| d.get(DELIVERY_ID_FIELD));
    let delivery_id = match delivery {
        Some(id) => id.to_string(),
        None => format!("#{}", data.log(log).len()),
    };
    let v = vars([
        ("key", key.clone().into()),
        ("delivery_id", delivery_id.into()),
    ]);
    if let Some((store, field)) = merge {
        let mut fields = call.body.get(field).and_then(Value::as_object).cloned();
        let fields = fields.get_or_insert_default();
        fields.remove(DELIVERY_ID_FIELD);
        write(call.api, data, store, &key, fields);
    }
    let mut entry = call.body.as_object().cloned().unwrap_or_default();
    for (k, t) in add {
        entry.insert(k.clone(), fill(t, &v));
    }
    data.logs
        .entry(log.to_owned())
        .or_default()
        .push(Value::Object(entry));
    let accepted = text(&call.op.accepted, &v);
    (v, vec![accepted])
}

/// A string or number key as a string; `None` when absent or empty.
fn key_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A template filled: a string that is one placeholder is its value; placeholders inside
/// longer strings, and in keys, are filled as text (unknown ones are left as they are).
fn fill(t: &Value, vars: &Map<String, Value>) -> Value {
    match t {
        Value::String(s) => {
            let whole = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}"));
            match whole
                .filter(|n| !n.contains("{{"))
                .and_then(|n| vars.get(n))
            {
                Some(v) => v.clone(),
                None => text(s, vars).into(),
            }
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| (text(k, vars), fill(v, vars)))
            .collect::<Map<_, _>>()
            .into(),
        Value::Array(a) => a.iter().map(|v| fill(v, vars)).collect(),
        other => other.clone(),
    }
}

/// A string template filled as text.
fn text(s: &str, vars: &Map<String, Value>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let name = &rest[start + 2..start + len];
        out.push_str(&rest[..start]);
        match vars.get(name) {
            Some(Value::String(v)) => out.push_str(v),
            Some(v) => out.push_str(&v.to_string()),
            None => out.push_str(&rest[start..start + len + 2]),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
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

/// The API workspaces serve: the first emulation file (by name) that has a `workspace`.
pub fn workspace_api() -> Option<&'static WorkspaceApi> {
    crate::emulation::emulations()
        .iter()
        .find_map(|(_, e)| e.workspace.as_ref())
}

/// A reply of `status` with a `{"detail": ...}` body (the target's own answers).
pub fn detail(status: u16, detail: &str) -> Reply {
    Reply::error(status, json!({ "detail": detail }))
}

/// The most items the workspace API's operation `method path` takes in list `field`, as
/// its emulation file says (`max_items`); `None` when it sets no maximum.
pub fn max_items(method: &str, path: &str, field: &str) -> Option<usize> {
    let op = workspace_api()?
        .operations
        .iter()
        .find(|op| op.method == method && matched(&op.path, path).is_some())?;
    op.checks.iter().find_map(|c| match c {
        Check::MaxItems { field: f, max, .. } if f == field => Some(*max),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workspace_api_names_only_its_own_stores_and_logs() {
        let apis: Vec<&WorkspaceApi> = crate::emulation::emulations()
            .iter()
            .filter_map(|(_, e)| e.workspace.as_ref())
            .collect();
        assert!(
            !apis.is_empty(),
            "an emulation file describes a workspace API"
        );
        for api in apis {
            let store = |s: &String| assert!(api.stores.contains_key(s), "store {s}");
            for op in &api.operations {
                for c in &op.checks {
                    match c {
                        Check::Declared { store: s, .. }
                        | Check::Exists { store: s }
                        | Check::Reference { store: s, .. } => store(s),
                        _ => {}
                    }
                }
                match &op.action {
                    Action::Upsert { store: s, .. }
                    | Action::SetMany { store: s, .. }
                    | Action::Delete { store: s } => store(s),
                    Action::Append { log, merge, .. } => {
                        assert!(api.logs.contains(log), "log {log}");
                        merge.iter().for_each(|(s, _)| store(s));
                    }
                }
                assert!(
                    op.path.ends_with('/') || !api.prefix.ends_with('/'),
                    "{}: paths end as the prefix does",
                    op.path
                );
            }
        }
    }

    #[test]
    fn templates_fill_keys_values_and_text() {
        let v = vars([("field", "name".into()), ("n", 3.into()), ("l", json!([1]))]);
        assert_eq!(
            fill(
                &json!({"{{field}}": ["{{n}} of {{l}}", "{{l}}", "{{nope}}"]}),
                &v
            ),
            json!({"name": ["3 of [1]", [1], "{{nope}}"]})
        );
        assert_eq!(
            matched("a/{key}/b/", "/a/x%20y/b"),
            Some(Some("x y".into()))
        );
        assert_eq!(matched("a/{key}/b/", "a/x/c/"), None);
        assert_eq!(matched("a/", "a/b/"), None);
    }
}
