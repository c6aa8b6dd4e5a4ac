//! The batch sink: what a vendor's batch endpoint answers a call of many records, by the
//! style its path names (`batch/<style>/`) or the vendor endpoint a preset calls
//! ([`BatchAnswers`]). Pure: a call's path, body and headers in, a [`BatchReply`] out; the
//! server counts what it accepted.

use axum::http::HeaderMap;

/// How the batch sink answers a call holding an invalid item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchAnswers {
    /// 200 with an array of one `{"status": ...}` per item (`"error"` for a refused one).
    PerItem,
    /// 400 for the whole call when any item is invalid; nothing of it is accepted.
    AllOrNothing,
    /// HubSpot's batch upsert: 200, or 207 when any item is invalid, with
    /// `{"results": [...], "errors": [...]}` whose items carry `objectWriteTraceId` (the
    /// item's own, else its delivery id from the call's `Idempotency-Key`).
    Keyed,
    /// Salesforce's sObject collections: 200 with one `{"id", "success", "errors"}` per
    /// item, in order.
    Positional,
    /// Braze's `/users/track`: 201 with `{"message": "success", "errors": [{"type",
    /// "input_array", "index"}]}` naming the invalid items' positions.
    Indexed,
    /// A 207 that names no record (`{"status": "partial"}`) when any item is invalid:
    /// an answer courier cannot map.
    Unmapped,
    /// Salesforce's spent daily allowance: 403 `REQUEST_LIMIT_EXCEEDED` to every call.
    LimitExceeded,
    /// An answer without a body: HubSpot's event batch (204), Klaviyo's bulk jobs (202).
    NoBody(u16),
    /// Brevo's contacts batch: 204, or 207 `{"successIds": [...], "failureIds": [...]}`
    /// naming the items by their `email`.
    Brevo,
    /// Customer.io's v2 batch: 200, or 207 `{"errors": [{"batch_index", "reason"}]}`.
    CustomerIo,
    /// Mailchimp's batch subscribe: 200 `{"new_members", "errors": [{"email_address",
    /// "error"}]}`.
    Mailchimp,
}

/// The answer style of a vendor's batch endpoint, by its path (the preset's).
fn vendor_style(path: &str) -> Option<BatchAnswers> {
    let p = path.trim_end_matches('/');
    let segments: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    Some(match segments.as_slice() {
        [.., "objects", _, "batch", "upsert" | "create" | "update"] => BatchAnswers::Keyed,
        [.., "events", "v3", "send", "batch"] => BatchAnswers::NoBody(204),
        [
            ..,
            "profile-subscription-bulk-create-jobs" | "event-bulk-create-jobs",
        ] => BatchAnswers::NoBody(202),
        [.., "contacts", "batch"] => BatchAnswers::Brevo,
        [.., "users", "track"] => BatchAnswers::Indexed,
        [.., "api", "v2", "batch"] => BatchAnswers::CustomerIo,
        [.., "lists", _] => BatchAnswers::Mailchimp,
        _ if p.contains("/composite/sobjects") => BatchAnswers::Positional,
        _ => return None,
    })
}

/// The records of a batch body: the body if it is an array, else its first array found
/// depth first (an envelope at any depth, beside constant fields).
fn batch_items(body: &serde_json::Value) -> Option<&Vec<serde_json::Value>> {
    match body {
        serde_json::Value::Array(items) => Some(items),
        serde_json::Value::Object(m) => m.values().find_map(batch_items),
        _ => None,
    }
}

/// What the batch sink answers one call, and the keys it accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchReply {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: serde_json::Value,
    /// Keys of the accepted items: `courier-<delivery id>` from the call's
    /// `Idempotency-Key`, else `<key or "batch">#<position>`.
    pub accepted: Vec<String>,
}

