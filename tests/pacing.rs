//! Pacing against the declared rate: one budget per connection or budget key, shared by
//! rules and by worker processes, one slot per writer call, fair between rules.

mod common;

use std::{sync::Arc, time::Duration};

use chrono::Duration as Span;
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
    assert!(
        other <= a.clock.now() + Span::milliseconds(1),
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

#[tokio::test]
async fn a_429_slows_this_process_down_and_answers_bring_it_back() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    set_rate(&db.pool, 600).await;
    let engine = engine(&db.pool, settings(&db.url));
    let key: String = sqlx::query_scalar("SELECT courier_budget_key(c) FROM connections c")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("1"));
    drive(&engine).await;
    assert_eq!(engine.pacer.speed(&key), 0.5);
    // Slots leased now are spaced twice as wide.
    let a = engine.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    let b = engine.pacer.acquire(&key, 600, 1, 1).await.unwrap();
    assert!(b - a >= Span::milliseconds(200), "{a} {b}");
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(2));
    drive(&engine).await;
    assert!(
        engine.pacer.speed(&key) > 0.5,
        "answered calls speed it up again"
    );
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
