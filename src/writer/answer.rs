//! How a batch answer names each record's fate (a rule's `answer`), and reading an answer
//! by it.
//!
//! Targets answer a call of many records in three ways: **positionally** (an array with
//! one item per record, in the call's order: Salesforce's `[{"success": false, ...}]`),
//! **by key** (lists of results and errors whose items name their record by a field:
//! HubSpot's `objectWriteTraceId`, Mailchimp's e-mail), or **by index** (a list of errors
//! naming the failed records' positions; the rest went through: Braze, Customer.io).
//! Places in the answer are JSON pointers (RFC 6901: `/errors`, `/context/id`; empty: the
//! body itself).
//!
//! One rule decides every record: it is **delivered** when the answer says it went through,
//! or names no failure at all (and is not a 207); it **failed** as the answer says when the
//! answer names its failure; and when the answer names failures courier cannot match to
//! records (an index out of range, a key no record has, a 207 whose results list leaves it out),
//! every record it does not account for is recorded **failed, unaccounted for**: retried
//! with backoff like a 5xx, never read as delivered, since a failure the target reported
//! must not vanish. Re-sending is what a batch upsert is made for; a record that did go
//! through is then delivered again, which the ledger shows.

use crate::invalid::Invalid;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::endpoint::snippet;
use super::wire::{Body, Outgoing, WriteError};

/// The longest error text kept from an answer item.
const MESSAGE_LIMIT: usize = 300;

/// How a rule's batch answers name each record's fate.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AnswerMap {
    /// An array at `items`, one item per record in the call's order.
    Positional {
        /// Where the array is (empty: the body is the array).
        #[serde(default)]
        items: String,
        /// What an item that went through looks like.
        success: Success,
        /// Where an item's error text is (absent: the whole item is quoted).
        #[serde(default)]
        message: Option<String>,
    },
    /// Lists of results and of errors whose items name their record.
    Keyed {
        /// Where the list of records that went through is (absent: the target lists
        /// only failures, and a record no error names went through).
        #[serde(default)]
        results: Option<String>,
        /// Where the list of failures is.
        errors: String,
        /// Where an item of either list names its record (a string, a number, or an array
        /// of them).
        key: String,
        /// What of the record that name matches.
        record: RecordKey,
        /// Where an error item's text is (absent: the whole item is quoted).
        #[serde(default)]
        message: Option<String>,
        /// The HTTP status an error item stands for when it carries none (absent: 422, a
        /// refusal of its content): User.com's `not_found` ids are 404s.
        #[serde(default)]
        status: Option<u16>,
    },
    /// A list of errors naming the failed records' positions (from 0); the rest went
    /// through.
    Indexed {
        /// Where the list of errors is.
        errors: String,
        /// Where an error item's position is.
        index: String,
        /// Where an error item's text is (absent: the whole item is quoted).
        #[serde(default)]
        message: Option<String>,
    },
    /// A 2xx takes every record of the call and says nothing of any one's fate, now or
    /// later (a job with nothing to poll): each ends `unconfirmed`, never `delivered`.
    Unreported {},
}

/// What an answer item that went through looks like.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Success {
    /// The field at `field` equals `value` (Salesforce: `/success` is `true`).
    Equals {
        /// Where the field is.
        field: String,
        /// The value that means success.
        value: Value,
    },
    /// The field at `field` is an HTTP status below 400, or absent.
    Status {
        /// Where the status is.
        field: String,
    },
    /// The field at `field` is absent, null or an empty array or object (`/errors`).
    Empty {
        /// Where the field is.
        field: String,
    },
}

/// What of a record an answer item's key matches.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RecordKey {
    /// The delivery's id (sent, e.g., as HubSpot's `objectWriteTraceId`).
    DeliveryId,
    /// The payload's field at this pointer (`/email`).
    Payload(String),
}

