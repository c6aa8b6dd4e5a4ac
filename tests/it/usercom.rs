//! User.com through its preset (`presets/usercom.json`) against the local target: each
//! operation's request (method, path, headers, body) as the target recorded it, each
//! response class mapped to its outcome, one end-to-end delivery through the engine on a
//! real database, and a catalog stored for the `usercom` writer of an older courier
//! migrated to the preset and delivering.

use std::time::Duration;

use crate::common::{TestDb, drive, engine, erase, erased_part, erasing, settings};
use courier::{
    apply,
    enqueue::{self, NewDelivery},
    model::Connection,
    presets::{self, Preset},
    profile::{RuleProfile, Stored},
    writer::{Outgoing, WriteError, Writer, http::HttpJsonWriter},
};
use courier_target::{Faults, RetryAfterMode, Target, TargetConfig, WorkspaceConfig};
use serde_json::{Value, json};

const TOKEN: &str = "test-token-0123456789";

/// The `Accept` header User.com's clients send to select API version 2.
const ACCEPT_VERSION_2: &str = "*/*; version=2";

/// The preset's rule for each operation the `usercom` writer had, by the name a rule's
/// path gave it there (the migration maps them so).
const OPERATIONS: [(&str, &str); 6] = [
    ("user_upsert", "usercom-users"),
    ("user_attributes", "usercom-attributes"),
    ("mass_update_custom_attributes", "usercom-mass-update"),
    ("event", "usercom-events"),
    ("product_event", "usercom-product-events"),
    ("deal_upsert", "usercom-deals"),
];

fn preset() -> &'static Preset {
    presets::find("usercom").unwrap()
}

/// The preset's rule `name` as stored: its path, records per call, request and answer.
fn preset_rule(name: &str) -> serde_json::Map<String, Value> {
    preset().rule(Some(name), &json!({})).unwrap()
}

#[test]
fn the_target_counts_appends_by_the_field_the_preset_fills() {
    // courier-target does not depend on the engine: the preset names the field it reads.
    for rule in ["usercom-events", "usercom-product-events"] {
        let data = &preset_rule(rule)["request"]["item"]["data"];
        assert_eq!(
            data[courier_target::DELIVERY_ID_FIELD],
            "{{delivery_id | number}}"
        );
    }
    let c = preset().connection(&json!({}));
    assert_eq!(c["headers"]["Accept"], ACCEPT_VERSION_2);
}

async fn target(config: TargetConfig) -> Target {
    Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
        ..config
    })
    .await
    .unwrap()
}

/// The preset's connection pointed at `base_url`.
fn connection(base_url: String, timeout_ms: i32) -> Connection {
    let c = preset().connection(&json!({}));
    Connection {
        id: 1,
        name: "shop-usercom".into(),
        writer: "http_json".into(),
        base_url,
        api_key_env: Some("UNUSED_HERE".into()),
        auth: Some(c["auth"].clone()),
        headers: c["headers"].clone(),
        requests_per_minute: None,
        max_in_flight: 4,
        timeout_ms,
        budget_key: "connection:1".into(),
        ..Connection::default()
    }
}

