//! Pacing against the declared rate: one budget per connection or budget key, shared by
//! rules and by worker processes, one slot per writer call, fair between rules.

use std::{sync::Arc, time::Duration};

use crate::common::*;
use chrono::{DateTime, Duration as Span, SubsecRound, Utc};
use courier::chain::ChainOutcome;
use courier::ratelimit::{
    answer::{Answer, Answered, Verdict},
    limits::Limit,
    signals::RateSignals,
};
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
    let other = a
        .pacer
        .acquire("ws:other", &[Limit::per_minute(600)], 0, 1, 1)
        .await
        .unwrap()
        .at;
    assert!(
        other <= a.clock.now() + Span::milliseconds(1),
        "{other} vs {}",
        a.clock.now()
    );
}

#[tokio::test]
async fn a_block_another_process_met_holds_back_the_slots_this_one_leases() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let limits = [Limit::per_minute(600)];
    let now = e.clock.now();
    // Another process met a 429 naming one second: its block arrives here by NOTIFY.
    let until = now + Span::seconds(1);
    e.blocks.written("ws:k", until);
    assert_eq!(e.pacer.held_until("ws:k"), Some(until));
    let slot = e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    // (Slots are whole microseconds.)
    assert!(
        slot.at + Span::microseconds(1) > until,
        "a slot at {} inside the block until {until}",
        slot.at
    );
    // A block longer than a batch sits out stops the waiting calls, like a spent window.
    let long = now + Span::seconds(30);
    e.blocks.written("ws:j", long);
    match e.pacer.acquire("ws:j", &limits, 0, 1, 1).await {
        Err(courier::ratelimit::pacer::PacerError::Spent(at)) => assert_eq!(at, long),
        other => panic!("expected the block's end, got {other:?}"),
    }
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

/// Declared (per minute), learned and effective rate of budget `key` at `at` (the engine's
/// manual clock), as status computes them from the budget's row.
async fn rates(pool: &sqlx::PgPool, key: &str, at: DateTime<Utc>) -> (i32, Option<f64>, f64) {
    let (state, limits): (serde_json::Value, Vec<String>) =
        sqlx::query_as("SELECT state, limits FROM budgets WHERE budget_key = $1")
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap();
    let limits: Vec<courier::ratelimit::limits::Limit> =
        limits.iter().map(|l| l.parse().unwrap()).collect();
    let state: courier::ratelimit::budget::BudgetState = serde_json::from_value(state).unwrap();
    let pace = courier::status::budget_pace(&state, &limits, 0, at);
    let declared = (limits[0].per_second() * 60.0).round() as i32;
    (declared, pace.learned_rpm, pace.effective_rpm)
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
        assert!(
            e.pacer
                .acquire("ws:k", &[Limit::per_minute(600)], 0, 1, 1)
                .now_or_never()
                .is_none()
        );
    }
    // The next call gets a slot right after the first slice (2 slots at 600/min), not
    // after ten slots booked for calls that were never made.
    let slot = e
        .pacer
        .acquire("ws:k", &[Limit::per_minute(600)], 0, 1, 1)
        .await
        .unwrap()
        .at;
    let interval = Span::from_std(courier::ratelimit::pacer::emission_interval(600)).unwrap();
    assert!(
        slot <= start + interval * 3,
        "slot {} after the start, interval {interval}",
        slot - start
    );
}

/// When the process's next call on budget `ws:k` goes, as the call stage lets it: at the
/// time the pacer names, asked again once that time has come.
fn departs(e: &Engine) -> DateTime<Utc> {
    let mut at = e.clock.now();
    while let Err(later) = e.pacer.depart("ws:k", at) {
        at = later;
    }
    at
}

#[tokio::test]
async fn a_call_let_go_late_holds_the_next_one_back_by_most_of_an_interval() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let interval = courier::ratelimit::pacer::emission_interval(600);
    // Unknown budget: nothing to space from.
    assert_eq!(departs(&e), e.clock.now());
    e.pacer
        .acquire("ws:k", &[Limit::per_minute(600)], 0, 1, 1)
        .await
        .unwrap();
    let first = departs(&e);
    assert_eq!(first, e.clock.now());
    // The next slot came right away (the first call went late): held back.
    e.clock.advance(Span::from_std(interval / 2).unwrap());
    let min_gap = interval.mul_f64(courier::ratelimit::pacer::MIN_GAP_SHARE);
    let second = departs(&e);
    assert_eq!((second - first).to_std().unwrap(), min_gap);
    assert!(
        min_gap < interval && min_gap > interval.mul_f64(1.0 - courier::ratelimit::pacer::HEADROOM)
    );
    // On schedule, nothing is held back.
    e.clock.advance(Span::from_std(interval * 2).unwrap());
    assert_eq!(departs(&e), e.clock.now());
}

