//! Bulk delivery: a rule whose calls carry several records, against the local target's
//! batch sink (both answer styles) and User.com mass update, on a real database. Each
//! record keeps its own outcome: a per-item answer decides each; a call refused as a whole
//! is split until its bad records are alone; a 429 records nothing; a 5xx or a timeout
//! fails each record of the call; a crash re-sends only what was not committed.

use std::time::Duration;

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    catalog::{self, CatalogError, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    {dispatcher::Dispatcher, maintenance::reaper::Reaper},
};
use courier_target::{Target, TargetConfig, WorkspaceConfig};
use serde_json::json;
use sqlx::PgPool;

/// Rule `name` on connection `shop` posting to `path`, `per_call` records per call.
async fn bulk_rule(pool: &PgPool, name: &str, path: &str, per_call: i32, envelope: Option<&str>) {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: name.into(),
            connection: "shop".into(),
            path: path.into(),
            batch_size: Some(100),
            max_attempts: Some(3),
            backoff_base_ms: Some(1_000),
            records_per_call: Some(per_call),
            request: envelope.map(|field| json!({"body": {field: "{{records}}"}})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// `n` deliveries `{prefix}:{i}`; those whose index is in `invalid` carry `"invalid": true`.
fn records(prefix: &str, n: usize, invalid: &[usize]) -> Vec<NewDelivery> {
    (0..n)
        .map(|i| {
            let payload = match invalid.contains(&i) {
                true => json!({"n": i, "invalid": true}),
                false => json!({"n": i}),
            };
            NewDelivery::new(format!("{prefix}:{i}"), payload)
        })
        .collect()
}

/// Deliveries by status, e.g. `[("delivered", 8), ("rejected", 2)]`.
async fn statuses(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT status, count(*) FROM deliveries GROUP BY status ORDER BY status")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Ledger rows `delivered`.
async fn delivered_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ledger WHERE outcome = 'delivered'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The ids of the deliveries whose payload is marked invalid.
async fn invalid_ids(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM deliveries WHERE payload ? 'invalid' ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Every delivery delivered exactly once at the target (its `courier-<id>` key), and the
/// rejected ones never.
async fn accepted_once_each(pool: &PgPool, target: &Target) {
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, status FROM deliveries")
        .fetch_all(pool)
        .await
        .unwrap();
    for (id, status) in rows {
        let want = u32::from(status == "delivered");
        assert_eq!(
            target.accepted(&format!("courier-{id}")),
            want,
            "delivery {id} ({status})"
        );
    }
}

#[tokio::test]
async fn per_item_answers_decide_each_record_of_a_call() {
    let (db, target) = shop(&[], 100, 2).await;
    bulk_rule(&db.pool, "events", "batch/per-item/", 5, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 10, &[3, 7]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 8), ("rejected".into(), 2)]
    );
    // Two calls of five, none split.
    assert_eq!(target.counters().requests, 2);
    accepted_once_each(&db.pool, &target).await;
    for id in invalid_ids(&db.pool).await {
        assert_eq!(ledger(&db.pool, id).await, [("rejected".into(), 1)]);
    }
    // One call: an array of payloads, one Idempotency-Key naming its deliveries.
    let first = &target.requests()[0];
    assert_eq!(first.body.as_array().map(Vec::len), Some(5));
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM deliveries ORDER BY id LIMIT 5")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let names = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let calls = target.requests();
    assert!(
        calls
            .iter()
            .any(|r| r.headers.get("idempotency-key") == Some(&format!("courier-{names}"))),
        "{:?}",
        calls
            .iter()
            .map(|r| &r.headers["idempotency-key"])
            .collect::<Vec<_>>()
    );
}

/// Rule `events` on `path` (5 records per call) whose answers are read by `answer`.
async fn mapped_rule(pool: &PgPool, path: &str, answer: serde_json::Value) {
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: "events".into(),
            connection: "shop".into(),
            path: path.into(),
            batch_size: Some(100),
            max_attempts: Some(3),
            backoff_base_ms: Some(1_000),
            records_per_call: Some(5),
            answer: Some(answer),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Ten records, the 4th and 8th invalid, through a rule whose answers `answer` reads on
/// the target's `path`: each invalid one ends rejected with the target's text, every
/// other one delivered once.
async fn a_mapped_answer_decides_each_record(path: &str, answer: serde_json::Value, text: &str) {
    let (db, target) = shop(&[], 100, 2).await;
    mapped_rule(&db.pool, path, answer).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 10, &[3, 7]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 8), ("rejected".into(), 2)]
    );
    assert_eq!(
        target.counters().requests,
        2,
        "two calls of five, none split"
    );
    accepted_once_each(&db.pool, &target).await;
    for id in invalid_ids(&db.pool).await {
        let (outcome, error): (String, String) =
            sqlx::query_as("SELECT outcome, error FROM ledger WHERE delivery_id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(outcome, "rejected");
        assert!(error.ends_with(&format!("(HTTP 422): {text}")), "{error}");
    }
}

#[tokio::test]
async fn a_keyed_207_decides_each_record_by_its_trace_id() {
    a_mapped_answer_decides_each_record(
        "batch/keyed/",
        json!({"kind": "keyed", "results": "/results", "errors": "/errors",
               "key": "/objectWriteTraceId", "record": "delivery_id", "message": "/message"}),
        "Property values were not valid",
    )
    .await;
}

#[tokio::test]
async fn a_positional_success_false_rejects_that_record() {
    a_mapped_answer_decides_each_record(
        "batch/positional/",
        json!({"kind": "positional", "success": {"equals": {"field": "/success", "value": true}},
               "message": "/errors/0/message"}),
        "invalid record",
    )
    .await;
}

#[tokio::test]
async fn indexed_errors_reject_the_records_at_their_positions() {
    a_mapped_answer_decides_each_record(
        "batch/indexed/",
        json!({"kind": "indexed", "errors": "/errors", "index": "/index", "message": "/type"}),
        "invalid record",
    )
    .await;
}

#[tokio::test]
async fn a_207_courier_cannot_map_delivers_none_of_its_records() {
    let (db, target) = shop(&[], 100, 2).await;
    bulk_rule(&db.pool, "events", "batch/unmapped/", 5, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 10, &[3]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    // The call with the bad record got a 207 naming nobody: split in halves until the bad
    // record is alone, whose 207 still names nobody: it is failed, to be sent again,
    // never delivered; every other record is delivered.
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 9), ("pending".into(), 1)]
    );
    let failed: Vec<(String, i16, String)> = sqlx::query_as(
        "SELECT outcome, http_status, error FROM ledger WHERE outcome <> 'delivered'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (outcome, status, error) = &failed[0];
    assert_eq!((outcome.as_str(), *status), ("failed", 207));
    assert!(error.contains("unaccounted for"), "{error}");
    // Two calls of five, the 207'd one split 5 -> 2 + 3 -> 1 + 2 -> 1 + 1.
    assert_eq!(target.counters().requests, 2 + 2 + 2 + 2);
}

