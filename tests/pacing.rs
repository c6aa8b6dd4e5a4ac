//! Pacing against the declared rate: one budget per connection or budget key, shared by
//! rules and by worker processes, one slot per writer call, fair between rules.

mod common;

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Duration as Span, Utc};
use common::*;
use courier::chain::JobOutcome;
use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
    status,
    worker::{self, Engine},
};
use courier_target::Target;
use serde_json::json;

async fn set_rate(pool: &sqlx::PgPool, rpm: i32) {
    sqlx::query("UPDATE connections SET requests_per_minute = $1")
        .bind(rpm)
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn each_call_takes_one_slot_and_suppressed_or_held_take_none() {
    let (db, target) = shop(&["customers"], 50, 4).await;
    set_rate(&db.pool, 600).await;
    let engine = engine(&db.pool, settings(&db.url));
    let mut held = NewDelivery::new("c:held", json!({}));
    held.hold_until = Some(engine.clock.now() + Span::hours(1));
    let mut input = vec![NewDelivery::new("c:1", json!({"v": 1})), held];
    input.extend(burst("c", 4)); // c:0 .. c:3; c:1 supersedes the first delivery
    enqueue::enqueue_many(&db.pool, "customers", input)
        .await
        .unwrap();
    drive(&engine).await;
    let key: String = sqlx::query_scalar("SELECT courier_budget_key(c) FROM connections c")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(target.counters().requests, 4);
    assert_eq!(
        engine.pacer.granted(&key),
        4,
        "one slot per call, none for suppressed or held"
    );
    let used: i64 = sqlx::query_scalar("SELECT sum(calls) FROM budget_calls")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(used, 4);
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    assert_eq!(report.connections[0].requests_per_minute, 600);
    assert_eq!(report.connections[0].used_last_minute, 4);
}

#[tokio::test]
async fn slots_are_spaced_across_processes_and_budgets_are_independent() {
    let db = TestDb::new().await;
    let a = engine(&db.pool, settings(&db.url));
    let b = engine(&db.pool, settings(&db.url));
    // Two processes, two rules each, all asking at once on one budget at 600/min.
    let ask = |e: Arc<Engine>, rule: i64| async move {
        let mut slots = Vec::new();
        for _ in 0..15 {
            slots.push(e.pacer.acquire("ws:shared", 600, rule, 1).await.unwrap());
        }
        slots
    };
    let (s1, s2, s3, s4) = tokio::join!(
        ask(a.clone(), 1),
        ask(a.clone(), 2),
        ask(b.clone(), 1),
        ask(b.clone(), 2)
    );
    let mut all: Vec<_> = [s1, s2, s3, s4].concat();
    all.sort();
    assert_eq!(all.len(), 60);
    for pair in all.windows(2) {
        assert!(
            pair[1] - pair[0] >= Span::milliseconds(100),
            "slots closer than the interval: {pair:?}"
        );
    }
    // Another budget key is not held back by the first one.
    let other = a.pacer.acquire("ws:other", 600, 1, 1).await.unwrap();
    let first = Span::from_std(courier::pacer::FIRST_LOOKAHEAD).unwrap();
    assert!(
        other <= a.clock.now() + first + Span::milliseconds(1),
        "{other} vs {}",
        a.clock.now()
    );
}

#[tokio::test]
async fn a_block_holds_every_connection_of_its_budget_key_in_every_process() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    for (name, key) in [
        ("x", Some("workspace-1")),
        ("y", Some("workspace-1")),
        ("z", None),
    ] {
        catalog::upsert_connection(
            &db.pool,
            &NewConnection {
                name: name.into(),
                writer: "http_json".into(),
                base_url: target.url(),
                budget_key: key.map(Into::into),
                requests_per_minute: Some(600_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        catalog::upsert_rule(
            &db.pool,
            &NewRule {
                name: format!("rule-{name}"),
                connection: name.into(),
                path: format!("{name}/"),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    let first = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "rule-x", burst("x", 2))
        .await
        .unwrap();
    target.respond_with(429, Some("120"));
    drive(&first).await;
    target.respond_with(200, None);

    // A second worker process: it starts nothing on connection y (same workspace), and
    // delivers on z (its own budget).
    let second = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "rule-y", burst("y", 2))
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "rule-z", burst("z", 2))
        .await
        .unwrap();
    drive(&second).await;
    let delivered: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.name, count(*) FROM deliveries d JOIN rules r ON r.id = d.rule_id
         WHERE d.status = 'delivered' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(delivered, vec![("rule-z".to_string(), 2)]);
    let report = status::report(&db.pool, second.clock.now()).await.unwrap();
    let states: Vec<(&str, &str, Option<&str>)> = report
        .rules
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.state.as_str(),
                r.blocked_by_rule.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("rule-x", "waiting", Some("rule-x")),
            ("rule-y", "throttled", Some("rule-x")),
            ("rule-z", "idle", None)
        ]
    );
}

#[tokio::test]
async fn rules_with_equal_backlogs_share_the_budget_evenly() {
    let (db, target) = shop(&["customers", "prices"], 25, 8).await;
    set_rate(&db.pool, 3_000).await; // 50 calls/s
    // The first rule's backlog is in first; the second one's follows.
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 300))
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "prices", burst("p", 300))
        .await
        .unwrap();
    let engine = Arc::new(Engine::new(db.pool.clone(), settings(&db.url)));
    let handle = tokio::spawn(worker::run(engine.clone()));
    let t = target.clone();
    eventually("120 calls made", || {
        let t = t.clone();
        async move { t.counters().requests >= 120 }
    })
    .await;
    let counters = target.counters();
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
    let a = counters.paths.get("/customers/").copied().unwrap_or(0) as f64;
    let b = counters.paths.get("/prices/").copied().unwrap_or(0) as f64;
    let share = a / (a + b);
    assert!(
        (0.4..=0.6).contains(&share),
        "customers got {a}, prices {b}"
    );
}