/// An engine whose process has taken a slot of budget `ws:k` at 600/min: the interval
/// between slots and the least gap between two calls of the process.
async fn one_call_on_600_a_minute() -> (TestDb, Arc<Engine>, Duration, Duration) {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let interval = courier::ratelimit::pacer::emission_interval(600);
    let min_gap = interval.mul_f64(courier::ratelimit::pacer::MIN_GAP_SHARE);
    e.pacer
        .acquire("ws:k", &[Limit::per_minute(600)], 0, 1, 1)
        .await
        .unwrap();
    (db, e, interval, min_gap)
}

#[tokio::test]
async fn a_call_answered_slower_than_usual_holds_the_next_one_back_by_its_lateness() {
    let (_db, e, interval, min_gap) = one_call_on_600_a_minute().await;
    let ms = std::time::Duration::from_millis;
    // The process's next call after one answered in `trip`: how much later than the least
    // gap it may go.
    let held = |trip: std::time::Duration| {
        let go = departs(&e);
        e.pacer.returned("ws:k", go, trip);
        let next = departs(&e);
        e.clock.advance(Span::from_std(interval * 3).unwrap());
        (next - go).to_std().unwrap() - min_gap
    };
    // Calls answering in 2 ms are usual: nothing held back.
    for _ in 0..50 {
        assert!(held(ms(2)) < ms(1), "a usual trip holds nothing back");
    }
    // One answering in 14 ms may have reached the target 12 ms late: the next waits that
    // much more.
    assert_eq!(held(ms(14)), ms(12));
    // Never more than an interval.
    assert_eq!(held(ms(900)), interval);
    // An answer of a call that is no longer the latest holds nothing back.
    let go = departs(&e);
    e.clock.advance(Span::from_std(interval * 3).unwrap());
    let next = departs(&e);
    e.pacer.returned("ws:k", go, ms(50));
    assert_eq!((departs(&e) - next).to_std().unwrap(), min_gap);
    e.clock.advance(Span::from_std(interval * 3).unwrap());
    // A path whose every trip varies widely (50–250 ms) is learned as such: only about one
    // call in ten is held back, not every one.
    let holds: Vec<_> = (0..400).map(|i| held(ms(50 + (i * 37 % 201)))).collect();
    let holds = holds[100..].iter().filter(|&&h| h > ms(1)).count();
    assert!((10..=60).contains(&holds), "{holds} of 300 calls held back");
}

