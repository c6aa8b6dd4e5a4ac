//! Adding deliveries. Three doors lead here: plain SQL (`INSERT INTO deliveries (rule_id,
//! record_key, payload) ...`, which a statement trigger announces with NOTIFY), the
//! functions below for Rust applications, and `courier enqueue` reading NDJSON.
//! Every door inserts in bulk and all-or-nothing.
//!
//! A delivery is an upsert (the record as it is now) or a delete (the record removed at
//! the shop, to be removed at the target: [`Op`], column `deliveries.op`, NDJSON field
//! `"op": "delete"`).

use crate::invalid::Invalid;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{PgExecutor, PgPool};

/// Rows per INSERT statement when enqueuing in bulk.
pub const INSERT_CHUNK: usize = 5_000;
/// A bulk enqueue at least this large refreshes the planner's statistics of `deliveries`
/// right away instead of leaving the hot queries planned for a small table until
/// autovacuum catches up: a plan made for a few rows can run many times slower over a
/// burst of tens of thousands.
pub const ANALYZE_AFTER: usize = 10_000;

/// What a delivery does to its record at the target (`deliveries.op`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Op {
    /// Creates or updates the record as its payload says (its rule's request shape).
    #[default]
    Upsert,
    /// Removes the record, as its rule's `request.delete` says; its payload fills that
    /// request's path and body.
    Delete,
}

impl Op {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Upsert => "upsert",
            Op::Delete => "delete",
        }
    }
}

/// One record to deliver.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewDelivery {
    /// The record's identity in the shop, e.g. `customer:123`.
    pub record_key: String,
    /// What the writer sends.
    pub payload: serde_json::Value,
    /// Do not deliver before this time.
    #[serde(default)]
    pub hold_until: Option<DateTime<Utc>>,
    /// A record key of the same connection that must be delivered first.
    #[serde(default)]
    pub depends_on: Option<String>,
    /// An upsert (the default) or a delete.
    #[serde(default)]
    pub op: Op,
}

impl NewDelivery {
    /// An upsert with no hold and no dependency.
    pub fn new(record_key: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            record_key: record_key.into(),
            payload,
            hold_until: None,
            depends_on: None,
            op: Op::Upsert,
        }
    }

    /// A delete of the record `record_key`, with no hold and no dependency; `payload`
    /// fills its rule's delete request (its path names the record by it).
    pub fn delete(record_key: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            op: Op::Delete,
            ..Self::new(record_key, payload)
        }
    }
}

/// Why deliveries could not be enqueued. Nothing of the input was inserted.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// No rule has that name.
    #[error("unknown rule {0:?} (--rule): `courier rule list` shows the rules")]
    UnknownRule(String),
    /// Lines of NDJSON input that could not be accepted.
    #[error("{} bad line(s) in input, nothing was enqueued:\n{}", .0.len(), render(.0))]
    BadInput(Vec<LineError>),
    /// The database refused.
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// One refused line of NDJSON input, or one refused delivery of a list given to
/// [`enqueue_many`].
#[derive(Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number (NDJSON), or 1-based position in the list ([`enqueue_many`]).
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

