//! The delivery engine against the real PostgreSQL and a real HTTP target on loopback.
//! Each test has a database of its own; time-dependent paths run on a manual clock and
//! drive chain jobs step by step, end-to-end paths run a real worker process.

use std::{sync::Arc, time::Duration};

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    chain::ChainOutcome,
    config::BreakerSettings,
    enqueue::{self, EnqueueError, NewDelivery},
    runs::RunStatus,
    worker,
    {dispatcher::Dispatcher, maintenance::reaper::Reaper},
};
use courier_target::Target;
use serde_json::json;

#[tokio::test]
async fn a_burst_is_delivered_by_a_real_worker_woken_by_sql_inserts() {
    let (db, target) = shop(&["customers", "prices"], 50, 8).await;
    let mut settings = settings(&db.url);
    // Nothing but NOTIFY can wake the dispatcher quickly: its tick is an hour.
    settings.dispatch_interval = Duration::from_secs(3600);
    let engine = Arc::new(courier::worker::Engine::new(db.pool.clone(), settings));
    let handle = tokio::spawn(worker::run(engine.clone()));

    enqueue::enqueue_many(&db.pool, "customers", burst("customer", 300))
        .await
        .unwrap();
    // Plain SQL with defaults for everything else.
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'price:' || g, jsonb_build_object('n', g)
         FROM rules r, generate_series(1, 200) g WHERE r.name = 'prices'",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    let pool = db.pool.clone();
    eventually("all 500 delivered and every run finished", || {
        let pool = pool.clone();
        async move {
            let (n, active): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered'),
                        (SELECT count(*) FROM runs WHERE status IN ('running', 'waiting'))",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            n == 500 && active == 0
        }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();

    let counters = target.counters();
    assert_eq!(counters.accepted_keys, 500);
    assert_eq!(counters.duplicates, 0);
    assert!(
        counters.max_in_flight <= 16,
        "two rules × 8 in flight at most"
    );
    let ledger: Vec<(String, i64)> =
        sqlx::query_as("SELECT outcome, count(*) FROM ledger GROUP BY outcome")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(ledger, vec![("delivered".to_string(), 500)]);
    let active: i64 =
        sqlx::query_scalar("SELECT count(*) FROM runs WHERE status IN ('running', 'waiting')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(active, 0);
}

#[tokio::test]
async fn transient_failures_back_off_then_exhaust() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let id = enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("c:1", json!({"a": 1})),
    )
    .await
    .unwrap();
    target.respond_with(503, None);

    drive(&engine).await;
    assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 1));
    let next = next_attempt(&db.pool, id).await;
    let delay = next - engine.clock.now();
    assert!(
        delay >= Span::milliseconds(500) && delay <= Span::milliseconds(1000),
        "{delay}"
    );

    // Not due yet: no run starts.
    assert!(drive(&engine).await.is_empty());
    engine.clock.advance(Span::seconds(1));
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 2));
    engine.clock.advance(Span::seconds(2));
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, id).await, ("exhausted".into(), 3));
    assert_eq!(
        ledger(&db.pool, id).await,
        vec![
            ("failed".into(), 1),
            ("failed".into(), 2),
            ("exhausted".into(), 3)
        ]
    );
    engine.clock.advance(Span::hours(1));
    assert!(
        drive(&engine).await.is_empty(),
        "an exhausted delivery is not retried"
    );
    assert_eq!(target.counters().requests, 3);
}

#[tokio::test]
async fn permanent_failures_are_rejected_without_retry() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let id = enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:1", json!({})))
        .await
        .unwrap();
    target.respond_with(422, None);
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, id).await, ("rejected".into(), 1));
    let (status, error): (Option<i16>, Option<String>) =
        sqlx::query_as("SELECT http_status, error FROM ledger WHERE delivery_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(status, Some(422));
    assert!(error.unwrap().contains("injected failure"));
    engine.clock.advance(Span::hours(1));
    assert!(drive(&engine).await.is_empty());
    assert_eq!(target.counters().requests, 1);
}