#[tokio::test]
async fn a_call_that_left_late_keeps_the_next_one_a_whole_gap_behind_it() {
    let (_db, e, interval, min_gap) = one_call_on_600_a_minute().await;
    let ms = |n| Span::milliseconds(n);
    let go = departs(&e);
    // Its task woke 40 ms after the time it was let go (beyond what an answer's lateness
    // may hold back): the next call keeps its gap from when it really left.
    e.pacer.left("ws:k", go, go + ms(40));
    e.pacer
        .returned("ws:k", go, std::time::Duration::from_millis(41));
    let next = departs(&e);
    assert_eq!(
        (next - go).to_std().unwrap(),
        min_gap + ms(40).to_std().unwrap()
    );
    // A lateness learned after the next call's slot came, before it went, still holds it
    // back.
    e.clock.advance(Span::from_std(interval * 3).unwrap());
    let first = departs(&e);
    let early = e.pacer.depart("ws:k", first + ms(10));
    let due = first + Span::from_std(min_gap).unwrap();
    assert_eq!(early, Err(due));
    e.pacer.left("ws:k", first, first + ms(900));
    assert_eq!(
        e.pacer.depart("ws:k", due),
        Err(due + Span::from_std(interval).unwrap())
    );
    let next = departs(&e);
    assert_eq!(next, due + Span::from_std(interval).unwrap());
    // Never more than an interval later; and only for the process's latest call.
    e.pacer.left("ws:k", next, next + Span::seconds(5));
    let after = departs(&e);
    assert_eq!((after - next).to_std().unwrap(), min_gap + interval);
    e.pacer.left("ws:k", next, next + ms(50));
    let last = departs(&e);
    assert_eq!((last - after).to_std().unwrap(), min_gap);
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
    sqlx::query("INSERT INTO budgets (budget_key, state, updated_at) VALUES ($1, $2, now())")
        .bind(&key)
        .bind(json!({ "tat": booked }))
        .execute(&db.pool)
        .await
        .unwrap();
    let slot = engine
        .pacer
        .acquire(&key, &[Limit::per_minute(60)], 0, 1, 1)
        .await
        .unwrap()
        .at;
    assert!(slot >= booked - Span::milliseconds(1), "{slot} vs {booked}");

    courier::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let job = take_jobs(&engine).await.remove(0);
    let outcome = run_job(&engine, &job).await;
    let ChainOutcome::Rescheduled(at) = outcome else {
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
    courier::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let job = take_jobs(&engine).await.remove(0);
    assert_eq!(run_job(&engine, &job).await, ChainOutcome::Continued);
    assert_eq!(delivered(&db.pool).await, 10 * batches as i64);
    assert_eq!(target.counters().requests, 10 * batches as u64);
    let outcomes = drive(&engine).await;
    assert_eq!(
        outcomes,
        vec![ChainOutcome::Finished(courier::runs::RunStatus::Completed)]
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
    usercom_shop_with(&db, &target, KEY_VAR, 6).await;
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
    // No 429 was met: nothing learned; the stated quota (4/min) is the advertised rate,
    // reported to the budget with the process's next lease. Until the reset, a call asking
    // for a slot is told the budget is spent until then; after it, it gets one.
    let key = budget_key(&db.pool).await;
    let limits = [Limit::per_minute(600)];
    match engine.pacer.acquire(&key, &limits, 0, 1, 1).await {
        Err(courier::ratelimit::pacer::PacerError::Spent(at)) => assert_eq!(at, until),
        other => panic!("expected the reset {until}, got {other:?}"),
    }
    engine.clock.advance(until - engine.clock.now());
    let slot = engine
        .pacer
        .acquire(&key, &limits, 0, 1, 1)
        .await
        .unwrap()
        .at;
    assert!(slot + Span::milliseconds(1) >= until, "{slot} vs {until}");
    let (_, learned, effective) = rates(&db.pool, &key, engine.clock.now()).await;
    assert_eq!((learned, effective), (None, 4.0));
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    assert_eq!(report.connections[0].advertised_rpm, Some(4.0));
}

#[tokio::test]
async fn what_a_429_teaches_one_process_paces_every_other() {
    let db = TestDb::new().await;
    let (a, b) = (
        engine(&db.pool, settings(&db.url)),
        engine(&db.pool, settings(&db.url)),
    );
    let limits = [Limit::per_minute(6_000)];
    // Process a calls at 100/s; the target accepts 10 in its first second, then says 429
    // to the eleventh (its slot 100 ms in; the slice booked more after it).
    for _ in 0..10 {
        a.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    }
    a.clock.advance(Span::milliseconds(100));
    let sent = a.clock.now();
    let paced = a.pacer.effective_rate("ws:k").unwrap();
    a.pacer
        .throttled("ws:k", sent, paced, sent + Span::seconds(1))
        .await
        .unwrap();
    let at = a.clock.now() + Span::seconds(1);
    let (declared, learned, effective) = rates(&db.pool, "ws:k", at).await;
    // What the target accepted (10 in under a second: 10/s) is the learned rate.
    assert_eq!(declared, 6_000);
    let learned = learned.expect("a 429 teaches a rate");
    assert!((learned - 600.0).abs() < 1.0, "{learned}");
    assert_eq!(effective, learned);
    // Process b, which met no 429, paces at the learned rate from its first lease (as it
    // stands then: climbing back from 10/s, still far below the declared 100/s).
    b.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    let rate = b.pacer.effective_rate("ws:k").unwrap();
    let (_, _, shared) = rates(&db.pool, "ws:k", b.clock.now()).await;
    assert!(rate < 20.0, "{rate}/s");
    assert!(
        (rate * 60.0 - shared).abs() < shared * 0.05,
        "{rate}/s vs {shared}/min"
    );
}

/// A 429 naming a wait of `wait` seconds for a call sent at `sent` on a slot paced
/// `paced`, heard by `e` at `at`.
async fn hear_429(
    e: &Engine,
    (sent, paced): (DateTime<Utc>, f64),
    wait: u64,
    at: DateTime<Utc>,
) -> Verdict {
    let headers = reqwest::header::HeaderMap::new();
    let answer = Answer {
        answered: Answered::Refused {
            wait: Some(Duration::from_secs(wait)),
            raw: Some(wait.to_string()),
        },
        headers: &headers,
        signals: &RateSignals::default(),
        sent,
        paced,
    };
    e.pacer.hear("ws:k", answer, at).await
}

#[tokio::test]
async fn a_429_holds_the_process_back_at_once_and_the_next_block_cuts_again() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let limits = [Limit::per_minute(6_000)];
    let slot = e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    // The second call at 100/s is refused; its answer is heard 5 ms after it came (a
    // busy process).
    let sent = e.clock.now();
    let at = sent + Span::milliseconds(1);
    e.clock.advance(Span::milliseconds(6));
    let verdict = hear_429(&e, (sent, slot.paced), 1, at).await;
    assert!(matches!(verdict, Verdict::Block { .. }), "{verdict:?}");
    // The process's calls wait for the block's end from the moment the 429 is heard, not
    // from when the job's commit writes the block.
    let end = (at + Span::seconds(1)).trunc_subsecs(6);
    assert_eq!(e.pacer.held_until("ws:k"), Some(end));
    // The first call after the block is refused too: it was sent once the block ended,
    // however late the block's 429 was heard, so the budget is cut again (40/s, then 16/s).
    e.clock.advance(end + Span::milliseconds(1) - e.clock.now());
    hear_429(&e, (end, 40.0), 1, e.clock.now()).await;
    let again = e.clock.now() + Span::seconds(1);
    let (_, learned, _) = rates(&db.pool, "ws:k", again).await;
    let learned = learned.expect("a 429 teaches a rate");
    assert!((learned - 16.0 * 60.0).abs() < 1.0, "{learned}/min");
}

#[tokio::test]
async fn a_block_heard_is_kept_until_written_and_then_the_table_speaks_for_it() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    let limits = [Limit::per_minute(6_000)];
    let slot = e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    let at = e.clock.now();
    hear_429(&e, (slot.at, slot.paced), 1, at).await;
    let end = e
        .pacer
        .held_until("ws:k")
        .expect("blocked from the moment it is heard");
    // Before the job writes the block, a refresh from the table (another job about to
    // wait, or a NOTIFY of an older write) finds no row: the block heard stands.
    e.blocks.refresh(&db.pool, "ws:k").await.unwrap();
    assert_eq!(e.pacer.held_until("ws:k"), Some(end));
    // Once its job wrote it, the table speaks for it: a row gone (an operator lifted the
    // block) ends it here too.
    e.blocks.written("ws:k", end);
    e.blocks.refresh(&db.pool, "ws:k").await.unwrap();
    assert_eq!(e.pacer.held_until("ws:k"), None);
}