#[tokio::test]
async fn an_unmapped_207_costs_no_valid_record() {
    let (db, _target) = shop(&[], 100, 2).await;
    bulk_rule(&db.pool, "events", "batch/unmapped/", 50, None).await;
    let invalid: Vec<usize> = (0..10).map(|i| 7 + i * 49).collect();
    enqueue::enqueue_many(&db.pool, "events", records("e", 500, &invalid))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    // Every attempt the rule allows (3), each after its backoff.
    for _ in 0..4 {
        drive(&engine).await;
        engine.clock.advance(Span::minutes(10));
    }
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 490), ("exhausted".into(), 10)]
    );
    assert_eq!(delivered_rows(&db.pool).await, 490, "each delivered once");
    let exhausted: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM deliveries WHERE status = 'exhausted' ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(exhausted, invalid_ids(&db.pool).await);
}

#[tokio::test]
async fn an_answer_map_courier_cannot_read_is_refused_when_the_rule_is_saved() {
    let (db, _target) = shop(&[], 100, 2).await;
    let e = catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "events".into(),
            connection: "shop".into(),
            path: "batch/keyed/".into(),
            records_per_call: Some(5),
            answer: Some(
                json!({"kind": "keyed", "errors": "/errors", "key": "/id", "record": "email"}),
            ),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, CatalogError::Invalid(m) if m.contains("answer") && m.contains("unknown variant `email`")),
        "{e}"
    );
    // Written by plain SQL instead: the run ends with the rule unusable, the reason named,
    // its records untouched.
    bulk_rule(&db.pool, "events", "batch/keyed/", 5, None).await;
    sqlx::query("UPDATE rules SET answer = '{\"kind\": \"sorted\"}'")
        .execute(&db.pool)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "events", records("e", 3, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 3)]);
    let reason: String = sqlx::query_scalar("SELECT error FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(reason.contains("unknown variant `sorted`"), "{reason}");
}