fn render(errors: &[LineError]) -> String {
    errors
        .iter()
        .take(20)
        .map(|e| format!("  line {}: {}", e.line, e.reason))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks one delivery before it is enqueued: its record key must hold a character that is
/// not blank, and its `depends_on`, when given, must not be blank nor the delivery's own
/// key (a delivery cannot wait for itself). The table's check constraints refuse the same
/// for plain SQL.
pub fn check_delivery(d: &NewDelivery) -> Result<(), Invalid> {
    const NUL: &str = "holds a NUL character (\\u0000), which PostgreSQL cannot store";
    // PostgreSQL's text and jsonb cannot hold U+0000: say where it is, before the
    // database refuses the whole statement without saying which row.
    if d.record_key.contains('\0') {
        return Err(Invalid::new("record_key", format!("record_key {NUL}")));
    }
    if d.depends_on.as_deref().is_some_and(|k| k.contains('\0')) {
        return Err(Invalid::new("depends_on", format!("depends_on {NUL}")));
    }
    if let Some(at) = nul_in(&d.payload, "payload") {
        return Err(Invalid::new("payload", format!("{at} {NUL}")));
    }
    if d.record_key.trim().is_empty() {
        return Err(Invalid::new(
            "record_key",
            if d.record_key.is_empty() {
                "record_key is empty"
            } else {
                "record_key is blank (it must hold a character that is not blank)"
            },
        ));
    }
    let key = &d.record_key;
    match d.depends_on.as_deref() {
        Some(dep) if dep.trim().is_empty() => Err(Invalid::new(
            "depends_on",
            format!("record_key {key:?}: depends_on is blank (leave it out for no dependency)"),
        )),
        Some(dep) if dep == key => Err(Invalid::new(
            "depends_on",
            format!(
                "record_key {key:?}: depends_on names the delivery's own key (a delivery \
                 cannot wait for itself)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Looks up a rule's id by name.
async fn rule_id(db: impl PgExecutor<'_>, rule: &str) -> Result<i64, EnqueueError> {
    crate::catalog::rule_id(db, rule)
        .await?
        .ok_or_else(|| EnqueueError::UnknownRule(rule.to_owned()))
}

/// Enqueues one delivery for the rule named `rule`; returns its id.
pub async fn enqueue(
    pool: &PgPool,
    rule: &str,
    delivery: NewDelivery,
) -> Result<i64, EnqueueError> {
    Ok(enqueue_many(pool, rule, vec![delivery]).await?[0])
}

/// Enqueues many deliveries for the rule named `rule` in one transaction, a few thousand
/// rows per statement; returns their ids in input order. Every delivery is checked first
/// ([`check_delivery`]): any refused one is reported by its position in the list
/// ([`EnqueueError::BadInput`]) and nothing is inserted. An error means nothing was
/// inserted: once the transaction commits, the call succeeds.
pub async fn enqueue_many(
    pool: &PgPool,
    rule: &str,
    deliveries: Vec<NewDelivery>,
) -> Result<Vec<i64>, EnqueueError> {
    let errors: Vec<LineError> = deliveries
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            check_delivery(d).err().map(|e| LineError {
                line: i + 1,
                reason: e.reason,
            })
        })
        .collect();
    if !errors.is_empty() {
        return Err(EnqueueError::BadInput(errors));
    }
    let mut tx = pool.begin().await?;
    let rule_id = rule_id(&mut *tx, rule).await?;
    let mut ids = Vec::with_capacity(deliveries.len());
    for chunk in deliveries.chunks(INSERT_CHUNK) {
        ids.extend(insert_chunk(&mut *tx, rule_id, chunk).await?);
    }
    tx.commit().await?;
    // The rows are in: from here on nothing may fail the call, or a caller retrying it
    // would enqueue them twice. Fresh statistics only help the planner (autovacuum
    // refreshes them later anyway), so a failed ANALYZE is a warning.
    if ids.len() >= ANALYZE_AFTER
        && let Err(e) = sqlx::query!("ANALYZE deliveries").execute(pool).await
    {
        tracing::warn!(error = %e, rows = ids.len(), "refreshing the statistics of deliveries after a bulk enqueue failed");
    }
    Ok(ids)
}

async fn insert_chunk(
    db: impl PgExecutor<'_>,
    rule_id: i64,
    chunk: &[NewDelivery],
) -> Result<Vec<i64>, sqlx::Error> {
    let keys: Vec<&str> = chunk.iter().map(|d| d.record_key.as_str()).collect();
    let payloads: Vec<serde_json::Value> = chunk.iter().map(|d| d.payload.clone()).collect();
    let holds: Vec<Option<DateTime<Utc>>> = chunk.iter().map(|d| d.hold_until).collect();
    let deps: Vec<Option<&str>> = chunk.iter().map(|d| d.depends_on.as_deref()).collect();
    let ops: Vec<&str> = chunk.iter().map(|d| d.op.as_str()).collect();
    sqlx::query_scalar!(
        r#"INSERT INTO deliveries (rule_id, record_key, payload, hold_until, depends_on, op)
           SELECT $1, k, p, h, d, o
           FROM unnest($2::text[], $3::jsonb[], $4::timestamptz[], $5::text[], $6::text[])
                WITH ORDINALITY AS t(k, p, h, d, o, n)
           ORDER BY n
           RETURNING id"#,
        rule_id,
        &keys as &[&str],
        &payloads,
        &holds as &[Option<DateTime<Utc>>],
        &deps as &[Option<&str>],
        &ops as &[&str],
    )
    .fetch_all(db)
    .await
}

/// Where in `value` a string (or an object key) holds U+0000, as a path like
/// `payload.items[2].name`.
fn nul_in(value: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => Some(path.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| nul_in(v, &format!("{path}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(format!("a key of {path}"))
            } else {
                nul_in(v, &format!("{path}.{k}"))
            }
        }),
        _ => None,
    }
}

/// Reads one NDJSON line into a delivery, naming the field when a value is wrong.
fn parse_line(line: &str) -> Result<NewDelivery, String> {
    use serde_json::Value;
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut fields) = value else {
        return Err("not a JSON object (expected {\"record_key\": ..., \"payload\": ...})".into());
    };
    const FIELDS: [&str; 5] = ["record_key", "payload", "hold_until", "depends_on", "op"];
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {unknown:?} (the fields are {})",
            FIELDS.join(", ")
        ));
    }
    let text = |fields: &mut serde_json::Map<String, Value>, name: &str| match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("field {name}: expected a string, got {other}")),
    };
    let record_key =
        text(&mut fields, "record_key")?.ok_or_else(|| "field record_key is missing".to_owned())?;
    let payload = fields
        .remove("payload")
        .ok_or_else(|| "field payload is missing".to_owned())?;
    let hold_until = match text(&mut fields, "hold_until")? {
        None => None,
        Some(raw) => Some(
            DateTime::parse_from_rfc3339(&raw)
                .map_err(|e| {
                    format!("field hold_until: {raw:?} is not an RFC 3339 time ({e}), e.g. 2030-01-01T00:00:00Z")
                })?
                .with_timezone(&Utc),
        ),
    };
    let depends_on = text(&mut fields, "depends_on")?;
    let op = match text(&mut fields, "op")?.as_deref() {
        None | Some("upsert") => Op::Upsert,
        Some("delete") => Op::Delete,
        Some(other) => {
            return Err(format!(
                "field op: {other:?} is not one of \"upsert\" (the default), \"delete\""
            ));
        }
    };
    Ok(NewDelivery {
        record_key,
        payload,
        hold_until,
        depends_on,
        op,
    })
}