#[tokio::test]
async fn a_slot_booked_before_a_429_is_given_up_even_past_the_block() {
    let db = TestDb::new().await;
    let e = engine(&db.pool, settings(&db.url));
    // One call a second: the third slot lies two seconds ahead, past the shortest block.
    let limits = [Limit::per_minute(60)];
    let mut slots = Vec::new();
    for _ in 0..3 {
        slots.push(e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap());
    }
    let booked = slots[2];
    assert!(e.pacer.may_use("ws:k", &booked));
    // The first call is refused, naming no wait: the block lasts the shortest wait (1 s),
    // and the third slot, leased ahead at the refused pace, lies past it.
    let at = e.clock.now();
    hear_429(&e, (slots[0].at, slots[0].paced), 0, at).await;
    let end = e.pacer.held_until("ws:k").expect("blocked");
    assert!(booked.at > end, "{} vs {end}", booked.at);
    assert!(!e.pacer.may_use("ws:k", &booked));
    // A slot leased since, at the pace the 429 taught, may be used.
    let fresh = e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    assert!(
        fresh.paced < booked.paced,
        "{} vs {}",
        fresh.paced,
        booked.paced
    );
    assert!(
        e.pacer.may_use("ws:k", &fresh),
        "{fresh:?} held {:?}",
        e.pacer.held_until("ws:k")
    );
}

