//! Delivery through a target's asynchronous jobs survives a crash, with real `courier
//! worker` processes: a worker that submitted jobs and is polling them is killed with
//! SIGKILL; a second worker takes the polling over once the first is found dead (by the
//! rescuer's rule, before the job's lease lapses) and settles every record once. No job is
//! submitted twice for the same records, and the target holds each record once.

use std::time::{Duration, Instant};

use crate::common::*;
use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
};
use courier_target::{
    Target,
    jobs::{JobEnd, JobsConfig},
};
use serde_json::json;

/// Workers that take a process silent for 4 s for dead.
const DEAD_AFTER: &[(&str, &str)] = &[("COURIER_WORKER_DEAD_AFTER_SECONDS", "4")];

async fn shop(pool: &sqlx::PgPool, url: &str) {
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: "klaviyo".into(),
            writer: "http_json".into(),
            base_url: url.into(),
            max_in_flight: Some(2),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    catalog::upsert_rule(
        pool,
        &NewRule {
            name: "profiles".into(),
            connection: "klaviyo".into(),
            path: "api/profile-bulk-import-jobs".into(),
            records_per_call: Some(100),
            request: Some(json!({
                "item": {"type": "profile", "attributes": "{{payload}}"},
                "body": {"data": {"type": "profile-bulk-import-job",
                                  "attributes": {"profiles": {"data": "{{records}}"}}}}
            })),
            job: Some(json!({
                "id": "/data/id",
                "poll": {"path": "api/profile-bulk-import-jobs/{id}",
                         "status": "/data/attributes/status",
                         "complete": ["complete"], "failed": ["cancelled"]},
                "errors": {"path": "api/profile-bulk-import-jobs/{id}/import-errors",
                           "items": "/data", "next": "/links/next",
                           "record": {"pointer": {"pointer": "/attributes/source/pointer",
                                                  "prefix": "/data/attributes/profiles/data/"}},
                           "message": "/attributes/detail"},
                "first_poll_seconds": 1, "max_poll_seconds": 1
            })),
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_polling_its_jobs_loses_nothing_and_submits_nothing_twice() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    // Jobs run long enough that the kill finds them polled and still processing.
    target.set_jobs(JobsConfig {
        complete_after: Duration::from_secs(12),
        end: JobEnd::Complete,
        limited: false,
    });
    shop(&db.pool, &target.url()).await;
    let n = 300;
    let invalid = [7, 150, 299];
    let records = (0..n)
        .map(|i| {
            let mut p = json!({"email": format!("p{i}@example.com")});
            if invalid.contains(&i) {
                p["invalid"] = json!(true);
            }
            NewDelivery::new(format!("p:{i}"), p)
        })
        .collect();
    enqueue::enqueue_many(&db.pool, "profiles", records)
        .await
        .unwrap();

    // Each answer takes a while, so the kill can find a poll in flight.
    target.set_latency(Duration::from_millis(1500));
    let mut first = worker_process(&db.url, DEAD_AFTER);
    // A job polled once and leased for its next poll, in flight: the kill comes mid-poll.
    eventually("the first worker is polling a job again", || {
        let pool = db.pool.clone();
        async move {
            let polling: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM target_jobs WHERE polls >= 1 AND lease_owner IS NOT NULL",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            polling > 0
        }
    })
    .await;
    first.kill();
    let killed = Instant::now();
    let accepted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'accepted'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(accepted, n as i64, "every record in a job at the kill");

    let _second = worker_process(&db.url, DEAD_AFTER);
    // Within the test's minute: the jobs' two-minute leases are taken over once the
    // first process is found dead.
    eventually("every record settled", || {
        let pool = db.pool.clone();
        async move {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM deliveries WHERE status IN ('pending', 'accepted')",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            open == 0
        }
    })
    .await;
    println!(
        "settled {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let fates: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM deliveries GROUP BY 1 ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(fates, [("delivered".into(), 297), ("rejected".into(), 3)]);
    let settled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ledger WHERE outcome IN ('delivered', 'rejected')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(settled, n as i64, "each record settled once");
    let jobs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM target_jobs WHERE status = 'complete'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let submits = target
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/api/profile-bulk-import-jobs")
        .count();
    assert_eq!(
        (jobs, submits),
        (3, 3),
        "one job per 100 records, none twice"
    );
    let c = target.counters();
    assert_eq!((c.accepted_keys, c.duplicates), (297, 0));
}