#[tokio::test]
async fn a_short_wait_goes_through_the_real_queue_and_resumes_the_same_run() {
    // The apalis path of a sat-out wait: the next job is queued for the block's end and a
    // real worker picks it up then. If an apalis upgrade breaks scheduled jobs, this fails.
    let (db, target) = shop(&["customers"], 10, 1).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("1"));
    // The queue's safety-net poll is a minute: only the wake-up the waiting process sends
    // on apalis' insert channel at the block's end can resume the chain within seconds.
    let mut s = settings(&db.url);
    s.queue_poll = Duration::from_secs(60);
    let engine = Arc::new(Engine::new(db.pool.clone(), s));
    let handle = tokio::spawn(worker::run(engine.clone()));
    let pool = db.pool.clone();
    eventually("the run waiting, its next job scheduled", || {
        let pool = pool.clone();
        async move {
            let row: Option<(String, bool)> = sqlx::query_as(
                "SELECT r.status, EXISTS (SELECT 1 FROM apalis.jobs j WHERE j.status = 'Pending'
                                          AND j.run_at > now() - interval '1 second')
                 FROM runs r",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            matches!(row, Some((ref s, true)) if s == "waiting")
        }
    })
    .await;
    target.respond_with(200, None);
    // A 1 s block: the run resumes within seconds, not at the next poll or heartbeat.
    within(
        Duration::from_secs(10),
        "all delivered by the same run",
        || {
            let pool = pool.clone();
            async move {
                let (delivered, runs, status): (i64, i64, String) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered'),
                        (SELECT count(*) FROM runs), (SELECT max(status) FROM runs)",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                delivered == 3 && runs == 1 && status == "completed"
            }
        },
    )
    .await;
    let attempts: Vec<i32> = sqlx::query_scalar("SELECT attempts FROM deliveries ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, vec![1, 1, 1], "the 429 spent no attempt");
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

/// The budget's key (the tests' one connection).
async fn budget_key(pool: &sqlx::PgPool) -> String {
    sqlx::query_scalar("SELECT courier_budget_key(c) FROM connections c")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Declared, learned and effective rate as the view `budget_rates` shows them now... at
/// `at` (the engine's manual clock), through the same SQL functions.
async fn rates(pool: &sqlx::PgPool, key: &str, at: DateTime<Utc>) -> (i32, Option<f64>, f64) {
    sqlx::query_as(
        "SELECT declared_rpm,
                courier_learned_rpm(learned_rpm, learned_at, ceiling_rpm, declared_rpm, $2),
                courier_effective_rpm(declared_rpm, learned_rpm, learned_at, ceiling_rpm,
                                      advertised_rpm, advertised_at, $2)
         FROM budgets WHERE budget_key = $1",
    )
    .bind(key)
    .bind(at)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `n` more deliveries answered 200, then the clock moves `secs` on.
async fn accepted_for(engine: &Arc<Engine>, target: &Target, prefix: &str, n: usize, secs: i64) {
    target.respond_with(200, None);
    enqueue::enqueue_many(&engine.pool, "customers", burst(prefix, n))
        .await
        .unwrap();
    drive(engine).await;
    engine.clock.advance(Span::seconds(secs));
}

/// One delivery answered 429 (`retry-after: 1`); the clock stays inside the block.
async fn refused(engine: &Arc<Engine>, target: &Target, prefix: &str) {
    target.respond_with(429, Some("1"));
    enqueue::enqueue_many(&engine.pool, "customers", burst(prefix, 1))
        .await
        .unwrap();
    drive(engine).await;
}

/// One delivery answered 429 (`retry-after: 1`), then the clock moves past the block.
async fn one_429(engine: &Arc<Engine>, target: &Target, prefix: &str) {
    refused(engine, target, prefix).await;
    engine.clock.advance(Span::milliseconds(1_100));
}

#[tokio::test]
async fn requests_that_stopped_waiting_book_no_slots() {
    use futures::FutureExt;
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let start = e.clock.now();
    // A batch of ten calls asks for slots and is stopped at once (a 429 met by another
    // call): their requests go away before the first lease comes back.
    for _ in 0..10 {
        assert!(e.pacer.acquire("ws:k", 600, 1, 1).now_or_never().is_none());
    }
    // The next call gets a slot right after the first slice (2 slots at 600/min), not
    // after ten slots booked for calls that were never made.
    let slot = e.pacer.acquire("ws:k", 600, 1, 1).await.unwrap();
    let interval = Span::from_std(courier::pacer::emission_interval(600)).unwrap();
    assert!(
        slot <= start + interval * 3,
        "slot {} after the start, interval {interval}",
        slot - start
    );
}

#[tokio::test]
async fn a_call_let_go_late_holds_the_next_one_back_by_most_of_an_interval() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let interval = courier::pacer::emission_interval(600);
    // Unknown budget: nothing to space from.
    assert_eq!(e.pacer.spaced("ws:k"), e.clock.now());
    e.pacer.acquire("ws:k", 600, 1, 1).await.unwrap();
    let first = e.pacer.spaced("ws:k");
    assert_eq!(first, e.clock.now());
    // The next slot came right away (the first call went late): held back.
    e.clock.advance(Span::from_std(interval / 2).unwrap());
    let min_gap = interval.mul_f64(courier::pacer::MIN_GAP_SHARE);
    let second = e.pacer.spaced("ws:k");
    assert_eq!((second - first).to_std().unwrap(), min_gap);
    assert!(min_gap < interval && min_gap > interval.mul_f64(1.0 - courier::pacer::HEADROOM));
    // On schedule, nothing is held back.
    e.clock.advance(Span::from_std(interval * 2).unwrap());
    assert_eq!(e.pacer.spaced("ws:k"), e.clock.now());
}

#[tokio::test]
async fn a_process_first_slice_on_a_budget_is_spaced_wider_until_it_has_called() {
    use courier::pacer::{IDLE_AFTER, cold_interval_for, interval_for};
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let slot = || e.pacer.acquire("ws:k", 600, 1, 1);
    let gap = |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).to_std().unwrap();
    // No call of this process on the budget yet: its first calls go out cold, their slots
    // (a slice of two at 600/min) 5% further apart.
    let (a, b) = (slot().await.unwrap(), slot().await.unwrap());
    assert_eq!(gap(a, b), cold_interval_for(600.0));
    assert!(cold_interval_for(600.0) > interval_for(600.0).mul_f64(1.04));
    // Once it has called, the next slice is spaced at the rate.
    e.pacer.spaced("ws:k");
    let (c, d) = (slot().await.unwrap(), slot().await.unwrap());
    assert_eq!(gap(c, d), interval_for(600.0));
    assert!(c >= b + Span::from_std(cold_interval_for(600.0)).unwrap());
    // Idle for longer than IDLE_AFTER: cold again.
    e.pacer.spaced("ws:k");
    e.clock
        .advance(Span::from_std(IDLE_AFTER).unwrap() + Span::seconds(1));
    let (f, g) = (slot().await.unwrap(), slot().await.unwrap());
    assert_eq!(gap(f, g), cold_interval_for(600.0));
}

#[tokio::test]
async fn a_call_answered_slowly_holds_the_next_one_back_by_its_lateness() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let interval = courier::pacer::emission_interval(600);
    let min_gap = interval.mul_f64(courier::pacer::MIN_GAP_SHARE);
    let ms = std::time::Duration::from_millis;
    e.pacer.acquire("ws:k", 600, 1, 1).await.unwrap();
    // Calls answering in 1 ms: the quickest trip.
    let mut go = e.pacer.spaced("ws:k");
    for _ in 0..3 {
        e.pacer.returned("ws:k", go, ms(1));
        e.clock.advance(Span::from_std(ms(10)).unwrap());
        let next = e.pacer.spaced("ws:k");
        assert_eq!((next - go).to_std().unwrap(), min_gap, "no lateness");
        go = next;
    }
    // One answering in 4 ms may have arrived 3 ms late: the next waits 3 ms more.
    e.pacer.returned("ws:k", go, ms(4));
    let next = e.pacer.spaced("ws:k");
    assert_eq!((next - go).to_std().unwrap(), min_gap + ms(3) - ms(3) / 256);
    // The lateness counts once, for the call right after; and never beyond 5% of the
    // interval.
    e.pacer.returned("ws:k", next, ms(500));
    let after = e.pacer.spaced("ws:k");
    assert_eq!(
        (after - next).to_std().unwrap(),
        min_gap + interval.mul_f64(courier::pacer::MAX_LATE_SHARE)
    );
    // An answer of a call that is no longer the latest holds nothing back.
    e.pacer.returned("ws:k", go, ms(50));
    let last = e.pacer.spaced("ws:k");
    assert_eq!((last - after).to_std().unwrap(), min_gap);
}