/// An error answer that refuses some records of a call rather than the request itself
/// (Brevo's `404 {"code": "document_not_found", "message": "No contact found for indexes
/// 3,4"}` to a batch update naming contacts it does not know): the call is split in halves
/// like any call refused for its content, until each such record is refused alone and
/// rejected with the target's message, the others delivered.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// The answer's status.
    pub status: u16,
    /// Text its body holds.
    pub body_contains: String,
}

impl Refusal {
    /// Whether `e`, a call's whole answer, is this refusal.
    pub fn matches(&self, e: &WriteError) -> bool {
        matches!(e, WriteError::Permanent { status: Some(s), message }
            if *s == self.status && message.contains(&self.body_contains))
    }
}

/// Reads a rule's `answer` (JSON): its map (a `kind` and the fields of that kind), and the
/// error answers that refuse records rather than the request (`refusals`), either alone.
pub fn parse_rule(value: &Value) -> Result<(Option<AnswerMap>, Vec<Refusal>), Invalid> {
    parse_rule_or_why(value).map_err(Invalid::at("answer"))
}

fn parse_rule_or_why(value: &Value) -> Result<(Option<AnswerMap>, Vec<Refusal>), String> {
    let mut fields = value.as_object().cloned().unwrap_or_default();
    let refusals = match fields.remove("refusals") {
        None => Vec::new(),
        Some(r) => serde_json::from_value::<Vec<Refusal>>(r).map_err(|e| {
            format!("answer: refusals: {e} (each {{\"status\", \"body_contains\"}})")
        })?,
    };
    if refusals.iter().any(|r| r.body_contains.is_empty()) {
        return Err("answer: refusals: body_contains is empty, which every answer holds".into());
    }
    let map = match fields.is_empty() && !refusals.is_empty() {
        true => None,
        false => Some(AnswerMap::parse_or_why(&Value::Object(fields))?),
    };
    Ok((map, refusals))
}

impl AnswerMap {
    /// Reads a rule's `answer` (JSON), checking every pointer; the error names what is
    /// wrong.
    pub fn parse(value: &Value) -> Result<Self, Invalid> {
        Self::parse_or_why(value).map_err(Invalid::at("answer"))
    }

