//! One clock for the fleet: processes on hosts whose wall clocks disagree (played by
//! [`Clock::skewed`]) keep time by the database's clock, so beats, leases, blocks and the
//! budget's slots mean the same to all of them.

use std::{sync::Arc, time::Duration};

use crate::common::*;
use chrono::{Duration as Span, Utc};
use courier::{
    clock::Clock,
    enqueue,
    maintenance::{heartbeat::Heartbeat, rescuer::Rescuer},
    ratelimit::limits::Limit,
    status,
    worker::{self, Engine},
};

/// An engine whose host's wall clock is off by `skew`, synced to the database as a
/// worker's first beat does.
async fn skewed(db: &TestDb, skew: Span) -> Arc<Engine> {
    let engine = Arc::new(Engine::with_clock(
        db.pool.clone(),
        settings(&db.url),
        Clock::skewed(skew),
    ));
    Heartbeat::new(&engine).run_once().await.unwrap();
    engine
}

#[tokio::test]
async fn hosts_an_hour_apart_keep_one_time_and_see_each_other_alive() {
    let db = TestDb::new().await;
    let ahead = skewed(&db, Span::hours(1)).await;
    let behind = skewed(&db, -Span::hours(1)).await;
    let db_now: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    for e in [&ahead, &behind] {
        let gap = (e.clock.now() - db_now).abs();
        assert!(gap < Span::milliseconds(200), "{gap} off the database");
    }
    // Each sees the other's beat as fresh: neither rescuer judges anyone dead.
    for e in [&ahead, &behind] {
        let rescued = Rescuer::new(e).run_once().await.unwrap();
        assert!(rescued.resumed.is_empty(), "{rescued:?}");
    }
    // The offsets are shown per worker.
    let now = Clock::synced(&db.pool).await.unwrap().now();
    let report = status::report(&db.pool, now).await.unwrap();
    let mut offsets: Vec<f64> = report
        .workers
        .iter()
        .map(|w| w.clock_offset_ms.expect("measured"))
        .collect();
    offsets.sort_by(f64::total_cmp);
    assert_eq!(offsets.len(), 2, "{:?}", report.workers);
    assert!((offsets[0] + 3_600_000.0).abs() < 200.0, "{offsets:?}");
    assert!((offsets[1] - 3_600_000.0).abs() < 200.0, "{offsets:?}");
}

#[tokio::test]
async fn slots_booked_by_hosts_an_hour_apart_are_spaced_as_one_budget() {
    let db = TestDb::new().await;
    let a = skewed(&db, Span::hours(1)).await;
    let b = skewed(&db, -Span::minutes(59)).await;
    let ask = |e: Arc<Engine>, rule: i64| async move {
        let mut slots = Vec::new();
        for _ in 0..10 {
            slots.push(
                e.pacer
                    .acquire("ws:shared", &[Limit::per_minute(600)], 0, rule, 1)
                    .await
                    .unwrap()
                    .at,
            );
        }
        slots
    };
    let (s1, s2) = tokio::join!(ask(a.clone(), 1), ask(b.clone(), 2));
    let mut all: Vec<_> = [s1, s2].concat();
    all.sort();
    for pair in all.windows(2) {
        assert!(
            pair[1] - pair[0] >= Span::milliseconds(100),
            "slots closer than the interval: {pair:?}"
        );
    }
    // Twenty slots at 10/s: the next two seconds of the database's clock, which both
    // processes wait for by their own reading of it.
    let db_now: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    for (e, slot) in [(&a, all[0]), (&b, all[0]), (&a, all[19]), (&b, all[19])] {
        let wait = slot - e.clock.now();
        assert!(wait < Span::seconds(4), "a slot {wait} ahead");
    }
    assert!(*all.last().unwrap() - db_now < Span::seconds(4));
}

#[tokio::test]
async fn two_workers_whose_clocks_are_an_hour_apart_deliver_everything_once() {
    two_workers_deliver_everything_once(Span::hours(1), -Span::hours(1)).await;
}

#[tokio::test]
async fn two_workers_whose_clocks_are_a_second_apart_deliver_everything_once() {
    two_workers_deliver_everything_once(Span::zero(), -Span::seconds(1)).await;
}

#[tokio::test]
async fn two_workers_whose_clocks_are_20_s_apart_deliver_everything_once() {
    two_workers_deliver_everything_once(Span::seconds(20), Span::zero()).await;
}

/// Two worker processes whose hosts' clocks are off by `first` and `second` share three
/// rules of 40 records on one budget: every record is delivered, each in one call.
async fn two_workers_deliver_everything_once(first: Span, second: Span) {
    let rules = ["customers", "prices", "consents"];
    let (db, target) = shop(&rules, 20, 3).await;
    sqlx::query("UPDATE connections SET requests_per_minute = 1200")
        .execute(&db.pool)
        .await
        .unwrap();
    for rule in rules {
        enqueue::enqueue_many(&db.pool, rule, burst(rule, 40))
            .await
            .unwrap();
    }
    let mut handles = Vec::new();
    let mut engines = Vec::new();
    for skew in [first, second] {
        let engine = Arc::new(Engine::with_clock(
            db.pool.clone(),
            settings(&db.url),
            Clock::skewed(skew),
        ));
        handles.push(tokio::spawn(worker::run(engine.clone())));
        engines.push(engine);
    }
    let pool = db.pool.clone();
    within(Duration::from_secs(60), "all 120 delivered", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 120 }
    })
    .await;
    // Each record reached the target once: no live worker's job was taken for a dead one's.
    let mut records: Vec<String> = target
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.path, r.body))
        .collect();
    let calls = records.len();
    records.sort();
    records.dedup();
    assert_eq!(
        (calls, records.len()),
        (120, 120),
        "calls, distinct records"
    );
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'running', 'waiting')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(failed, 0, "runs that failed or were taken for stalled");
    for e in &engines {
        e.shutdown.cancel();
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
}