#[tokio::test]
async fn a_sporadic_429_costs_a_percent_of_the_pace_not_half() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 600).await;
    let engine = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // 98 calls accepted over 10 s (98% of 10/s), then one 429.
    accepted_for(&engine, &target, "a", 98, 10).await;
    one_429(&engine, &target, "b").await;
    let (declared, learned, effective) = rates(&db.pool, &key, engine.clock.now()).await;
    assert_eq!(declared, 600);
    let learned = learned.expect("a 429 teaches the budget");
    assert!((590.0..600.0).contains(&learned), "{learned}");
    assert_eq!(effective, learned);
    assert_eq!(engine.pacer.effective_rpm(&key), Some(learned));
    // The process's next slots are spaced at the learned rate, no wider.
    let a = engine.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    let b = engine.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    let gap = (b - a).to_std().unwrap();
    assert_eq!(gap, courier::pacer::interval_for(learned), "{a} {b}");
    assert!(gap < std::time::Duration::from_millis(105), "{gap:?}");
    // The 429 cost no attempt and no failure.
    let attempts: i64 = sqlx::query_scalar("SELECT sum(attempts) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        attempts, 98,
        "the delivery that met the 429 spent no attempt"
    );
}

#[tokio::test]
async fn a_rate_declared_five_times_too_high_is_corrected_by_one_429() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 3_000).await; // 50/s declared
    let engine = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // The target accepts 10 in its second, then answers 429.
    accepted_for(&engine, &target, "a", 10, 1).await;
    one_429(&engine, &target, "b").await;
    let (_, learned, effective) = rates(&db.pool, &key, engine.clock.now()).await;
    assert_eq!(
        learned,
        Some(600.0),
        "what the target let through per second"
    );
    assert_eq!(effective, 600.0);
    // The pace holds there while the target keeps accepting it.
    accepted_for(&engine, &target, "c", 50, 5).await;
    assert_eq!(rates(&db.pool, &key, engine.clock.now()).await.2, 600.0);
}

