//! A delete of one record (`deliveries.op = 'delete'`): sent as its rule's `request.delete`
//! says, one record per call, through the same paced call path as any call, against a raw
//! HTTP target on loopback that keeps every request it read. What the target saw is the
//! proof: the delete's method and path, no upsert a delete superseded, an upsert after a
//! delivered delete sent again.

use std::sync::Arc;

use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    worker::Engine,
};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::common::{self, Reply, Seen, Server, TestDb, answer};

/// A target answering each request as `reply` says (200 `{}` when it says nothing).
async fn crm(reply: impl Fn(&Seen) -> Option<Reply> + Send + Sync + 'static) -> Server {
    Server::start("127.0.0.1", move |s| {
        reply(s).unwrap_or_else(|| answer("200 OK", "", "{}"))
    })
    .await
}

/// The requests `server` read, as `METHOD path body`.
fn seen(server: &Server) -> Vec<String> {
    server
        .seen()
        .iter()
        .map(|s| {
            let method = s.head.split_whitespace().next().unwrap_or_default();
            format!("{method} {} {}", s.path, s.body)
        })
        .collect()
}

fn is_delete(s: &Seen) -> bool {
    s.head.starts_with("DELETE ")
}

/// The request shape of rule `contacts`: deletes by `DELETE contacts/{email}`, a 404
/// meaning gone.
fn deleting() -> Value {
    json!({"delete": {"path": "contacts/{payload/email}", "gone": [404]}})
}