#[tokio::test]
async fn a_call_refused_as_a_whole_is_split_until_its_bad_records_are_alone() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(&db.pool, "events", "batch/all-or-nothing/", 16, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 64, &[5, 40, 41]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 61), ("rejected".into(), 3)]
    );
    accepted_once_each(&db.pool, &target).await;
    // Four calls of 16; each bad record costs at most 2·log2(16) = 8 more.
    let calls = target.counters().requests;
    assert!(calls > 4 && calls <= 4 + 3 * 8, "{calls} calls");
    // A rejected record has one ledger row, from the call that carried it alone.
    for id in invalid_ids(&db.pool).await {
        assert_eq!(ledger(&db.pool, id).await, [("rejected".into(), 1)]);
    }
    assert_eq!(
        delivered_rows(&db.pool).await,
        61,
        "every good record delivered once"
    );
}

#[tokio::test]
async fn a_429_to_a_bulk_call_records_nothing_and_blocks_the_budget() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(&db.pool, "events", "batch/per-item/", 10, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 30, &[]))
        .await
        .unwrap();
    target.respond_with(429, Some("30"));
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let (rows, attempts, blocked): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ledger), (SELECT sum(attempts) FROM deliveries),
                (SELECT count(*) FROM connection_blocks WHERE blocked_until > now())",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((rows, attempts, blocked), (0, 0, 1));
    // One call met the 429; no other call followed it.
    assert_eq!(target.counters().requests, 1);
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 30)]);

    // Once the block is over, everything goes, three calls of ten.
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(31));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 30)]);
    assert_eq!(target.counters().requests, 4);
}

#[tokio::test]
async fn a_5xx_or_a_timeout_fails_every_record_of_the_call() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(&db.pool, "events", "batch/per-item/", 10, None).await;
    let ids = enqueue::enqueue_many(&db.pool, "events", records("e", 20, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    target.respond_with(503, None);
    drive(&engine).await;
    assert_eq!(target.counters().requests, 2, "a 5xx is not split");
    for &id in &ids {
        assert_eq!(ledger(&db.pool, id).await, [("failed".into(), 1)]);
        assert!(next_attempt(&db.pool, id).await > engine.clock.now());
    }

    // The retry times out: a second attempt each, still one call per ten records.
    target.respond_with(200, None);
    target.set_latency(Duration::from_millis(1_500));
    sqlx::query("UPDATE connections SET timeout_ms = 200")
        .execute(&db.pool)
        .await
        .unwrap();
    engine.clock.advance(Span::minutes(5));
    drive(&engine).await;
    assert_eq!(target.counters().requests, 4);
    for &id in &ids {
        assert_eq!(
            ledger(&db.pool, id).await,
            [("failed".into(), 1), ("failed".into(), 2)]
        );
    }
}

#[tokio::test]
async fn an_envelope_wraps_the_records_of_a_call() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(
        &db.pool,
        "events",
        "batch/all-or-nothing/",
        50,
        Some("records"),
    )
    .await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 7, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 7)]);
    let calls = target.requests();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body["records"].as_array().map(Vec::len), Some(7));
    assert_eq!(calls[0].body["records"][6], json!({"n": 6}));
}

/// A job dropped mid-batch (its process gone) has committed only what it flushed: once
/// its run is reaped, a new run delivers the rest, and what is re-sent is at most the
/// records of the calls made since the last commit.
#[tokio::test]
async fn a_crash_mid_batch_resends_at_most_the_records_not_committed() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(&db.pool, "events", "batch/per-item/", 10, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 100, &[]))
        .await
        .unwrap();
    target.set_latency(Duration::from_millis(100));
    let engine = engine(&db.pool, settings(&db.url));
    Dispatcher::new(&engine).run_once().await.unwrap();
    let job = take_jobs(&engine).await.remove(0);
    let crashed =
        tokio::time::timeout(Duration::from_millis(450), try_run_job(&engine, &job)).await;
    assert!(
        crashed.is_err(),
        "the job was still calling when it was dropped"
    );
    let sent_before = target.counters().requests;
    assert!(sent_before >= 2, "{sent_before} calls before the crash");
    let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&db.pool)
        .await
        .unwrap();

    target.set_latency(Duration::ZERO);
    engine.clock.advance(Span::seconds(601));
    assert_eq!(
        Reaper::new(&engine).run_once().await.unwrap(),
        [job.job.run_id]
    );
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 100)]);
    let c = target.counters();
    // Re-sent: the records of the calls answered but not committed (those made before the
    // crash, ten records each, but the one cut off in flight), each at most once more.
    let uncommitted = sent_before * 10 - committed as u64;
    assert!(
        c.duplicates + 10 >= uncommitted && c.duplicates <= uncommitted,
        "{} duplicates, {uncommitted} records sent and not committed",
        c.duplicates
    );
    assert!(target.accepted_log().len() as u64 == 100 + c.duplicates);
    assert_eq!(
        delivered_rows(&db.pool).await,
        100,
        "one delivered row per record"
    );
}