/// The batch sink's answer to a call on `path` (`.../batch/<style>/...`, a style of
/// [`BatchAnswers`]: `per-item`, `all-or-nothing`, `keyed`, `positional`, `indexed`,
/// `unmapped`, `limit-exceeded`), or `None` when `path` is not the sink's.
pub fn batch_sink(path: &str, body: &serde_json::Value, headers: &HeaderMap) -> Option<BatchReply> {
    let segments: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let style = segments.windows(2).find_map(|w| match w {
        ["batch", "per-item"] => Some(BatchAnswers::PerItem),
        ["batch", "all-or-nothing"] => Some(BatchAnswers::AllOrNothing),
        ["batch", "keyed"] => Some(BatchAnswers::Keyed),
        ["batch", "positional"] => Some(BatchAnswers::Positional),
        ["batch", "indexed"] => Some(BatchAnswers::Indexed),
        ["batch", "unmapped"] => Some(BatchAnswers::Unmapped),
        ["batch", "limit-exceeded"] => Some(BatchAnswers::LimitExceeded),
        _ => None,
    });
    let style = style.or_else(|| vendor_style(path))?;
    let Some(items) = batch_items(body) else {
        return Some(BatchReply {
            status: 400,
            body: serde_json::json!({"detail": "expected a JSON array of records, or an object with one array field"}),
            accepted: Vec::new(),
        });
    };
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let ids: Vec<&str> = key
        .and_then(|k| k.strip_prefix("courier-"))
        .map(|ids| ids.split(',').collect())
        .unwrap_or_default();
    // Marked invalid on the item, or one level down (a template's `properties`).
    let marked = |v: &serde_json::Value| v.get("invalid") == Some(&serde_json::Value::Bool(true));
    let b = Batch {
        items,
        keys: (0..items.len())
            .map(|j| match ids.len() == items.len() {
                true => format!("courier-{}", ids[j]),
                false => format!("{}#{j}", key.unwrap_or("batch")),
            })
            .collect(),
        invalid: items
            .iter()
            .map(|i| marked(i) || i.as_object().is_some_and(|o| o.values().any(marked)))
            .collect(),
        trace: (0..items.len())
            .map(|j| {
                items[j]
                    .get("objectWriteTraceId")
                    .cloned()
                    .or_else(|| ids.get(j).map(|id| serde_json::Value::from(*id)))
                    .unwrap_or_else(|| serde_json::Value::from(j.to_string()))
            })
            .collect(),
    };
    Some(match style {
        BatchAnswers::Keyed | BatchAnswers::Brevo | BatchAnswers::Mailchimp => {
            keyed_reply(style, &b)
        }
        BatchAnswers::Positional | BatchAnswers::Indexed | BatchAnswers::CustomerIo => {
            vendor_reply(style, &b)
        }
        _ => plain_reply(style, &b),
    })
}

/// One batch call as the sink sees it.
struct Batch<'a> {
    /// The records.
    items: &'a [serde_json::Value],
    /// Each record's key for the accepted-write log.
    keys: Vec<String>,
    /// Whether each record is marked invalid.
    invalid: Vec<bool>,
    /// Each record's trace id: its own `objectWriteTraceId`, else its delivery id.
    trace: Vec<serde_json::Value>,
}

impl Batch<'_> {
    fn valid_keys(&self) -> Vec<String> {
        (0..self.items.len())
            .filter(|&j| !self.invalid[j])
            .map(|j| self.keys[j].clone())
            .collect()
    }

    fn any_invalid(&self) -> bool {
        self.invalid.iter().any(|&i| i)
    }
}

/// What a vendor's batch endpoint answers by position or index (the presets' targets).
fn vendor_reply(style: BatchAnswers, b: &Batch<'_>) -> BatchReply {
    match style {
        BatchAnswers::Positional => BatchReply {
            status: 200,
            body: (0..b.items.len())
                .map(|j| match b.invalid[j] {
                    true => serde_json::json!({"success": false, "errors": [
                        {"statusCode": "INVALID_EMAIL_ADDRESS", "message": "invalid record", "fields": []}
                    ]}),
                    false => serde_json::json!({"id": format!("003{j:012}"), "success": true, "errors": []}),
                })
                .collect(),
            accepted: b.valid_keys(),
        },
        BatchAnswers::Indexed => BatchReply {
            status: 201,
            body: serde_json::json!({
                "message": "success",
                "errors": (0..b.items.len()).filter(|&j| b.invalid[j]).map(|j| serde_json::json!({
                    "type": "invalid record", "input_array": "attributes", "index": j
                })).collect::<Vec<_>>(),
            }),
            accepted: b.valid_keys(),
        },
        BatchAnswers::CustomerIo => BatchReply {
            status: if b.any_invalid() { 207 } else { 200 },
            body: serde_json::json!({
                "errors": (0..b.items.len()).filter(|&j| b.invalid[j]).map(|j| serde_json::json!({
                    "batch_index": j, "reason": "invalid record", "field": "identifiers"
                })).collect::<Vec<_>>(),
            }),
            accepted: b.valid_keys(),
        },
        _ => unreachable!("not this function's style: {style:?}"),
    }
}

