//! Several limits per budget and a rule's own budget, through the real chain: manual
//! clock, real PostgreSQL, real HTTP target.

use crate::common::*;
use chrono::Duration as Span;
use courier::{chain::ChainOutcome, enqueue, status};

#[tokio::test]
async fn a_spent_long_window_stops_the_batch_and_status_says_when_it_frees() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    sqlx::query("UPDATE connections SET limits = '{10/s,3/h}'")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let outcomes = drive(&engine).await;
    // Three calls fit the hour; the job stops, and the next one waits in the queue for
    // the window instead of holding a worker.
    assert_eq!(delivered(&db.pool).await, 3, "{outcomes:?}");
    let hour = engine.clock.now() + Span::minutes(59);
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, ChainOutcome::Rescheduled(t) if *t > hour)),
        "{outcomes:?}"
    );
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    let limits = &report.connections[0].limits;
    assert_eq!(
        limits.iter().map(|l| l.limit.as_str()).collect::<Vec<_>>(),
        ["10/s", "3/h"]
    );
    assert_eq!((limits[1].used, limits[1].spent), (Some(3), true));
    let frees = limits[1]
        .frees_at
        .expect("a spent window says when it frees");
    // The oldest call's minute bucket leaves the counted window (the hour and its
    // headroom) at the bucket's end: within a minute (and the slot's lead) after that.
    let headroom = courier::ratelimit::pacer::HEADROOM;
    let window = Span::milliseconds((3_600_000.0 * (1.0 + headroom)) as i64);
    let now = engine.clock.now();
    assert!(
        frees > now + window && frees <= now + window + Span::seconds(61),
        "{frees}"
    );
    assert!(!limits[0].spent && limits[0].used.is_none());

    // Past the window, the rest goes.
    engine.clock.advance(Span::minutes(65));
    drive(&engine).await;
    assert_eq!(delivered(&db.pool).await, 5);
}

#[tokio::test]
async fn a_rule_with_a_budget_of_its_own_is_blocked_apart_from_its_connection() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    sqlx::query("UPDATE rules SET budget_key = 'shop:orders-endpoint' WHERE name = 'orders'")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "orders", burst("o", 2))
        .await
        .unwrap();
    target.respond_with(429, Some("600"));
    drive(&engine).await;
    let keys: Vec<String> = sqlx::query_scalar("SELECT budget_key FROM connection_blocks")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(keys, ["shop:orders-endpoint"]);

    // The connection's own budget is free: the other rule delivers while orders waits.
    target.respond_with(200, None);
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    engine.clock.advance(Span::seconds(1));
    drive(&engine).await;
    assert_eq!(delivered(&db.pool).await, 3);
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    let state = |name: &str| {
        report
            .rules
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.state.clone())
            .unwrap()
    };
    assert_eq!(state("orders"), "throttled");
    assert_ne!(state("customers"), "throttled");
}

#[tokio::test]
async fn status_estimates_each_backlog_s_drain_at_its_share_of_the_pace() {
    let (db, _target) = shop(&["customers", "orders", "products"], 10, 1).await;
    sqlx::query("UPDATE connections SET limits = '{10/s,100000/day}'")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE rules SET weight = 3 WHERE name = 'orders'")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE rules SET records_per_call = 10 WHERE name = 'products'")
        .execute(&db.pool)
        .await
        .unwrap();
    for (rule, n) in [("customers", 30), ("orders", 60), ("products", 100)] {
        enqueue::enqueue_many(&db.pool, rule, burst(rule, n))
            .await
            .unwrap();
    }
    let engine = engine(&db.pool, settings(&db.url));
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    let drain = |name: &str| {
        report
            .rules
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| r.drain_secs)
            .unwrap()
    };
    // 10 calls a second shared 1 : 3 : 1; products carries 10 records a call.
    assert!(
        (drain("customers") - 30.0 / 2.0).abs() < 1e-6,
        "{}",
        drain("customers")
    );
    assert!(
        (drain("orders") - 60.0 / 6.0).abs() < 1e-6,
        "{}",
        drain("orders")
    );
    assert!(
        (drain("products") - 100.0 / 20.0).abs() < 1e-6,
        "{}",
        drain("products")
    );
}
