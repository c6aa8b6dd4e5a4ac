//! The template language of a rule's requests: a template is JSON in which a string names
//! what fills it: `"{{payload}}"` (the record's payload), `"{{payload/email}}"` (a field of
//! it, by JSON pointer), `"{{delivery_id}}"`, `"{{record_key}}"`, and in a body,
//! `"{{records}}"` (the call's items) and, in the body of a group's call, `"{{group/...}}"`
//! (the key its records share: [`super::group`]). A placeholder that is the whole string is
//! replaced by the value itself (an object stays an object); one inside a longer string by
//! its text. A `?` after a payload field's name (`"{{payload/data?}}"`) makes it optional:
//! absent, the key it fills is left out (a `"..."` spread spreads nothing) instead of the
//! record being refused.
//! Filters after a `|` put a value in the target's types and names
//! (`"{{payload | omit email | upper_keys}}"`: [`super::filters`]). An object's key `"..."`
//! spreads its value's fields into the object. In the rule's path, `{payload/email}`,
//! `{delivery_id}` and `{record_key}` are filled URL-encoded, one record per call, through
//! their filters too (`{payload/email | lower | md5}`). The
//! request shape ([`super::request`]) checks its templates here when the rule is saved and
//! fills them here for each record. A [`Template`] is read once, when its rule is parsed:
//! its placeholders, filters and constants become a tree that filling a record walks,
//! never reading the template's text again.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::filters::{self, Filter};

