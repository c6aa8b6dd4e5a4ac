//! Operator actions (`courier::ops`): pause and resume, retry, unblock, history, against
//! the real database and a real local target.

use std::sync::Arc;

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    chain::ChainOutcome,
    clock::Clock,
    dispatcher::Dispatcher,
    enqueue::{self, NewDelivery},
    ledger::{DeliveryStatus, Outcome},
    ops::{self, OpsError},
    runs::RunStatus,
    worker::Engine,
};
use serde_json::json;
use sqlx::{PgPool, postgres::PgListener};

async fn count(pool: &sqlx::PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn rule_state(pool: &sqlx::PgPool, rule: &str) -> String {
    sqlx::query_scalar("SELECT state FROM rule_states WHERE rule = $1")
        .bind(rule)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_paused_rule_gets_no_run_even_in_a_new_engine_and_resuming_delivers() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();

    let changed = ops::set_rule_paused(&db.pool, "customers", true)
        .await
        .unwrap();
    assert!(changed.changed());
    assert_eq!(changed.to_string(), "active → paused");
    let again = ops::set_rule_paused(&db.pool, "customers", true)
        .await
        .unwrap();
    assert!(!again.changed());
    assert_eq!(again.to_string(), "already paused");
    assert_eq!(rule_state(&db.pool, "customers").await, "paused");

    assert_eq!(Dispatcher::new(&engine).run_once().await.unwrap(), 0);
    // A new process (a restart) reads the pause from the table.
    let restarted = Arc::new(Engine::with_clock(
        db.pool.clone(),
        settings(&db.url),
        Clock::manual(engine.clock.now() + Span::minutes(5)),
    ));
    assert!(drive(&restarted).await.is_empty());
    assert_eq!(target.counters().requests, 0);
    assert_eq!(count(&db.pool, "pending").await, 5);

    // A connection pause holds every rule of it, whatever the rule's own state.
    let changed = ops::set_rule_paused(&db.pool, "customers", false)
        .await
        .unwrap();
    assert_eq!(changed.to_string(), "paused → active");
    ops::set_connection_paused(&db.pool, "shop", true)
        .await
        .unwrap();
    assert_eq!(rule_state(&db.pool, "customers").await, "paused");
    assert!(drive(&restarted).await.is_empty());
    let report = courier::status::report(&db.pool, restarted.clock.now())
        .await
        .unwrap();
    assert!(report.connections[0].paused);
    assert_eq!(report.rules[0].paused.as_deref(), Some("connection"));

    let changed = ops::set_connection_paused(&db.pool, "shop", false)
        .await
        .unwrap();
    assert!(changed.changed());
    drive(&restarted).await;
    assert_eq!(count(&db.pool, "delivered").await, 5);
    assert_eq!(rule_state(&db.pool, "customers").await, "idle");
}

#[tokio::test]
async fn a_run_under_way_stops_at_its_next_batch_and_keeps_its_backlog() {
    let (db, _target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    // Batches of 10: a job claims up to BATCHES_PER_JOB of them, then the chain goes on.
    let per_job = 10 * courier::chain::BATCHES_PER_JOB as i64;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", per_job as usize + 15))
        .await
        .unwrap();
    Dispatcher::new(&engine).run_once().await.unwrap();
    let first = take_jobs(&engine).await.remove(0);
    assert_eq!(run_job(&engine, &first).await, ChainOutcome::Continued);
    assert_eq!(count(&db.pool, "delivered").await, per_job);
    // A claim made once the rule is paused takes nothing (a job stops between batches).
    ops::set_rule_paused(&db.pool, "customers", true)
        .await
        .unwrap();
    let scope = courier::chain::claim::ClaimScope {
        rule_id: 1,
        connection_id: 1,
        after_id: 0,
        limit: 10,
    };
    let claimed = courier::chain::claim::claim(&engine, scope, engine.clock.now())
        .await
        .unwrap();
    assert!(claimed.is_empty(), "nothing claimed while paused");
    ops::set_rule_paused(&db.pool, "customers", false)
        .await
        .unwrap();

    ops::set_rule_paused(&db.pool, "customers", true)
        .await
        .unwrap();
    let next = take_jobs(&engine).await.remove(0);
    assert_eq!(
        run_job(&engine, &next).await,
        ChainOutcome::Finished(RunStatus::Paused)
    );
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM runs ORDER BY id DESC LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), error.as_deref()),
        ("paused", Some("rule paused"))
    );
    assert_eq!(count(&db.pool, "pending").await, 15);
    assert!(drive(&engine).await.is_empty(), "no run while paused");

    ops::set_rule_paused(&db.pool, "customers", false)
        .await
        .unwrap();
    drive(&engine).await;
    assert_eq!(count(&db.pool, "delivered").await, per_job + 15);
}

