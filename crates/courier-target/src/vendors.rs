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

use std::collections::{BTreeMap, BTreeSet};

use crate::emulation::{Accepts, Answer, Contacts, Endpoint, Forgotten, Unknown, emulations};

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
fn batch_items(body: &Value) -> Option<&[Value]> {
    match body {
        Value::Array(items) => Some(items),
        Value::Object(m) => m.values().find_map(batch_items),
        _ => None,
    }
}

/// The records of a call to `endpoint`: at its `records` pointer (a list, or one record),
/// else the body's first list.
fn call_items<'b>(endpoint: &Endpoint, body: &'b Value) -> Option<&'b [Value]> {
    match &endpoint.records {
        None => batch_items(body),
        Some(p) => match body.pointer(p)? {
            Value::Array(items) => Some(items),
            one @ Value::Object(_) => Some(std::slice::from_ref(one)),
            _ => None,
        },
    }
}

/// The people the target keeps, by store (one per vendor), each by key (lower case): the
/// last record written for them and the id the target gave them; and those a vendor erased
/// for good.
#[derive(Clone, Debug, Default)]
pub struct ContactBook {
    /// Each store's people by key.
    people: BTreeMap<String, BTreeMap<String, (u64, Value)>>,
    /// The last id each store gave, so that an id is never given twice (an erased
    /// person's id is not someone else's later).
    last_id: BTreeMap<String, u64>,
    /// Each store's people erased for good, by key: an endpoint that refuses them again
    /// ([`Contacts::forgotten`]) reads it.
    forgotten: BTreeMap<String, BTreeSet<String>>,
}

impl ContactBook {
    /// The id of the person `key` names in `store`, if the target has them.
    fn id(&self, store: &str, key: &str) -> Option<u64> {
        self.people
            .get(store)?
            .get(&key.to_lowercase())
            .map(|(id, _)| *id)
    }

    /// Keeps `item` for the person `key` names in `store`, under their id.
    pub fn put(&mut self, store: &str, key: &str, item: Value) {
        let next = self.next_id(store);
        let people = self.people.entry(store.to_owned()).or_default();
        let id = people.get(&key.to_lowercase()).map_or(next, |(id, _)| *id);
        if id == next {
            self.last_id.insert(store.to_owned(), next);
        }
        people.insert(key.to_lowercase(), (id, item));
    }

    /// The id the next person new to `store` gets.
    fn next_id(&self, store: &str) -> u64 {
        self.last_id.get(store).copied().unwrap_or(0) + 1
    }