/// How far past `slot` the shared budget is booked (its `tat`).
async fn booked(pool: &sqlx::PgPool, key: &str, slot: DateTime<Utc>) -> Duration {
    let tat: DateTime<Utc> = sqlx::query_scalar("SELECT tat FROM budgets WHERE budget_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap();
    (tat - slot).to_std().unwrap()
}

#[tokio::test]
async fn a_process_taking_over_after_a_cut_books_a_quarter_second_at_the_new_pace() {
    use courier::pacer::{cold_interval_for, slice_len};
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 6_000).await; // 100/s declared
    let first = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // Another process has paced the budget at the declared rate: a quarter second's slots.
    let other = engine(&db.pool, settings(&db.url));
    let a = other.pacer.acquire(&key, 6_000, 1, 1).await.unwrap();
    assert_eq!(
        booked(&db.pool, &key, a).await,
        cold_interval_for(6_000.0) * 25
    );
    // The target lets 10 a second through: one 429 cuts the rate to 600/min. (Later than
    // the idle time: the stretch the 429 measures starts afresh.)
    other.clock.advance(Span::seconds(10));
    first.clock.advance(Span::seconds(10));
    accepted_for(&first, &target, "a", 10, 1).await;
    one_429(&first, &target, "b").await;
    assert_eq!(rates(&db.pool, &key, first.clock.now()).await.2, 600.0);
    // The run moves on to the other process (its job fetched there after the block): it
    // books a quarter second at 600/min, not 25 slots (4 s) as at its last lease.
    other.clock.advance(first.clock.now() - other.clock.now());
    let b = other.pacer.acquire(&key, 6_000, 1, 1).await.unwrap();
    assert_eq!(slice_len(600.0), 2);
    assert_eq!(
        booked(&db.pool, &key, b).await,
        cold_interval_for(600.0) * 2
    );
    // So does a process that never leased on the budget.
    let fresh = engine(&db.pool, settings(&db.url));
    fresh
        .clock
        .advance(first.clock.now() - fresh.clock.now() + Span::seconds(1));
    let c = fresh.pacer.acquire(&key, 6_000, 1, 1).await.unwrap();
    assert_eq!(
        booked(&db.pool, &key, c).await,
        cold_interval_for(600.0) * 2
    );
    assert_eq!(fresh.pacer.effective_rpm(&key), Some(600.0));
    // The SQL formula the lease books by is the Rust one.
    for rpm in [
        0.0, 1.0, 239.9, 240.0, 479.99, 480.0, 6_000.0, 11_999.0, 12_000.0, 1e6,
    ] {
        let sql: i32 = sqlx::query_scalar("SELECT courier_slice_len($1)")
            .bind(rpm)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(sql as u32, slice_len(rpm), "{rpm}");
    }
}

