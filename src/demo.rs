//! `courier demo`: the end-to-end showcase. On a fresh `courier_demo` database (on the
//! server `DATABASE_URL` points at) it starts a local target, creates a connection and
//! three rules, enqueues a burst, runs a worker in-process with live progress, and ends with
//! a summary proving every record arrived exactly once.

use std::{sync::Arc, time::Instant};

use anyhow::Context;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;

use crate::{
    catalog::{self, NewConnection, NewRule},
    config::Settings,
    db,
    enqueue::{self, NewDelivery},
    target::Target,
    worker::{self, Engine},
};

/// The database the demo (re)creates on the configured server.
pub const DEMO_DATABASE: &str = "courier_demo";

/// Options of `courier demo`.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Deliveries to enqueue, spread over the three rules.
    pub records: usize,
}

/// Runs the demo; returns an error when any delivery did not arrive.
pub async fn run(mut settings: Settings, opts: DemoOptions) -> anyhow::Result<()> {
    let server = PgConnectOptions::from_str(&settings.database_url)?;
    let admin = sqlx::PgPool::connect_with(server.clone().database("postgres"))
        .await
        .context("connecting to PostgreSQL (is it running? set DATABASE_URL)")?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    let url = {
        let base = settings
            .database_url
            .rsplit_once('/')
            .map_or("", |(b, _)| b);
        format!("{base}/{DEMO_DATABASE}")
    };
    settings.database_url = url.clone();
    println!("demo database: {DEMO_DATABASE} (fresh)");
    let pool = db::connect(&url, settings.db_max_connections).await?;
    db::migrate(&pool).await?;

    let target = Target::start(0).await?;
    println!("local target listening on {}", target.url());
    catalog::upsert_connection(
        &pool,
        &NewConnection {
            name: "demo-shop".into(),
            writer: "http_json".into(),
            base_url: target.url(),
            api_key_env: None,
            headers: Default::default(),
            requests_per_minute: None,
            max_in_flight: Some(16),
            timeout_ms: None,
            ..Default::default()
        },
    )
    .await?;
    let rules = ["customers", "consents", "price_changes"];
    for name in rules {
        catalog::upsert_rule(
            &pool,
            &NewRule {
                name: name.into(),
                connection: "demo-shop".into(),
                path: format!("{name}/"),
                batch_size: Some(500),
                max_attempts: None,
                backoff_base_ms: None,
                backoff_max_ms: None,
                ..Default::default()
            },
        )
        .await?;
    }

    let started = Instant::now();
    for (i, name) in rules.iter().enumerate() {
        let n = opts.records / rules.len() + usize::from(i < opts.records % rules.len());
        let batch = (0..n)
            .map(|k| {
                NewDelivery::new(
                    format!("{name}:{k}"),
                    serde_json::json!({"id": k, "kind": name, "seq": k}),
                )
            })
            .collect();
        enqueue::enqueue_many(&pool, name, batch).await?;
    }
    println!(
        "enqueued {} deliveries over {} rules",
        opts.records,
        rules.len()
    );

    let engine = Arc::new(Engine::new(pool.clone(), settings));
    worker::cancel_on_signal(engine.shutdown.clone());
    let handle = tokio::spawn(worker::run(engine.clone()));

    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let row = sqlx::query!(
            r#"SELECT count(*) FILTER (WHERE status = 'pending') AS "pending!",
                      count(*) FILTER (WHERE status = 'delivered') AS "delivered!",
                      count(*) FILTER (WHERE status IN ('rejected', 'exhausted')) AS "failed!"
               FROM deliveries"#
        )
        .fetch_one(&pool)
        .await?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "[{secs:5.1}s] delivered {:>7}  pending {:>7}  failed {:>3}  rate {:>7.0}/s",
            row.delivered,
            row.pending,
            row.failed,
            row.delivered as f64 / secs
        );
        if row.pending == 0 || engine.shutdown.is_cancelled() {
            break;
        }
    }
    engine.shutdown.cancel();
    handle.await??;

    let elapsed = started.elapsed().as_secs_f64();
    let counts = target.counters();
    let delivered: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM deliveries WHERE status = 'delivered'"#
    )
    .fetch_one(&pool)
    .await?;
    let failed: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM ledger WHERE outcome IN ('failed', 'exhausted', 'rejected')"#
    )
    .fetch_one(&pool)
    .await?;
    println!("\nsummary");
    println!("  delivered          {delivered} of {}", opts.records);
    println!("  failed outcomes    {failed}");
    println!(
        "  target accepted    {} distinct records, {} duplicates",
        counts.accepted_keys, counts.duplicates
    );
    println!("  most calls at once {}", counts.max_in_flight);
    println!(
        "  elapsed            {elapsed:.1}s ({:.0} deliveries/s)",
        delivered as f64 / elapsed
    );
    pool.close().await;
    anyhow::ensure!(
        delivered as usize == opts.records && counts.accepted_keys == opts.records,
        "not every record arrived"
    );
    Ok(())
}