#[tokio::test]
async fn a_process_books_at_most_a_slice_ahead_however_many_calls_wait() {
    use courier::{clock::Clock, ratelimit::pacer::SLICE};
    let db = TestDb::new().await;
    // The system's clock: the pacer's wait for the next lease is what is tested.
    let e = Arc::new(Engine::with_clock(
        db.pool.clone(),
        settings(&db.url),
        Clock::system(),
    ));
    // 100/s: a slice is a quarter second's 25 slots, all handed out at once.
    let limits = [Limit::per_minute(6_000)];
    let mut slots = Vec::new();
    for _ in 0..25 {
        slots.push(e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap());
    }
    // A call asking now gets its slot from the next slice, leased only when the last slot
    // of this one is near (twice a lease's round trip before it, at most half a slice),
    // not at once: the process's booking stays a slice ahead however many calls wait.
    let next = e.pacer.acquire("ws:k", &limits, 0, 1, 1).await.unwrap();
    let leased = e.clock.now();
    let near = slots[24].at - Span::from_std(SLICE / 2 + courier::clock::PRECISE_WITHIN).unwrap();
    assert!(
        leased >= near,
        "leased {} before the slice's end",
        slots[24].at - leased
    );
    assert!(next.at > slots[24].at);
}

/// Connection `shop` (the usercom preset's) on `target`'s workspace and its rule
/// `customers` (the preset's users) with `n` deliveries.
async fn usercom_shop_with(db: &TestDb, target: &Target, key_var: &str, n: usize) {
    let preset = courier::presets::find("usercom").unwrap();
    let over = json!({"name": "shop", "base_url": target.workspace_url("shop"),
                      "api_key_env": key_var, "limits": ["600/min"], "max_in_flight": 1});
    let rule = json!({"name": "customers", "connection": "shop"});
    let file = json!({"connections": [preset.connection(&over)],
                      "rules": [preset.rule(Some("usercom-users"), &rule).unwrap()]});
    courier::apply::apply_file(&db.pool, &file.to_string(), Default::default())
        .await
        .unwrap();
    let users = (0..n)
        .map(|i| NewDelivery::new(format!("u{i}"), json!({"custom_id": format!("u{i}")})))
        .collect();
    enqueue::enqueue_many(&db.pool, "customers", users)
        .await
        .unwrap();
}

#[tokio::test]
async fn vendors_rate_limit_headers_are_heard_through_a_chain_job() {
    const KEY_VAR: &str = "COURIER_PACING_TEST_DIALECT_KEY";
    const TOKEN: &str = "dialect-token";
    // SAFETY: set before any worker of this test reads it; no other test names it.
    unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    for preset in ["hubspot", "brevo"] {
        // The vendor's headers as its emulation file names them.
        let mode: courier_target::RateHeaders = preset.parse().unwrap();
        let db = TestDb::new().await;
        // 4 requests a minute, stated in the vendor's own headers with every answer.
        let target = Target::start_with(courier_target::TargetConfig {
            workspaces: vec![courier_target::WorkspaceConfig::new("shop", TOKEN)],
            rate: 4,
            period: std::time::Duration::from_secs(60),
            window: courier_target::Window::Fixed,
            rate_headers: mode,
            ..Default::default()
        })
        .await
        .unwrap();
        usercom_shop_with(&db, &target, KEY_VAR, 6).await;
        // The vendor's headers are named by its preset's signals.
        use_preset_signals(&db.pool, preset).await;
        let engine = engine(&db.pool, settings(&db.url));
        drive(&engine).await;
        let counters = target.counters();
        let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
        match preset {
            // HubSpot states its quota (the window in milliseconds) but no reset: the
            // quota is the advertised rate, which paces the budget from then on.
            "hubspot" => {
                assert_eq!(report.connections[0].advertised_rpm, Some(4.0), "{mode:?}");
                assert!(counters.throttled <= 1, "{mode:?}: {counters:?}");
            }
            // Brevo states what is left and when it resets: nothing left blocks the
            // budget until the reset before any 429, as Brevo's 429 names no wait.
            _ => {
                assert_eq!((counters.requests, counters.throttled), (4, 0), "{mode:?}");
                let raw: String =
                    sqlx::query_scalar("SELECT retry_after_raw FROM connection_blocks")
                        .fetch_one(&db.pool)
                        .await
                        .unwrap();
                assert!(raw.starts_with("remaining 0"), "{mode:?}: {raw}");
            }
        }
        assert_eq!(delivered(&db.pool).await, 4, "{mode:?}");
    }
}
