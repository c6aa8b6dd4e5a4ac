//! Erasure, as each vendor does it: how is data, in the `erase` calls of a preset's
//! emulation file (`presets/<name>.target.json`, see [`EraseCall`]). A call names people
//! (by a path segment, a query parameter, possibly inside a statement, or a field of its
//! body, possibly a list; by the store's key, the id the target gave them, or a field of
//! the record kept for them, possibly hashed) and removes them from the store the
//! vendor's endpoints keep them in, or finds them there (a lookup of the vendor's own id,
//! deleted by a later call). The answer is the vendor's: one when it knew someone, one
//! when it knew nobody. A vendor that refuses to take an erased person again remembers
//! them ([`EraseCall::forget`]); its endpoints' `contacts.forgotten` say how they refuse.
//! A call with its own `limits` has limiters of its own, always in force.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use md5::{Digest, Md5};
use serde_json::Value;

use crate::{
    Limiter, Window,
    emulation::{EraseAction, EraseCall, Name, NameHash, emulations},
    limiter,
    operations::percent_decode,
    vendors::{Batch, ContactBook, path_matches},
};

/// The limiters of the erase calls that state limits, by the call's index, made as first
/// called.
#[derive(Default)]
pub(crate) struct EraseLimiters(HashMap<usize, Vec<Limiter>>);

/// A call as an erase call sees it.
pub struct EraseRequest<'a> {
    /// Its method.
    pub method: &'a str,
    /// Its path (still percent-encoded).
    pub path: &'a str,
    /// Its query string, if any.
    pub query: Option<&'a str>,
    /// Its body, when it is JSON.
    pub body: Option<&'a Value>,
}

/// What an erase call answers, or the wait its limits ask for.
#[derive(Clone, Debug, PartialEq)]
pub enum EraseReply {
    /// The vendor's answer: its status and body (null: none).
    Answer(u16, Value),
    /// A limit of the call's is spent: the wait before it admits one again.
    Throttled(Duration),
}

/// The erase calls of every emulation, in order.
fn calls() -> impl Iterator<Item = &'static EraseCall> {
    emulations().iter().flat_map(|(_, e)| &e.erase)
}

/// The erase call `r` is, if any: its index, and its path's `{name}` segment.
fn find(r: &EraseRequest<'_>) -> Option<(usize, &'static EraseCall, Option<String>)> {
    calls().enumerate().find_map(|(i, c)| {
        if c.method != r.method {
            return None;
        }
        let name = path_name(&c.path, r.path)?;
        let erasures = erasures(c, r.body);
        let held = c.when.iter().all(|(pointer, want)| {
            !erasures.is_empty() && erasures.iter().all(|e| e.pointer(pointer) == Some(want))
        });
        held.then_some((i, c, name))
    })
}

/// The path's `{name}` segment (percent-decoded; `Some(None)` for a path without one) if
/// `path` is `pattern`.
fn path_name(pattern: &str, path: &str) -> Option<Option<String>> {
    let segments: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let Some(at) = segments.iter().position(|s| *s == "{name}") else {
        return path_matches(pattern, path).then_some(None);
    };
    // `{name}` matches one segment; find which by matching with it as `*`, from the end
    // (patterns start with `**`).
    let star = pattern.replace("{name}", "*");
    if !path_matches(&star, path) {
        return None;
    }
    let from_end = segments.len() - at;
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let segment = parts.get(parts.len().checked_sub(from_end)?)?;
    Some(Some(percent_decode(segment)))
}

/// A call's erasures: the items at its `records` pointer, or its body as the one.
fn erasures<'b>(c: &EraseCall, body: Option<&'b Value>) -> Vec<&'b Value> {
    match (&c.records, body) {
        (Some(p), Some(b)) => b
            .pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        (None, Some(b)) => vec![b],
        (_, None) => Vec::new(),
    }
}

/// The answer to an erase call, or `None` when `r` is none: the people it names removed
/// from (or found in) `book`, past the call's own limits.
pub(crate) fn answer(
    book: &mut ContactBook,
    limiters: &mut EraseLimiters,
    r: &EraseRequest<'_>,
    now: Instant,
) -> Option<EraseReply> {
    let (i, c, segment) = find(r)?;
    if let Err(wait) = admitted(limiters, i, c, now) {
        return Some(EraseReply::Throttled(wait));
    }
    let names: Vec<(&Name, String)> = match erasures(c, r.body).as_slice() {
        [] => named(c, None, segment.as_deref(), r.query),
        many => many
            .iter()
            .flat_map(|e| named(c, Some(e), segment.as_deref(), r.query))
            .collect(),
    };
    let mut people: Vec<(String, u64, Value)> = Vec::new();
    for (key, id, record) in book.entries(&c.store) {
        if names
            .iter()
            .any(|(n, v)| names_person(n, v, (key, id, record)))
        {
            people.push((key.to_owned(), id, record.clone()));
        }
    }
    if c.action == EraseAction::Remove {
        for (key, _, _) in &people {
            book.remove(&c.store, key, c.forget);
        }
        // Erased for good though the target never had them (a vendor that blocks the
        // address all the same).
        if c.forget {
            for (n, v) in &names {
                if n.matches == "key" && n.hash.is_none() {
                    book.remove(&c.store, &v.to_lowercase(), true);
                }
            }
        }
    }
    let answer = match (people.is_empty(), &c.unknown) {
        (true, Some(unknown)) => unknown,
        _ => &c.ok,
    };
    let records: Vec<Value> = people.iter().map(|(_, _, r)| r.clone()).collect();
    let mut b = Batch::of(
        &records,
        &vec![false; records.len()],
        Default::default(),
        None,
    );
    b.people = people.iter().map(|(_, id, _)| (*id, false)).collect();
    let body = answer
        .body
        .as_ref()
        .map_or(Value::Null, |t| b.fill(t, None));
    Some(EraseReply::Answer(answer.status, body))
}

