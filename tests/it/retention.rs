//! Retention (`maintenance::retention`): old finished rows go in bounded batches; young,
//! pending and failed ones stay; `depends_on` still sees keys delivered long ago.

use crate::common::*;
use chrono::Duration as Span;
use courier::{
    enqueue::{self, NewDelivery},
    maintenance::retention::Retention,
};
use serde_json::json;

async fn scalar(pool: &sqlx::PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn old_finished_rows_go_in_bounded_batches_and_the_rest_stays() {
    let (db, target) = shop(&["customers"], 10, 4).await;
    let engine = engine(&db.pool, settings(&db.url));
    assert_eq!(
        engine.settings.retention,
        Some(std::time::Duration::from_secs(7 * 86_400))
    );
    // Old: 25 delivered (one run, one job of three batches) and 3 rejected (another run).
    enqueue::enqueue_many(&db.pool, "customers", burst("old", 25))
        .await
        .unwrap();
    drive(&engine).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("rej", 3))
        .await
        .unwrap();
    target.respond_with(422, None);
    drive(&engine).await;
    target.respond_with(200, None);
    let old_jobs: Vec<String> = sqlx::query_scalar("SELECT id FROM apalis.jobs")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    // One job each: a job claims up to BATCHES_PER_JOB batches of the run.
    assert_eq!(old_jobs.len(), 2);

    // Eight days later: 5 young deliveries, 2 pending ones.
    engine.clock.advance(Span::days(8));
    enqueue::enqueue_many(&db.pool, "customers", burst("young", 5))
        .await
        .unwrap();
    drive(&engine).await;
    enqueue::enqueue_many(&db.pool, "customers", burst("pend", 2))
        .await
        .unwrap();
    // The queue stamps jobs with the database's time, not the test's clock: the young
    // run's jobs ended "now" by the test's clock.
    sqlx::query("UPDATE apalis.jobs SET done_at = $1 WHERE NOT (id = ANY($2))")
        .bind(engine.clock.now())
        .bind(&old_jobs)
        .execute(&db.pool)
        .await
        .unwrap();

    let removed = Retention::with_batch(&engine, 10).run_once().await.unwrap();
    assert_eq!(removed.deliveries, 25);
    assert_eq!(removed.ledger, 25);
    assert_eq!(removed.runs, 1, "the rejected run keeps its ledger rows");
    assert_eq!(removed.jobs, old_jobs.len() as u64);
    assert!(removed.largest <= 10, "{removed:?}");
    // 25 deliveries at 10 per statement take 3; runs, queue jobs and target jobs one each.
    assert_eq!(removed.batches, 6, "{removed:?}");

    let left: Vec<(String, String)> = sqlx::query_as(
        "SELECT split_part(record_key, ':', 1), status FROM deliveries
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let left: Vec<(&str, &str)> = left.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(
        left,
        vec![
            ("pend", "pending"),
            ("rej", "rejected"),
            ("young", "delivered")
        ]
    );
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM ledger").await, 3 + 5);
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM runs").await, 2);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM apalis.jobs").await,
        1
    );
    // Suppression and depends_on keep what they read.
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM delivered_records").await,
        30
    );
    let again = Retention::new(&engine).run_once().await.unwrap();
    assert!(!again.any(), "{again:?}");

    // A delivery waiting for a key delivered long ago is not orphaned.
    let mut dep = NewDelivery::new("dep:1", json!({}));
    dep.depends_on = Some("old:0".into());
    enqueue::enqueue(&db.pool, "customers", dep).await.unwrap();
    drive(&engine).await;
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM deliveries WHERE record_key = 'dep:1' AND status = 'delivered'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn retention_off_keeps_everything() {
    let (db, _target) = shop(&["customers"], 10, 4).await;
    let settings = courier::config::Settings {
        retention: None,
        ..settings(&db.url)
    };
    let engine = engine(&db.pool, settings);
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 5))
        .await
        .unwrap();
    drive(&engine).await;
    engine.clock.advance(Span::days(3650));
    let removed = Retention::new(&engine).run_once().await.unwrap();
    assert!(!removed.any());
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM deliveries").await, 5);
}

#[tokio::test]
async fn a_finished_target_job_goes_once_no_ledger_row_names_it() {
    let (db, _target) = shop(&["customers"], 10, 4).await;
    let engine = engine(&db.pool, settings(&db.url));
    enqueue::enqueue_many(&db.pool, "customers", burst("c", 1))
        .await
        .unwrap();
    drive(&engine).await;
    let (rule, run, delivery): (i64, i64, i64) =
        sqlx::query_as("SELECT rule_id, run_id, delivery_id FROM ledger LIMIT 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let now = engine.clock.now();
    let old = now - Span::days(8);
    // Ended eight days ago: one no row names, one a kept ledger row names, one overdue
    // whose record is still accepted; ended now; still running.
    for (name, status, finished) in [
        ("gone", "complete", Some(old)),
        ("named", "complete", Some(old)),
        ("overdue", "overdue", Some(old)),
        ("young", "failed", Some(now)),
        ("running", "submitted", None),
    ] {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO target_jobs (rule_id, run_id, target_id, status, delivery_ids,
                                      submitted_at, next_poll_at, poll_every_ms, finished_at)
             VALUES ($1, $2, $3, $4, ARRAY[$5::bigint], $6, $6, 1000, $7) RETURNING id",
        )
        .bind(rule)
        .bind(run)
        .bind(name)
        .bind(status)
        .bind(delivery)
        .bind(old)
        .bind(finished)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if matches!(name, "named" | "overdue") {
            sqlx::query(
                "INSERT INTO ledger (run_id, rule_id, delivery_id, outcome, attempt, created_at,
                                     target_job)
                 VALUES ($1, $2, $3, 'accepted', 1, $4, $5)",
            )
            .bind(run)
            .bind(rule)
            .bind(delivery)
            .bind(old)
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
        }
    }
    let removed = Retention::new(&engine).run_once().await.unwrap();
    assert_eq!(removed.target_jobs, 1, "{removed:?}");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT target_id FROM target_jobs ORDER BY target_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, ["named", "overdue", "running", "young"]);
}
