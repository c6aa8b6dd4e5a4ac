//! Rate limits as a signal: a 429 blocks the connection, costs the delivery nothing, and the
//! chain waits or ends throttled. Manual clock, real PostgreSQL, real HTTP target.

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    chain::ChainOutcome,
    enqueue::{self, NewDelivery},
    runs::RunStatus,
    status,
};
use serde_json::json;

type At = chrono::DateTime<chrono::Utc>;

#[tokio::test]
async fn a_429_blocks_the_connection_and_costs_the_delivery_nothing() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let ids = enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("30"));

    let now = engine.clock.now();
    let outcomes = drive(&engine).await;
    let resume = now + Span::seconds(30);
    // The job that met the 429 only records the block and continues the chain; the
    // throttle layer makes the next job (the same apalis row from then on) wait it out.
    assert!(
        matches!(outcomes[..], [ChainOutcome::Continued, ChainOutcome::Waiting(t)] if (t - resume).num_milliseconds().abs() < 1),
        "{outcomes:?}"
    );
    for &id in &ids {
        assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 0));
        assert!(ledger(&db.pool, id).await.is_empty());
    }
    let (raw, by): (Option<String>, String) = sqlx::query_as(
        "SELECT b.retry_after_raw, r.name FROM connection_blocks b JOIN rules r ON r.id = b.rule_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((raw.as_deref(), by.as_str()), (Some("30"), "customers"));
    let (state, failures): (String, i32) =
        sqlx::query_as("SELECT state, consecutive_failures FROM circuits")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), failures), ("closed", 0));

    // Another rule on the connection is not started while the block holds, and reads as
    // throttled; the rule whose run waits reads as waiting.
    enqueue::enqueue(&db.pool, "orders", NewDelivery::new("o:1", json!({})))
        .await
        .unwrap();
    engine.clock.advance(Span::seconds(10));
    assert!(drive(&engine).await.is_empty());
    let report = status::report(&db.pool, engine.clock.now()).await.unwrap();
    let states: Vec<(&str, &str)> = report
        .rules
        .iter()
        .map(|r| (r.name.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![("customers", "waiting"), ("orders", "throttled")]
    );
    assert_eq!(
        report.connections[0].blocked_by.as_deref(),
        Some("customers")
    );

    // The block lapses: the same run resumes, the other rule starts by itself.
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(21));
    drive(&engine).await;
    for &id in &ids {
        assert_eq!(delivery(&db.pool, id).await, ("delivered".into(), 1));
        assert_eq!(ledger(&db.pool, id).await, vec![("delivered".into(), 1)]);
    }
    let runs: Vec<(String, i32)> = sqlx::query_as("SELECT status, delivered FROM runs ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(runs, vec![("completed".into(), 3), ("completed".into(), 1)]);
}

#[tokio::test]
async fn short_waits_are_sat_out_and_long_ones_throttle() {
    // The header, the block's length in milliseconds (a wait of none, or one in the
    // past, lasts a second), what becomes of the run.
    let past =
        httpdate::fmt_http_date(std::time::SystemTime::now() - std::time::Duration::from_secs(60));
    let cases: [(Option<&str>, i64, RunStatus); 8] = [
        (Some("0"), 1_000, RunStatus::Waiting),
        (Some(past.as_str()), 1_000, RunStatus::Waiting),
        (Some("1"), 1_000, RunStatus::Waiting),
        (Some("300"), 300_000, RunStatus::Waiting),
        (Some("301"), 301_000, RunStatus::Throttled),
        (Some("86400"), 86_400_000, RunStatus::Throttled),
        (Some("86401"), 86_400_000, RunStatus::Throttled),
        (None, 60_000, RunStatus::Waiting),
    ];
    for (header, ms, expected) in cases {
        let (db, target) = shop(&["customers"], 10, 1).await;
        let engine = engine(&db.pool, settings(&db.url));
        enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
            .await
            .unwrap();
        target.respond_with(429, header);
        let now = engine.clock.now();
        drive(&engine).await;
        let (status, resume, throttled, blocked): (String, Option<At>, Option<At>, At) =
            sqlx::query_as("SELECT r.status, r.resume_at, r.throttled_until, b.blocked_until FROM runs r, connection_blocks b")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        let end = now + Span::milliseconds(ms);
        assert!(
            (blocked - end).num_milliseconds().abs() < 1,
            "{header:?}: block {blocked} vs {end}"
        );
        assert_eq!(status, expected.as_str(), "{header:?}");
        match expected {
            RunStatus::Waiting => assert_eq!(resume, Some(blocked), "{header:?}"),
            _ => assert_eq!(throttled, Some(blocked), "{header:?}"),
        }
        assert_eq!(
            target.counters().requests,
            1,
            "{header:?}: one call, then the block holds"
        );
    }
}