/// What fills a placeholder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Slot<'t> {
    Payload(&'t str),
    DeliveryId,
    RecordKey,
    Records,
    Group(&'t str),
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
pub(super) fn fill_path(path: &str, r: Record<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("path {path:?}: a {{ without its }}"))?;
        let placeholder = &rest[open + 1..open + close];
        let (name, filters) = filters::split(placeholder)?;
        let value = match slot(name)? {
            Slot::Payload(p) => lookup(r.payload, p)?.clone(),
            Slot::DeliveryId => Value::String(r.delivery_id.to_string()),
            Slot::RecordKey => Value::String(r.record_key.to_owned()),
            Slot::Records | Slot::Group(_) => {
                return Err(format!("path {path:?}: {{{name}}} belongs in a body"));
            }
        };
        let value = text(&filters::apply(value, &filters)?);
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
        let at = |e: String| format!("path {path:?}: {e}");
        let (name, _) = filters::split(&rest[open + 1..open + close]).map_err(at)?;
        let s = slot(name).map_err(at)?;
        if matches!(s, Slot::Records | Slot::Group(_)) {
            return Err(format!(
                "path {path:?}: {{{}}} belongs in a body",
                &rest[open + 1..open + close]
            ));
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
        "group" => Ok(Slot::Group("")),
        other => match (other.strip_prefix("payload"), other.strip_prefix("group")) {
            (Some(p), _) if p.starts_with('/') => Ok(Slot::Payload(p)),
            (_, Some(p)) if p.starts_with('/') => Ok(Slot::Group(p)),
            _ => Err(format!(
                "unknown placeholder {{{{{name}}}}} (known: payload, payload/<pointer>, \
                 delivery_id, record_key, records, group/<pointer>)"
            )),
        },
    }
}

/// A placeholder's name without its optional mark, and whether it had one: `payload/data?`
/// names a field that may be absent.
fn optional(name: &str) -> (&str, bool) {
    match name.strip_suffix('?') {
        Some(n) => (n.trim_end(), true),
        None => (name, false),
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

/// Where a template stands, which says what may fill it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// A record's item, or a group's key: the record's payload, delivery id and key.
    Item,
    /// A bulk call's body: `{{records}}` and constants.
    Body,
    /// The body of a group's call: `{{records}}`, the group's key (`{{group/...}}`) and
    /// constants.
    GroupBody,
}

/// Checks a template's placeholders; returns how many `{{records}}` it holds. A body
/// holds `{{records}}` and constants only (a group's body its key too): what is a record's
/// (its payload, delivery id, key, a `"..."` spread) belongs in the item. An optional
/// placeholder (`{{payload/data?}}`) names a payload field and is a whole value. No object
/// key may hold a placeholder (keys are sent as written).
pub(super) fn check(t: &Value, what: &str, place: Place) -> Result<usize, String> {
    match t {
        Value::String(s) => {
            let mut n = 0;
            for (start, end, placeholder) in placeholders(s) {
                let at = |e: String| format!("request: {what}: {e}");
                let (name, filters) = filters::split(placeholder).map_err(at)?;
                let (name, optional) = optional(name);
                let s_ = slot(name).map_err(at)?;
                check_slot(s_, place).map_err(|e| at(format!("{{{{{name}}}}} {e}")))?;
                let whole = start == 0 && end == s.len();
                if optional && !(whole && matches!(s_, Slot::Payload(_))) {
                    return Err(at(format!(
                        "{{{{{name}?}}}}: only a payload field may be optional, as a whole \
                         value (an absent one leaves its key out)"
                    )));
                }
                if s_ == Slot::Records {
                    if !filters.is_empty() {
                        return Err(at("{{records}} takes no filter".into()));
                    }
                    if !whole {
                        return Err(at("{{records}} must be a whole value".into()));
                    }
                    n += 1;
                }
            }
            Ok(n)
        }
        Value::Array(a) => a.iter().map(|v| check(v, what, place)).sum(),
        Value::Object(o) => {
            if o.keys().any(|k| !placeholders(k).is_empty()) {
                return Err(format!(
                    "request: {what}: an object key holds a placeholder, and keys are sent as \
                     written (put the placeholder in a value)"
                ));
            }
            if place != Place::Item && o.contains_key(SPREAD) {
                return Err(format!(
                    "request: {what}: the spread key \"...\" spreads a record's fields, which \
                     belong in item (the body holds {{{{records}}}} and constants only)"
                ));
            }
            o.values().map(|v| check(v, what, place)).sum()
        }
        _ => Ok(0),
    }
}

/// Whether a slot may stand in `place`; the error says why not (after the slot's name).
fn check_slot(s: Slot<'_>, place: Place) -> Result<(), String> {
    match (s, place) {
        (Slot::Records, Place::Item) => Err("belongs in the body".into()),
        (Slot::Group(_), Place::Item | Place::Body) => {
            Err("is a group's key, which only the body of a group's call names".into())
        }
        (Slot::Payload(_) | Slot::DeliveryId | Slot::RecordKey, Place::Body | Place::GroupBody) => {
            Err(
                "is a record's, and the body holds {{records}} and constants only (name the \
                 record's fields in item)"
                    .into(),
            )
        }
        _ => Ok(()),
    }
}

/// What fills a template: one record, or a call's items and its group's key.
#[derive(Clone, Copy, Debug)]
pub(super) enum Scope<'a> {
    /// One record's item (or its group's key).
    Record(Record<'a>),
    /// A call's body.
    Call {
        /// The call's items, as a list.
        records: &'a Value,
        /// The key its records share (a group's call).
        group: Option<&'a Value>,
    },
}

/// A template as stated (JSON), read once into the tree filling walks. Compares, prints and
/// serializes as the JSON it was read from.
#[derive(Clone, Debug)]
pub struct Template {
    raw: Value,
    node: Node,
}

/// A template's tree: constants, placeholders, and the strings, lists and objects that
/// hold them.
#[derive(Clone, Debug)]
enum Node {
    /// Holds no placeholder.
    Const(Value),
    /// A string that is one placeholder: replaced by the value itself.
    Whole(Placeholder),
    /// A string with placeholders inside text: each replaced by its text.
    Text(Vec<Part>),
    List(Vec<Node>),
    /// An object: the fields its `"..."` key spreads into it, then its own.
    Object {
        spread: Option<Box<Node>>,
        fields: Vec<(String, Node)>,
    },
}

#[derive(Clone, Debug)]
enum Part {
    Text(String),
    Slot(Placeholder),
}

/// A placeholder read: what fills it, its filters, whether its field may be absent; or,
/// for one that cannot be read, why (a rule's check refuses it before anything is filled).
#[derive(Clone, Debug)]
enum Placeholder {
    Read {
        source: Source,
        filters: Vec<Filter>,
        optional: bool,
    },
    Unreadable(String),
}

/// What fills a placeholder, owned by the tree.
#[derive(Clone, Debug)]
enum Source {
    Payload(String),
    DeliveryId,
    RecordKey,
    Records,
    Group(String),
}

impl Placeholder {
    fn read(text: &str) -> Self {
        let read = || -> Result<Self, String> {
            let (name, filters) = filters::split(text)?;
            let (name, optional) = optional(name);
            let source = match slot(name)? {
                Slot::Payload(p) => Source::Payload(p.to_owned()),
                Slot::DeliveryId => Source::DeliveryId,
                Slot::RecordKey => Source::RecordKey,
                Slot::Records => Source::Records,
                Slot::Group(p) => Source::Group(p.to_owned()),
            };
            Ok(Placeholder::Read {
                source,
                filters,
                optional,
            })
        };
        read().unwrap_or_else(Placeholder::Unreadable)
    }

    /// What fills it in `scope`, through its filters; `None`: an optional field that is
    /// absent.
    fn value(&self, scope: Scope<'_>) -> Result<Option<Value>, String> {
        let (source, filters, optional) = match self {
            Placeholder::Read {
                source,
                filters,
                optional,
            } => (source, filters, *optional),
            Placeholder::Unreadable(why) => return Err(why.clone()),
        };
        let v = match (source, scope) {
            (Source::Payload(p), Scope::Record(r)) => match r.payload.pointer(p) {
                Some(v) => v.clone(),
                None if optional => return Ok(None),
                None => lookup(r.payload, p)?.clone(),
            },
            (Source::DeliveryId, Scope::Record(r)) => Value::String(r.delivery_id.to_string()),
            (Source::RecordKey, Scope::Record(r)) => Value::String(r.record_key.to_owned()),
            (Source::Records, Scope::Call { records, .. }) => records.clone(),
            (Source::Group(p), Scope::Call { group: Some(g), .. }) => g
                .pointer(p)
                .cloned()
                .ok_or_else(|| format!("the group's key has no field {p}"))?,
            _ => return Err(format!("{source:?} has nothing to fill it here")),
        };
        filters::apply(v, filters).map(Some)
    }
}

impl Node {
    fn read(t: &Value) -> Self {
        match t {
            Value::String(s) => {
                let found = placeholders(s);
                match found.as_slice() {
                    [] => Node::Const(t.clone()),
                    [(0, end, name)] if *end == s.len() => Node::Whole(Placeholder::read(name)),
                    _ => {
                        let mut parts = Vec::new();
                        let mut last = 0;
                        for (start, end, name) in found {
                            parts.push(Part::Text(s[last..start].to_owned()));
                            parts.push(Part::Slot(Placeholder::read(name)));
                            last = end;
                        }
                        parts.push(Part::Text(s[last..].to_owned()));
                        Node::Text(parts)
                    }
                }
            }
            Value::Array(a) => {
                let nodes: Vec<Node> = a.iter().map(Node::read).collect();
                match nodes.iter().all(|n| matches!(n, Node::Const(_))) {
                    true => Node::Const(t.clone()),
                    false => Node::List(nodes),
                }
            }
            Value::Object(o) => {
                let spread = o.get(SPREAD).map(|s| Box::new(Node::read(s)));
                let fields: Vec<(String, Node)> = o
                    .iter()
                    .filter(|(k, _)| *k != SPREAD)
                    .map(|(k, v)| (k.clone(), Node::read(v)))
                    .collect();
                match spread.is_none() && fields.iter().all(|(_, n)| matches!(n, Node::Const(_))) {
                    true => Node::Const(t.clone()),
                    false => Node::Object { spread, fields },
                }
            }
            other => Node::Const(other.clone()),
        }
    }

    /// The node filled in `scope`; `None` when it is an optional placeholder whose field is
    /// absent (its key, or its item of a list, is left out).
    fn fill(&self, scope: Scope<'_>) -> Result<Option<Value>, String> {
        Ok(Some(match self {
            Node::Const(v) => v.clone(),
            Node::Whole(p) => return p.value(scope),
            Node::Text(parts) => {
                let mut out = String::new();
                for part in parts {
                    match part {
                        Part::Text(t) => out.push_str(t),
                        Part::Slot(p) => {
                            out.push_str(&text(&p.value(scope)?.unwrap_or(Value::Null)))
                        }
                    }
                }
                Value::String(out)
            }
            Node::List(nodes) => Value::Array(
                nodes
                    .iter()
                    .filter_map(|n| n.fill(scope).transpose())
                    .collect::<Result<_, _>>()?,
            ),
            Node::Object { spread, fields } => {
                // `"...": "{{payload}}"` spreads an object's fields into this one; the
                // template's own fields win.
                let mut out = serde_json::Map::new();
                match spread
                    .as_ref()
                    .map(|s| s.fill(scope))
                    .transpose()?
                    .flatten()
                {
                    None => {}
                    Some(Value::Object(spread)) => out.extend(spread),
                    Some(other) => {
                        return Err(format!(
                            "\"...\" spreads an object, and this record gives {other}"
                        ));
                    }
                }
                for (k, n) in fields {
                    if let Some(v) = n.fill(scope)? {
                        out.insert(k.clone(), v);
                    }
                }
                Value::Object(out)
            }
        }))
    }
}

impl Template {
    /// `raw` read once.
    pub fn new(raw: Value) -> Self {
        let node = Node::read(&raw);
        Template { raw, node }
    }

    /// The template as stated.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// Checks its placeholders against where it stands ([`check`]); returns how many
    /// `{{records}}` it holds.
    pub(super) fn check(&self, what: &str, place: Place) -> Result<usize, String> {
        check(&self.raw, what, place)
    }

    /// The template filled in `scope`.
    pub(super) fn fill(&self, scope: Scope<'_>) -> Result<Value, String> {
        Ok(self.node.fill(scope)?.unwrap_or(Value::Null))
    }

    /// A body template (holding `{{records}}` and constants only) with its records filled.
    pub(super) fn fill_records(&self, items: &Value) -> Value {
        let scope = Scope::Call {
            records: items,
            group: None,
        };
        self.fill(scope).unwrap_or(Value::Null)
    }
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Template::new)
    }
}

/// The key of a template object whose value's fields are spread into it.
const SPREAD: &str = "...";

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
