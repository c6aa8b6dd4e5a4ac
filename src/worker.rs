//! The worker process: the shared [`Engine`] state, the apalis worker that executes chain
//! jobs, the dispatcher and reaper loops, and a graceful stop on SIGTERM or Ctrl-C (stop
//! taking work, let in-flight calls finish within the shutdown timeout, record them).

use std::{sync::Arc, time::Duration};

use apalis::prelude::{
    BackendExt, BoxDynError, Data, Monitor, TaskId, WorkerBuilder, WorkerBuilderExt,
};
use apalis_postgres::{Config, PostgresStorage};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{
    chain,
    clock::Clock,
    config::Settings,
    dispatch::{Dispatcher, Reaper},
    pacer::Pacer,
    queue::{CHAIN_QUEUE, ChainJob, Tick},
};

/// What every part of a worker process shares.
pub struct Engine {
    /// The database holding courier's tables and the queue.
    pub pool: PgPool,
    /// Validated settings.
    pub settings: Settings,
    /// Where "now" comes from (manual in tests).
    pub clock: Clock,
    /// One HTTP client (and connection pool) for every writer.
    pub http: reqwest::Client,
    /// Unique per process: owner of rule leases, creator of runs, apalis worker name.
    pub worker_name: String,
    /// Cancelled when the process is asked to stop.
    pub shutdown: CancellationToken,
    /// Request slots per budget, fair between rules, shared with other processes.
    pub pacer: Arc<Pacer>,
}

impl Engine {
    /// An engine on `pool` with the system clock and a fresh unique worker name.
    pub fn new(pool: PgPool, settings: Settings) -> Self {
        Self::with_clock(pool, settings, Clock::system())
    }

    /// An engine whose notion of "now" comes from `clock` (tests pass a manual one).
    pub fn with_clock(pool: PgPool, settings: Settings, clock: Clock) -> Self {
        Self {
            pacer: Arc::new(Pacer::new(pool.clone(), clock.clone())),
            pool,
            settings,
            clock,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()
                .expect("reqwest client builds"),
            worker_name: unique_worker_name(),
            shutdown: CancellationToken::new(),
        }
    }
}

/// `courier-<host>-<pid>-<random>`: a restarted process never reuses a dead one's name
/// (apalis would otherwise keep the dead one's jobs "running" forever).
pub fn unique_worker_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!(
        "courier-{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// The apalis handler: decodes the payload itself, so a payload that is not a chain job
/// fails that job with a clear log line instead of stopping the worker.
async fn handle(
    payload: serde_json::Value,
    engine: Data<Arc<Engine>>,
    task_id: TaskId,
) -> Result<(), BoxDynError> {
    let job: ChainJob = match serde_json::from_value(payload.clone()) {
        Ok(job) => job,
        Err(e) => {
            tracing::error!(task = %task_id, %payload, error = %e, "undecodable chain job dropped");
            return Err(Box::new(apalis::prelude::AbortError::new(e)));
        }
    };
    let id = task_id.to_string();
    match chain::execute(&engine, job, Some(&id)).await {
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::error!(run = job.run_id, rule = job.rule_id, error = %e, "chain job failed; apalis retries it");
            Err(Box::new(e))
        }
    }
}

/// Runs dispatcher, reaper and the chain worker until `engine.shutdown` is cancelled.
pub async fn run(engine: Arc<Engine>) -> anyhow::Result<()> {
    let shutdown = engine.shutdown.clone();
    let dispatcher = {
        let engine = engine.clone();
        let token = shutdown.clone();
        tokio::spawn(async move { Dispatcher::new(&engine).run(token).await })
    };
    let reaper = {
        let engine = engine.clone();
        let token = shutdown.clone();
        tokio::spawn(async move { Reaper::new(&engine).run(token).await })
    };

    let factory_engine = engine.clone();
    let monitor = Monitor::new()
        .register(move |_restarts| {
            let e = factory_engine.clone();
            let config = Config::default()
                .queue(CHAIN_QUEUE)
                .batch_size(e.settings.queue_batch_size)
                .heartbeat_interval(Duration::from_secs(30))
                .missed_heartbeats(10);
            let storage = PostgresStorage::<serde_json::Value>::new(&e.pool)
                .with_config(config)
                .with_pubsub()
                .poll_with_strategy(Tick::every(e.settings.queue_poll));
            WorkerBuilder::new(e.worker_name.clone())
                .backend(storage)
                .data(e.clone())
                .concurrency(e.settings.worker_concurrency)
                .build(handle)
        })
        .should_restart(|_ctx, error| {
            tracing::error!(%error, "chain worker stopped; restarting");
            true
        })
        .shutdown_timeout(engine.settings.shutdown_timeout);
    tracing::info!(worker = %engine.worker_name, "worker started");
    let token = shutdown.clone();
    monitor
        .run_with_signal(async move {
            token.cancelled().await;
            Ok(())
        })
        .await?;
    dispatcher.await??;
    reaper.await?;
    tracing::info!("worker stopped");
    Ok(())
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler installs");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("stop requested: finishing in-flight calls");
        token.cancel();
    });
}