#[tokio::test]
async fn records_per_call_outside_what_the_writer_carries_is_refused() {
    let (db, _target) = shop(&[], 100, 1).await;
    let rule = |per_call, path: &str, request: Option<serde_json::Value>| NewRule {
        name: "r".into(),
        connection: "shop".into(),
        path: path.into(),
        records_per_call: Some(per_call),
        request,
        ..Default::default()
    };
    for (per_call, envelope, names) in [
        (0, None, "records_per_call 0 is outside 1..=1000"),
        (-3, None, "records_per_call -3 is outside 1..=1000"),
        (1001, None, "records_per_call 1001 is outside 1..=1000"),
        (
            10,
            Some(json!({"body": {"items": []}})),
            "body must hold \"{{records}}\" exactly once, not 0 times",
        ),
    ] {
        let e = catalog::upsert_rule(&db.pool, &rule(per_call, "x/", envelope))
            .await
            .unwrap_err();
        assert!(matches!(e, CatalogError::Invalid(_)), "{e}");
        assert!(e.to_string().contains(names), "{e}");
    }
    let enveloped = json!({"body": {"items": "{{records}}"}});
    catalog::upsert_rule(&db.pool, &rule(1000, "x/", Some(enveloped)))
        .await
        .unwrap();

    // The writer of an older courier is refused, naming the preset that replaced it.
    let e = catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "uc".into(),
            writer: "usercom".into(),
            base_url: "http://127.0.0.1:9/".into(),
            api_key_env: Some("COURIER_TEST_BULK_KEY".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("preset usercom"), "{e}");
    // A rule that groups its records is checked when saved, each error naming the field.
    let attributes = courier::presets::find("usercom")
        .unwrap()
        .rule(Some("usercom-attributes"), &json!({}))
        .unwrap();
    let path = attributes["path"].as_str().unwrap();
    let grouped = |change: serde_json::Value| {
        let mut request = attributes["request"].clone();
        for (k, v) in change.as_object().unwrap() {
            request["group"][k] = v.clone();
        }
        Some(request)
    };
    for (per_call, request, names) in [
        (1001, grouped(json!({})), "outside 1..=1000"),
        (
            100,
            grouped(json!({"body": {"ids": []}})),
            "request: group: body must hold",
        ),
        (
            100,
            grouped(json!({"path": "users/{payload/id}/"})),
            "names a record's field",
        ),
        (
            100,
            Some(json!({"group": attributes["request"]["group"], "csv": ["a"]})),
            "give no csv",
        ),
    ] {
        let e = catalog::upsert_rule(&db.pool, &rule(per_call, path, request))
            .await
            .unwrap_err();
        assert!(e.to_string().contains(names), "{e}");
    }
    catalog::upsert_rule(&db.pool, &rule(100, path, grouped(json!({}))))
        .await
        .unwrap();
    // The schema refuses what the door refuses for any writer.
    let e = sqlx::query("UPDATE rules SET records_per_call = 0")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("rules_records_per_call"), "{e}");
}

#[tokio::test]
async fn a_rule_stored_by_sql_beyond_its_writers_maximum_is_left_alone_with_the_reason() {
    const KEY_VAR: &str = "COURIER_TEST_BULK_USERCOM_KEY";
    unsafe { std::env::set_var(KEY_VAR, "tok") };
    let db = TestDb::new().await;
    let target = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", "tok")],
        ..TargetConfig::default()
    })
    .await
    .unwrap();
    usercom_shop(&db.pool, &target, KEY_VAR, 1).await;
    sqlx::query("UPDATE rules SET records_per_call = 1001 WHERE name = 'consents'")
        .execute(&db.pool)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "consents", consents(0..3, false, None))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let error: Option<String> =
        sqlx::query_scalar("SELECT unusable_error FROM rules WHERE name = 'consents'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("records_per_call 1001")),
        "{error:?}"
    );
    assert_eq!(target.counters().requests, 0);
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 3)]);
}

