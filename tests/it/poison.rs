//! No row stops other work: extreme values a user may write by plain SQL into the
//! timestamp and number columns of a delivery, a rule, a connection or a block are handled
//! without a panic, and another rule on another connection keeps delivering.

use crate::common::*;
use courier::{enqueue, enqueue::NewDelivery};
use courier_target::Target;
use proptest::prelude::*;
use serde_json::json;

/// Timestamps PostgreSQL accepts that no chrono type can hold, and the edges of its range.
const TIMESTAMPS: &[&str] = &[
    "infinity",
    "-infinity",
    "290000-01-01 00:00:00+00",
    "294276-12-31 23:59:59+00",
    "0001-01-01 00:00:00+00",
    "4713-01-01 00:00:00+00 BC",
];

/// `(table, column, where)` of every timestamp a user may write that courier reads.
const TIMESTAMP_COLUMNS: &[(&str, &str)] = &[
    ("deliveries", "hold_until"),
    ("deliveries", "next_attempt_at"),
    ("deliveries", "created_at"),
    ("circuits", "open_until"),
    ("connection_blocks", "blocked_until"),
];

/// `(table, column, values)` of numbers a user may write, at the edges their checks allow.
const NUMBER_COLUMNS: &[(&str, &str, &[i64])] = &[
    ("deliveries", "attempts", &[0, i32::MAX as i64]),
    ("rules", "backoff_base_ms", &[1, i32::MAX as i64]),
    ("rules", "backoff_max_ms", &[i32::MAX as i64]),
    ("rules", "max_attempts", &[1, 1000]),
    ("rules", "batch_size", &[1, 10_000]),
    ("rules", "weight", &[1, 1000]),
    ("rules", "records_per_call", &[1, 1000]),
    ("connections", "requests_per_minute", &[1, i32::MAX as i64]),
    ("connections", "max_in_flight", &[1, 1000]),
    ("connections", "timeout_ms", &[1, 600_000]),
];

/// A poisoned `poisoned` rule on connection `shop` and a healthy `other` rule on its own
/// connection; returns after both were driven.
async fn poisoned_then_driven(poison: &str) {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["poisoned"], 10, 2).await;
    sqlx::raw_sql(
        "INSERT INTO connections (name, writer, base_url, requests_per_minute)
         SELECT 'elsewhere', writer, base_url, requests_per_minute FROM connections;
         INSERT INTO rules (name, connection_id, path)
         SELECT 'other', id, 'other/' FROM connections WHERE name = 'elsewhere'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let poisoned = (0..3)
        .map(|i| NewDelivery::new(format!("p:{i}"), json!({ "n": i })))
        .collect();
    enqueue::enqueue_many(&db.pool, "poisoned", poisoned)
        .await
        .unwrap();
    // A block row to poison (on the poisoned connection's budget).
    sqlx::query(
        "INSERT INTO connection_blocks (budget_key, blocked_until, set_at)
         SELECT courier_budget_key(c), now() - interval '1 hour', now()
         FROM connections c WHERE c.name = 'shop'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(poison.to_owned()))
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{poison}: {e}"));
    let ids = (0..20)
        .map(|i| NewDelivery::new(format!("o:{i}"), json!({ "n": i })))
        .collect();
    enqueue::enqueue_many(&db.pool, "other", ids).await.unwrap();

    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    courier::status::report(&db.pool, engine.clock.now())
        .await
        .unwrap_or_else(|e| panic!("status after {poison}: {e}"));
    let other_delivered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries d JOIN rules r ON r.id = d.rule_id
         WHERE r.name = 'other' AND d.status = 'delivered'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(other_delivered, 20, "after {poison}");
}

fn timestamp_poison() -> impl Strategy<Value = String> {
    (
        prop::sample::select(TIMESTAMP_COLUMNS),
        prop::sample::select(TIMESTAMPS),
    )
        .prop_map(|((table, column), value)| {
            let scope = match table {
                "deliveries" => "WHERE rule_id = (SELECT id FROM rules WHERE name = 'poisoned')",
                "circuits" => {
                    "WHERE connection_id = (SELECT id FROM connections WHERE name = 'shop')"
                }
                _ => "",
            };
            let extra = if table == "circuits" {
                ", state = 'open'"
            } else {
                ""
            };
            format!("UPDATE {table} SET {column} = '{value}'{extra} {scope}")
        })
}

fn number_poison() -> impl Strategy<Value = String> {
    prop::sample::select(NUMBER_COLUMNS).prop_flat_map(|(table, column, values)| {
        prop::sample::select(values).prop_map(move |v| {
            let scope = match table {
                "deliveries" => "WHERE rule_id = (SELECT id FROM rules WHERE name = 'poisoned')",
                "rules" => "WHERE name = 'poisoned'",
                _ => "WHERE name = 'shop'",
            };
            // The cap must stay at least the base for the table's own check.
            let fix = if column == "backoff_base_ms" {
                format!(", backoff_max_ms = GREATEST(backoff_max_ms, {v})")
            } else {
                String::new()
            };
            format!("UPDATE {table} SET {column} = {v}{fix} {scope}")
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn extreme_timestamps_stop_nothing(poison in timestamp_poison()) {
        tokio::runtime::Runtime::new().unwrap().block_on(poisoned_then_driven(&poison));
    }

    #[test]
    fn extreme_numbers_stop_nothing(poison in number_poison()) {
        tokio::runtime::Runtime::new().unwrap().block_on(poisoned_then_driven(&poison));
    }
}

#[tokio::test]
async fn a_delivery_held_until_infinity_is_held_not_panicked_over() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["customers"], 10, 1).await;
    let id = enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:1", json!({})))
        .await
        .unwrap();
    sqlx::query("UPDATE deliveries SET hold_until = 'infinity'")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    assert_eq!(ledger(&db.pool, id).await, vec![("held".to_string(), 0)]);
    let next: String = sqlx::query_scalar("SELECT next_attempt_at::text FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(next.starts_with("9999-12-31"), "{next}");
}