    fn parse_or_why(value: &Value) -> Result<Self, String> {
        let map: AnswerMap = serde_json::from_value(value.clone()).map_err(|e| {
            format!(
                "answer: {e} (kinds: positional, keyed, indexed; see docs/enqueue-and-ledger.md)"
            )
        })?;
        for (name, pointer) in map.pointers() {
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(format!(
                    "answer: {name} {pointer:?} is not a JSON pointer (empty, or starting with /)"
                ));
            }
        }
        Ok(map)
    }

    /// Every pointer of the map, with the field that holds it.
    fn pointers(&self) -> Vec<(&'static str, &str)> {
        let (mut out, message) = match self {
            AnswerMap::Positional {
                items,
                success,
                message,
            } => {
                let (Success::Equals { field, .. }
                | Success::Status { field }
                | Success::Empty { field }) = success;
                (
                    vec![("items", items.as_str()), ("success field", field.as_str())],
                    message,
                )
            }
            AnswerMap::Keyed {
                results,
                errors,
                key,
                record,
                message,
                ..
            } => {
                let mut out = vec![("errors", errors.as_str()), ("key", key.as_str())];
                if let Some(r) = results {
                    out.push(("results", r.as_str()));
                }
                if let RecordKey::Payload(p) = record {
                    out.push(("record payload field", p.as_str()));
                }
                (out, message)
            }
            AnswerMap::Indexed {
                errors,
                index,
                message,
            } => (
                vec![("errors", errors.as_str()), ("index", index.as_str())],
                message,
            ),
            AnswerMap::Unreported {} => (Vec::new(), &None),
        };
        if let Some(m) = message {
            out.push(("message", m.as_str()));
        }
        out
    }

    /// Each record's fate from a 2xx answer `status` with `body` to a call that carried
    /// `records`: `None` delivered, else why not. A body the map cannot read whole (cut
    /// off, not JSON, a list where the map names one that is something else) leaves every
    /// record it does not account for unaccounted for.
    pub fn read(
        &self,
        status: u16,
        body: &Body,
        records: &[Outgoing<'_>],
    ) -> Vec<Option<WriteError>> {
        let n = records.len();
        if matches!(self, AnswerMap::Unreported {}) {
            return vec![None; n];
        }
        let body = match body {
            Body::Unreadable(why) => return unaccounted(status, n, why),
            Body::Text(_) => return unaccounted(status, n, "a CSV answer, not JSON"),
            // No content names no failure, but a positional map needs an item per record.
            Body::Empty => match self {
                AnswerMap::Positional { .. } => {
                    return unaccounted(status, n, "an empty answer, not one item per record");
                }
                _ => return unnamed(status, n),
            },
            Body::Json(v) => v,
        };
        match self {
            AnswerMap::Positional {
                items,
                success,
                message,
            } => positional(status, body.pointer(items), n, success, message.as_deref()),
            AnswerMap::Keyed {
                results,
                errors,
                key,
                record,
                message,
                status: named,
            } => {
                let keys: Vec<Option<String>> = records
                    .iter()
                    .map(|r| match record {
                        RecordKey::DeliveryId => Some(r.delivery_id.to_string()),
                        RecordKey::Payload(p) => names(r.payload.pointer(p)).into_iter().next(),
                    })
                    .collect();
                let errors = match list(body, errors, "errors") {
                    Ok(e) => e,
                    Err(why) => return unaccounted(status, n, &why),
                };
                let results = results.as_deref().map(|r| list(body, r, "results"));
                let item = Item {
                    key,
                    message: message.as_deref(),
                    status: *named,
                };
                keyed(status, (errors, results), item, &keys)
            }
            AnswerMap::Indexed {
                errors,
                index,
                message,
            } => match list(body, errors, "errors") {
                Ok(errors) => indexed(status, errors, index, n, message.as_deref()),
                Err(why) => unaccounted(status, n, &why),
            },
            AnswerMap::Unreported {} => vec![None; n],
        }
    }

    /// Whether a 2xx says nothing of its records' fate ([`AnswerMap::Unreported`]).
    pub fn unreported(map: Option<&AnswerMap>) -> bool {
        matches!(map, Some(AnswerMap::Unreported {}))
    }
}

/// A positional answer: the array `items` (if any), one item per record; an item that is
/// no object, or whose success field cannot be read, accounts for nobody.
fn positional(
    status: u16,
    items: Option<&Value>,
    n: usize,
    success: &Success,
    message: Option<&str>,
) -> Vec<Option<WriteError>> {
    match items.and_then(Value::as_array) {
        Some(items) if items.len() == n => items
            .iter()
            .map(|item| match success.holds(item) {
                Some(true) => None,
                Some(false) => Some(item_failure(item, success, message)),
                None => Some(unaccounted_error(
                    status,
                    "an answer item whose success field cannot be read",
                )),
            })
            .collect(),
        Some(items) => unaccounted(
            status,
            n,
            &format!("{} answer items for {n} records", items.len()),
        ),
        None => unaccounted(
            status,
            n,
            &format!("the answer has no list of items ({})", kind(items)),
        ),
    }
}