/// Connection `uc` on workspace `shop` of `target`, rules `customers` (the usercom
/// preset's users) and `consents` (its attributes, `per_call` records per call).
async fn usercom_shop(pool: &PgPool, target: &Target, key_var: &str, per_call: i32) {
    let preset = courier::presets::find("usercom").unwrap();
    let over = json!({"name": "uc", "base_url": target.workspace_url("shop"),
                      "api_key_env": key_var, "limits": ["10000/s"], "max_in_flight": 2});
    let rules: Vec<_> = [
        ("customers", "usercom-users", 1),
        ("consents", "usercom-attributes", per_call),
    ]
    .iter()
    .map(|(name, rule, per_call)| {
        let over = json!({"name": name, "connection": "uc", "records_per_call": per_call});
        preset.rule(Some(rule), &over).unwrap()
    })
    .collect();
    let file = json!({"connections": [preset.connection(&over)], "rules": rules});
    courier::apply::apply_file(pool, &file.to_string(), Default::default())
        .await
        .unwrap();
}

/// Consent changes `email_consent = value` for customers `c{i}`, each waiting for its
/// customer's record when `depends_on` is given.
fn consents(
    ids: std::ops::Range<usize>,
    value: bool,
    depends_on: Option<&str>,
) -> Vec<NewDelivery> {
    ids.map(|i| {
        let d = NewDelivery::new(
            format!("consent:c{i}"),
            json!({"custom_id": format!("c{i}"), "attributes": {"email_consent": value}}),
        );
        NewDelivery {
            depends_on: depends_on.map(|prefix| format!("{prefix}:c{i}")),
            ..d
        }
    })
    .collect()
}

#[tokio::test]
async fn consent_changes_go_as_mass_updates_grouped_by_attribute_and_value() {
    const KEY_VAR: &str = "COURIER_TEST_MASS_KEY";
    unsafe { std::env::set_var(KEY_VAR, "tok") };
    assert_eq!(
        courier::presets::find("usercom")
            .unwrap()
            .rule(Some("usercom-attributes"), &json!({}))
            .unwrap()["records_per_call"]
            .as_u64()
            .map(|n| n as usize),
        courier_target::operations::max_items(
            "PUT",
            "users-by-id/mass_update_custom_attributes/",
            "ids"
        )
    );
    let db = TestDb::new().await;
    let target = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", "tok")],
        rate: 100_000,
        ..TargetConfig::default()
    })
    .await
    .unwrap();
    usercom_shop(&db.pool, &target, KEY_VAR, 100).await;
    // 250 customers; consents for them (true for 0..150, false for 150..250), each after its
    // customer; consents for two users the workspace never gets (due at once, so they go
    // together); one change of two attributes, which has no mass form.
    let customers = (0..250)
        .map(|i| {
            NewDelivery::new(
                format!("customer:c{i}"),
                json!({"custom_id": format!("c{i}")}),
            )
        })
        .collect();
    let mut changes = consents(0..150, true, Some("customer"));
    changes.extend(consents(150..250, false, Some("customer")));
    for ghost in ["ghost1", "ghost2"] {
        changes.push(NewDelivery::new(
            format!("consent:{ghost}"),
            json!({"custom_id": ghost, "attributes": {"email_consent": true}}),
        ));
    }
    changes.push(NewDelivery {
        depends_on: Some("customer:c0".into()),
        ..NewDelivery::new(
            "consent:c0-both",
            json!({"custom_id": "c0", "attributes": {"email_consent": true, "sms_consent": true}}),
        )
    });
    // The consents are enqueued first: they wait for their customers.
    enqueue::enqueue_many(&db.pool, "consents", changes)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", customers)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    for _ in 0..5 {
        drive(&engine).await;
        engine.clock.advance(Span::minutes(2));
    }
    let by_status: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT r.name, d.status, count(*) FROM deliveries d JOIN rules r ON r.id = d.rule_id
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        by_status,
        [
            ("consents".into(), "delivered".into(), 251),
            ("consents".into(), "rejected".into(), 2),
            ("customers".into(), "delivered".into(), 250),
        ]
    );
    // The users the workspace does not know are rejected as a single call's 404 would be.
    let rejected: Vec<(String, i16, String)> = sqlx::query_as(
        "SELECT d.record_key, l.http_status, l.error FROM ledger l
         JOIN deliveries d ON d.id = l.delivery_id WHERE l.outcome = 'rejected' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rejected.len(), 2);
    for ((key, status, error), ghost) in rejected.iter().zip(["ghost1", "ghost2"]) {
        assert_eq!(
            (key.as_str(), *status),
            (format!("consent:{ghost}").as_str(), 404)
        );
        assert!(error.contains(&format!("{ghost:?}")), "{error}");
    }
    let ws = &target.counters().workspaces["shop"];
    let data = target.workspace_data("shop").unwrap();
    assert_eq!(data.store("users")["c10"]["email_consent"], json!(true));
    assert_eq!(data.store("users")["c200"]["email_consent"], json!(false));
    assert_eq!(data.store("users")["c0"]["sms_consent"], json!(true));
    assert_eq!(ws.duplicates, 0);
    let mass = target
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("mass_update_custom_attributes/"))
        .collect::<Vec<_>>();
    // Every single-attribute consent in calls of at most 100 ids of one value, however the
    // customers' deliveries interleaved (a group of one goes as a single call).
    let ids: usize = mass
        .iter()
        .map(|r| r.body["ids"].as_array().unwrap().len())
        .sum();
    assert!(ids >= 240, "{ids} ids in mass updates");
    assert!(
        mass.iter()
            .all(|r| r.method == "PUT" && r.body["ids"].as_array().unwrap().len() <= 100)
    );
    assert!(mass.len() <= 8, "{} mass updates", mass.len());
}

