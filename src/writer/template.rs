//! The template language of a rule's requests: a template is JSON in which a string names
//! what fills it: `"{{payload}}"` (the record's payload), `"{{payload/email}}"` (a field of
//! it, by JSON pointer), `"{{delivery_id}}"`, `"{{record_key}}"`, and in a body,
//! `"{{records}}"` (the call's items). A placeholder that is the whole string is replaced by
//! the value itself (an object stays an object); one inside a longer string by its text.
//! Filters after a `|` put a value in the target's types and names
//! (`"{{payload | omit email | upper_keys}}"`: [`super::filters`]). An object's key `"..."`
//! spreads its value's fields into the object. In the rule's path, `{payload/email}`,
//! `{delivery_id}` and `{record_key}` are filled URL-encoded, one record per call. The
//! request shape ([`super::request`]) checks its templates here when the rule is saved and
//! fills them here for each record.

use serde_json::Value;

use super::filters;

/// What fills a placeholder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Slot<'t> {
    Payload(&'t str),
    DeliveryId,
    RecordKey,
    Records,
}

/// One record as a template sees it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The delivery's id.
    pub delivery_id: i64,
    /// The record's key.
    pub record_key: &'a str,
    /// Its payload.
    pub payload: &'a Value,
}

/// The rule's path with a record's fields filled, URL-encoded.
pub fn fill_path(path: &str, r: Record<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("path {path:?}: a {{ without its }}"))?;
        let name = &rest[open + 1..open + close];
        let value = match slot(name)? {
            Slot::Payload(p) => text(lookup(r.payload, p)?),
            Slot::DeliveryId => r.delivery_id.to_string(),
            Slot::RecordKey => r.record_key.to_owned(),
            Slot::Records => return Err(format!("path {path:?}: {{records}} belongs in a body")),
        };
        // `.` and `..` would move the path instead of naming a thing in it.
        if is_dot_segment(&value) {
            return Err(format!(
                "path {path:?}: {{{name}}} is a dot segment (. or ..), which would change \
                 the path; refused"
            ));
        }
        out.push_str(&encode(&value));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The placeholders of a path (checked).
pub(super) fn path_slots(path: &str) -> Result<Vec<Slot<'_>>, String> {
    let mut slots = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("path {path:?}: a {{ without its }}"))?;
        let s = slot(&rest[open + 1..open + close]).map_err(|e| format!("path {path:?}: {e}"))?;
        if s == Slot::Records {
            return Err(format!("path {path:?}: {{records}} belongs in a body"));
        }
        slots.push(s);
        rest = &rest[open + close + 1..];
    }
    Ok(slots)
}

/// A placeholder's name read.
fn slot(name: &str) -> Result<Slot<'_>, String> {
    match name {
        "payload" => Ok(Slot::Payload("")),
        "delivery_id" => Ok(Slot::DeliveryId),
        "record_key" => Ok(Slot::RecordKey),
        "records" => Ok(Slot::Records),
        other => match other.strip_prefix("payload") {
            Some(p) if p.starts_with('/') => Ok(Slot::Payload(p)),
            _ => Err(format!(
                "unknown placeholder {{{{{name}}}}} (known: payload, payload/<pointer>, \
                 delivery_id, record_key, records)"
            )),
        },
    }
}

/// The placeholders inside a string: `(start, end, name)` of each `{{name}}`.
pub(super) fn placeholders(s: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(open) = s[from..].find("{{") {
        let open = from + open;
        let Some(close) = s[open..].find("}}") else {
            break;
        };
        let close = open + close;
        out.push((open, close + 2, s[open + 2..close].trim()));
        from = close + 2;
    }
    out
}