#[tokio::test]
async fn superseded_and_unchanged_deliveries_are_suppressed() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let old = enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("c:1", json!({"v": 1})),
    )
    .await
    .unwrap();
    let new = enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("c:1", json!({"v": 2})),
    )
    .await
    .unwrap();
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, old).await, ("suppressed".into(), 0));
    assert_eq!(ledger(&db.pool, old).await, vec![("suppressed".into(), 0)]);
    assert_eq!(delivery(&db.pool, new).await, ("delivered".into(), 1));

    let same = enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("c:1", json!({"v": 2})),
    )
    .await
    .unwrap();
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, same).await, ("suppressed".into(), 0));
    assert_eq!(
        target.counters().requests,
        1,
        "only one call reached the target"
    );
}

#[tokio::test]
async fn held_deliveries_wait_for_their_time_and_dependencies() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let later = engine.clock.now() + Span::minutes(10);
    let mut held = NewDelivery::new("c:1", json!({}));
    held.hold_until = Some(later);
    let held = enqueue::enqueue(&db.pool, "customers", held).await.unwrap();
    let mut order = NewDelivery::new("order:1", json!({"customer": "c:2"}));
    order.depends_on = Some("c:2".into());
    let order = enqueue::enqueue(&db.pool, "orders", order).await.unwrap();

    drive(&engine).await;
    assert_eq!(delivery(&db.pool, held).await, ("pending".into(), 0));
    assert_eq!(delivery(&db.pool, order).await, ("pending".into(), 0));
    assert_eq!(
        ledger(&db.pool, held).await,
        vec![("held".into(), 0)],
        "once per run"
    );
    assert_eq!(ledger(&db.pool, order).await, vec![("held".into(), 0)]);
    assert_eq!(target.counters().requests, 0);

    // The dependency (another rule, same connection) is delivered; the order follows.
    enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:2", json!({})))
        .await
        .unwrap();
    engine.clock.advance(Span::seconds(1));
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen(courier::runs::WAKE_CHANNEL).await.unwrap();
    drive(&engine).await;
    // A held dependant would be looked at again only after half the time it has waited;
    // its dependency delivered, it is due at once, and the dispatchers are told.
    let next = next_attempt(&db.pool, order).await;
    assert!(next <= engine.clock.now(), "{next}");
    let mut payloads = Vec::new();
    while let Ok(Ok(n)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), listener.recv()).await
    {
        payloads.push(n.payload().to_owned());
    }
    assert!(payloads.iter().any(|p| p == "due sooner"), "{payloads:?}");
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, order).await, ("delivered".into(), 1));
    assert_eq!(delivery(&db.pool, held).await.0, "pending");

    engine.clock.advance(Span::minutes(10));
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, held).await, ("delivered".into(), 1));
}