#[tokio::test]
async fn a_refusal_of_the_request_itself_rejects_each_record_without_a_split() {
    let (db, target) = shop(&[], 100, 1).await;
    bulk_rule(&db.pool, "events", "batch/all-or-nothing/", 10, None).await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 20, &[]))
        .await
        .unwrap();
    target.respond_with(401, None);
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("rejected".into(), 20)]);
    // Bad credentials are every record's: two calls of ten, none split.
    assert_eq!(target.counters().requests, 2);
}

#[tokio::test]
async fn each_auth_kind_presents_the_key_as_its_target_expects() {
    let cases = [
        (
            json!({"kind": "header", "name": "Authorization", "scheme": "Klaviyo-API-Key"}),
            "authorization",
            "Klaviyo-API-Key pk_live",
        ),
        (
            json!({"kind": "header", "name": "api-key"}),
            "api-key",
            "pk_live",
        ),
        // base64("anystring:pk_live")
        (
            json!({"kind": "basic", "user": "anystring"}),
            "authorization",
            "Basic YW55c3RyaW5nOnBrX2xpdmU=",
        ),
    ];
    // SAFETY: set once, before any thread of this test reads it; no other test names it.
    unsafe { std::env::set_var("COURIER_TEST_AUTH_KEY", "pk_live") };
    for (auth, header, value) in cases {
        let (db, target) = shop(&[], 100, 2).await;
        sqlx::query("UPDATE connections SET api_key_env = 'COURIER_TEST_AUTH_KEY'")
            .execute(&db.pool)
            .await
            .unwrap();
        // Through the catalog, as `courier connection add --auth` and `apply` save it.
        let mut conn = catalog::list_connections(&db.pool).await.unwrap().remove(0);
        conn.auth = Some(auth.clone());
        catalog::upsert_connection(
            &db.pool,
            &NewConnection {
                name: conn.name,
                writer: conn.writer,
                base_url: conn.base_url,
                api_key_env: conn.api_key_env,
                auth: conn.auth,
                requests_per_minute: conn.requests_per_minute,
                max_in_flight: Some(conn.max_in_flight),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        bulk_rule(&db.pool, "events", "batch/per-item/", 5, None).await;
        enqueue::enqueue_many(&db.pool, "events", records("e", 3, &[]))
            .await
            .unwrap();
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        assert_eq!(
            statuses(&db.pool).await,
            [("delivered".into(), 3)],
            "{auth}"
        );
        let sent = &target.requests()[0].headers;
        assert_eq!(
            sent.get(header).map(String::as_str),
            Some(value),
            "{auth}: {sent:?}"
        );
        // The key is nowhere in the database.
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM connections WHERE row_to_json(connections)::text LIKE '%pk_live%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(stored, 0);
    }
}

#[tokio::test]
async fn a_hubspot_shaped_upsert_sends_templated_items_and_reads_the_207_by_trace_id() {
    let (db, target) = shop(&[], 100, 2).await;
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "contacts".into(),
            connection: "shop".into(),
            path: "crm/v3/objects/contacts/batch/keyed/".into(),
            records_per_call: Some(5),
            max_attempts: Some(3),
            request: Some(json!({
                "item": {"idProperty": "email", "id": "{{payload/email}}",
                         "properties": "{{payload}}", "objectWriteTraceId": "{{delivery_id}}"},
                "body": {"inputs": "{{records}}"}
            })),
            answer: Some(
                json!({"kind": "keyed", "results": "/results", "errors": "/errors",
                                "key": "/objectWriteTraceId", "record": "delivery_id",
                                "message": "/message"}),
            ),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let contacts: Vec<NewDelivery> = (0..5)
        .map(|i| {
            let mut p = json!({"email": format!("c{i}@example.com"), "firstname": format!("C{i}")});
            if i == 2 {
                p["invalid"] = json!(true);
            }
            NewDelivery::new(format!("contact:{i}"), p)
        })
        .collect();
    enqueue::enqueue_many(&db.pool, "contacts", contacts)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 4), ("rejected".into(), 1)]
    );
    let sent = &target.requests()[0];
    let first_id: i64 = sqlx::query_scalar("SELECT min(id) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        sent.body.pointer("/inputs/0"),
        Some(&json!({"idProperty": "email", "id": "c0@example.com",
                     "properties": {"email": "c0@example.com", "firstname": "C0"},
                     "objectWriteTraceId": first_id.to_string()}))
    );
    assert_eq!(sent.body["inputs"].as_array().map(Vec::len), Some(5));
}