/// How the budget's learned rate was set last (`budget_rates.learned_by`).
async fn learned_by(pool: &sqlx::PgPool, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT learned_by FROM budget_rates WHERE budget_key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_bucket_declared_twice_too_high_is_found_by_what_it_lets_through_between_429s() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 1_200).await; // 20/s declared; a bucket of 10 refilling at 10/s
    let engine = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // From idle the bucket lets 21 through in a second at the pace: a sporadic 429.
    accepted_for(&engine, &target, "a", 21, 1).await;
    one_429(&engine, &target, "b").await;
    assert_eq!(
        learned_by(&db.pool, &key).await.as_deref(),
        Some("sporadic")
    );
    // Refilled by the 1 s block, it lets 21 through in the next second again: 21 between
    // the two refusals, 2 s apart, is its rate, 10.5/s; a fast probe climbs back up.
    accepted_for(&engine, &target, "c", 21, 1).await;
    one_429(&engine, &target, "d").await;
    assert_eq!(learned_by(&db.pool, &key).await.as_deref(), Some("between"));
    let (_, learned, _) = rates(&db.pool, &key, engine.clock.now()).await;
    let between = learned.expect("learned");
    // About 21 over 2 s (the clock stands still while the calls go): far below the 20/s
    // paced, above the half of it.
    assert!((600.0..700.0).contains(&between), "{between}");
    let soon = engine.clock.now() + Span::seconds(2);
    let probed = rates(&db.pool, &key, soon).await.2;
    assert!(probed > between * 1.2, "probing up: {probed}");
    // The probe meets the bucket's 429 with the same let through between refusals: a
    // bucket's rate, held without a probe.
    accepted_for(&engine, &target, "e", 21, 1).await;
    one_429(&engine, &target, "f").await;
    assert_eq!(learned_by(&db.pool, &key).await.as_deref(), Some("bucket"));
    let (_, learned, _) = rates(&db.pool, &key, engine.clock.now()).await;
    let bucket = learned.expect("learned");
    assert!(
        (bucket - between).abs() < 0.1 * between,
        "{bucket} {between}"
    );
    let later = engine.clock.now() + Span::seconds(30);
    assert_eq!(rates(&db.pool, &key, later).await.2, bucket, "no probe");
}