#[tokio::test]
async fn a_dependant_triaged_before_its_dependency_was_delivered_is_due_at_once() {
    use courier::ledger::{self, Entry, Outcome};
    let (db, _target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let mut order = NewDelivery::new("order:1", json!({}));
    order.depends_on = Some("c:2".into());
    let order = enqueue::enqueue(&db.pool, "orders", order).await.unwrap();
    drive(&engine).await;
    // The dependency is delivered while the order's next batch, triaged before, is in
    // flight; that batch then records the order held, for its next look.
    enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:2", json!({})))
        .await
        .unwrap();
    drive(&engine).await;
    assert_eq!(
        delivery(&db.pool, order).await.0,
        "pending",
        "held, not sent"
    );
    let (run, rule, connection): (i64, i64, i64) = sqlx::query_as(
        "INSERT INTO runs (rule_id, started_by) SELECT id, 'test' FROM rules WHERE name = 'orders'
         RETURNING id, rule_id, (SELECT connection_id FROM rules WHERE name = 'orders')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let now = engine.clock.now();
    let held = Entry {
        delivery_id: order,
        outcome: Outcome::Held,
        attempt: 0,
        http_status: None,
        error: Some("waiting for depends_on".into()),
        duration_ms: None,
        next_attempt_at: Some(now + Span::seconds(30)),
        at: now,
    };
    let mut tx = db.pool.begin().await.unwrap();
    ledger::record(&mut tx, run, rule, connection, &[held], &[], now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let next = next_attempt(&db.pool, order).await;
    assert!(next <= now, "{next} after {now}: its next look, not now");
}

#[tokio::test]
async fn one_active_run_per_rule_under_concurrent_dispatch() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let engines: Vec<_> = (0..8)
        .map(|_| engine(&db.pool, settings(&db.url)))
        .collect();
    let started = futures::future::join_all(
        engines
            .iter()
            .map(|e| async move { Dispatcher::new(e).run_once().await.unwrap() }),
    )
    .await;
    assert_eq!(started.iter().sum::<usize>(), 1, "{started:?}");
    let active: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(active, 1);
    assert_eq!(
        take_jobs(&engines[0]).await.len(),
        1,
        "one first job for the one run"
    );
    // The database itself refuses a second active run.
    let err = sqlx::query("INSERT INTO runs (rule_id, started_by) SELECT id, 'sql' FROM rules")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("runs_one_active_per_rule"),
        "{err}"
    );
}

#[tokio::test]
async fn two_jobs_of_one_rule_never_execute_at_once() {
    let (db, target) = shop(&["customers"], 10, 5).await;
    target.set_latency(Duration::from_millis(300));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let a = engine(&db.pool, settings(&db.url));
    let b = engine(&db.pool, settings(&db.url));
    Dispatcher::new(&a).run_once().await.unwrap();
    let job = take_jobs(&a).await.remove(0);
    let t = target.clone();
    let (ra, rb) = tokio::join!(try_run_job(&a, &job), async {
        // The second copy starts once the first is calling the target (holding the lease).
        eventually("the first job calling", || {
            let t = t.clone();
            async move { t.counters().requests > 0 }
        })
        .await;
        try_run_job(&b, &job).await
    });
    assert!(matches!(
        ra.unwrap(),
        ChainOutcome::Finished(RunStatus::Completed)
    ));
    assert!(matches!(rb.unwrap(), ChainOutcome::Rescheduled(_)));
    assert_eq!(target.counters().requests, 5);
}

#[tokio::test]
async fn a_circuit_admits_a_run_closed_cooled_down_or_half_open_for_its_own_probe() {
    let (db, _target) = shop(&["customers", "orders"], 20, 1).await;
    let runs: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO runs (rule_id, started_by, started_at, heartbeat_at)
         SELECT id, 'test', now(), now() FROM rules ORDER BY id RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let (mine, other) = (runs[0], runs[1]);
    let at = chrono::Utc::now();
    let cases = [
        ("closed", None, None, true),
        ("open", Some(at + Span::seconds(10)), None, false),
        ("open", Some(at - Span::seconds(1)), None, true),
        ("half_open", None, Some(mine), true),
        ("half_open", None, Some(other), false),
        ("half_open", None, None, true),
    ];
    for (state, open_until, probe, admits) in cases {
        let got: bool = sqlx::query_scalar(
            "UPDATE circuits c SET state = $1, open_until = $2, probe_run_id = $3
             RETURNING courier_circuit_admits(c, $4, $5)",
        )
        .bind(state)
        .bind(open_until)
        .bind(probe)
        .bind(mine)
        .bind(at)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            got, admits,
            "{state}, open until {open_until:?}, probe {probe:?}"
        );
    }
}