/// Connection `crm` on `server`, rule `contacts` (path `contacts`, `request`, up to
/// `per_call` records per call) and rule `orders` beside it.
async fn shop(server: &Server, request: Option<Value>, per_call: i32) -> (TestDb, Arc<Engine>) {
    let db = TestDb::new().await;
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "crm".into(),
            writer: "http_json".into(),
            base_url: server.url.clone(),
            requests_per_minute: Some(600_000),
            max_in_flight: Some(1),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for (name, request, per_call) in [("contacts", request, per_call), ("orders", None, 1)] {
        catalog::upsert_rule(
            &db.pool,
            &NewRule {
                name: name.into(),
                connection: "crm".into(),
                path: name.into(),
                batch_size: Some(10),
                max_attempts: Some(3),
                records_per_call: Some(per_call),
                request,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    let engine = common::engine(&db.pool, common::settings(&db.url));
    (db, engine)
}

fn ann() -> Value {
    json!({"email": "ann@x.io", "name": "Ann"})
}

async fn enqueue(pool: &PgPool, rule: &str, d: NewDelivery) -> i64 {
    enqueue::enqueue(pool, rule, d).await.unwrap()
}

/// `(status, last ledger outcome, its HTTP status, its error)` of delivery `id`.
async fn fate(pool: &PgPool, id: i64) -> (String, Option<String>, Option<i16>, Option<String>) {
    sqlx::query_as(
        "SELECT d.status, l.outcome, l.http_status, l.error FROM deliveries d
         LEFT JOIN LATERAL (SELECT * FROM ledger l WHERE l.delivery_id = d.id
                            ORDER BY l.id DESC LIMIT 1) l ON true
         WHERE d.id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The delivery that last delivered `key` of rule `contacts`, if its row is there.
async fn delivered_record(pool: &PgPool, key: &str) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT delivery_id FROM delivered_records
         WHERE record_key = $1 AND rule_id = (SELECT id FROM rules WHERE name = 'contacts')",
    )
    .bind(key)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_delete_goes_as_the_rules_delete_call_alone_and_ends_delivered() {
    let server = crm(|s| is_delete(s).then(|| answer("204 No Content", "", ""))).await;
    // A bulk rule: its upserts share a call, its delete goes alone.
    let (db, engine) = shop(&server, Some(deleting()), 10).await;
    let upserts = enqueue::enqueue_many(
        &db.pool,
        "contacts",
        vec![
            NewDelivery::new("c:2", json!({"email": "bo@x.io"})),
            NewDelivery::new("c:3", json!({"email": "cy@x.io"})),
        ],
    )
    .await
    .unwrap();
    let delete = enqueue(
        &db.pool,
        "contacts",
        NewDelivery::delete("c:1", json!({"email": "ann b@x.io"})),
    )
    .await;
    common::drive(&engine).await;
    let mut got = seen(&server);
    got.sort();
    assert_eq!(
        got,
        [
            "DELETE /contacts/ann%20b%40x.io ",
            r#"POST /contacts [{"email":"bo@x.io"},{"email":"cy@x.io"}]"#,
        ]
    );
    // No body, so no content type either.
    let sent = server.seen();
    let deleted = sent.iter().find(|s| is_delete(s)).unwrap();
    assert_eq!(deleted.header("content-type"), "");
    assert_eq!(
        deleted.header("idempotency-key"),
        format!("courier-{delete}")
    );
    assert_eq!(
        fate(&db.pool, delete).await,
        (
            "delivered".into(),
            Some("delivered".into()),
            Some(204),
            None
        )
    );
    for id in upserts {
        assert_eq!(common::delivery(&db.pool, id).await.0, "delivered");
    }
}

#[tokio::test]
async fn a_gone_status_reads_delivered_and_another_4xx_rejected() {
    let server = crm(|s| match s.path.as_str() {
        "/contacts/ann%40x.io" => Some(answer("404 Not Found", "", r#"{"error":"no such"}"#)),
        "/contacts/bo%40x.io" => Some(answer("410 Gone", "", "{}")),
        _ => None,
    })
    .await;
    let (db, engine) = shop(&server, Some(deleting()), 1).await;
    let gone = enqueue(&db.pool, "contacts", NewDelivery::delete("c:1", ann())).await;
    let other = enqueue(
        &db.pool,
        "contacts",
        NewDelivery::delete("c:2", json!({"email": "bo@x.io"})),
    )
    .await;
    common::drive(&engine).await;
    assert_eq!(seen(&server).len(), 2, "{:?}", seen(&server));
    assert_eq!(
        fate(&db.pool, gone).await,
        (
            "delivered".into(),
            Some("delivered".into()),
            Some(404),
            None
        )
    );
    // 410 is not in the rule's `gone`: a refusal like any call's.
    let (status, outcome, http, _) = fate(&db.pool, other).await;
    assert_eq!(
        (status.as_str(), outcome.as_deref(), http),
        ("rejected", Some("rejected"), Some(410))
    );
}

#[tokio::test]
async fn a_delete_supersedes_the_pending_upserts_of_its_key_and_an_upsert_a_pending_delete() {
    let server = crm(|_| None).await;
    let (db, engine) = shop(&server, Some(deleting()), 1).await;
    let first = enqueue(&db.pool, "contacts", NewDelivery::new("c:1", ann())).await;
    let second = enqueue(
        &db.pool,
        "contacts",
        NewDelivery::new("c:1", json!({"email": "ann@x.io", "name": "Ann B"})),
    )
    .await;
    let delete = enqueue(&db.pool, "contacts", NewDelivery::delete("c:1", ann())).await;
    // Key c:2: a delete, then an upsert that makes the record again.
    let bo = json!({"email": "bo@x.io"});
    let undone = enqueue(&db.pool, "contacts", NewDelivery::delete("c:2", bo.clone())).await;
    let again = enqueue(&db.pool, "contacts", NewDelivery::new("c:2", bo)).await;
    let superseded: Vec<(i64, bool)> =
        sqlx::query_as("SELECT id, superseded FROM deliveries ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        superseded,
        [
            (first, true),
            (second, true),
            (delete, false),
            (undone, true),
            (again, false)
        ]
    );
    common::drive(&engine).await;
    let mut got = seen(&server);
    got.sort();
    assert_eq!(
        got,
        [
            "DELETE /contacts/ann%40x.io ",
            r#"POST /contacts {"email":"bo@x.io"}"#
        ]
    );
    for id in [first, second, undone] {
        let (status, _, _, error) = fate(&db.pool, id).await;
        assert_eq!(
            (status.as_str(), error.as_deref()),
            ("suppressed", Some("superseded by a newer delivery"))
        );
    }
    assert_eq!(common::delivery(&db.pool, delete).await.0, "delivered");
    assert_eq!(common::delivery(&db.pool, again).await.0, "delivered");
}

#[tokio::test]
async fn an_upsert_after_a_delivered_delete_is_sent_and_a_dependency_waits_again() {
    let server = crm(|_| None).await;
    let (db, engine) = shop(&server, Some(deleting()), 1).await;
    let created = enqueue(&db.pool, "contacts", NewDelivery::new("c:1", ann())).await;
    common::drive(&engine).await;
    assert_eq!(delivered_record(&db.pool, "c:1").await, Some(created));
    enqueue(&db.pool, "contacts", NewDelivery::delete("c:1", ann())).await;
    common::drive(&engine).await;
    assert_eq!(delivered_record(&db.pool, "c:1").await, None);
    // An order of the deleted customer waits for it to be made again.
    let order = enqueue(
        &db.pool,
        "orders",
        NewDelivery {
            depends_on: Some("c:1".into()),
            ..NewDelivery::new("o:1", json!({"total": 3}))
        },
    )
    .await;
    common::drive(&engine).await;
    let (status, outcome, _, _) = fate(&db.pool, order).await;
    assert_eq!(
        (status.as_str(), outcome.as_deref()),
        ("pending", Some("held"))
    );
    // The same payload as the one delivered before the delete: sent, not "unchanged".
    let made_again = enqueue(&db.pool, "contacts", NewDelivery::new("c:1", ann())).await;
    common::drive(&engine).await;
    common::drive(&engine).await;
    assert_eq!(
        seen(&server),
        [
            r#"POST /contacts {"email":"ann@x.io","name":"Ann"}"#,
            "DELETE /contacts/ann%40x.io ",
            r#"POST /contacts {"email":"ann@x.io","name":"Ann"}"#,
            r#"POST /orders {"total":3}"#,
        ]
    );
    assert_eq!(common::delivery(&db.pool, made_again).await.0, "delivered");
    assert_eq!(delivered_record(&db.pool, "c:1").await, Some(made_again));
    assert_eq!(common::delivery(&db.pool, order).await.0, "delivered");
}

#[tokio::test]
async fn a_delete_of_a_rule_with_no_request_delete_is_rejected_unsent() {
    let server = crm(|_| None).await;
    let (db, engine) = shop(&server, None, 1).await;
    let delete = enqueue(&db.pool, "contacts", NewDelivery::delete("c:1", ann())).await;
    let upsert = enqueue(
        &db.pool,
        "contacts",
        NewDelivery::new("c:2", json!({"email": "bo@x.io"})),
    )
    .await;
    common::drive(&engine).await;
    assert_eq!(seen(&server), [r#"POST /contacts {"email":"bo@x.io"}"#]);
    let (status, outcome, http, error) = fate(&db.pool, delete).await;
    assert_eq!(
        (status.as_str(), outcome.as_deref(), http),
        ("rejected", Some("rejected"), None)
    );
    assert!(error.unwrap().contains("states no request.delete"));
    assert_eq!(common::delivery(&db.pool, upsert).await.0, "delivered");
}

#[tokio::test]
async fn a_429_to_a_delete_blocks_the_budget_and_spends_no_attempt() {
    let server =
        crm(|s| is_delete(s).then(|| answer("429 Too Many Requests", "Retry-After: 30\r\n", "{}")))
            .await;
    let (db, engine) = shop(&server, Some(deleting()), 1).await;
    let delete = enqueue(&db.pool, "contacts", NewDelivery::delete("c:1", ann())).await;
    common::drive(&engine).await;
    assert_eq!(seen(&server), ["DELETE /contacts/ann%40x.io "]);
    assert_eq!(
        common::delivery(&db.pool, delete).await,
        ("pending".into(), 0)
    );
    assert!(common::ledger(&db.pool, delete).await.is_empty());
    let blocked: (i64, Option<String>) = sqlx::query_as(
        "SELECT count(*), max(retry_after_raw) FROM connection_blocks WHERE blocked_until > now()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(blocked, (1, Some("30".into())));
}