#[tokio::test]
async fn a_bucket_declared_five_times_too_high_is_found_by_its_second_429() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 3_000).await; // 50/s declared; a bucket of 10 refilling at 10/s
    let engine = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // From idle the bucket lets its 10 and a little refill through: 12 in the first
    // second, measured as the limit.
    accepted_for(&engine, &target, "a", 12, 1).await;
    one_429(&engine, &target, "b").await;
    assert_eq!(
        learned_by(&db.pool, &key).await.as_deref(),
        Some("measured")
    );
    assert_eq!(
        rates(&db.pool, &key, engine.clock.now()).await.1,
        Some(720.0)
    );
    // Refilled by the block, the bucket hides the 2/s excess for 6 s: 70 accepted, about
    // the pace, but over block and stretch (7 s) its refill, 10/s. Taken, and held.
    accepted_for(&engine, &target, "c", 70, 6).await;
    one_429(&engine, &target, "d").await;
    assert_eq!(learned_by(&db.pool, &key).await.as_deref(), Some("bucket"));
    let (_, learned, _) = rates(&db.pool, &key, engine.clock.now()).await;
    // 71 (the 70 and the delivery refused before) over 7 s: the leases start where the
    // manual clock stands, however slow the database's round trip.
    let bucket = learned.expect("learned");
    assert!((600.0..=610.0).contains(&bucket), "{bucket}");
    let later = engine.clock.now() + Span::seconds(30);
    assert_eq!(rates(&db.pool, &key, later).await.2, bucket, "no probe");
}

#[tokio::test]
async fn the_stretch_a_429_measures_starts_when_the_block_before_it_ends() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 600).await;
    let engine = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    accepted_for(&engine, &target, "a", 10, 1).await;
    refused(&engine, &target, "b").await;
    // A lease made while the block holds (a call that was already waiting for its slot)
    // books slots after the block, and the stretch starts there: the block's second is
    // counted once, as the block between the refusals, not again as the stretch's.
    let during = engine.clock.now();
    engine.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    let (since, block_end): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT accepted_since, learned_at FROM budgets WHERE budget_key = $1")
            .bind(&key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let block_end = block_end.expect("the 429 set its block's end");
    assert!(block_end > during, "{block_end} {during}");
    assert_eq!(since, Some(block_end));
}