/// A writer on workspace `shop` of `t` with key `key`, and the preset's rules' profiles.
struct Shop {
    writer: HttpJsonWriter,
    rules: Vec<(&'static str, String, RuleProfile)>,
}

fn writer(t: &Target, key: &str, timeout_ms: i32) -> Shop {
    let writer = HttpJsonWriter::new(
        &connection(t.workspace_url("shop"), timeout_ms),
        &reqwest::Client::new(),
        Some(key.into()),
    )
    .unwrap();
    let rules = OPERATIONS
        .iter()
        .map(|&(op, name)| {
            let r = preset_rule(name);
            let path = r["path"].as_str().unwrap().to_owned();
            let per_call = r.get("records_per_call").and_then(Value::as_i64);
            let profile = RuleProfile::parse(Stored {
                writer: "http_json",
                path: &path,
                records_per_call: per_call.unwrap_or(1) as i32,
                request: r.get("request"),
                answer: r.get("answer"),
                job: None,
            })
            .unwrap();
            (op, path, profile)
        })
        .collect();
    Shop { writer, rules }
}

/// Delivers one record by operation `op`'s rule, as a chain job does: its status, or its
/// refusal (one refused before sending is the call's only item).
async fn write(w: &Shop, id: i64, op: &str, payload: Value) -> Result<u16, WriteError> {
    let (_, path, profile) = w.rules.iter().find(|(o, ..)| *o == op).unwrap();
    let records = [Outgoing {
        delivery_id: id,
        record_key: "k",
        path,
        payload: &payload,
    }];
    let written = w.writer.write_many(profile.call(&records)).await?;
    match written.items.into_iter().next().flatten() {
        Some(e) => Err(e),
        None => Ok(written.receipt.http_status.unwrap_or_default()),
    }
}

#[tokio::test]
async fn each_operation_sends_its_request() {
    let t = target(TargetConfig {
        rate: 1_000,
        ..TargetConfig::default()
    })
    .await;
    let w = writer(&t, TOKEN, 5_000);
    assert_eq!(
        courier::catalog::rpm_or_default(None),
        600,
        "User.com's 10/s by default"
    );
    let user = json!({"custom_id": "c1", "email": "ann@example.com", "email_consent": true,
                      "unsubscribed": false});
    let cases: Vec<(&str, Value, &str, &str, Value)> = vec![
        (
            "user_upsert",
            user.clone(),
            "POST",
            "/ws/shop/api/public/users/update_or_create/",
            user.clone(),
        ),
        (
            "user_attributes",
            json!({"custom_id": "c1", "attributes": {"sms_consent": true}}),
            "POST",
            "/ws/shop/api/public/users-by-id/c1/set_multiple_attributes/",
            json!({"sms_consent": true}),
        ),
        (
            "mass_update_custom_attributes",
            json!({"custom_ids": ["c1"], "attribute": "vip", "value": 2}),
            "PUT",
            "/ws/shop/api/public/users-by-id/mass_update_custom_attributes/",
            json!({"ids": ["c1"], "attribute": "vip", "value": 2}),
        ),
        (
            "event",
            json!({"user_custom_id": "c1", "name": "order_placed", "timestamp": 1_700_000_000,
                   "data": {"total": 12.5}}),
            "POST",
            "/ws/shop/api/public/events/",
            json!({"user_custom_id": "c1", "name": "order_placed", "timestamp": 1_700_000_000,
                   "data": {"total": 12.5, "courier_delivery_id": 4}}),
        ),
        (
            "product_event",
            json!({"product_custom_id": "sku 7", "user_custom_id": "c1", "event_type": "view",
                   "data": {"price": 19.9}}),
            "POST",
            "/ws/shop/api/public/products-by-id/sku%207/product_event/",
            json!({"user_custom_id": "c1", "event_type": "view",
                   "data": {"price": 19.9, "courier_delivery_id": 5}}),
        ),
        (
            "deal_upsert",
            json!({"custom_id": "order-9", "name": "Order 9", "value": 99}),
            "POST",
            "/ws/shop/api/public/deals/update_or_create/",
            json!({"custom_id": "order-9", "name": "Order 9", "value": 99}),
        ),
    ];
    for (i, (op, payload, method, path, body)) in cases.into_iter().enumerate() {
        assert_eq!(write(&w, i as i64 + 1, op, payload).await, Ok(200), "{op}");
        let sent = t.requests().pop().expect("a request");
        assert_eq!(
            (sent.method.as_str(), sent.path.as_str()),
            (method, path),
            "{op}"
        );
        assert_eq!(sent.headers["authorization"], format!("Token {TOKEN}"));
        assert_eq!(sent.headers["accept"], ACCEPT_VERSION_2);
        assert_eq!(sent.headers["content-type"], "application/json");
        assert_eq!(sent.body, body, "{op}");
    }
    let data = t.workspace_data("shop").unwrap();
    assert_eq!(data.store("users")["c1"]["email"], "ann@example.com");
    assert_eq!(data.store("users")["c1"]["sms_consent"], true);
    assert_eq!(data.store("users")["c1"]["vip"], 2);
    assert_eq!(data.log("events").len(), 1);
    assert_eq!(data.store("products")["sku 7"]["price"], 19.9);
    assert_eq!(data.store("deals")["order-9"]["value"], 99);
    assert_eq!(t.accepted("event:4"), 1);
    assert_eq!(t.accepted("product_event:5"), 1);
}

#[tokio::test]
async fn payloads_lacking_a_field_are_permanent_and_send_nothing() {
    let t = target(TargetConfig::default()).await;
    let w = writer(&t, TOKEN, 5_000);
    for (op, payload, needle) in [
        ("user_upsert", json!({"email": "x@y"}), "\"custom_id\""),
        ("user_upsert", json!({"custom_id": " "}), "\"custom_id\""),
        ("deal_upsert", json!({"name": "order 1"}), "\"custom_id\""),
        ("event", json!({"user_custom_id": "c"}), "\"name\""),
        (
            "event",
            json!({"name": "n"}),
            "\"user_custom_id\" (or \"user_id\")",
        ),
        (
            "event",
            json!({"name": "n", "user_id": 1, "data": [1]}),
            "spreads an object",
        ),
        (
            "user_attributes",
            json!({"custom_id": "c"}),
            "\"attributes\"",
        ),
        (
            "product_event",
            json!({"user_custom_id": "c", "event_type": "view"}),
            "\"product_custom_id\"",
        ),
        (
            "mass_update_custom_attributes",
            json!({"attribute": "x", "value": 1}),
            "\"custom_ids\"",
        ),
    ] {
        match write(&w, 1, op, payload).await {
            Err(WriteError::Permanent {
                status: None,
                message,
            }) => assert!(message.contains(needle), "{op}: {message}"),
            other => panic!("{op}: {other:?}"),
        }
    }
    assert_eq!(t.counters().requests, 0);
}

fn status_of(e: &WriteError) -> (&'static str, Option<u16>) {
    match e {
        WriteError::RateLimited { .. } => ("rate_limited", Some(429)),
        WriteError::Permanent { status, .. } => ("permanent", *status),
        WriteError::Transient { status, .. } => ("transient", *status),
        WriteError::Unaccounted { status, .. } => ("unaccounted", Some(*status)),
    }
}

#[tokio::test]
async fn forced_statuses_map_to_their_classes() {
    let t = target(TargetConfig::default()).await;
    let w = writer(&t, TOKEN, 5_000);
    let upsert = json!({"custom_id": "c1"});
    for (status, class) in [
        (400, "permanent"),
        (401, "permanent"),
        (403, "permanent"),
        (404, "permanent"),
        (422, "permanent"),
        (500, "transient"),
        (502, "transient"),
        (504, "transient"),
    ] {
        t.respond_with(status, None);
        let e = write(&w, 1, "user_upsert", upsert.clone())
            .await
            .unwrap_err();
        assert_eq!(status_of(&e), (class, Some(status)));
    }
    t.respond_with(201, None);
    assert_eq!(write(&w, 1, "user_upsert", upsert).await, Ok(200));
}

#[tokio::test]
async fn real_refusals_by_the_workspace_are_permanent() {
    let mut ws = WorkspaceConfig::new("shop", TOKEN);
    ws.custom_attributes = Some(["email_consent".to_owned()].into());
    let t = Target::start_with(TargetConfig {
        workspaces: vec![ws],
        ..TargetConfig::default()
    })
    .await
    .unwrap();
    let wrong = writer(&t, "not-the-token", 5_000);
    let e = write(&wrong, 1, "user_upsert", json!({"custom_id": "c1"}))
        .await
        .unwrap_err();
    assert_eq!(status_of(&e), ("permanent", Some(401)));
    assert!(
        !e.to_string().contains("not-the-token"),
        "no key in errors: {e}"
    );
    let w = writer(&t, TOKEN, 5_000);
    let e = write(
        &w,
        1,
        "user_upsert",
        json!({"custom_id": "c1", "loyalty": 1}),
    )
    .await
    .unwrap_err();
    assert_eq!(status_of(&e), ("permanent", Some(400)));
    assert!(e.to_string().contains("loyalty"), "{e}");
    let e = write(
        &w,
        1,
        "user_attributes",
        json!({"custom_id": "nobody", "attributes": {"email_consent": true}}),
    )
    .await
    .unwrap_err();
    assert_eq!(status_of(&e), ("permanent", Some(404)));
}

#[tokio::test]
async fn throttling_maps_to_rate_limited_with_the_wait_it_names() {
    for mode in [
        RetryAfterMode::Seconds,
        RetryAfterMode::HttpDate,
        RetryAfterMode::None,
    ] {
        let t = target(TargetConfig {
            rate: 1,
            period: Duration::from_secs(30),
            retry_after: mode,
            ..TargetConfig::default()
        })
        .await;
        let w = writer(&t, TOKEN, 5_000);
        assert_eq!(
            write(&w, 1, "user_upsert", json!({"custom_id": "a"})).await,
            Ok(200)
        );
        let e = write(&w, 2, "user_upsert", json!({"custom_id": "b"}))
            .await
            .unwrap_err();
        let WriteError::RateLimited { wait, raw, .. } = e else {
            panic!("{mode:?}: {e:?}")
        };
        match mode {
            RetryAfterMode::Seconds => {
                assert_eq!(wait, Some(Duration::from_secs(30)));
                assert_eq!(raw.as_deref(), Some("30"));
            }
            RetryAfterMode::HttpDate => {
                let wait = wait.expect("an HTTP-date names a wait");
                assert!(
                    wait > Duration::from_secs(25) && wait <= Duration::from_secs(31),
                    "{wait:?}"
                );
                assert!(raw.unwrap().ends_with("GMT"));
            }
            RetryAfterMode::None => assert_eq!((wait, raw), (None, None)),
        }
        assert_eq!(t.counters().workspaces["shop"].throttled, 1);
    }
}

#[tokio::test]
async fn faults_map_to_transient_failures() {
    let t = target(TargetConfig::default()).await;
    let w = writer(&t, TOKEN, 300);
    let upsert = json!({"custom_id": "c1"});

    t.set_faults(Faults {
        share_5xx: 1.0,
        ..Faults::default()
    });
    let e = write(&w, 1, "user_upsert", upsert.clone())
        .await
        .unwrap_err();
    let (class, status) = status_of(&e);
    assert_eq!(class, "transient");
    assert!(matches!(status, Some(500 | 502 | 504)), "{status:?}");
    assert!(!e.proves_reachable());

    t.set_faults(Faults {
        hang_share: 1.0,
        ..Faults::default()
    });
    let e = write(&w, 1, "user_upsert", upsert.clone())
        .await
        .unwrap_err();
    assert_eq!(status_of(&e), ("transient", None));
    assert!(e.to_string().contains("timeout"), "{e}");

    t.set_faults(Faults {
        reset_share: 1.0,
        ..Faults::default()
    });
    let e = write(&w, 1, "user_upsert", upsert.clone())
        .await
        .unwrap_err();
    assert_eq!(status_of(&e), ("transient", None));
    assert!(!e.to_string().contains("timeout"), "{e}");

    t.set_faults(Faults::default());
    assert_eq!(write(&w, 1, "user_upsert", upsert).await, Ok(200));
    assert_eq!(t.counters().workspaces["shop"].faults, 3);
}

/// The environment variable the end-to-end test's connection names.
const KEY_VAR: &str = "COURIER_TEST_USERCOM_KEY";

#[tokio::test]
async fn the_engine_delivers_through_the_preset() {
    // SAFETY: every value this binary writes to it is the same.
    unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    let db = TestDb::new().await;
    let t = target(TargetConfig::default()).await;
    let mut file: Value = serde_json::from_str(preset().text).unwrap();
    file["connections"][0]["base_url"] = json!(t.workspace_url("shop"));
    file["connections"][0]["api_key_env"] = json!(KEY_VAR);
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .expect("the preset applies");
    enqueue::enqueue_many(
        &db.pool,
        "usercom-users",
        (0..3)
            .map(|k| {
                NewDelivery::new(
                    format!("customer:{k}"),
                    json!({"custom_id": format!("c{k}")}),
                )
            })
            .collect(),
    )
    .await
    .unwrap();
    let price_ids = enqueue::enqueue_many(
        &db.pool,
        "usercom-product-events",
        (0..3)
            .map(|k| {
                NewDelivery::new(
                    format!("price:{k}"),
                    json!({"product_custom_id": format!("sku{k}"), "user_custom_id": "c0",
                           "event_type": "view", "data": {"price": k}}),
                )
            })
            .collect(),
    )
    .await
    .unwrap();
    let e = engine(&db.pool, settings(&db.url));
    drive(&e).await;
    let delivered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'delivered'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(delivered, 6);
    for id in price_ids {
        assert_eq!(t.accepted(&format!("product_event:{id}")), 1);
    }
    let c = t.counters();
    assert_eq!((c.workspaces["shop"].stored["users"], c.duplicates), (3, 0));
}

/// The first migration after which no connection names the `usercom` writer.
const PRESET_MIGRATION: i64 = 20261231000001;

/// A catalog an older courier stored for its `usercom` writer, on workspace `shop` of `t`:
/// connection `shop-usercom` (an `accept` header of its own, another header) and a rule per
/// operation, `consents` grouping 100 to a call, and `odd` naming no operation.
async fn store_old_catalog(pool: &sqlx::PgPool, t: &Target, key_var: &str) {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO connections (name, writer, base_url, api_key_env, headers, max_in_flight)
         VALUES ('shop-usercom', 'usercom', $1, $2, '{\"accept\": \"text/plain\", \"X-Shop\": \"a\"}', 2)
         RETURNING id",
    )
    .bind(t.workspace_url("shop"))
    .bind(key_var)
    .fetch_one(pool)
    .await
    .unwrap();
    for (name, path, per_call) in [
        ("customers", "user_upsert", 1),
        ("consents", " /user_attributes/", 100),
        ("mass", "mass_update_custom_attributes", 1),
        ("events", "event", 1),
        ("prices", "product_event/", 1),
        ("deals", "deal_upsert", 1),
        ("odd", "nonsense", 1),
    ] {
        sqlx::query(
            "INSERT INTO rules (name, connection_id, path, records_per_call) VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(id)
        .bind(path)
        .bind(per_call)
        .execute(pool)
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_catalog_stored_for_the_usercom_writer_becomes_the_preset_and_delivers() {
    const OLD_KEY_VAR: &str = "COURIER_TEST_OLD_USERCOM_KEY";
    // SAFETY: every value this binary writes to it is the same.
    unsafe { std::env::set_var(OLD_KEY_VAR, TOKEN) };
    let db = TestDb::migrated_before(PRESET_MIGRATION).await;
    let t = target(TargetConfig {
        rate: 1_000,
        ..TargetConfig::default()
    })
    .await;
    store_old_catalog(&db.pool, &t, OLD_KEY_VAR).await;
    courier::db::migrate(&db.pool).await.unwrap();
    the_old_catalog_is_the_presets(&db.pool).await;
    it_delivers_as_before(&db, &t).await;
}

/// A rule as the test reads it back: name, path, records per call, request, answer, paused.
type StoredRule = (String, String, i32, Option<Value>, Option<Value>, bool);

/// The catalog [`store_old_catalog`] left, once migrated: the preset's connection and
/// rules, with what was the catalog's own kept.
async fn the_old_catalog_is_the_presets(pool: &sqlx::PgPool) {
    let (writer, auth, headers): (String, Value, Value) =
        sqlx::query_as("SELECT writer, auth, headers FROM connections")
            .fetch_one(pool)
            .await
            .unwrap();
    let c = preset().connection(&json!({}));
    assert_eq!((writer.as_str(), &auth), ("http_json", &c["auth"]));
    // The connection's own Accept gives way to User.com's, as the writer's did.
    assert_eq!(headers, json!({"X-Shop": "a", "Accept": ACCEPT_VERSION_2}));
    let rules: Vec<StoredRule> = sqlx::query_as(
        "SELECT name, path, records_per_call, request, answer, paused FROM rules ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let names = ["customers", "consents", "mass", "events", "prices", "deals"];
    for ((name, path, _, request, answer, paused), (_, preset_name)) in rules.iter().zip(OPERATIONS)
    {
        let want = preset_rule(preset_name);
        assert!(names.contains(&name.as_str()) && !paused, "{name}");
        assert_eq!(path, want["path"].as_str().unwrap(), "{name}");
        assert_eq!(request.as_ref(), want.get("request"), "{name}");
        assert_eq!(answer.as_ref(), want.get("answer"), "{name}");
    }
    assert_eq!(rules[1].2, 100, "records per call kept");
    assert_eq!(
        (rules[6].0.as_str(), rules[6].1.as_str(), rules[6].5),
        ("odd", "nonsense", true),
        "a path that named no operation is paused, not sent"
    );
    // The schema takes the writer no more.
    let e = sqlx::query("UPDATE connections SET writer = 'usercom'")
        .execute(pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("connections_writer_check"), "{e}");
}

/// The migrated catalog delivers as before: users, consents grouped into a mass update (a
/// user the workspace does not know rejected as a 404), an event carrying its delivery id.
async fn it_delivers_as_before(db: &TestDb, t: &Target) {
    let users = (0..3)
        .map(|i| NewDelivery::new(format!("u:{i}"), json!({"custom_id": format!("c{i}")})))
        .collect();
    enqueue::enqueue_many(&db.pool, "customers", users)
        .await
        .unwrap();
    let e = engine(&db.pool, settings(&db.url));
    drive(&e).await;
    let consents = ["c0", "c1", "c2", "ghost"]
        .iter()
        .map(|id| {
            NewDelivery::new(
                format!("consent:{id}"),
                json!({"custom_id": id, "attributes": {"email_consent": false}}),
            )
        })
        .collect();
    enqueue::enqueue_many(&db.pool, "consents", consents)
        .await
        .unwrap();
    let event = NewDelivery::new("e:1", json!({"user_custom_id": "c0", "name": "order"}));
    let event_ids = enqueue::enqueue_many(&db.pool, "events", vec![event])
        .await
        .unwrap();
    drive(&e).await;
    let outcomes: Vec<(String, String, Option<i16>)> = sqlx::query_as(
        "SELECT d.record_key, d.status, (SELECT l.http_status FROM ledger l
           WHERE l.delivery_id = d.id ORDER BY l.id DESC LIMIT 1)
         FROM deliveries d ORDER BY d.id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let rejected: Vec<_> = outcomes.iter().filter(|o| o.1 != "delivered").collect();
    assert_eq!(
        rejected,
        [&("consent:ghost".to_owned(), "rejected".to_owned(), Some(404))],
        "{outcomes:?}"
    );
    let mass: Vec<_> = t
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                .ends_with("/users-by-id/mass_update_custom_attributes/")
        })
        .collect();
    assert_eq!(mass.len(), 1);
    assert_eq!(mass[0].method, "PUT");
    assert_eq!(
        mass[0].body,
        json!({"ids": ["c0", "c1", "c2", "ghost"], "attribute": "email_consent", "value": false})
    );
    assert_eq!(mass[0].headers["accept"], ACCEPT_VERSION_2);
    assert_eq!(mass[0].headers["authorization"], format!("Token {TOKEN}"));
    assert_eq!(t.accepted(&format!("event:{}", event_ids[0])), 1);
    let data = t.workspace_data("shop").unwrap();
    assert_eq!(data.store("users")["c2"]["email_consent"], json!(false));
}

/// A person erased by the shop's id of them: the preset's erase (`DELETE
/// users-by-id/{custom_id}/`) through the eraser removes the user from the workspace,
/// courier's copies of them go, and the other users stay.
#[tokio::test]
async fn an_erased_user_is_deleted_from_the_workspace() {
    // SAFETY: every value this binary writes to it is the same.
    unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    let db = TestDb::new().await;
    let t = target(TargetConfig::default()).await;
    let mut file: Value = serde_json::from_str(preset().text).unwrap();
    file["connections"][0]["base_url"] = json!(t.workspace_url("shop"));
    file["connections"][0]["api_key_env"] = json!(KEY_VAR);
    apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let users = (0..3).map(|k| {
        NewDelivery::new(
            format!("customer:{k}"),
            json!({"custom_id": format!("c{k}"), "email": format!("c{k}@example.com")}),
        )
    });
    enqueue::enqueue_many(&db.pool, "usercom-users", users.collect())
        .await
        .unwrap();
    let e = engine(&db.pool, erasing(&db.url));
    drive(&e).await;
    assert_eq!(t.counters().workspaces["shop"].stored["users"], 3);
    let person = courier::erasure::Person {
        external_id: Some("c1".into()),
        ..Default::default()
    };
    let id = erase(&e, &person).await;
    let (outcome, status) = erased_part(&db.pool, id).await;
    assert_eq!((outcome.as_str(), status), ("erased", Some(204)));
    assert_eq!(t.counters().workspaces["shop"].stored["users"], 2);
    let left: Vec<String> = sqlx::query_scalar("SELECT record_key FROM deliveries ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, ["customer:0", "customer:2"]);
}
