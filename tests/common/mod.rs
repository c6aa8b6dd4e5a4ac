//! Test helpers: a fresh database per test, an engine with a manual clock, a local target,
//! and a driver that executes a run's chain jobs step by step.

#![allow(dead_code)]

use std::{str::FromStr, sync::Arc};

use chrono::Utc;
use courier::{
    catalog::{self, NewConnection, NewRule},
    chain::{self, JobOutcome},
    clock::Clock,
    config::Settings,
    db,
    dispatch::Dispatcher,
    enqueue::NewDelivery,
    queue::{CHAIN_QUEUE, ChainJob},
    worker::Engine,
};
use courier_target::Target;
use sqlx::{PgPool, postgres::PgConnectOptions};

/// The server tests create their databases on: `COURIER_TEST_DATABASE_URL`, else the
/// local default.
pub fn server_url() -> String {
    std::env::var("COURIER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of its own for one test, migrated like a real one.
pub struct TestDb {
    pub pool: PgPool,
    pub url: String,
    name: String,
}

impl TestDb {
    pub async fn new() -> Self {
        let name = format!("courier_test_{:016x}", rand::random::<u64>());
        let server = server_url();
        let base = server.rsplit_once('/').expect("URL has a database").0;
        let url = format!("{base}/{name}");
        let pool = db::connect(&url, 10).await.expect("test database");
        db::migrate(&pool).await.expect("migrations apply");
        Self { pool, url, name }
    }

    /// Closes the pool and drops the database.
    pub async fn drop_db(self) {
        self.pool.close().await;
        let admin = PgPool::connect_with(PgConnectOptions::from_str(&server_url()).unwrap())
            .await
            .unwrap();
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&admin)
        .await;
    }
}

/// An engine on `pool` with a manual clock a little ahead of the database's `now()`, so
/// rows inserted with default timestamps are due.
pub fn engine(pool: &PgPool, settings: Settings) -> Arc<Engine> {
    let clock = Clock::manual(Utc::now() + chrono::Duration::seconds(5));
    Arc::new(Engine::with_clock(pool.clone(), settings, clock))
}

/// `n` deliveries with record keys `{prefix}:0` .. and small payloads `{"n": i}`.
pub fn burst(prefix: &str, n: usize) -> Vec<NewDelivery> {
    (0..n)
        .map(|i| NewDelivery::new(format!("{prefix}:{i}"), serde_json::json!({"n": i})))
        .collect()
}

/// Settings for tests: defaults with a fast poll.
pub fn settings(url: &str) -> Settings {
    Settings {
        database_url: url.to_owned(),
        queue_poll: std::time::Duration::from_millis(100),
        dispatch_interval: std::time::Duration::from_millis(200),
        ..Settings::default()
    }
}

/// Creates connection `shop` on `target` and rules with the given names and batch size.
pub async fn setup(pool: &PgPool, target: &Target, rules: &[&str], batch: i32, in_flight: i32) {
    catalog::upsert_connection(
        pool,
        &NewConnection {
            name: "shop".into(),
            writer: "http_json".into(),
            base_url: target.url(),
            api_key_env: None,
            headers: Default::default(),
            // Pacing is not what these tests are about: a budget they never exhaust.
            requests_per_minute: Some(600_000),
            max_in_flight: Some(in_flight),
            timeout_ms: Some(5_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for rule in rules {
        catalog::upsert_rule(
            pool,
            &NewRule {
                name: (*rule).into(),
                connection: "shop".into(),
                path: format!("{rule}/"),
                batch_size: Some(batch),
                max_attempts: Some(3),
                backoff_base_ms: Some(1_000),
                backoff_max_ms: Some(60_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
}

/// Takes every chain job due by `now` out of apalis' table (marking it done).
pub async fn take_due_jobs(pool: &PgPool, now: chrono::DateTime<Utc>) -> Vec<ChainJob> {
    let rows: Vec<Vec<u8>> = sqlx::query_scalar(
        "UPDATE apalis.jobs SET status = 'Done', done_at = now()
         WHERE job_type = $1 AND status = 'Pending' AND run_at <= $2 RETURNING job",
    )
    .bind(CHAIN_QUEUE)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter()
        .map(|b| serde_json::from_slice(b).expect("chain job payload"))
        .collect()
}

/// Takes every queued chain job that is due now.
pub async fn take_jobs(pool: &PgPool) -> Vec<ChainJob> {
    take_due_jobs(pool, Utc::now() + chrono::Duration::seconds(5)).await
}

/// One dispatcher pass, then every chain job until none is left; returns their outcomes.
pub async fn drive(engine: &Engine) -> Vec<JobOutcome> {
    Dispatcher::new(engine).run_once().await.unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..10_000 {
        let jobs = take_due_jobs(&engine.pool, engine.clock.now()).await;
        if jobs.is_empty() {
            return outcomes;
        }
        for job in jobs {
            outcomes.push(chain::execute(engine, job, None).await.unwrap());
        }
    }
    panic!("chain did not end");
}

/// How many deliveries are delivered.
pub async fn delivered(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE status = 'delivered'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `(status, attempts)` of a delivery.
pub async fn delivery(pool: &PgPool, id: i64) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `(outcome, attempt)` ledger rows of a delivery, oldest first.
pub async fn ledger(pool: &PgPool, id: i64) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT outcome, attempt FROM ledger WHERE delivery_id = $1 ORDER BY id")
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Polls `cond` every 50 ms until it holds (up to 60 s); for tests that run a real worker.
pub async fn eventually<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(std::time::Duration::from_secs(60), what, cond).await
}

/// Polls `cond` every 50 ms until it holds, failing after `limit`: for a bound that is part
/// of the behaviour (a wait must end when its block lapses, not at some later heartbeat).
pub async fn within<F, Fut>(limit: std::time::Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}