/// A keyed answer: its errors and results (if listed) name records by `key`, matched to
/// each record's own (`keys`).
fn keyed(
    status: u16,
    (errors, results): (&[Value], Option<Result<&[Value], String>>),
    item: Item<'_>,
    keys: &[Option<String>],
) -> Vec<Option<WriteError>> {
    let named = |i: &Value| names(i.pointer(item.key));
    // A results list that cannot be read: the errors still count, nobody else is known.
    let (results, unreadable) = match results {
        Some(Ok(r)) => (Some(r), None),
        Some(Err(why)) => (None, Some(why)),
        None => (None, None),
    };
    let mut fates: Vec<Fate> = vec![Fate::Unnamed; keys.len()];
    let mut stray = 0;
    for e in errors {
        let hit: Vec<usize> = named(e).iter().flat_map(|k| positions(keys, k)).collect();
        if hit.is_empty() {
            stray += 1;
        }
        for i in hit {
            fates[i] = Fate::Failed(keyed_failure(e, item.message, item.status));
        }
    }
    for r in results.into_iter().flatten() {
        for i in named(r).iter().flat_map(|k| positions(keys, k)) {
            if matches!(fates[i], Fate::Unnamed) {
                fates[i] = Fate::Through;
            }
        }
    }
    let why = (stray > 0)
        .then(|| format!("{stray} errors name no record of the call"))
        .or(unreadable);
    settle(status, fates, why, results.is_some())
}

/// An indexed answer: its errors name the failed records' positions at `index`.
fn indexed(
    status: u16,
    errors: &[Value],
    index: &str,
    n: usize,
    message: Option<&str>,
) -> Vec<Option<WriteError>> {
    let mut fates: Vec<Fate> = vec![Fate::Unnamed; n];
    let mut stray = 0;
    for e in errors {
        match e.pointer(index).and_then(Value::as_u64) {
            Some(i) if (i as usize) < n => {
                fates[i as usize] = Fate::Failed(keyed_failure(e, message, None));
            }
            _ => stray += 1,
        }
    }
    let why = (stray > 0).then(|| format!("{stray} errors name no position of the call"));
    settle(status, fates, why, false)
}

impl Success {
    /// Whether `item` went through; `None` when the item cannot say (it is no object, or
    /// its status field is no number).
    fn holds(&self, item: &Value) -> Option<bool> {
        if !item.is_object() {
            return None;
        }
        Some(match self {
            Success::Equals { field, value } => item.pointer(field) == Some(value),
            Success::Status { field } => match item.pointer(field) {
                None | Some(Value::Null) => true,
                Some(s) => s.as_u64()? < 400,
            },
            Success::Empty { field } => match item.pointer(field) {
                None | Some(Value::Null) => true,
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(o)) => o.is_empty(),
                Some(_) => false,
            },
        })
    }
}

/// One record's fate while a keyed or indexed answer is read.
#[derive(Clone, Debug)]
enum Fate {
    /// Named by no item.
    Unnamed,
    /// Listed among the results.
    Through,
    /// Named by an error.
    Failed(WriteError),
}

/// The fates of a keyed or indexed answer: a record no item names went through, unless
/// the answer named failures it cannot place (`why`), or is a 207 whose results list
/// (`listed`) leaves it out; then it is unaccounted for.
fn settle(
    status: u16,
    fates: Vec<Fate>,
    why: Option<String>,
    listed: bool,
) -> Vec<Option<WriteError>> {
    let doubtful = why.is_some() || (status == 207 && listed);
    let why = why.unwrap_or_else(|| "a 207 answer that names no outcome for it".into());
    fates
        .into_iter()
        .map(|f| match f {
            Fate::Through => None,
            Fate::Failed(e) => Some(e),
            Fate::Unnamed if doubtful => Some(unaccounted_error(status, &why)),
            Fate::Unnamed => None,
        })
        .collect()
}

/// An answer that names no record: delivered, unless it is a 207 (a multi-status answer
/// whose statuses courier could not find).
pub fn unnamed(status: u16, n: usize) -> Vec<Option<WriteError>> {
    match status {
        207 => unaccounted(
            status,
            n,
            "a 207 answer without the per-record answers expected",
        ),
        _ => vec![None; n],
    }
}

/// Every record of a call unaccounted for, and why.
pub fn unaccounted(status: u16, n: usize, why: &str) -> Vec<Option<WriteError>> {
    vec![Some(unaccounted_error(status, why)); n]
}