#[tokio::test]
async fn breaker_opens_skips_and_recovers_through_half_open() {
    let (db, target) = shop(&["customers", "orders"], 20, 1).await;
    let mut s = settings(&db.url);
    s.breaker = BreakerSettings {
        failure_threshold: 5,
        cooldown: Duration::from_secs(30),
        max_cooldown: Duration::from_secs(600),
    };
    let engine = engine(&db.pool, s);
    let ids = enqueue::enqueue_many(&db.pool, "customers", burst("c", 10))
        .await
        .unwrap();
    target.respond_with(503, None);

    let outcomes = drive(&engine).await;
    assert_eq!(
        outcomes,
        vec![ChainOutcome::Finished(RunStatus::CircuitOpen)]
    );
    let circuit: String = sqlx::query_scalar("SELECT state FROM circuits")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(circuit, "open");
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries d WHERE attempts = 0 AND status = 'pending'
         AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.delivery_id = d.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(untouched, 5, "deliveries not attempted keep their attempts");
    // Status reads true: an open circuit shows the failures that opened it.
    let report = courier::status::report(&db.pool, engine.clock.now())
        .await
        .unwrap();
    let shop = &report.connections[0];
    assert_eq!(
        (shop.circuit.as_str(), shop.consecutive_failures),
        ("open", 5)
    );

    // Open: the dispatcher skips every rule of the connection.
    enqueue::enqueue(&db.pool, "orders", NewDelivery::new("o:1", json!({})))
        .await
        .unwrap();
    engine.clock.advance(Span::seconds(29));
    assert!(drive(&engine).await.is_empty());

    // Cooled down: one probing run; it fails, and the circuit reopens for twice as long.
    engine.clock.advance(Span::seconds(2));
    let outcomes = drive(&engine).await;
    assert_eq!(
        outcomes,
        vec![ChainOutcome::Finished(RunStatus::CircuitOpen)]
    );
    let (state, until): (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT state, open_until FROM circuits")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(state, "open");
    let expected = engine.clock.now() + Span::seconds(60);
    assert!(
        (until - expected).num_milliseconds().abs() < 1,
        "{until} vs {expected}"
    );

    // The target is back: the next probe closes the circuit and everything is delivered.
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(61));
    drive(&engine).await;
    let circuit: String = sqlx::query_scalar("SELECT state FROM circuits")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(circuit, "closed");
    engine.clock.advance(Span::seconds(5));
    drive(&engine).await;
    for id in ids {
        assert_eq!(delivery(&db.pool, id).await.0, "delivered");
    }
}

#[tokio::test]
async fn answers_that_prove_the_target_reachable_never_open_the_circuit() {
    let (db, target) = shop(&["customers"], 50, 4).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 50))
        .await
        .unwrap();
    target.respond_with(400, None);
    drive(&engine).await;
    let (state, rejected): (String, i64) = sqlx::query_as(
        "SELECT (SELECT state FROM circuits), (SELECT count(*) FROM deliveries WHERE status = 'rejected')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), rejected), ("closed", 50));
}

#[tokio::test]
async fn a_stale_run_is_reaped_and_its_late_job_does_nothing() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let late = take_jobs(&engine).await.remove(0);

    engine.clock.advance(Span::seconds(599));
    assert!(Reaper::new(&engine).run_once().await.unwrap().is_empty());
    engine.clock.advance(Span::seconds(2));
    assert_eq!(
        Reaper::new(&engine).run_once().await.unwrap(),
        vec![late.job.run_id]
    );

    assert_eq!(
        try_run_job(&engine, &late).await.unwrap(),
        ChainOutcome::Skipped
    );
    assert_eq!(target.counters().requests, 0);
    // The rule is free again: a new run delivers everything.
    drive(&engine).await;
    assert_eq!(delivered(&db.pool).await, 3);
}

