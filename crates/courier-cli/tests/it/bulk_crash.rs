//! Bulk delivery survives a crash mid-batch, with real `courier worker` processes: a worker
//! sending 25 records per call is killed with SIGKILL while its calls are in flight; a
//! second worker finishes the backlog. Nothing is lost, no record is delivered twice in the
//! ledger, and what the target saw twice is at most the records of the calls in flight plus
//! about a second of calls (the crash bound, counted in records).

use std::time::Duration;

use crate::common::*;
use courier::{
    catalog::{self, NewConnection, NewRule},
    enqueue::{self, NewDelivery},
};
use courier_target::Target;

/// Records per call of the test's rule.
const PER_CALL: i32 = 25;
/// Calls in flight at once.
const IN_FLIGHT: i32 = 2;
/// Calls per second the connection declares.
const RATE: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_loses_nothing_and_resends_at_most_its_calls_in_flight() {
    let db = TestDb::new().await;
    let target = Target::start(0).await.unwrap();
    // Each call takes a while, so the kill finds calls in flight.
    target.set_latency(Duration::from_millis(300));
    catalog::upsert_connection(
        &db.pool,
        &NewConnection {
            name: "sink".into(),
            writer: "http_json".into(),
            base_url: target.url(),
            requests_per_minute: Some(RATE * 60),
            max_in_flight: Some(IN_FLIGHT),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    catalog::upsert_rule(
        &db.pool,
        &NewRule {
            name: "events".into(),
            connection: "sink".into(),
            path: "batch/per-item/".into(),
            records_per_call: Some(PER_CALL),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let n = 1_000;
    let records = (0..n)
        .map(|i| NewDelivery::new(format!("e:{i}"), serde_json::json!({"n": i})))
        .collect();
    enqueue::enqueue_many(&db.pool, "events", records)
        .await
        .unwrap();

    let mut first = worker_process(&db.url, &[]);
    // Mid-batch: some calls answered (and perhaps committed), more to come.
    eventually("the first worker has delivered a few calls", || {
        let target = target.clone();
        async move { target.counters().accepted_keys >= 3 * PER_CALL as usize }
    })
    .await;
    first.kill();
    let sent_at_kill = target.counters().accepted_keys;

    let _second = worker_process(&db.url, &[]);
    eventually("every record is delivered", || {
        let pool = db.pool.clone();
        async move { delivered(&pool).await == n }
    })
    .await;
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE outcome = 'delivered'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ledger, n, "one delivered ledger row per record");
    let c = target.counters();
    assert_eq!(c.accepted_keys as i64, n, "every record arrived");
    // The calls in flight at the kill, plus about a second of calls, in records.
    let bound = ((IN_FLIGHT + RATE) * PER_CALL) as u64;
    assert!(
        c.duplicates <= bound,
        "{} records sent twice after the kill (bound {bound}; {sent_at_kill} had arrived)",
        c.duplicates
    );
}