#[tokio::test]
async fn a_process_started_later_begins_at_the_learned_rate_which_probes_back_up() {
    let (db, target) = shop(&["customers"], 100, 1).await;
    set_rate(&db.pool, 600).await;
    let first = engine(&db.pool, settings(&db.url));
    let key = budget_key(&db.pool).await;
    // Nothing accepted before either 429 (a limiter without burst refusing at once): a
    // lone one costs 1%, the next one halves the pace.
    one_429(&first, &target, "a").await;
    let (_, learned, _) = rates(&db.pool, &key, first.clock.now()).await;
    assert_eq!(learned, Some(600.0 * courier::learned::LONE_CUT));
    one_429(&first, &target, "b").await;
    let expected = 600.0 * courier::learned::LONE_CUT * courier::learned::NO_BURST_CUT;
    let (_, learned, _) = rates(&db.pool, &key, first.clock.now()).await;
    assert_eq!(learned, Some(expected));

    let second = engine(&db.pool, settings(&db.url));
    second.clock.advance(first.clock.now() - second.clock.now());
    let a = second.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    let b = second.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    assert_eq!(
        (b - a).to_std().unwrap(),
        courier::pacer::cold_interval_for(expected),
        "the new process paces at the learned rate from its first (cold) lease"
    );
    assert_eq!(second.pacer.effective_rpm(&key), Some(expected));
    let report = status::report(&db.pool, second.clock.now()).await.unwrap();
    assert_eq!(report.connections[0].learned_rpm, Some(expected));
    assert_eq!(report.connections[0].effective_rpm, expected);
    assert!(report.connections[0].last_429_at.is_some());

    // Half a second after the block it probes up fast towards the pace refused (less 3%), holds
    // there through the quiet period, then probes on slowly and is forgotten at the
    // declared rate.
    let (learned_at, ceiling): (DateTime<Utc>, Option<f64>) =
        sqlx::query_as("SELECT learned_at, ceiling_rpm FROM budgets WHERE budget_key = $1")
            .bind(&key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let ceiling = ceiling.expect("a halved pace probes back up");
    assert_eq!(
        ceiling,
        600.0 * courier::learned::LONE_CUT * courier::learned::RECENT_CUT
    );
    let after = |ms: i64| learned_at + Span::milliseconds(ms);
    let hold_ms = (courier::learned::FAST_HOLD * 1e3) as i64;
    assert_eq!(
        rates(&db.pool, &key, after(hold_ms)).await.1,
        Some(expected)
    );
    let climbing = rates(&db.pool, &key, after(hold_ms + 2_000))
        .await
        .1
        .unwrap();
    let grown = (2.0 * courier::learned::FAST_PROBE_PER_SECOND).exp();
    assert!((climbing - expected * grown).abs() < 1e-6, "{climbing}");
    assert_eq!(rates(&db.pool, &key, after(59_000)).await.1, Some(ceiling));
    let (_, learned, effective) = rates(&db.pool, &key, after(70_000)).await;
    assert_eq!((learned, effective), (None, 600.0));
    // The Rust formula and the SQL one agree.
    let row: (Option<f64>, Option<DateTime<Utc>>, Option<f64>) = sqlx::query_as(
        "SELECT learned_rpm, learned_at, ceiling_rpm FROM budgets WHERE budget_key = $1",
    )
    .bind(&key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let rust = courier::learned::Learned {
        rpm: row.0,
        at: row.1,
        ceiling: row.2,
    };
    for ms in [
        -500, 0, 1_500, 4_000, 17_000, 31_000, 61_000, 63_000, 90_000,
    ] {
        let sql = rates(&db.pool, &key, after(ms)).await.1;
        match (sql, rust.now(600, after(ms))) {
            (Some(x), Some(y)) => assert!((x - y).abs() < 1e-6, "{ms}: {x} {y}"),
            (x, y) => assert_eq!(x, y, "{ms}"),
        }
    }
}

#[tokio::test]
async fn a_budget_booked_far_ahead_by_other_processes_makes_the_job_wait_in_the_queue() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    sqlx::query("UPDATE connections SET requests_per_minute = 60")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    let key: String = sqlx::query_scalar("SELECT courier_budget_key(c) FROM connections c")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Other processes have booked the shared budget 30 s ahead; this one learns it with
    // its first lease.
    let booked = engine.clock.now() + Span::seconds(30);
    sqlx::query("INSERT INTO budgets (budget_key, tat, updated_at) VALUES ($1, $2, now())")
        .bind(&key)
        .bind(booked)
        .execute(&db.pool)
        .await
        .unwrap();
    let slot = engine.pacer.acquire(&key, 60, 1, 1).await.unwrap();
    assert!(slot >= booked - Span::milliseconds(1), "{slot} vs {booked}");

    courier::maintenance::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let job = take_jobs(&engine).await.remove(0);
    let outcome = run_job(&engine, &job).await;
    let JobOutcome::Rescheduled(at) = outcome else {
        panic!("expected the job to wait in the queue, got {outcome:?}");
    };
    assert!(at > engine.clock.now() + Span::seconds(25), "{at}");
    assert_eq!(target.counters().requests, 0);
    let (status, run): (String, String) =
        sqlx::query_as("SELECT j.status, r.status FROM apalis.jobs j, runs r WHERE j.id = $1")
            .bind(&job.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), run.as_str()), ("Pending", "running"));
}