    /// The people of `store`: each key (lower case) and the last record written for them.
    pub fn people(&self, store: &str) -> BTreeMap<String, Value> {
        self.people
            .get(store)
            .map(|p| p.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// The people of `store`, each as its key (lower case), id and record.
    pub(crate) fn entries(&self, store: &str) -> impl Iterator<Item = (&str, u64, &Value)> {
        self.people
            .get(store)
            .into_iter()
            .flatten()
            .map(|(k, (id, v))| (k.as_str(), *id, v))
    }

    /// Removes the person of `key` (lower case) from `store`, remembering them as erased
    /// for good when `forget`.
    pub(crate) fn remove(&mut self, store: &str, key: &str, forget: bool) {
        if let Some(people) = self.people.get_mut(store) {
            people.remove(key);
        }
        if forget {
            let forgotten = self.forgotten.entry(store.to_owned()).or_default();
            forgotten.insert(key.to_owned());
        }
    }

    /// Whether the vendor erased the person `key` names from `store` for good.
    pub fn is_forgotten(&self, store: &str, key: &str) -> bool {
        self.forgotten
            .get(store)
            .is_some_and(|f| f.contains(&key.to_lowercase()))
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
    /// The people it wrote: store, key and record.
    pub stored: Vec<(String, String, Value)>,
}

impl BatchReply {
    /// A reply accepting nothing.
    fn refusal(status: u16, body: Value) -> Self {
        BatchReply {
            status,
            body,
            accepted: Vec::new(),
            stored: Vec::new(),
        }
    }
}

/// The batch sink's answer to a call on `path`, or `None` when no emulation serves it;
/// `book` holds the people the target knows.
pub fn batch_sink(
    path: &str,
    body: &Value,
    headers: &HeaderMap,
    book: &ContactBook,
) -> Option<BatchReply> {
    let endpoint = endpoint(path)?;
    let Some(items) = call_items(endpoint, body) else {
        return Some(BatchReply::refusal(
            400,
            serde_json::json!({"detail": "expected a JSON array of records, or an object with one array field"}),
        ));
    };
    if let Some(refused) = malformed(endpoint, items) {
        return Some(refused);
    }
    let (keys, ids) = record_keys(headers, items.len(), "batch");
    let people = endpoint.contacts.as_ref();
    let person = |j: usize| {
        people
            .and_then(|c| items[j].pointer(&c.key))
            .and_then(Value::as_str)
    };
    let known: Vec<Option<u64>> = (0..items.len())
        .map(|j| {
            people
                .zip(person(j))
                .and_then(|(c, k)| book.id(&c.store, k))
        })
        .collect();
    let mut b = Batch::of(
        items,
        &items.iter().map(invalid).collect::<Vec<_>>(),
        Default::default(),
        None,
    );
    b.keys = keys;
    b.trace = traces(items, &ids);
    let forgotten: Vec<usize> = (0..items.len())
        .filter(|&j| {
            people.is_some_and(|c| {
                c.forgotten.is_some() && person(j).is_some_and(|k| book.is_forgotten(&c.store, k))
            })
        })
        .collect();
    if let Some(refused) = refuse_forgotten(people, &forgotten, &mut b) {
        return Some(refused);
    }
    if let Some(refused) = people.and_then(|c| refused_people(c, body, &b, &known)) {
        return Some(refused);
    }
    b.people = people_ids(book, people, &known);
    let answer = match (b.invalid.contains(&true), &endpoint.updated) {
        (true, _) => endpoint.partial.as_ref().unwrap_or(&endpoint.ok),
        (false, Some(updated)) if known.iter().all(Option::is_some) => updated,
        (false, _) => &endpoint.ok,
    };
    let accepts = |j: usize| match answer.accepts {
        Accepts::Valid => !b.invalid[j],
        Accepts::None => false,
        Accepts::All => true,
    };
    let stored = people.map_or_else(Vec::new, |c| {
        (0..items.len())
            .filter(|&j| accepts(j))
            .filter_map(|j| Some((c.store.clone(), person(j)?.to_owned(), items[j].clone())))
            .collect()
    });
    // An endpoint of one record (`records: ""`) fills its answer from that record.
    let one = (endpoint.records.as_deref() == Some("")).then_some(0);
    Some(BatchReply {
        status: answer.status,
        body: answer.body.as_ref().map_or(Value::Null, |t| b.fill(t, one)),
        accepted: (0..items.len())
            .filter(|&j| accepts(j))
            .map(|j| b.keys[j].clone())
            .collect(),
        stored,
    })
}

/// Each record's trace: its own objectWriteTraceId, else its delivery id, else its place.
fn traces(items: &[Value], ids: &[&str]) -> Vec<Value> {
    (0..items.len())
        .map(|j| {
            items[j]
                .get("objectWriteTraceId")
                .cloned()
                .or_else(|| ids.get(j).map(|id| Value::from(*id)))
                .unwrap_or_else(|| Value::from(j.to_string()))
        })
        .collect()
}

/// People the vendor erased for good among the call's records (`forgotten`, by place): the
/// call refused as the vendor refuses it, or each of their records refused.
fn refuse_forgotten(
    people: Option<&Contacts>,
    forgotten: &[usize],
    b: &mut Batch,
) -> Option<BatchReply> {
    match (people.and_then(|c| c.forgotten.as_ref()), forgotten.first()) {
        (Some(Forgotten::Call(a)), Some(&j)) => {
            let body = a.body.as_ref().map_or(Value::Null, |t| b.fill(t, Some(j)));
            Some(BatchReply::refusal(a.status, body))
        }
        (Some(Forgotten::Record), _) => {
            forgotten.iter().for_each(|&j| b.invalid[j] = true);
            None
        }
        _ => None,
    }
}

/// The endpoint's refusal of a call it takes for malformed: a record whose field the
/// endpoint wants strings only holds something else.
fn malformed(endpoint: &Endpoint, items: &[Value]) -> Option<BatchReply> {
    let field = endpoint.strings.as_ref()?;
    let j = items.iter().position(|i| !strings_only(i.pointer(field)))?;
    let message = format!("inputs[{j}]{field}: every value must be a string");
    Some(match &endpoint.bad_request {
        Some(a) => BatchReply::refusal(a.status, fill_message(a, &message)),
        None => BatchReply::refusal(400, serde_json::json!({"message": message})),
    })
}

/// Whether a field holds strings only (an object whose every value is one; absent: yes).
fn strings_only(v: Option<&Value>) -> bool {
    match v {
        None => true,
        Some(Value::Object(m)) => m.values().all(Value::is_string),
        Some(_) => false,
    }
}

/// An answer's body with `{{message}}` filled.
fn fill_message(a: &Answer, message: &str) -> Value {
    let mut vars = serde_json::Map::new();
    vars.insert("message".into(), message.into());
    let b = Batch::of(&[], &[], vars, None);
    a.body.as_ref().map_or(Value::Null, |t| b.fill(t, None))
}

/// The whole call refused for the people it names, if it is: a person the target does not
/// have at an endpoint that only updates, or one it has without the update flag.
fn refused_people(
    c: &Contacts,
    body: &Value,
    b: &Batch<'_>,
    known: &[Option<u64>],
) -> Option<BatchReply> {
    let unknown: Vec<String> = (0..known.len())
        .filter(|&j| !b.invalid[j] && known[j].is_none())
        .map(|j| j.to_string())
        .collect();
    if c.unknown == Unknown::Refuse && !unknown.is_empty() {
        let indexes = unknown.join(",");
        let Some(a) = &c.refused else {
            let detail = format!("no such contact at indexes {indexes}");
            return Some(BatchReply::refusal(
                404,
                serde_json::json!({"detail": detail}),
            ));
        };
        let mut vars = serde_json::Map::new();
        vars.insert("unknown_indexes".into(), indexes.into());
        let filled = Batch::of(b.items, &b.invalid, vars, None);
        return Some(BatchReply::refusal(
            a.status,
            a.body
                .as_ref()
                .map_or(Value::Null, |t| filled.fill(t, None)),
        ));
    }
    let flagged = c
        .update_flag
        .as_ref()
        .is_none_or(|f| body.pointer(f) == Some(&Value::Bool(true)));
    match (flagged, known.iter().any(Option::is_some), &c.duplicate) {
        (false, true, Some(a)) => Some(BatchReply::refusal(
            a.status,
            a.body.as_ref().map_or(Value::Null, |t| b.fill(t, None)),
        )),
        _ => None,
    }
}

/// Each record's person as `(id, new)`: the id the target has for them, or the one it
/// gives them now.
fn people_ids(book: &ContactBook, c: Option<&Contacts>, known: &[Option<u64>]) -> Vec<(u64, bool)> {
    let Some(c) = c else {
        return Vec::new();
    };
    let mut next = book.next_id(&c.store) - 1;
    known
        .iter()
        .map(|k| match k {
            Some(id) => (*id, false),
            None => {
                next += 1;
                (next, true)
            }
        })
        .collect()
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

/// Whether a record is marked invalid (`"invalid": true`, the key in any case, the value
/// true or its text, as a template's filters may leave it), on itself or one level down
/// (a template's `properties` or `attributes`).
pub(crate) fn invalid(record: &Value) -> bool {
    let marked = |v: &Value| {
        v.as_object().is_some_and(|o| {
            o.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("invalid")
                    && (v == &Value::Bool(true) || v.as_str() == Some("true"))
            })
        })
    };
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
    /// Each record's person, where the endpoint keeps people: their id, and whether the
    /// call creates them (`{{contact_id}}`, `{{new}}`, `$each: created | updated`).
    pub people: Vec<(u64, bool)>,
}

impl<'a> Batch<'a> {
    /// A call of `items` (`invalid` marking the refused) with placeholders `vars`.
    pub fn of(
        items: &'a [Value],
        invalid: &[bool],
        vars: serde_json::Map<String, Value>,
        refused_page: Option<(usize, usize)>,
    ) -> Self {
        Batch {
            items,
            keys: Vec::new(),
            invalid: invalid.to_vec(),
            trace: (0..items.len())
                .map(|j| Value::from(j.to_string()))
                .collect(),
            vars,
            refused_page,
            people: Vec::new(),
        }
    }
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
            Some(which @ ("created" | "updated")) => all
                .filter(|&i| !self.invalid[i])
                .filter(|&i| {
                    self.people
                        .get(i)
                        .is_some_and(|p| p.1 == (which == "created"))
                })
                .map(|i| self.fill(template("$as"), Some(i)))
                .collect(),
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
            ("contact_id", Some(j)) => self.people.get(j).map_or(Value::Null, |p| p.0.into()),
            ("new", Some(j)) => self.people.get(j).map_or(Value::Null, |p| p.1.into()),
            // A refused record creates and updates nobody.
            ("created_count", _) => self.people_counted(true).into(),
            ("updated_count", _) => self.people_counted(false).into(),
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
    /// How many accepted records create a person (`new`), or update one.
    fn people_counted(&self, new: bool) -> usize {
        let accepted = |i: &usize| !self.invalid.get(*i).copied().unwrap_or(false);
        (0..self.people.len())
            .filter(accepted)
            .filter(|&i| self.people[i].1 == new)
            .count()
    }

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
            let serves = !e.endpoints.is_empty() || !e.jobs.is_empty() || e.workspace.is_some();
            assert!(!e.about.is_empty() && serves, "{name}");
            let sources = e.endpoints.iter().map(|ep| &ep.source);
            let sources = sources.chain(e.jobs.iter().map(|j| &j.source));
            let sources = sources.chain(
                e.jobs
                    .iter()
                    .filter_map(|j| Some(&j.limits.as_ref()?.source)),
            );
            let sources = sources.chain(e.rate_headers.iter().map(|r| &r.source));
            let sources = sources.chain(e.workspace.iter().map(|w| &w.source));
            let sources = sources.chain(e.erase.iter().map(|c| &c.source));
            let erase_limits = e.erase.iter().filter_map(|c| c.limits.as_ref());
            let sources = sources.chain(erase_limits.map(|l| &l.source));
            let ops = e.workspace.iter().flat_map(|w| &w.operations);
            let sources = sources.chain(ops.map(|op| &op.source));
            for source in sources {
                assert!(
                    source.len() > 20,
                    "{name}: an endpoint or job names no source"
                );
            }
        }
    }

    #[test]
    fn an_update_only_endpoint_refuses_a_call_naming_someone_unknown() {
        let c = Contacts {
            store: "crm".into(),
            key: "/email".into(),
            unknown: Unknown::Refuse,
            refused: None,
            update_flag: None,
            duplicate: None,
            forgotten: None,
        };
        let items = [json!({"email": "known@x"}), json!({"email": "new@x"})];
        let b = Batch::of(&items, &[false, false], Default::default(), None);
        let reply = refused_people(&c, &json!({}), &b, &[Some(1), None]).unwrap();
        assert_eq!(reply.status, 404);
        assert_eq!(reply.body["detail"], "no such contact at indexes 1");
        assert!(reply.accepted.is_empty() && reply.stored.is_empty());
        assert!(refused_people(&c, &json!({}), &b, &[Some(1), Some(2)]).is_none());
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
            people: Vec::new(),
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