/// What a vendor's batch endpoint answers naming records by a key (HubSpot, Brevo, Mailchimp).
fn keyed_reply(style: BatchAnswers, b: &Batch<'_>) -> BatchReply {
    match style {
        BatchAnswers::Keyed => {
            let (bad, good): (Vec<usize>, Vec<usize>) =
                (0..b.items.len()).partition(|&j| b.invalid[j]);
            BatchReply {
                status: if bad.is_empty() { 200 } else { 207 },
                body: serde_json::json!({
                    "status": "COMPLETE",
                    "results": good.iter().map(|&j| serde_json::json!({
                        "id": format!("{}", 1000 + j), "objectWriteTraceId": b.trace[j].clone()
                    })).collect::<Vec<_>>(),
                    "numErrors": bad.len(),
                    "errors": bad.iter().map(|&j| serde_json::json!({
                        "status": "error", "category": "VALIDATION_ERROR",
                        "message": "Property values were not valid", "objectWriteTraceId": b.trace[j].clone()
                    })).collect::<Vec<_>>(),
                }),
                accepted: b.valid_keys(),
            }
        }
        BatchAnswers::Brevo => {
            let email = |j: usize| b.items[j].get("email").cloned().unwrap_or_default();
            let (bad, good): (Vec<usize>, Vec<usize>) =
                (0..b.items.len()).partition(|&j| b.invalid[j]);
            BatchReply {
                status: if bad.is_empty() { 204 } else { 207 },
                body: match bad.is_empty() {
                    true => serde_json::Value::Null,
                    false => serde_json::json!({
                        "successIds": good.iter().map(|&j| email(j)).collect::<Vec<_>>(),
                        "failureIds": bad.iter().map(|&j| email(j)).collect::<Vec<_>>(),
                    }),
                },
                accepted: b.valid_keys(),
            }
        }
        BatchAnswers::Mailchimp => {
            let address = |j: usize| b.items[j].get("email_address").cloned().unwrap_or_default();
            let (bad, good): (Vec<usize>, Vec<usize>) =
                (0..b.items.len()).partition(|&j| b.invalid[j]);
            BatchReply {
                status: 200,
                body: serde_json::json!({
                    "new_members": good.iter().map(|&j| serde_json::json!({"email_address": address(j), "status": "subscribed"})).collect::<Vec<_>>(),
                    "updated_members": [],
                    "errors": bad.iter().map(|&j| serde_json::json!({
                        "email_address": address(j), "error": "invalid record", "error_code": "ERROR_GENERIC"
                    })).collect::<Vec<_>>(),
                    "total_created": good.len(), "total_updated": 0, "error_count": bad.len(),
                }),
                accepted: b.valid_keys(),
            }
        }
        _ => unreachable!("not this function's style: {style:?}"),
    }
}

/// The sink's own answer styles.
fn plain_reply(style: BatchAnswers, b: &Batch<'_>) -> BatchReply {
    match style {
        BatchAnswers::NoBody(status) => BatchReply {
            status,
            body: serde_json::Value::Null,
            accepted: b.valid_keys(),
        },
        BatchAnswers::LimitExceeded => BatchReply {
            status: 403,
            body: serde_json::json!([{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]),
            accepted: Vec::new(),
        },
        BatchAnswers::Unmapped => BatchReply {
            status: if b.any_invalid() { 207 } else { 200 },
            body: serde_json::json!({"status": if b.any_invalid() { "partial" } else { "complete" }}),
            accepted: b.valid_keys(),
        },
        BatchAnswers::PerItem => BatchReply {
            status: 200,
            body: (0..b.items.len())
                .map(|j| match b.invalid[j] {
                    true => serde_json::json!({"status": 400, "error": "invalid record"}),
                    false => serde_json::json!({"status": 200}),
                })
                .collect(),
            accepted: (0..b.items.len())
                .filter(|&j| !b.invalid[j])
                .map(|j| b.keys[j].clone())
                .collect(),
        },
        BatchAnswers::AllOrNothing => match b.invalid.iter().position(|&i| i) {
            Some(j) => BatchReply {
                status: 400,
                body: serde_json::json!({"detail": format!("item {j} is invalid; nothing was accepted")}),
                accepted: Vec::new(),
            },
            None => BatchReply {
                status: 200,
                body: serde_json::json!({"accepted": b.items.len()}),
                accepted: (0..b.items.len()).map(|j| b.keys[j].clone()).collect(),
            },
        },
        _ => unreachable!("not this function's style: {style:?}"),
    }
}