/// A record the answer does not account for: transient, so it is sent again.
fn unaccounted_error(status: u16, why: &str) -> WriteError {
    WriteError::Unaccounted {
        status,
        message: why.to_owned(),
    }
}

/// The list `name` at `pointer` in `body`: absent or null in an object, none; anything
/// else that is not a list cannot be read.
fn list<'b>(body: &'b Value, pointer: &str, name: &str) -> Result<&'b [Value], String> {
    match body.pointer(pointer) {
        Some(Value::Array(a)) => Ok(a),
        Some(Value::Null) => Ok(&[]),
        None if body.is_object() => Ok(&[]),
        None => Err(format!(
            "the answer is {}, not an object with {name}",
            kind(Some(body))
        )),
        found => Err(format!(
            "{name} at {pointer:?} is {}, not a list",
            kind(found)
        )),
    }
}

/// What a JSON value is, in words.
fn kind(v: Option<&Value>) -> &'static str {
    match v {
        None => "absent",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "a list",
        Some(Value::Object(_)) => "an object",
    }
}

/// The names a key field holds: a string, a number, or an array of them.
fn names(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Number(n)) => vec![n.to_string()],
        Some(Value::Array(a)) => a.iter().flat_map(|v| names(Some(v))).collect(),
        _ => Vec::new(),
    }
}

fn positions<'k>(keys: &'k [Option<String>], k: &'k str) -> impl Iterator<Item = usize> + 'k {
    keys.iter()
        .enumerate()
        .filter(move |(_, key)| key.as_deref() == Some(k))
        .map(|(i, _)| i)
}

/// A failed positional item: its status (when the success test reads one) decides
/// whether a retry may help; else it is the record's content.
fn item_failure(item: &Value, success: &Success, message: Option<&str>) -> WriteError {
    let status = match success {
        Success::Status { field } => item
            .pointer(field)
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok()),
        _ => None,
    };
    failure(status, text(item, message))
}

/// How a keyed answer's items are read: where an item names its record, where its text
/// is, and the status an error item stands for when it carries none.
#[derive(Clone, Copy, Debug)]
struct Item<'a> {
    key: &'a str,
    message: Option<&'a str>,
    status: Option<u16>,
}

/// A failure an error item names: by content (422, or the map's `status`) unless it
/// carries a status field saying otherwise.
fn keyed_failure(item: &Value, message: Option<&str>, named: Option<u16>) -> WriteError {
    let status = ["/status", "/statusCode", "/code"]
        .iter()
        .find_map(|p| item.pointer(p).and_then(Value::as_u64))
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (400..600).contains(s))
        .or(named);
    failure(status, text(item, message))
}

fn failure(status: Option<u16>, message: String) -> WriteError {
    let status = status.filter(|s| *s >= 400).unwrap_or(422);
    if status >= 500 || matches!(status, 408 | 429) {
        WriteError::Transient {
            status: Some(status),
            message,
        }
    } else {
        WriteError::Permanent {
            status: Some(status),
            message,
        }
    }
}

/// An item's error text: at `message`, else the item itself.
fn text(item: &Value, message: Option<&str>) -> String {
    let raw = match message.and_then(|m| item.pointer(m)) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => item.to_string(),
    };
    let mut s: String = raw.chars().take(MESSAGE_LIMIT).collect();
    if raw.chars().count() > MESSAGE_LIMIT {
        s.push('…');
    }
    s
}