#[tokio::test]
async fn a_mailchimp_shaped_member_put_fills_its_path_from_the_record() {
    let (db, target) = shop(&[], 100, 2).await;
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "members".into(),
            connection: "shop".into(),
            path: "lists/abc/members/{payload/email}".into(),
            request: Some(
                json!({"method": "PUT", "item": {"email_address": "{{payload/email}}",
                                 "status_if_new": "subscribed"}}),
            ),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let members = vec![
        NewDelivery::new("m:1", json!({"email": "ann+news@example.com"})),
        NewDelivery::new("m:2", json!({"name": "no e-mail"})),
    ];
    enqueue::enqueue_many(&db.pool, "members", members)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 1), ("rejected".into(), 1)]
    );
    let calls = target.requests();
    assert_eq!(calls.len(), 1, "the record without an e-mail is never sent");
    assert_eq!(calls[0].method, "PUT");
    assert_eq!(calls[0].path, "/lists/abc/members/ann%2Bnews%40example.com");
    assert_eq!(
        calls[0].body,
        json!({"email_address": "ann+news@example.com", "status_if_new": "subscribed"})
    );
    let error: String = sqlx::query_scalar("SELECT error FROM ledger WHERE outcome = 'rejected'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(error.contains("no field /email"), "{error}");
}

#[tokio::test]
async fn a_salesforce_403_request_limit_exceeded_is_a_rate_limit_not_a_refusal() {
    let (db, target) = shop(&[], 100, 2).await;
    bulk_rule(&db.pool, "events", "batch/limit-exceeded/", 5, None).await;
    // The preset's signals say a 403 naming REQUEST_LIMIT_EXCEEDED means rate limited.
    use_preset_signals(&db.pool, "salesforce").await;
    enqueue::enqueue_many(&db.pool, "events", records("e", 5, &[]))
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    // Nothing recorded against the records, no attempt spent, the budget blocked.
    assert_eq!(statuses(&db.pool).await, [("pending".into(), 5)]);
    let ledger_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ledger_rows, 0);
    let (blocks, raw): (i64, Option<String>) = sqlx::query_as(
        "SELECT count(*), max(retry_after_raw) FROM connection_blocks WHERE blocked_until > now()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (blocks, raw.as_deref()),
        (1, Some("403 REQUEST_LIMIT_EXCEEDED"))
    );
    assert_eq!(target.counters().requests, 1);
}

#[tokio::test]
async fn oauth_client_credentials_fetch_a_token_once_and_renew_it_on_a_401() {
    let (db, target) = shop(&[], 100, 2).await;
    // SAFETY: set before any worker of this test reads them; no other test names them.
    unsafe {
        std::env::set_var("COURIER_TEST_OAUTH_CLIENT", "client-1");
        std::env::set_var("COURIER_TEST_OAUTH_SECRET", "s3cret");
    }
    let auth = json!({"kind": "oauth", "token_url": format!("{}services/oauth2/oauth/token", target.url()),
                      "client_id_env": "COURIER_TEST_OAUTH_CLIENT", "instance_url": true});
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "shop".into(),
            writer: "http_json".into(),
            // The token answer's instance URL (the target's) takes this origin's place.
            base_url: "https://login.example.com/services/data/v62.0/".into(),
            api_key_env: Some("COURIER_TEST_OAUTH_SECRET".into()),
            auth: Some(auth),
            requests_per_minute: Some(600_000),
            max_in_flight: Some(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    bulk_rule(
        &db.pool,
        "events",
        "oauth-protected/batch/per-item/",
        3,
        None,
    )
    .await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "events", records("a", 6, &[]))
        .await
        .unwrap();
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 6)]);
    assert_eq!(
        target.tokens_granted(),
        1,
        "one token for every call while it holds"
    );
    let calls = target.requests();
    let sent = &calls.last().unwrap().headers;
    assert_eq!(
        sent.get("authorization").map(String::as_str),
        Some("Bearer tok-1")
    );
    assert!(
        target
            .requests()
            .iter()
            .all(|r| r.path.starts_with("/services/data/v62.0/"))
    );
    // The target revokes it: the next call's 401 fetches a new token and is sent again.
    target.revoke_tokens();
    enqueue::enqueue_many(&db.pool, "events", records("b", 3, &[]))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    drive(&engine).await;
    assert_eq!(statuses(&db.pool).await, [("delivered".into(), 9)]);
    assert_eq!(target.tokens_granted(), 2);
    let ledger_401: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE http_status = 401")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        ledger_401, 0,
        "a renewed token's 401 is no record's outcome"
    );
}

