//! The chain queue as a worker consumes it: rows apalis cannot read are set aside once.

mod common;

use common::*;
use courier::{
    maintenance::quarantine::Quarantine,
    queue::{CHAIN_QUEUE, UNREADABLE},
};
use sqlx::PgPool;

/// Inserts an apalis row of the chain queue the way a SQL user could: `id`, payload bytes
/// (hex), then `extra` (a statement on the row, `$1` its id) in the same transaction.
async fn insert_job(pool: &PgPool, id: &str, job_hex: &str, extra: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority)
         VALUES ($1, $2, decode($3, 'hex'), 'Pending', 0, 3, now(), 0)",
    )
    .bind(id)
    .bind(CHAIN_QUEUE)
    .bind(job_hex)
    .execute(&mut *tx)
    .await
    .unwrap();
    if !extra.is_empty() {
        sqlx::query(sqlx::AssertSqlSafe(extra.to_owned()))
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh ULID as apalis writes them.
fn ulid() -> String {
    courier::queue::new_job_id()
}

/// One row of each kind apalis cannot read, with the words its reason must contain.
fn unreadable_rows() -> Vec<(String, String, &'static str, &'static str)> {
    let json = hex(br#"{"run_id": 1, "rule_id": 1}"#);
    vec![
        ("not-a-ulid".into(), json.clone(), "", "is not a ULID"),
        (ulid().to_lowercase(), json.clone(), "", "is not a ULID"),
        (ulid(), hex(b"\xff\xfe{}"), "", "not UTF-8 JSON"),
        (ulid(), hex(b"not json"), "", "not UTF-8 JSON"),
        (
            ulid(),
            json.clone(),
            "UPDATE apalis.jobs SET run_at = '-infinity' WHERE id = $1",
            "before 1970",
        ),
        (
            ulid(),
            json.clone(),
            "UPDATE apalis.jobs SET metadata = 'k=>NULL'::hstore WHERE id = $1",
            "metadata key 'k' is NULL",
        ),
        // PostgreSQL's json takes a lone surrogate escape, serde_json does not: only the
        // worker's own decoding can catch this one.
        (ulid(), hex(br#"{"a": "\ud800"}"#), "", "not UTF-8 JSON"),
    ]
}

/// `(status, last_result)` of an apalis row.
async fn job_state(pool: &PgPool, id: &str) -> (String, Option<String>) {
    sqlx::query_as("SELECT status, last_result->>'Err' FROM apalis.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_quarantine_sets_every_unreadable_row_aside_once_with_its_reason() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let rows = unreadable_rows();
    for (id, job, extra, _) in &rows {
        insert_job(&db.pool, id, job, extra).await;
    }
    let readable = ulid();
    insert_job(
        &db.pool,
        &readable,
        &hex(br#"{"run_id": 1, "rule_id": 1}"#),
        "",
    )
    .await;

    let set_aside = Quarantine::new(&engine).run_once().await.unwrap();
    // All but the lone surrogate, which PostgreSQL's json accepts.
    let sql_readable = &rows[rows.len() - 1].0;
    let mut expected: Vec<&String> = rows
        .iter()
        .map(|r| &r.0)
        .filter(|id| *id != sql_readable)
        .collect();
    expected.sort();
    let mut got: Vec<&String> = set_aside.iter().map(|s| &s.id).collect();
    got.sort();
    assert_eq!(got, expected);
    for (id, _, _, words) in &rows[..rows.len() - 1] {
        let (status, reason) = job_state(&db.pool, id).await;
        assert_eq!(status, "Killed", "{id}");
        let reason = reason.unwrap_or_default();
        assert!(
            reason.starts_with(UNREADABLE) && reason.contains(words),
            "{id}: {reason}"
        );
    }
    assert_eq!(job_state(&db.pool, &readable).await.0, "Pending");
    assert_eq!(job_state(&db.pool, sql_readable).await.0, "Pending");
    assert!(
        Quarantine::new(&engine)
            .run_once()
            .await
            .unwrap()
            .is_empty(),
        "a row is set aside once"
    );
}