#[tokio::test]
async fn resuming_wakes_a_running_worker() {
    resume_wakes_a_running_worker("UPDATE rules SET paused = true", async |pool| {
        ops::set_rule_paused(pool, "customers", false)
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_rule_resumed_by_plain_sql_wakes_a_running_worker() {
    resume_wakes_a_running_worker("UPDATE rules SET paused = true", async |pool| {
        sql(pool, "UPDATE rules SET paused = false").await;
    })
    .await;
}

#[tokio::test]
async fn a_connection_resumed_by_plain_sql_wakes_a_running_worker() {
    resume_wakes_a_running_worker("UPDATE connections SET paused = true", async |pool| {
        sql(pool, "UPDATE connections SET paused = false").await;
    })
    .await;
}

#[tokio::test]
async fn a_rule_enabled_by_plain_sql_wakes_a_running_worker() {
    resume_wakes_a_running_worker("UPDATE rules SET enabled = false", async |pool| {
        sql(pool, "UPDATE rules SET enabled = true").await;
    })
    .await;
}

/// Ends every delivery rejected, for the retry cases to make pending again.
const REJECT_ALL: &str = "UPDATE deliveries SET status = 'rejected', finished_at = now()";

#[tokio::test]
async fn a_retry_wakes_a_running_worker() {
    resume_wakes_a_running_worker(REJECT_ALL, async |pool| {
        let n = ops::retry(pool, "customers", &[Outcome::Rejected], None)
            .await
            .unwrap();
        assert_eq!(n, 20);
    })
    .await;
}

#[tokio::test]
async fn a_retry_by_plain_sql_wakes_a_running_worker() {
    resume_wakes_a_running_worker(REJECT_ALL, async |pool| {
        sql(
            pool,
            "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_at = now(),
                                       finished_at = NULL",
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_delivery_made_due_sooner_by_plain_sql_wakes_a_running_worker() {
    resume_wakes_a_running_worker(
        "UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'",
        async |pool| {
            sql(pool, "UPDATE deliveries SET next_attempt_at = now()").await;
        },
    )
    .await;
}

/// How many sessions of this database listen on the wake-up channel (a listener's last
/// statement is its `LISTEN`, as sqlx's `PgListener` words it).
async fn listening(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        r#"SELECT count(*) FROM pg_stat_activity
           WHERE datname = current_database() AND query = format('LISTEN "%s"', $1::text)"#,
    )
    .bind(courier::runs::WAKE_CHANNEL)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn sql(pool: &PgPool, statement: &'static str) {
    sqlx::query(statement).execute(pool).await.unwrap();
}

/// A backlog of 20 held back by the statement `hold` (run before the worker starts), and a
/// real worker whose dispatcher's fallback timer is far away. Updates that resume nothing
/// (`hold` again, other columns) notify no one; once `resume` has run, the backlog is
/// delivered, which only a notification can start promptly.
async fn resume_wakes_a_running_worker(hold: &'static str, resume: impl AsyncFnOnce(&PgPool)) {
    let (db, _target) = shop(&["customers"], 10, 2).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 20))
        .await
        .unwrap();
    sql(&db.pool, hold).await;
    let settings = courier::config::Settings {
        dispatch_interval: std::time::Duration::from_secs(600),
        ..settings(&db.url)
    };
    let engine = Arc::new(Engine::new(db.pool.clone(), settings));
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen(courier::runs::WAKE_CHANNEL).await.unwrap();
    let worker = tokio::spawn(courier::worker::run(engine.clone()));
    // The worker's dispatcher hears the wake-up only once it listens: wait for its LISTEN
    // (beside this test's own), however slowly a loaded machine starts it.
    within(
        std::time::Duration::from_secs(60),
        "the worker's dispatcher listens",
        || async { listening(&db.pool).await >= 2 },
    )
    .await;
    sql(&db.pool, hold).await;
    sql(&db.pool, "UPDATE rules SET batch_size = 5").await;
    sql(&db.pool, "UPDATE connections SET timeout_ms = 5000").await;
    let heard = tokio::time::timeout(std::time::Duration::from_millis(300), listener.recv());
    assert!(heard.await.is_err(), "a notification with nothing resumed");
    assert_eq!(count(&db.pool, "delivered").await, 0);
    resume(&db.pool).await;
    within(
        std::time::Duration::from_secs(60),
        "the resumed rule delivers",
        || async { count(&db.pool, "delivered").await == 20 },
    )
    .await;
    engine.shutdown.cancel();
    worker.await.unwrap().unwrap();
}

/// Drives until the rule's deliveries with prefix `prefix` are exhausted (3 attempts).
async fn exhaust(engine: &Arc<Engine>, target: &courier_target::Target) {
    target.respond_with(500, None);
    for _ in 0..3 {
        drive(engine).await;
        // Past any backoff (the rules' cap is a minute).
        engine.clock.advance(Span::seconds(61));
    }
    target.respond_with(200, None);
}

#[tokio::test]
async fn retry_makes_exactly_the_chosen_failures_pending_again() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("r", 3))
        .await
        .unwrap();
    target.respond_with(422, None);
    drive(&engine).await;
    assert_eq!(count(&db.pool, "rejected").await, 3);
    engine.clock.advance(Span::minutes(10));
    let between = engine.clock.now();
    engine.clock.advance(Span::minutes(10));
    // One record: five failures in a row would open the circuit.
    enqueue::enqueue_many(&db.pool, "customers", burst("x", 1))
        .await
        .unwrap();
    exhaust(&engine, &target).await;
    assert_eq!(count(&db.pool, "exhausted").await, 1);
    // A newer delivery of r:0 waits already: retrying the old one would only duplicate it.
    enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("r:0", json!({"n": 99})),
    )
    .await
    .unwrap();
    let requests = target.counters().requests;

    let n = ops::retry(&db.pool, "customers", &[Outcome::Exhausted], None)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let (status, attempts): (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM deliveries WHERE record_key = 'x:0'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), attempts),
        ("pending", 0),
        "attempts reset"
    );
    let actor: Option<String> = sqlx::query_scalar(
        "SELECT l.actor FROM ledger l JOIN deliveries d ON d.id = l.delivery_id
         WHERE d.record_key = 'x:0' AND l.outcome = 'retried'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(actor.unwrap().starts_with("courier CLI ("));

    // Rejected ones ended before `between`: a later --since takes none of them.
    let n = ops::retry(
        &db.pool,
        "customers",
        &[Outcome::Rejected],
        Some(engine.clock.now()),
    )
    .await
    .unwrap();
    assert_eq!(n, 0);
    let n = ops::retry(&db.pool, "customers", &[Outcome::Rejected], Some(between))
        .await
        .unwrap();
    assert_eq!(n, 0, "they ended before `between`");
    let n = ops::retry(
        &db.pool,
        "customers",
        &[Outcome::Rejected],
        Some(between - Span::hours(1)),
    )
    .await
    .unwrap();
    assert_eq!(n, 2, "r:1 and r:2; r:0 has a newer delivery pending");

    drive(&engine).await;
    assert_eq!(count(&db.pool, "delivered").await, 4);
    assert_eq!(count(&db.pool, "rejected").await, 1);
    assert_eq!(target.counters().requests - requests, 4);
    // Nothing is left to retry: a second retry changes nothing.
    assert_eq!(
        ops::retry(&db.pool, "customers", &[Outcome::Exhausted], None)
            .await
            .unwrap(),
        0
    );
    let e = ops::retry(&db.pool, "nope", &[Outcome::Exhausted], None)
        .await
        .unwrap_err();
    assert!(matches!(e, OpsError::NotFound { kind: "rule", .. }));
    assert_eq!(e.to_string(), "no rule named \"nope\"");
    let e = ops::retry(&db.pool, "customers", &[Outcome::Delivered], None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("only exhausted and rejected"), "{e}");
}

#[tokio::test]
async fn unblocking_lets_a_throttled_connection_call_at_once() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    engine
        .blocks
        .ensure_listening(&db.pool, &engine.shutdown)
        .await
        .unwrap();
    // A second process's copy of the blocks.
    let other = Arc::new(Engine::new(db.pool.clone(), settings(&db.url)));
    other
        .blocks
        .ensure_listening(&db.pool, &other.shutdown)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("3600"));
    drive(&engine).await;
    target.respond_with(200, None);
    let key = "connection:1";
    eventually("the other process hears of the block", || async {
        other.blocks.until(key).is_some()
    })
    .await;
    assert!(drive(&engine).await.is_empty(), "blocked for an hour");

    assert_eq!(ops::unblock_connection(&db.pool, "shop").await.unwrap(), 1);
    eventually("both copies drop the block", || async {
        engine.blocks.until(key).is_none() && other.blocks.until(key).is_none()
    })
    .await;
    drive(&engine).await;
    assert_eq!(count(&db.pool, "delivered").await, 3);
    assert_eq!(ops::unblock_connection(&db.pool, "shop").await.unwrap(), 0);
    let e = ops::unblock_connection(&db.pool, "nope").await.unwrap_err();
    assert_eq!(e.to_string(), "no connection named \"nope\"");
    let e = ops::set_connection_paused(&db.pool, "nope", true)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "no connection named \"nope\"");
    let e = ops::set_rule_paused(&db.pool, "nope", true)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "no rule named \"nope\"");
}