#[tokio::test]
async fn a_stored_batch_envelope_becomes_the_request_body_it_always_meant() {
    let db = TestDb::migrated_before(20261227000001).await;
    sqlx::raw_sql(
        "INSERT INTO connections (name, writer, base_url) VALUES ('shop', 'http_json', 'http://127.0.0.1:9/');
         INSERT INTO rules (name, connection_id, path, records_per_call, batch_envelope, request)
         SELECT v.name, c.id, 'x/', 10, v.envelope, v.request::jsonb
         FROM connections c, (VALUES
             ('enveloped', 'records', NULL),
             ('shaped', 'inputs', '{\"method\": \"PUT\"}'),
             ('both', 'ignored', '{\"body\": {\"kept\": \"{{records}}\"}}'),
             ('bare', NULL, NULL)) AS v(name, envelope, request)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    courier::db::migrate(&db.pool).await.unwrap();
    let rules = catalog::list_rules(&db.pool).await.unwrap();
    let request = |name: &str| {
        rules
            .iter()
            .find(|r| r.name == name)
            .unwrap()
            .request
            .clone()
    };
    assert_eq!(
        request("enveloped"),
        Some(json!({"body": {"records": "{{records}}"}}))
    );
    assert_eq!(
        request("shaped"),
        Some(json!({"method": "PUT", "body": {"inputs": "{{records}}"}}))
    );
    assert_eq!(
        request("both"),
        Some(json!({"body": {"kept": "{{records}}"}}))
    );
    assert_eq!(request("bare"), None);
    for r in &rules {
        let profile = courier::profile::RuleProfile::parse(courier::profile::Stored {
            writer: "http_json",
            path: &r.path,
            records_per_call: r.records_per_call,
            request: r.request.as_ref(),
            answer: r.answer.as_ref(),
            job: r.job.as_ref(),
        })
        .unwrap_or_else(|e| panic!("{}: {e}", r.name));
        let body = profile.request.body(vec![json!(1)]);
        let expected = match r.name.as_str() {
            "enveloped" => json!({"records": [1]}),
            "shaped" => json!({"inputs": [1]}),
            "both" => json!({"kept": [1]}),
            _ => json!([1]),
        };
        assert_eq!(body, expected, "{}", r.name);
    }
}

#[tokio::test]
async fn a_call_is_cut_to_the_rules_max_bytes_and_a_record_too_large_alone_is_rejected() {
    let (db, target) = shop(&[], 100, 2).await;
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "events".into(),
            connection: "shop".into(),
            path: "batch/per-item/".into(),
            batch_size: Some(100),
            max_attempts: Some(3),
            records_per_call: Some(10),
            request: Some(json!({"max_bytes": 200})),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Twelve records of 40 bytes or so, and one of 300 that no call of 200 bytes holds.
    let deliveries = (0..13).map(|i| {
        let pad = if i == 6 { 300 } else { 30 };
        NewDelivery::new(format!("e:{i}"), json!({"n": i, "pad": "x".repeat(pad)}))
    });
    enqueue::enqueue_many(&db.pool, "events", deliveries.collect())
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(
        statuses(&db.pool).await,
        [("delivered".into(), 12), ("rejected".into(), 1)]
    );
    let error: String =
        sqlx::query_scalar("SELECT last_error FROM deliveries WHERE status = 'rejected'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(error.contains("over the rule's max_bytes 200"), "{error}");
    // Each call within 200 bytes, none split after a refusal: cut before sending.
    let sizes: Vec<usize> = target
        .requests()
        .iter()
        .map(|r| serde_json::to_vec(&r.body).unwrap().len())
        .collect();
    assert!(sizes.iter().all(|&n| n <= 200), "{sizes:?}");
    assert!(
        sizes.len() >= 3,
        "{sizes:?}: twelve records of ~40 bytes need three calls"
    );
    accepted_once_each(&db.pool, &target).await;
}