#[tokio::test]
async fn a_busy_lease_reschedules_the_apalis_job_without_a_failure() {
    // Covers queue::reschedule against apalis-postgres' real worker: if an apalis upgrade
    // changes how acknowledgements treat a row we put back, this fails.
    let (db, _target) = shop(&["customers"], 10, 1).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE rules SET lease_owner = 'someone-else', lease_until = now() + interval '1 hour'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let engine = Arc::new(courier::worker::Engine::new(
        db.pool.clone(),
        settings(&db.url),
    ));
    let handle = tokio::spawn(worker::run(engine.clone()));
    let pool = db.pool.clone();
    eventually("the job put back as pending, no attempt counted", || {
        let pool = pool.clone();
        async move {
            let row: Option<(String, i32, bool)> = sqlx::query_as(
                "SELECT status, attempts, run_at > now() FROM apalis.jobs WHERE job_type = 'courier.chain'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            matches!(row, Some((ref s, 0, true)) if s == "Pending")
        }
    })
    .await;
    // Had the worker's acknowledgement marked the row done, nothing would resume the
    // run once the lease is free (it stays active), and this would time out.
    sqlx::query("UPDATE rules SET lease_owner = NULL, lease_until = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    eventually("delivered once the lease is free", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 3 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn stopping_lets_in_flight_calls_finish_and_records_them() {
    let (db, target) = shop(&["customers"], 100, 4).await;
    target.set_latency(Duration::from_millis(500));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 100))
        .await
        .unwrap();
    let engine = Arc::new(courier::worker::Engine::new(
        db.pool.clone(),
        settings(&db.url),
    ));
    let handle = tokio::spawn(worker::run(engine.clone()));
    let t = target.clone();
    eventually("calls in flight", || {
        let t = t.clone();
        async move { t.counters().requests >= 1 }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
    let sent = target.counters().requests as i64;
    let (delivered, ledger): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered'), (SELECT count(*) FROM ledger)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(sent < 100, "stopped early");
    assert_eq!(delivered, sent, "every call that went out was recorded");
    assert_eq!(ledger, sent);
}

#[tokio::test]
async fn a_missing_api_key_fails_the_run_naming_the_variable_only() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    sqlx::query("UPDATE connections SET api_key_env = 'COURIER_TEST_UNSET_KEY_VAR'")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    let id = enqueue::enqueue(&db.pool, "customers", NewDelivery::new("c:1", json!({})))
        .await
        .unwrap();
    assert_eq!(
        drive(&engine).await,
        vec![ChainOutcome::Finished(RunStatus::Failed)]
    );
    let error: String = sqlx::query_scalar("SELECT error FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(error.contains("COURIER_TEST_UNSET_KEY_VAR"), "{error}");
    assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 0));

    // Failed once, then left alone (no hot loop of failed runs), with the reason shown.
    engine.clock.advance(Span::seconds(60));
    assert!(drive(&engine).await.is_empty());
    let report = courier::status::report(&db.pool, engine.clock.now())
        .await
        .unwrap();
    assert_eq!(report.problems.len(), 1);
    assert_eq!(report.problems[0].what, "connection shop");
    assert!(
        report.problems[0]
            .reason
            .contains("COURIER_TEST_UNSET_KEY_VAR")
    );
    // The cooldown passing gives it one more run; so does a change to the connection.
    engine.clock.advance(Span::minutes(5));
    assert_eq!(
        drive(&engine).await,
        vec![ChainOutcome::Finished(RunStatus::Failed)]
    );
    sqlx::query("UPDATE connections SET api_key_env = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    drive(&engine).await;
    assert_eq!(delivery(&db.pool, id).await, ("delivered".into(), 1));
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'failed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failed, 2);
}

#[tokio::test]
async fn a_rule_path_its_writer_cannot_serve_fails_the_run_and_keeps_the_backlog_pending() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["customers"], 10, 1).await;
    let path: String = sqlx::query_scalar("SELECT path FROM rules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Plain SQL gets past any check at the door: a placeholder no record fills.
    sqlx::query("UPDATE rules SET path = 'users/{payload.custom_id}/'")
        .execute(&db.pool)
        .await
        .unwrap();
    let engine = engine(&db.pool, settings(&db.url));
    let ids = enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    assert_eq!(
        drive(&engine).await,
        vec![ChainOutcome::Finished(RunStatus::Failed)]
    );
    let error: String = sqlx::query_scalar("SELECT error FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        error.contains("{payload.custom_id}") && error.contains("unknown placeholder"),
        "{error}"
    );
    for id in ids {
        assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 0));
    }
    assert!(
        drive(&engine).await.is_empty(),
        "left alone until the rule changes"
    );
    assert_eq!(target.counters().requests, 0);
    sqlx::query("UPDATE rules SET path = $1")
        .bind(&path)
        .execute(&db.pool)
        .await
        .unwrap();
    let report = courier::status::report(&db.pool, engine.clock.now())
        .await
        .unwrap();
    assert!(report.problems.is_empty());
    assert_eq!(
        drive(&engine).await.len(),
        1,
        "a fixed rule runs again at once"
    );
}

#[tokio::test]
async fn a_committed_bulk_enqueue_never_reports_an_error() {
    // A large enqueue refreshes the planner's statistics after its commit. When that
    // fails (here: another session holds the lock ANALYZE needs, which inserts do not,
    // and this pool waits 100 ms for a lock at most), the rows are in all the same: an
    // error would make a caller retry and enqueue them twice.
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE deliveries IN SHARE UPDATE EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let impatient = sqlx::PgPool::connect_with(
        db.url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .unwrap()
            .options([("lock_timeout", "100ms")]),
    )
    .await
    .unwrap();
    let n = enqueue::ANALYZE_AFTER;
    let ids = enqueue::enqueue_many(&impatient, "customers", burst("c", n))
        .await
        .expect("the rows were committed");
    assert_eq!(ids.len(), n);
    holder.rollback().await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, n as i64);
}