#[tokio::test]
async fn a_waking_job_meeting_a_longer_block_ends_its_run_throttled() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("10"));
    drive(&engine).await;
    // Meanwhile another rule's 429 extends the block to ten minutes.
    let (conn, rule, run): (i64, i64, i64) = sqlx::query_as(
        "SELECT c.id, r.id, x.id FROM connections c, rules r, runs x WHERE r.name = 'orders'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let key = format!("connection:{conn}");
    let cause = courier::ratelimit::blocks::Cause {
        budget_key: &key,
        connection_id: conn,
        rule_id: Some(rule),
        run_id: Some(run),
    };
    let until = courier::ratelimit::blocks::block(
        &db.pool,
        &cause,
        engine.clock.now() + Span::seconds(600),
        Some("600"),
        engine.clock.now(),
    )
    .await
    .unwrap();
    // A shorter 429 never shortens it.
    let again = courier::ratelimit::blocks::block(
        &db.pool,
        &cause,
        engine.clock.now() + Span::seconds(5),
        Some("5"),
        engine.clock.now(),
    )
    .await
    .unwrap();
    assert_eq!(again, until);
    // Other processes hear of a block by NOTIFY; under load the listener may be late, and
    // the lag is not what this test checks: the copy reads the table as NOTIFY would.
    engine.blocks.refresh(&db.pool, &key).await.unwrap();
    engine.clock.advance(Span::seconds(11));
    let outcomes = drive(&engine).await;
    assert_eq!(outcomes, vec![ChainOutcome::Finished(RunStatus::Throttled)]);
    let (status, throttled_until): (String, Option<At>) =
        sqlx::query_as("SELECT status, throttled_until FROM runs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(status, "throttled");
    assert_eq!(throttled_until, Some(until));

    // While the block holds, nothing starts; once it lapses, the dispatcher starts again
    // by itself and the deliveries arrive with no attempt spent on the 429.
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(500));
    assert!(drive(&engine).await.is_empty());
    engine.clock.advance(Span::seconds(100));
    drive(&engine).await;
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("SELECT status, attempts FROM deliveries ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, vec![("delivered".to_string(), 1); 3]);
}

#[tokio::test]
async fn a_waiting_chain_is_never_reaped_as_stale() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    // A run that has been going for a while meets the longest wait it may sit out.
    engine.clock.advance(Span::seconds(1));
    target.respond_with(429, Some("300"));
    drive(&engine).await;
    engine.clock.advance(Span::seconds(300));
    assert!(
        courier::maintenance::reaper::Reaper::new(&engine)
            .run_once()
            .await
            .unwrap()
            .is_empty()
    );
    let status: String = sqlx::query_scalar("SELECT status FROM runs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(status, "waiting");
}

#[tokio::test]
async fn fifty_429s_never_open_the_circuit_nor_spend_attempts() {
    let (db, target) = shop(&["customers"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    let ids = enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    target.respond_with(429, Some("1"));
    while target.counters().requests < 50 {
        drive(&engine).await;
        engine.clock.advance(Span::seconds(2));
    }
    let state: String = sqlx::query_scalar("SELECT state FROM circuits")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "closed");
    for &id in &ids {
        assert_eq!(delivery(&db.pool, id).await, ("pending".into(), 0));
        assert!(ledger(&db.pool, id).await.is_empty());
    }
    target.respond_with(200, None);
    engine.clock.advance(Span::seconds(2));
    drive(&engine).await;
    for &id in &ids {
        assert_eq!(delivery(&db.pool, id).await, ("delivered".into(), 1));
    }
}

#[tokio::test]
async fn the_throttle_layer_snoozes_the_same_apalis_job_and_marks_the_run_waiting() {
    let (db, target, engine, job) = one_run(&["customers"], 3).await;
    // A block written by another process (plain SQL): the layer hears of it by NOTIFY.
    engine
        .blocks
        .ensure_listening(&engine.pool, &engine.shutdown)
        .await
        .unwrap();
    let (key, until): (String, At) = sqlx::query_as(
        "INSERT INTO connection_blocks (budget_key, blocked_until, set_at)
         SELECT courier_budget_key(c), $1, now() FROM connections c
         RETURNING budget_key, blocked_until",
    )
    .bind(engine.clock.now() + Span::seconds(20))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eventually("the block reaches the in-memory copy", || {
        let engine = engine.clone();
        let key = key.clone();
        async move { engine.blocks.until(&key) == Some(until) }
    })
    .await;
    assert_eq!(run_job(&engine, &job).await, ChainOutcome::Waiting(until));
    assert_eq!(
        target.counters().requests,
        0,
        "the chain job itself never ran"
    );
    let (status, run_at): (String, At) =
        sqlx::query_as("SELECT status, run_at FROM apalis.jobs WHERE id = $1")
            .bind(&job.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), run_at), ("Pending", until));
    let (run, resume_at): (String, Option<At>) =
        sqlx::query_as("SELECT status, resume_at FROM runs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((run.as_str(), resume_at), ("waiting", Some(until)));
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 1, "no new job was pushed for the wait");

    // When the block has passed, the same job runs and delivers; while it calls, its run
    // reads running, not waiting until a time past.
    engine.clock.advance(Span::seconds(21));
    let again = take_due_jobs(&db.pool, until).await.remove(0);
    assert_eq!(again.id, job.id);
    target.set_latency(std::time::Duration::from_millis(500));
    let running = tokio::spawn({
        let engine = engine.clone();
        async move { run_job(&engine, &again).await }
    });
    eventually("a call is in flight", || {
        let target = target.clone();
        async move { target.in_flight() == 1 }
    })
    .await;
    let (run, resume_at): (String, Option<At>) =
        sqlx::query_as("SELECT status, resume_at FROM runs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((run.as_str(), resume_at), ("running", None));
    running.await.unwrap();
    assert_eq!(delivered(&db.pool).await, 3);
}

#[tokio::test]
async fn a_chain_job_is_bound_to_its_run_not_to_its_payload() {
    let (db, target) = shop(&["customers", "orders"], 10, 1).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 3))
        .await
        .unwrap();
    enqueue::enqueue(&db.pool, "orders", NewDelivery::new("o:1", json!({})))
        .await
        .unwrap();
    courier::dispatcher::Dispatcher::new(&engine)
        .run_once()
        .await
        .unwrap();
    let mut jobs = take_jobs(&engine).await;
    jobs.sort_by_key(|j| j.job.run_id);
    // Run A's job claiming to be rule B's.
    let mut forged = jobs[0].clone();
    forged.job.rule_id = jobs[1].job.rule_id;
    assert_eq!(run_job(&engine, &forged).await, ChainOutcome::Skipped);
    assert_eq!(target.counters().requests, 0);
}