/// Checks a template's placeholders; returns how many `{{records}}` it holds. A body
/// (`in_body`) holds `{{records}}` and constants only: what is a record's (its payload,
/// delivery id, key, a `"..."` spread) belongs in the item. No object key may hold a
/// placeholder (keys are sent as written).
pub(super) fn check(t: &Value, what: &str, in_body: bool) -> Result<usize, String> {
    match t {
        Value::String(s) => {
            let mut n = 0;
            for (start, end, placeholder) in placeholders(s) {
                let at = |e: String| format!("request: {what}: {e}");
                let (name, filters) = filters::split(placeholder).map_err(at)?;
                let s_ = slot(name).map_err(at)?;
                if s_ == Slot::Records && !filters.is_empty() {
                    return Err(at("{{records}} takes no filter".into()));
                }
                if in_body && s_ != Slot::Records {
                    return Err(format!(
                        "request: body: {{{{{name}}}}} is a record's, and the body holds \
                         {{{{records}}}} and constants only (name the record's fields in item)"
                    ));
                }
                if s_ == Slot::Records {
                    if !in_body {
                        return Err(format!(
                            "request: {what}: {{{{records}}}} belongs in the body"
                        ));
                    }
                    if start != 0 || end != s.len() {
                        return Err(format!(
                            "request: {what}: {{{{records}}}} must be a whole value"
                        ));
                    }
                    n += 1;
                }
            }
            Ok(n)
        }
        Value::Array(a) => a.iter().map(|v| check(v, what, in_body)).sum(),
        Value::Object(o) => {
            if o.keys().any(|k| !placeholders(k).is_empty()) {
                return Err(format!(
                    "request: {what}: an object key holds a placeholder, and keys are sent as \
                     written (put the placeholder in a value)"
                ));
            }
            if in_body && o.contains_key(SPREAD) {
                return Err(
                    "request: body: the spread key \"...\" spreads a record's fields, which \
                     belong in item (the body holds {{records}} and constants only)"
                        .into(),
                );
            }
            o.values().map(|v| check(v, what, in_body)).sum()
        }
        _ => Ok(0),
    }
}

/// A template filled for record `r` (`records`: a body's items).
pub(super) fn fill(t: &Value, r: Record<'_>, records: Option<&Value>) -> Result<Value, String> {
    Ok(match t {
        Value::String(s) => {
            let found = placeholders(s);
            match found.as_slice() {
                [] => t.clone(),
                [(0, end, name)] if *end == s.len() => value(name, r, records)?,
                _ => {
                    let mut out = String::new();
                    let mut last = 0;
                    for (start, end, name) in found {
                        out.push_str(&s[last..start]);
                        out.push_str(&text(&value(name, r, records)?));
                        last = end;
                    }
                    out.push_str(&s[last..]);
                    Value::String(out)
                }
            }
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| fill(v, r, records))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => {
            // `"...": "{{payload}}"` spreads an object's fields into this one; the
            // template's own fields win.
            let mut out = serde_json::Map::new();
            if let Some(spread) = o.get(SPREAD) {
                match fill(spread, r, records)? {
                    Value::Object(fields) => out.extend(fields),
                    other => {
                        return Err(format!(
                            "\"...\" spreads an object, and this record gives {other}"
                        ));
                    }
                }
            }
            for (k, v) in o.iter().filter(|(k, _)| *k != SPREAD) {
                out.insert(k.clone(), fill(v, r, records)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// The key of a template object whose value's fields are spread into it.
const SPREAD: &str = "...";

/// A body template with its `{{records}}` filled.
pub(super) fn fill_records(t: &Value, items: &Value) -> Value {
    match t {
        Value::String(s) if matches!(placeholders(s).as_slice(), [(0, end, "records")] if *end == s.len()) => {
            items.clone()
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| fill_records(v, items)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), fill_records(v, items)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn value(placeholder: &str, r: Record<'_>, records: Option<&Value>) -> Result<Value, String> {
    let (name, filters) = filters::split(placeholder)?;
    let v = match slot(name)? {
        Slot::Payload(p) => lookup(r.payload, p)?.clone(),
        Slot::DeliveryId => Value::String(r.delivery_id.to_string()),
        Slot::RecordKey => Value::String(r.record_key.to_owned()),
        Slot::Records => records.cloned().unwrap_or(Value::Null),
    };
    filters::apply(v, &filters)
}

fn lookup<'v>(payload: &'v Value, pointer: &str) -> Result<&'v Value, String> {
    payload.pointer(pointer).ok_or_else(|| {
        format!("the payload has no field {pointer} (the request's template names it)")
    })
}

/// A value as text: a string as it is, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986), for a path segment or
/// a form value.
/// Whether a path value is `.` or `..`, as it is or once percent-decoded (`%2e%2E`).
fn is_dot_segment(value: &str) -> bool {
    let decoded = value.to_ascii_lowercase().replace("%2e", ".");
    matches!(value, "." | "..") || matches!(decoded.as_str(), "." | "..")
}

pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