#[tokio::test]
async fn enqueue_refuses_an_unknown_rule() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    assert!(matches!(
        enqueue::enqueue_many(&db.pool, "nope", burst("c", 3)).await,
        Err(EnqueueError::UnknownRule(r)) if r == "nope"
    ));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn an_undecodable_job_is_dropped_and_the_worker_keeps_delivering() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    // A job that is JSON but not a chain job, inserted the way SQL users can.
    sqlx::query(
        "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority)
         VALUES (apalis.generate_ulid(), 'courier.chain', convert_to('{\"nonsense\": true}', 'UTF8'),
                 'Pending', 0, 3, now(), 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let engine = Arc::new(courier::worker::Engine::new(
        db.pool.clone(),
        settings(&db.url),
    ));
    let handle = tokio::spawn(worker::run(engine.clone()));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    let pool = db.pool.clone();
    eventually("delivered despite the bad job", || {
        let pool = pool.clone();
        async move { delivered(&pool).await == 5 }
    })
    .await;
    eventually("the bad job killed", || {
        let pool = pool.clone();
        async move {
            let status: String = sqlx::query_scalar(
                "SELECT status FROM apalis.jobs WHERE convert_from(job, 'UTF8') LIKE '%nonsense%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            status == "Killed"
        }
    })
    .await;
    engine.shutdown.cancel();
    handle.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_slow_batch_keeps_its_run_alive_and_its_lease() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    // Two calls of 1.5 s each, one at a time: the batch is out for 3 s of real time, in
    // which the job beats on its run (and renews its lease) every 0.4 s (a fifth of the
    // liveness window).
    target.set_latency(Duration::from_millis(1_500));
    let mut s = settings(&db.url);
    s.chain_stale_after = Duration::from_secs(2);
    s.worker_dead_after = Duration::from_secs(2);
    s.throttle_max_wait = Duration::ZERO;
    let engine = engine(&db.pool, s);
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 2))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let job = take_jobs(&engine).await.remove(0);
    let e = engine.clone();
    let running = tokio::spawn(async move { try_run_job(&e, &job).await });
    let t = target.clone();
    eventually("the first call out", || {
        let t = t.clone();
        async move { t.counters().requests >= 1 }
    })
    .await;
    // While the call is out, the batch outlives its staleness window five times over.
    engine.clock.advance(Span::seconds(10));
    let later = engine.clock.now() - Span::milliseconds(1);
    let pool = db.pool.clone();
    eventually("the heartbeat and the lease renewed at the new time", || {
        let pool = pool.clone();
        async move {
            let (beat, lease): (chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>) =
                sqlx::query_as("SELECT r.heartbeat_at, u.lease_until FROM runs r JOIN rules u ON u.id = r.rule_id")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            beat >= later && lease.is_some_and(|l| l >= later + Span::seconds(2))
        }
    })
    .await;
    // The reaper leaves the run alone, and the batch ends delivered, exactly once.
    assert!(Reaper::new(&engine).run_once().await.unwrap().is_empty());
    assert!(matches!(
        running.await.unwrap().unwrap(),
        ChainOutcome::Finished(RunStatus::Completed)
    ));
    assert_eq!(target.counters().requests, 2);
}

