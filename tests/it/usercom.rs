//! The User.com writer against the local target: each operation's request (method, path,
//! headers, body) as the target recorded it, each response class mapped to its outcome,
//! and one end-to-end delivery through the engine on a real database.

use std::time::Duration;

use crate::common::{TestDb, drive, engine, settings};
use courier::{
    catalog::{self, Connection, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    writer::{
        Outgoing, WriteError,
        usercom::{ACCEPT_VERSION_2, UserComWriter},
    },
};
use courier_target::{Faults, RetryAfterMode, Target, TargetConfig, WorkspaceConfig};
use serde_json::{Value, json};

const TOKEN: &str = "test-token-0123456789";

#[test]
fn the_target_counts_appends_by_the_field_the_writer_fills() {
    // courier-target does not depend on the engine, so it keeps its own copy.
    assert_eq!(
        courier::writer::usercom::DELIVERY_ID_FIELD,
        courier_target::DELIVERY_ID_FIELD
    );
}

async fn target(config: TargetConfig) -> Target {
    Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
        ..config
    })
    .await
    .unwrap()
}

fn connection(base_url: String, timeout_ms: i32) -> Connection {
    Connection {
        id: 1,
        name: "shop-usercom".into(),
        writer: "usercom".into(),
        base_url,
        api_key_env: Some("UNUSED_HERE".into()),
        headers: json!({}),
        requests_per_minute: None,
        max_in_flight: 4,
        timeout_ms,
        budget_key: "connection:1".into(),
        ..Connection::default()
    }
}

fn writer(t: &Target, key: &str, timeout_ms: i32) -> UserComWriter {
    UserComWriter::new(
        &connection(t.workspace_url("shop"), timeout_ms),
        &reqwest::Client::new(),
        Some(key.into()),
    )
    .unwrap()
}

async fn write(w: &UserComWriter, id: i64, op: &str, payload: Value) -> Result<u16, WriteError> {
    w.write(Outgoing {
        delivery_id: id,
        record_key: "k",
        path: op,
        payload: &payload,
    })
    .await
    .map(|r| r.http_status.unwrap_or_default())
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
async fn bad_operations_and_payloads_are_permanent_and_send_nothing() {
    let t = target(TargetConfig::default()).await;
    let w = writer(&t, TOKEN, 5_000);
    for (op, payload, needle) in [
        (
            "users/",
            json!({"custom_id": "c"}),
            "unknown User.com operation",
        ),
        ("user_upsert", json!({"email": "x@y"}), "\"custom_id\""),
        ("event", json!({"user_custom_id": "c"}), "\"name\""),
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
async fn the_engine_delivers_through_a_usercom_connection() {
    // SAFETY: the only test in this binary that touches the environment, and every
    // value it writes is the same.
    unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    let db = TestDb::new().await;
    let t = target(TargetConfig::default()).await;
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "shop-usercom".into(),
            writer: "usercom".into(),
            base_url: t.workspace_url("shop"),
            api_key_env: Some(KEY_VAR.into()),
            headers: Default::default(),
            requests_per_minute: None,
            max_in_flight: Some(4),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .expect("the schema accepts the usercom writer");
    for (rule, op) in [("customers", "user_upsert"), ("prices", "product_event")] {
        catalog::upsert_rule(
            &db.pool,
            &NewRule {
                name: rule.into(),
                connection: "shop-usercom".into(),
                path: op.into(),
                batch_size: Some(10),
                max_attempts: Some(3),
                backoff_base_ms: None,
                backoff_max_ms: None,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    enqueue::enqueue_many(
        &db.pool,
        "customers",
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
        "prices",
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