/// Parses NDJSON: one JSON object per line with `record_key`, `payload` and optionally
/// `hold_until` (RFC 3339), `depends_on` and `op` (`"upsert"`, the default, or
/// `"delete"`). Blank lines are skipped. Every bad line is
/// reported with its number; any bad line refuses the whole input.
pub fn parse_ndjson(input: &str) -> Result<Vec<NewDelivery>, EnqueueError> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match parse_line(line).and_then(|d| check_delivery(&d).map(|()| d).map_err(|e| e.reason)) {
            Ok(d) => out.push(d),
            Err(reason) => errors.push(LineError {
                line: i + 1,
                reason,
            }),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(EnqueueError::BadInput(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_line_is_named() {
        let input = "{\"record_key\":\"a\",\"payload\":{}}\n\nnot json\n{\"payload\":1}\n{\"record_key\":\"\",\"payload\":1}\n";
        let Err(EnqueueError::BadInput(errors)) = parse_ndjson(input) else {
            panic!("expected bad input");
        };
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![3, 4, 5]);
        assert!(errors[1].reason.contains("record_key"), "{:?}", errors[1]);
    }

    #[test]
    fn every_error_names_the_line_and_the_field() {
        let input = "{\"record_key\":\"a\",\"payload\":{},\"hold_until\":\"tomorrow\"}\n\
                     {\"record_key\":\"b\",\"payload\":{\"items\":[{\"name\":\"x\\u0000y\"}]}}\n\
                     {\"record_key\":\"c\",\"payload\":{},\"max_inflight\":3}\n\
                     {\"record_key\":7,\"payload\":{}}\n\
                     {\"record_key\":\"d\\u0000\",\"payload\":{}}\n";
        let Err(EnqueueError::BadInput(errors)) = parse_ndjson(input) else {
            panic!("expected bad input");
        };
        let got: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.reason.as_str())).collect();
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(
            got[0].1.contains("field hold_until") && got[0].1.contains("\"tomorrow\""),
            "{got:?}"
        );
        assert!(
            got[1].1.contains("payload.items[0].name") && got[1].1.contains("NUL"),
            "{got:?}"
        );
        assert!(
            got[2].1.contains("unknown field \"max_inflight\""),
            "{got:?}"
        );
        assert!(got[3].1.contains("field record_key"), "{got:?}");
        assert!(got[4].1.contains("record_key holds a NUL"), "{got:?}");
    }

    #[test]
    fn blank_keys_and_self_dependencies_are_named_by_line() {
        let input = "{\"record_key\":\"  \",\"payload\":{}}\n\
                     {\"record_key\":\"a\",\"payload\":{}}\n\
                     {\"record_key\":\"c:1\",\"payload\":{},\"depends_on\":\"c:1\"}\n\
                     {\"record_key\":\"c:2\",\"payload\":{},\"depends_on\":\" \"}\n\
                     {\"record_key\":\"c:3\",\"payload\":{},\"depends_on\":\"c:1\"}\n";
        let Err(EnqueueError::BadInput(errors)) = parse_ndjson(input) else {
            panic!("expected bad input");
        };
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![1, 3, 4]);
        assert!(errors[0].reason.contains("blank"), "{:?}", errors[0]);
        assert!(
            errors[1].reason.contains("c:1") && errors[1].reason.contains("own key"),
            "{:?}",
            errors[1]
        );
        assert!(
            errors[2].reason.contains("depends_on is blank"),
            "{:?}",
            errors[2]
        );
        // Blanks of every kind count, not only spaces.
        assert!(check_delivery(&NewDelivery::new("\t\u{a0}\n", serde_json::json!({}))).is_err());
        assert!(check_delivery(&NewDelivery::new(" k ", serde_json::json!({}))).is_ok());
    }

    #[test]
    fn good_lines_parse_with_optional_fields() {
        let input = "{\"record_key\":\"a\",\"payload\":{\"x\":1},\"depends_on\":\"b\",\"hold_until\":\"2030-01-01T00:00:00Z\"}";
        let d = parse_ndjson(input).unwrap();
        assert_eq!(d[0].depends_on.as_deref(), Some("b"));
        assert!(d[0].hold_until.is_some());
        assert_eq!(d[0].op, Op::Upsert);
    }

    #[test]
    fn a_line_may_be_a_delete_and_an_unknown_op_is_named() {
        let input = "{\"record_key\":\"a\",\"payload\":{\"email\":\"a@x.io\"},\"op\":\"delete\"}\n\
                     {\"record_key\":\"b\",\"payload\":{},\"op\":\"upsert\"}\n";
        let d = parse_ndjson(input).unwrap();
        assert_eq!((d[0].op, d[1].op), (Op::Delete, Op::Upsert));
        assert_eq!(
            d[0],
            NewDelivery::delete("a", serde_json::json!({"email": "a@x.io"}))
        );
        let Err(EnqueueError::BadInput(errors)) =
            parse_ndjson("{\"record_key\":\"a\",\"payload\":{},\"op\":\"erase\"}")
        else {
            panic!("expected bad input");
        };
        assert!(
            errors[0].reason.contains("field op: \"erase\""),
            "{errors:?}"
        );
        // The serde door reads the same field.
        let d: NewDelivery =
            serde_json::from_str("{\"record_key\":\"a\",\"payload\":1,\"op\":\"delete\"}").unwrap();
        assert_eq!(d.op, Op::Delete);
    }
}