#[tokio::test]
async fn a_disabled_rule_reads_disabled_even_on_a_blocked_connection() {
    let (db, _target) = shop(&["customers", "orders"], 10, 1).await;
    sqlx::raw_sql(
        "UPDATE rules SET enabled = false WHERE name = 'orders';
         INSERT INTO connection_blocks (budget_key, blocked_until, set_at)
         SELECT courier_budget_key(c), now() + interval '1 hour', now() FROM connections c",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let report = courier::status::report(&db.pool, chrono::Utc::now())
        .await
        .unwrap();
    let states: Vec<(&str, &str)> = report
        .rules
        .iter()
        .map(|r| (r.name.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![("customers", "throttled"), ("orders", "disabled")]
    );
}

#[tokio::test]
async fn run_states_agree_with_the_database_and_unknown_states_are_errors() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    setup(&db.pool, &target, &["customers"], 10, 1).await;
    for status in RunStatus::ALL {
        // The database's generated `active` column against the Rust side's is_active.
        let (active, decoded): (bool, RunStatus) = sqlx::query_as(
            "INSERT INTO runs (rule_id, status, started_by, finished_at)
             SELECT id, $1, 'test', CASE WHEN $2 THEN NULL ELSE now() END FROM rules
             RETURNING active, status",
        )
        .bind(status.as_str())
        .bind(status.is_active())
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((active, decoded), (status.is_active(), status));
        sqlx::query("DELETE FROM runs")
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let unknown = sqlx::query_scalar::<_, courier::breaker::State>("SELECT 'ajar'::text")
        .fetch_one(&db.pool)
        .await;
    assert!(
        unknown.is_err(),
        "an unknown circuit state must not read as closed"
    );
}

/// Marks `job` as held by a process named `worker` that last beat `ago` before the engine's
/// clock, with the rule's lease in its hands: what a kill -9 mid-batch leaves behind.
async fn held_by_dead_process(
    engine: &courier::worker::Engine,
    job: &Job,
    worker: &str,
    ago: Span,
) {
    let beat = engine.clock.now() - ago;
    sqlx::query("INSERT INTO workers (name, started_at, heartbeat_at) VALUES ($1, $2, $2)")
        .bind(worker)
        .bind(beat)
        .execute(&engine.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO apalis.workers (id, worker_type, storage_name) VALUES ($1, 'courier.chain', 'pg')",
    )
    .bind(worker)
    .execute(&engine.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE apalis.jobs SET status = 'Running', lock_by = $2, lock_at = now() WHERE id = $1",
    )
    .bind(&job.id)
    .bind(worker)
    .execute(&engine.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE rules SET lease_owner = $1 || '/' || $2, lease_until = $3")
        .bind(worker)
        .bind(&job.id)
        .bind(engine.clock.now() + Span::seconds(600))
        .execute(&engine.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dead_processes_job_resumes_the_same_run_once_its_heartbeat_lapses() {
    let (db, _target, engine, job) = one_run(&["customers"], 3).await;
    let rescuer = courier::maintenance::rescuer::Rescuer::new(&engine);

    // Beat 14 s ago: within the 15 s window, so still alive.
    held_by_dead_process(&engine, &job, "courier-dead-1", Span::seconds(14)).await;
    assert_eq!(rescuer.run_once().await.unwrap(), Default::default());

    engine.clock.advance(Span::seconds(2));
    let rescued = rescuer.run_once().await.unwrap();
    assert_eq!(rescued.requeued, vec![job.id.clone()]);
    assert!(
        rescued.resumed.is_empty(),
        "the same job carries the run on"
    );
    let lease: Option<String> = sqlx::query_scalar("SELECT lease_owner FROM rules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(lease, None, "the dead process's lease is freed");

    let again = take_due_jobs(&db.pool, engine.clock.now()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, job.id);
    run_job(&engine, &again[0]).await;
    let (run_id, status): (i64, String) = sqlx::query_as("SELECT id, status FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((run_id, status.as_str()), (job.job.run_id, "completed"));
    assert_eq!(delivered(&db.pool).await, 3);
}

#[tokio::test]
async fn a_run_whose_job_failed_for_good_gets_a_new_job_and_the_old_one_can_never_move_it() {
    let (db, target, engine, old) = one_run(&["customers"], 3).await;
    // Every attempt failed while the database was away.
    sqlx::query("UPDATE apalis.jobs SET status = 'Failed', attempts = max_attempts WHERE id = $1")
        .bind(&old.id)
        .execute(&db.pool)
        .await
        .unwrap();
    let rescuer = courier::maintenance::rescuer::Rescuer::new(&engine);
    assert!(
        rescuer.run_once().await.unwrap().resumed.is_empty(),
        "heartbeat still fresh"
    );
    engine.clock.advance(Span::seconds(16));
    assert_eq!(
        rescuer.run_once().await.unwrap().resumed,
        vec![old.job.run_id]
    );
    assert_eq!(run_job(&engine, &old).await, ChainOutcome::Skipped);
    let new = take_due_jobs(&db.pool, engine.clock.now()).await.remove(0);
    assert_ne!(new.id, old.id);
    assert_eq!(new.job, old.job);
    run_job(&engine, &new).await;
    assert_eq!(delivered(&db.pool).await, 3);
    assert_eq!(target.counters().requests, 3);
}

/// With nothing pending, blocked or open, nothing falls due: the dispatcher sleeps until a
/// notification or its interval. (`courier_ts(NULL)` once read as year 1, "due now", and
/// an idle worker passed about 400 times a second.)
#[tokio::test]
async fn an_idle_database_has_nothing_due_so_the_dispatcher_sleeps() {
    let db = TestDb::new().await;
    let engine = engine(&db.pool, settings(&db.url));
    let dispatcher = Dispatcher::new(&engine);
    assert_eq!(dispatcher.next_due().await.unwrap(), None);
    let empty: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT courier_ts(NULL)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(empty, None, "no time stays no time");
}

#[tokio::test]
async fn a_rule_whose_own_budget_is_blocked_never_probes_its_connection() {
    let (db, _target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let now = engine.clock.now();
    // customers spends from a budget of its own, blocked for an hour; the connection's
    // circuit is open and cooled down, its own budget free.
    sqlx::query(
        "WITH r AS (UPDATE rules SET budget_key = 'customers-endpoint' WHERE name = 'customers')
         INSERT INTO connection_blocks (budget_key, blocked_until, set_at)
         VALUES ('customers-endpoint', $1 + interval '1 hour', $1)",
    )
    .bind(now)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE circuits SET state = 'open', open_until = $1 - interval '1 second'")
        .bind(now)
        .execute(&db.pool)
        .await
        .unwrap();
    for rule in ["customers", "orders"] {
        enqueue::enqueue(&db.pool, rule, NewDelivery::new("k:1", json!({})))
            .await
            .unwrap();
    }
    assert_eq!(Dispatcher::new(&engine).run_once().await.unwrap(), 1);
    let probing: Vec<String> = sqlx::query_scalar(
        "SELECT r.name FROM runs x JOIN rules r ON r.id = x.rule_id
         JOIN circuits c ON c.probe_run_id = x.id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        probing,
        vec!["orders".to_owned()],
        "the probe is a rule that may call"
    );
}

/// Waits until a statement starting with `prefix` waits for a lock in `pool`'s database.
async fn until_waiting_on_lock(pool: &sqlx::PgPool, prefix: &str) {
    for _ in 0..200 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND ltrim(query) LIKE $1 || '%'",
        )
        .bind(prefix)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no statement starting with {prefix:?} waited for a lock");
}

/// A job's commit in flight goes on while the job's loop waits for the lease's renewal.
/// A commit left unpolled sits in its transaction holding the run's row, which the
/// renewal's beat waits for: the job would wait for itself until the statement timeout.
#[tokio::test]
async fn a_commit_in_flight_goes_on_while_the_lease_renewal_waits() {
    let (db, target) = shop(&["customers"], 50, 1).await;
    let mut settings = settings(&db.url);
    settings.worker_dead_after = Duration::from_millis(250); // a renewal every 50 ms
    let engine = engine(&db.pool, settings);
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 200))
        .await
        .unwrap();
    target.set_latency(Duration::from_millis(5));
    // The circuit's row held: the job's first commit waits for it, mid-transaction.
    let mut circuit = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM circuits FOR UPDATE")
        .execute(&mut *circuit)
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let job = take_due_jobs(&db.pool, engine.clock.now()).await.remove(0);
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move { run_job(&engine, &job).await })
    };
    until_waiting_on_lock(&db.pool, "SELECT state").await;
    // Then the rule's row (as an update would: the commit's foreign keys share it): the
    // next renewal waits for it, and the job's loop with it.
    let mut rule = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM rules FOR NO KEY UPDATE")
        .execute(&mut *rule)
        .await
        .unwrap();
    until_waiting_on_lock(&db.pool, "UPDATE rules SET lease_until").await;
    circuit.commit().await.unwrap();
    // The commit goes on, the renewal still waiting.
    let mut committed = 0;
    for _ in 0..100 {
        committed = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ledger")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if committed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(committed > 0, "the commit waited for the renewal");
    rule.commit().await.unwrap();
    running.await.unwrap();
}