#[tokio::test]
async fn unblocking_wakes_a_run_waiting_out_the_block() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    engine
        .blocks
        .ensure_listening(&db.pool, &engine.shutdown)
        .await
        .unwrap();
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("120"));
    let outcomes = drive(&engine).await;
    assert!(
        matches!(outcomes.last(), Some(ChainOutcome::Waiting(_))),
        "{outcomes:?}"
    );
    target.respond_with(200, None);
    assert!(take_jobs(&engine).await.is_empty(), "snoozed for 120 s");

    let until = engine.blocks.until("connection:1").unwrap();
    ops::unblock_connection(&db.pool, "shop").await.unwrap();
    eventually("the copy drops the block", || async {
        engine.blocks.until("connection:1").is_none()
    })
    .await;
    // A process whose NOTIFY is still on the way: its copy still holds the block. The
    // job must not wait it out on that stale copy.
    engine.blocks.written("connection:1", until);
    let jobs = take_jobs(&engine).await;
    assert_eq!(jobs.len(), 1, "the waiting job is due at once");
    run_job(&engine, &jobs[0]).await;
    assert_eq!(count(&db.pool, "delivered").await, 3);
}

#[tokio::test]
async fn history_lists_a_keys_path_oldest_first() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue(
        &db.pool,
        "customers",
        NewDelivery::new("k:1", json!({"v": 1})),
    )
    .await
    .unwrap();
    target.respond_with(503, None);
    drive(&engine).await;
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(5));
    drive(&engine).await;
    enqueue::enqueue(&db.pool, "orders", NewDelivery::new("k:1", json!({"v": 2})))
        .await
        .unwrap();
    enqueue::enqueue(&db.pool, "orders", NewDelivery::new("other", json!({})))
        .await
        .unwrap();

    let h = ops::history(&db.pool, "k:1").await.unwrap();
    // (The test's clock runs ahead of the database's, so compare per rule.)
    let path = |rule: &str| -> Vec<(Option<Outcome>, DeliveryStatus)> {
        h.iter()
            .filter(|e| e.rule == rule)
            .map(|e| (e.outcome, e.status))
            .collect()
    };
    assert_eq!(
        path("customers"),
        vec![
            (None, DeliveryStatus::Delivered),
            (Some(Outcome::Failed), DeliveryStatus::Delivered),
            (Some(Outcome::Delivered), DeliveryStatus::Delivered),
        ]
    );
    assert_eq!(path("orders"), vec![(None, DeliveryStatus::Pending)]);
    assert_eq!(h.len(), 4);
    let failed = h
        .iter()
        .find(|e| e.outcome == Some(Outcome::Failed))
        .unwrap();
    assert_eq!(failed.http_status, Some(503));
    assert!(failed.run_id.is_some());
    assert!(h.windows(2).all(|w| w[0].delivery_id <= w[1].delivery_id));
    assert!(ops::history(&db.pool, "never").await.unwrap().is_empty());
}