/// What one item of a per-item answer says of its record: its `status` is an HTTP status
/// (absent: 200), and an `error` field makes it a failure classified like that status (a
/// 2xx with an error counts as 422). 5xx, 408 and 429 are transient, other 4xx
/// permanent; anything else delivered.
pub fn item_outcome(answer_status: u16, item: &serde_json::Value) -> Option<WriteError> {
    if !item.is_object() {
        return unaccounted(answer_status, 1, "an answer item that is no object")
            .pop()
            .flatten();
    }
    let status = item
        .get("status")
        .and_then(serde_json::Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    let error = item.get("error").filter(|e| !e.is_null());
    let status = match (status, error) {
        (Some(s), None) if (200..400).contains(&s) => return None,
        (None, None) => return None,
        (Some(s), Some(_)) if (200..400).contains(&s) => 422,
        (None, Some(_)) => 422,
        (Some(s), _) => s,
    };
    let message = match error {
        Some(serde_json::Value::String(e)) => snippet(e),
        Some(e) => snippet(&e.to_string()),
        None => format!("the target answered {status} for this record"),
    };
    let status = Some(status);
    if status >= Some(500) || matches!(status, Some(408 | 429)) {
        Some(WriteError::Transient { status, message })
    } else {
        Some(WriteError::Permanent { status, message })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn records(payloads: &[Value]) -> Vec<Outgoing<'_>> {
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Outgoing {
                delivery_id: 10 + i as i64,
                record_key: "k",
                path: "p",
                payload: p,
            })
            .collect()
    }

    fn fates(v: &[Option<WriteError>]) -> Vec<&'static str> {
        v.iter()
            .map(|e| match e {
                None => "delivered",
                Some(WriteError::Permanent { .. }) => "rejected",
                Some(WriteError::Unaccounted { .. }) => "unaccounted",
                Some(_) => "failed",
            })
            .collect()
    }

    #[test]
    fn positional_success_false_fails_that_record() {
        let map = AnswerMap::parse(&json!({
            "kind": "positional",
            "success": {"equals": {"field": "/success", "value": true}},
            "message": "/errors/0/message"
        }))
        .unwrap();
        let p = [json!({}), json!({}), json!({})];
        let body = json!([
            {"id": "a", "success": true, "errors": []},
            {"success": false, "errors": [{"statusCode": "INVALID_EMAIL_ADDRESS", "message": "bad email"}]},
            {"id": "c", "success": true, "errors": []}
        ]);
        let out = map.read(200, &Body::Json(body.clone()), &records(&p));
        assert_eq!(fates(&out), ["delivered", "rejected", "delivered"]);
        assert!(
            matches!(&out[1], Some(WriteError::Permanent { message, .. }) if message == "bad email")
        );
        // An array of the wrong length accounts for nobody.
        let short = json!([{"success": true}]);
        assert_eq!(
            fates(&map.read(200, &Body::Json(short.clone()), &records(&p))),
            ["unaccounted"; 3]
        );
    }

    #[test]
    fn keyed_errors_and_results_name_their_records() {
        let map = AnswerMap::parse(&json!({
            "kind": "keyed", "results": "/results", "errors": "/errors",
            "key": "/objectWriteTraceId", "record": "delivery_id", "message": "/message"
        }))
        .unwrap();
        let p = [json!({}), json!({}), json!({})];
        let body = json!({
            "status": "COMPLETE",
            "results": [{"objectWriteTraceId": "10"}, {"objectWriteTraceId": "12"}],
            "errors": [{"status": "error", "message": "Property values were not valid", "objectWriteTraceId": "11"}]
        });
        let out = map.read(207, &Body::Json(body.clone()), &records(&p));
        assert_eq!(fates(&out), ["delivered", "rejected", "delivered"]);
        // A 207 that leaves a record out of both lists does not deliver it.
        let partial = json!({"results": [{"objectWriteTraceId": "10"}], "errors": []});
        assert_eq!(
            fates(&map.read(207, &Body::Json(partial.clone()), &records(&p))),
            ["delivered", "unaccounted", "unaccounted"]
        );
        // An error naming no record of the call: nobody unlisted can be called delivered.
        let stray = json!({"results": [{"objectWriteTraceId": "10"}], "errors": [{"objectWriteTraceId": "99"}]});
        assert_eq!(
            fates(&map.read(200, &Body::Json(stray.clone()), &records(&p))),
            ["delivered", "unaccounted", "unaccounted"]
        );
    }

    #[test]
    fn keyed_by_a_payload_field_with_errors_only() {
        let map = AnswerMap::parse(&json!({
            "kind": "keyed", "errors": "/errors", "key": "/email_address",
            "record": {"payload": "/email_address"}, "message": "/error"
        }))
        .unwrap();
        let p = [
            json!({"email_address": "a@x.io"}),
            json!({"email_address": "b@x.io"}),
        ];
        let body = json!({"new_members": [], "errors": [{"email_address": "b@x.io", "error": "looks fake"}]});
        assert_eq!(
            fates(&map.read(200, &Body::Json(body.clone()), &records(&p))),
            ["delivered", "rejected"]
        );
    }

    #[test]
    fn indexed_errors_fail_their_positions_and_a_stray_index_delivers_nobody_else() {
        let map = AnswerMap::parse(&json!({
            "kind": "indexed", "errors": "/errors", "index": "/index", "message": "/type"
        }))
        .unwrap();
        let p = [json!({}), json!({}), json!({})];
        let body = json!({"message": "success", "errors": [{"type": "bad attribute", "input_array": "attributes", "index": 2}]});
        assert_eq!(
            fates(&map.read(201, &Body::Json(body.clone()), &records(&p))),
            ["delivered", "delivered", "rejected"]
        );
        // A 207 naming positions says the rest went through, as Customer.io's does.
        assert_eq!(
            fates(&map.read(207, &Body::Json(body.clone()), &records(&p))),
            ["delivered", "delivered", "rejected"]
        );
        let stray = json!({"errors": [{"index": 7}, {"index": 0, "status": 503}]});
        assert_eq!(
            fates(&map.read(201, &Body::Json(stray.clone()), &records(&p))),
            ["failed", "unaccounted", "unaccounted"]
        );
    }

    #[test]
    fn an_answer_without_a_body_delivers_unless_it_is_a_207() {
        let map =
            AnswerMap::parse(&json!({"kind": "indexed", "errors": "/errors", "index": "/index"}))
                .unwrap();
        let p = [json!({}), json!({})];
        assert_eq!(
            fates(&map.read(204, &Body::Empty, &records(&p))),
            ["delivered"; 2]
        );
        assert_eq!(
            fates(&map.read(207, &Body::Empty, &records(&p))),
            ["unaccounted"; 2]
        );
    }

    #[test]
    fn a_map_that_cannot_be_read_is_refused_naming_what_is_wrong() {
        let e = AnswerMap::parse(&json!({"kind": "keyed", "errors": "/errors"})).unwrap_err();
        assert!(e.reason.contains("missing field `key`"), "{e}");
        let e = AnswerMap::parse(&json!({"kind": "indexed", "errors": "errors", "index": "/i"}))
            .unwrap_err();
        assert!(
            e.reason.contains("errors \"errors\" is not a JSON pointer"),
            "{e}"
        );
        let e = AnswerMap::parse(
            &json!({"kind": "indexed", "errors": "/e", "index": "/i", "colour": 1}),
        )
        .unwrap_err();
        assert!(e.reason.contains("unknown field `colour`"), "{e}");
        let e = AnswerMap::parse(&json!({"kind": "sorted"})).unwrap_err();
        assert!(e.reason.contains("unknown variant `sorted`"), "{e}");
    }

    #[test]
    fn an_answer_a_map_cannot_read_whole_delivers_nobody() {
        let p = [json!({}), json!({})];
        let positional = AnswerMap::parse(&json!({
            "kind": "positional", "success": {"equals": {"field": "/success", "value": true}}
        }))
        .unwrap();
        let keyed = AnswerMap::parse(&json!({
            "kind": "keyed", "results": "/results", "errors": "/errors",
            "key": "/id", "record": "delivery_id"
        }))
        .unwrap();
        let indexed =
            AnswerMap::parse(&json!({"kind": "indexed", "errors": "/errors", "index": "/index"}))
                .unwrap();
        let cut = Body::Unreadable("cut off".into());
        for map in [&positional, &keyed, &indexed] {
            assert_eq!(
                fates(&map.read(200, &cut, &records(&p))),
                ["unaccounted"; 2]
            );
            // An HTML page, a string, a number where an object or a list belongs.
            for wrong in [json!("<html>ok</html>"), json!(42)] {
                assert_eq!(
                    fates(&map.read(200, &Body::Json(wrong.clone()), &records(&p))),
                    ["unaccounted"; 2],
                    "{map:?} {wrong}"
                );
            }
        }
        // Wrong-typed parts: an object for the positional array, a string for errors.
        let object = Body::Json(json!({"success": false}));
        assert_eq!(
            fates(&positional.read(200, &object, &records(&p))),
            ["unaccounted"; 2]
        );
        let stringly = Body::Json(json!({"errors": "record 10 failed"}));
        assert_eq!(
            fates(&keyed.read(200, &stringly, &records(&p))),
            ["unaccounted"; 2]
        );
        assert_eq!(
            fates(&indexed.read(200, &stringly, &records(&p))),
            ["unaccounted"; 2]
        );
        // Items that are no objects say nothing of their records.
        let items = Body::Json(json!(["ok", {"success": true}]));
        assert_eq!(
            fates(&positional.read(200, &items, &records(&p))),
            ["unaccounted", "delivered"]
        );
        // What can be read still counts: a named error stands beside unreadable results.
        let half = Body::Json(json!({"results": "all", "errors": [{"id": "10"}]}));
        assert_eq!(
            fates(&keyed.read(200, &half, &records(&p))),
            ["rejected", "unaccounted"]
        );
        // An empty body names no failure, but a positional map needs its items.
        assert_eq!(
            fates(&keyed.read(200, &Body::Empty, &records(&p))),
            ["delivered"; 2]
        );
        assert_eq!(
            fates(&positional.read(200, &Body::Empty, &records(&p))),
            ["unaccounted"; 2]
        );
    }

    #[test]
    fn an_unreported_answer_names_no_fate_whatever_its_body() {
        let map = AnswerMap::parse(&json!({"kind": "unreported"})).unwrap();
        assert!(AnswerMap::unreported(Some(&map)));
        let payload = json!({});
        let one = Outgoing {
            delivery_id: 1,
            record_key: "k",
            path: "p",
            payload: &payload,
        };
        for body in [
            Body::Empty,
            Body::Unreadable("cut off".into()),
            Body::Json(json!({"errors": [1]})),
        ] {
            assert_eq!(map.read(202, &body, &[one, one]), [None, None], "{body:?}");
        }
        assert!(AnswerMap::parse(&json!({"kind": "unreported", "errors": "/e"})).is_err());
    }

    #[test]
    fn per_item_answers_read_status_and_error() {
        use serde_json::json;
        let status = |item| {
            item_outcome(200, &item)
                .map(|e| (e.http_status(), matches!(e, WriteError::Transient { .. })))
        };
        assert_eq!(status(json!({"status": 200})), None);
        assert_eq!(status(json!({})), None);
        assert_eq!(status(json!({"status": 201, "error": null})), None);
        assert_eq!(status(json!({"status": 400})), Some((Some(400), false)));
        assert_eq!(
            status(json!({"status": 200, "error": "bad"})),
            Some((Some(422), false))
        );
        assert_eq!(
            status(json!({"error": {"field": "x"}})),
            Some((Some(422), false))
        );
        assert_eq!(
            status(json!({"status": 503, "error": "later"})),
            Some((Some(503), true))
        );
        assert_eq!(status(json!({"status": 429})), Some((Some(429), true)));
        assert!(matches!(
            item_outcome(200, &json!("ok")),
            Some(WriteError::Unaccounted { .. })
        ));
        let e = item_outcome(200, &json!({"status": 409, "error": "duplicate sku"})).unwrap();
        assert!(e.to_string().contains("duplicate sku"), "{e}");
    }
}