#[tokio::test]
async fn one_job_claims_the_next_batch_while_the_tail_is_in_flight() {
    let (db, target) = shop(&["customers"], 10, 4).await;
    let engine = engine(&db.pool, settings(&db.url));
    let batches = courier::chain::BATCHES_PER_JOB;
    // One batch more than a job takes: the chain needs a second job for it.
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 10 * batches + 5))
        .await
        .unwrap();
    courier::maintenance::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let job = take_jobs(&engine).await.remove(0);
    assert_eq!(run_job(&engine, &job).await, JobOutcome::Continued);
    assert_eq!(delivered(&db.pool).await, 10 * batches as i64);
    assert_eq!(target.counters().requests, 10 * batches as u64);
    let outcomes = drive(&engine).await;
    assert_eq!(
        outcomes,
        vec![JobOutcome::Finished(courier::runs::RunStatus::Completed)]
    );
    assert_eq!(delivered(&db.pool).await, 10 * batches as i64 + 5);
}

#[tokio::test]
async fn a_target_stating_nothing_left_blocks_the_budget_before_any_429() {
    const KEY_VAR: &str = "COURIER_PACING_TEST_USERCOM_KEY";
    const TOKEN: &str = "pacing-token";
    // SAFETY: the only test in this binary that touches the environment.
    unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    let db = TestDb::new().await;
    // 4 requests a minute, stated in the IETF draft's fields with every answer.
    let target = Target::start_with(courier_target::TargetConfig {
        workspaces: vec![courier_target::WorkspaceConfig::new("shop", TOKEN)],
        rate: 4,
        period: std::time::Duration::from_secs(60),
        window: courier_target::Window::Fixed,
        rate_headers: courier_target::RateHeaders::Ietf,
        ..Default::default()
    })
    .await
    .unwrap();
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "shop".into(),
            writer: "usercom".into(),
            base_url: target.workspace_url("shop"),
            api_key_env: Some(KEY_VAR.into()),
            requests_per_minute: Some(600),
            max_in_flight: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "customers".into(),
            connection: "shop".into(),
            path: "user_upsert".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let users = (0..6)
        .map(|i| NewDelivery::new(format!("u{i}"), json!({"custom_id": format!("u{i}")})))
        .collect();
    enqueue::enqueue_many(&db.pool, "customers", users)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    drive(&engine).await;
    let counters = target.counters();
    assert_eq!(
        (counters.requests, counters.throttled),
        (4, 0),
        "the fourth answer said 0 left: no fifth call, no 429"
    );
    assert_eq!(delivered(&db.pool).await, 4);
    // The block is recorded like a 429's, until the stated reset (about a minute).
    let (until, raw): (DateTime<Utc>, String) =
        sqlx::query_as("SELECT blocked_until, retry_after_raw FROM connection_blocks")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let left = until - engine.clock.now();
    assert!(
        left > Span::seconds(50) && left <= Span::seconds(61),
        "{left}"
    );
    assert!(raw.starts_with("remaining 0"), "{raw}");
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    assert_eq!(report.rules[0].state, "waiting");
    // No 429 was met: nothing learned; the stated quota (4/min) is the advertised rate.
    let key = budget_key(&db.pool).await;
    let (_, learned, effective) = rates(&db.pool, &key, engine.clock.now()).await;
    assert_eq!((learned, effective), (None, 4.0));
    assert_eq!(report.connections[0].advertised_rpm, Some(4.0));
}