/// Whether erase call `i` may be called now under its limits; the wait when not.
fn admitted(
    limiters: &mut EraseLimiters,
    i: usize,
    c: &EraseCall,
    now: Instant,
) -> Result<(), Duration> {
    let Some(limits) = &c.limits else {
        return Ok(());
    };
    let limiters = limiters.0.entry(i).or_insert_with(|| {
        limits
            .each_call
            .iter()
            .filter_map(|l| limiter::parse_rate(l).ok())
            .map(|(n, period)| Limiter::new(n, period, Window::Fixed))
            .collect()
    });
    limiter::admit_all(limiters, now)
}

/// The names an erasure holds, by the first of the call's ways it holds one.
fn named<'c>(
    c: &'c EraseCall,
    erasure: Option<&Value>,
    segment: Option<&str>,
    query: Option<&str>,
) -> Vec<(&'c Name, String)> {
    for n in &c.names {
        let values: Vec<String> = match n.from.as_str() {
            "{name}" => segment.map(str::to_owned).into_iter().collect(),
            from if from.starts_with('?') => query_param(query, &from[1..]).into_iter().collect(),
            pointer => match erasure.and_then(|e| e.pointer(pointer)) {
                Some(Value::Array(a)) => a.iter().filter_map(text).collect(),
                Some(v) => text(v).into_iter().collect(),
                None => Vec::new(),
            },
        };
        let values: Vec<String> = values
            .iter()
            .filter_map(|v| within(n.pattern.as_deref(), v))
            .filter(|v| !v.is_empty())
            .collect();
        if !values.is_empty() {
            return values.into_iter().map(|v| (n, v)).collect();
        }
    }
    Vec::new()
}

/// A string or number as text.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The value of query parameter `name`, form-decoded (`+` a space).
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(&k.replace('+', " ")) == name).then(|| percent_decode(&v.replace('+', " ")))
    })
}

/// The name inside `value` where `pattern` (`{}` the name) says it stands; the whole value
/// without one. Literal parts are matched whatever their case and runs of spaces.
fn within(pattern: Option<&str>, value: &str) -> Option<String> {
    let Some(pattern) = pattern else {
        return Some(value.to_owned());
    };
    let (before, after) = pattern.split_once("{}")?;
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let value = squash(value);
    let (before, after) = (squash(before), squash(after));
    let lower = value.to_lowercase();
    let rest = lower.strip_prefix(&before.to_lowercase())?;
    let start = value.len() - rest.len();
    let end = value.len() - after.len();
    (rest.ends_with(&after.to_lowercase()) && end >= start).then(|| value[start..end].to_owned())
}

/// Whether `name` (held the way `n` says) names the kept person `(key, id, record)`.
fn names_person(n: &Name, name: &str, (key, id, record): (&str, u64, &Value)) -> bool {
    let kept = match n.matches.as_str() {
        "key" => Some(key.to_owned()),
        "id" => Some(
            n.id.as_deref()
                .unwrap_or("{{contact_id}}")
                .replace("{{contact_id}}", &id.to_string()),
        ),
        pointer => record.pointer(pointer).and_then(text),
    };
    let Some(kept) = kept else {
        return false;
    };
    let kept = match n.hash {
        Some(NameHash::Md5) => hex(&Md5::digest(kept.to_lowercase().as_bytes())),
        None => kept,
    };
    kept.eq_ignore_ascii_case(name)
}

/// Bytes in lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_read_from_a_segment_a_statement_or_a_hash() {
        assert_eq!(
            path_name("**/contacts/{name}", "/v3/contacts/a%40b.c"),
            Some(Some("a@b.c".into()))
        );
        assert_eq!(
            path_name(
                "**/members/{name}/actions/delete-permanent",
                "/3.0/lists/L/members/ab12/actions/delete-permanent"
            ),
            Some(Some("ab12".into()))
        );
        assert_eq!(path_name("**/contacts/{name}", "/v3/contacts"), None);
        let q = Some("q=SELECT+Id+FROM+Contact+WHERE+Email+%3D+%27a%40b.c%27");
        let statement = query_param(q, "q").unwrap();
        assert_eq!(
            within(
                Some("select id from Contact where Email = '{}'"),
                &statement
            ),
            Some("a@b.c".into())
        );
        assert_eq!(within(Some("WHERE Email = '{}'"), "nope"), None);
        let n = Name {
            from: "{name}".into(),
            pattern: None,
            matches: "key".into(),
            id: None,
            hash: Some(NameHash::Md5),
        };
        // Mailchimp's own example: md5 of the lower-cased address.
        let md5 = hex(&Md5::digest(b"urist.mcvankab@freddiesjokes.com"));
        assert!(names_person(
            &n,
            &md5,
            ("urist.mcvankab@freddiesjokes.com", 1, &Value::Null)
        ));
        assert!(!names_person(
            &n,
            &md5,
            ("someone@else.com", 1, &Value::Null)
        ));
    }
}
