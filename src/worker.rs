//! The worker process: the chain-job service stack (the [`throttle`](crate::throttle)
//! layer around the chain job), the apalis worker that executes it, the queue listener,
//! the maintenance loops, and a graceful stop on SIGTERM or Ctrl-C (stop taking work, let
//! in-flight calls finish within the shutdown timeout, record them).
//!
//! Start-up order: what may fail without leaving anything behind (the unusable marks
//! forgotten); the first heartbeat; then the loops, the queue listener and the apalis
//! worker (which fetches once it registered, and again each time the listener subscribes);
//! the dispatcher only once the listener listens, so no job it pushes is announced to
//! nobody. "worker started" is logged then. From the first beat on, every way out (a
//! stop, or a part that failed) goes through the same end: the queue worker stopped, the
//! jobs this process still holds and its leases put back, its `workers` row removed; so a
//! start that fails leaves nothing another process must wait out.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use apalis::prelude::{BoxDynError, Monitor, Task, WorkerBuilder, WorkerBuilderExt};
use futures::{FutureExt, future::BoxFuture};
use std::panic::AssertUnwindSafe;
use tower::{Service, ServiceBuilder};

pub use crate::engine::{Engine, unique_worker_name};
use crate::{
    chain::{
        self, ChainOutcome,
        throttle::{Admitted, ThrottleLayer},
    },
    dispatcher::Dispatcher,
    erasure::eraser::Eraser,
    maintenance::{
        heartbeat::Heartbeat, pruner::Pruner, quarantine::Quarantine, reaper::Reaper,
        rescuer::Rescuer, retention::Retention,
    },
    poller::Poller,
    queue::{self, ChainBackend, Fetcher},
};

/// The chain job itself, behind the throttle: runs the admitted job.
#[derive(Clone)]
pub struct ChainService {
    engine: Arc<Engine>,
}

impl Service<Task<serde_json::Value>> for ChainService {
    type Response = ChainOutcome;
    type Error = BoxDynError;
    type Future = BoxFuture<'static, Result<ChainOutcome, BoxDynError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, task: Task<serde_json::Value>) -> Self::Future {
        let engine = self.engine.clone();
        Box::pin(async move {
            let Some(Admitted { ctx, task_id }) = task.data().get::<Admitted>().cloned() else {
                return Err("chain job reached the handler without the throttle layer".into());
            };
            let executed = AssertUnwindSafe(chain::execute(&engine, &ctx, &task_id))
                .catch_unwind()
                .await;
            match executed {
                Ok(Ok(outcome)) => Ok(outcome),
                Ok(Err(e)) => {
                    tracing::error!(run = ctx.run_id, rule = ctx.rule_id, error = %e, "chain job failed; apalis retries it");
                    Err(Box::new(e) as BoxDynError)
                }
                // A bug met by one run ends that run, not the worker or other rules.
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    tracing::error!(run = ctx.run_id, rule = ctx.rule_id, panic = %what, "chain job panicked; its run ends failed");
                    let next = chain::settle::Next::Finish {
                        status: crate::runs::RunStatus::Failed,
                        error: Some(format!("chain job panicked: {what}")),
                        until: None,
                    };
                    chain::release_lease(&engine, &ctx, &task_id).await;
                    let tally = chain::settle::Tally::default();
                    Ok(chain::settle::settle(&engine, &ctx, &task_id, tally, 0, next).await?)
                }
            }
        })
    }
}

/// The service apalis runs for every chain job, and tests drive: the throttle layer on
/// the chain job.
pub fn chain_service(
    engine: Arc<Engine>,
) -> impl Service<
    Task<serde_json::Value>,
    Response = ChainOutcome,
    Error = BoxDynError,
    Future = BoxFuture<'static, Result<ChainOutcome, BoxDynError>>,
> + Clone
+ Send
+ 'static {
    ServiceBuilder::new()
        .layer(ThrottleLayer::new(engine.clone()))
        .service(ChainService { engine })
}

/// Runs the maintenance loops and the chain worker until `engine.shutdown` is cancelled.
/// A loop that cannot start (or the queue worker failing for good) stops the process with
/// the reason.
pub async fn run(engine: Arc<Engine>) -> anyhow::Result<()> {
    run_with(engine, Fetcher::new()).await
}

/// [`run`] with the queue's [`Fetcher`] given: tests hold its listener back, or watch its
/// fetches and restarts.
pub async fn run_with(engine: Arc<Engine>, fetcher: Arc<Fetcher>) -> anyhow::Result<()> {
    let shutdown = engine.shutdown.clone();
    // Before the first beat: a start that fails here has written nothing of its own.
    crate::breaker::forget_unusable(&engine.pool).await?;
    // The first beat precedes any job this process takes: a job locked by a process
    // without a beat would be taken for a dead one's.
    Heartbeat::new(&engine).run_once().await?;
    // The beat goes on until the jobs in flight have finished (a stop waits for them):
    // a process that stopped beating first would see them taken for a dead one's.
    let beat_stop = tokio_util::sync::CancellationToken::new();
    let beat = {
        let (engine, token) = (engine.clone(), beat_stop.clone());
        tokio::spawn(async move { Heartbeat::new(&engine).run(token).await })
    };
    let loops = spawn_loops(&engine, &fetcher);
    let mut dispatcher = spawn_dispatcher(&engine, &fetcher);
    let monitor = chain_worker(&engine, fetcher);
    let mut monitor = std::pin::pin!(monitor);
    // Whichever ends first: the queue worker (stopped, or failed for good) or the
    // dispatcher (which returns before a stop only when it could not start). Whatever
    // failed, the end below runs in full; the first failure is the process's reason.
    let dispatched = |ended: Result<Result<(), sqlx::Error>, tokio::task::JoinError>| match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(anyhow::Error::new(e).context("the dispatcher could not run")),
        Err(e) => Some(anyhow::Error::new(e).context("the dispatcher panicked")),
    };
    let (mut failure, monitor_done, dispatcher_done) = tokio::select! {
        ran = &mut monitor => {
            let failed = ran.err().map(|e| anyhow::Error::new(e).context("the chain worker failed"));
            (failed, true, false)
        }
        ended = &mut dispatcher => (dispatched(ended), false, true),
    };
    shutdown.cancel();
    if !monitor_done && let Err(e) = monitor.await {
        failure.get_or_insert(anyhow::Error::new(e).context("the chain worker failed"));
    }
    if !dispatcher_done && let Some(e) = dispatched(dispatcher.await) {
        failure.get_or_insert(e);
    }
    wind_down(&engine, loops, beat_stop, beat, failure).await
}

/// The maintenance loops and the queue listener, running until the engine's shutdown.
fn spawn_loops(engine: &Arc<Engine>, fetcher: &Arc<Fetcher>) -> [tokio::task::JoinHandle<()>; 7] {
    let shutdown = engine.shutdown.clone();
    [
        spawn_loop(engine, |e, token| async move {
            Rescuer::new(&e).run(token).await
        }),
        spawn_loop(engine, |e, token| async move {
            Reaper::new(&e).run(token).await
        }),
        spawn_loop(engine, |e, token| async move {
            Pruner::new(&e).run(token).await
        }),
        spawn_loop(engine, |e, token| async move {
            Retention::new(&e).run(token).await
        }),
        spawn_loop(engine, |e, token| async move {
            Quarantine::new(&e).run(token).await
        }),
        spawn_loop(engine, |e, token| async move {
            if let Err(err) = Poller::new(&e).run(Eraser::new(&e), token).await {
                tracing::error!(error = %err, "the job poller cannot listen; jobs are polled and erasures carried out by other processes");
            }
        }),
        tokio::spawn(queue::listen(
            engine.pool.clone(),
            engine.worker_name.clone(),
            fetcher.clone(),
            shutdown.clone(),
        )),
    ]
}

/// The dispatcher, once the queue listener listens (a job pushed before would be
/// announced to nobody).
fn spawn_dispatcher(
    engine: &Arc<Engine>,
    fetcher: &Arc<Fetcher>,
) -> tokio::task::JoinHandle<Result<(), sqlx::Error>> {
    let shutdown = engine.shutdown.clone();
    {
        let engine = engine.clone();
        let token = shutdown.clone();
        let fetcher = fetcher.clone();
        tokio::spawn(async move {
            // A job pushed before the queue listener listens would be announced to nobody.
            tokio::select! {
                _ = fetcher.listening() => {}
                _ = token.cancelled() => return Ok(()),
            }
            tracing::info!(worker = %engine.worker_name, "worker started");
            Dispatcher::new(&engine).run(token).await
        })
    }
}

/// The apalis monitor running the chain worker until the engine's shutdown, restarting it
/// after a failure (with a pause).
fn chain_worker(
    engine: &Arc<Engine>,
    fetcher: Arc<Fetcher>,
) -> impl std::future::Future<Output = Result<(), apalis_core::monitor::MonitorError>> + use<> {
    let shutdown = engine.shutdown.clone();
    let (factory_engine, factory_fetcher) = (engine.clone(), fetcher.clone());
    let monitor = Monitor::new()
        .register(move |_restarts| {
            let e = factory_engine.clone();
            WorkerBuilder::new(e.worker_name.clone())
                .backend(ChainBackend::new(&e, &factory_fetcher))
                .concurrency(e.settings.worker_concurrency)
                .build(chain_service(e.clone()))
        })
        .should_restart(move |_ctx, error| {
            // The restarted worker pauses before it registers again (doubling, capped).
            fetcher.restarted();
            tracing::error!(%error, "chain worker stopped; restarting it after a pause");
            true
        })
        .shutdown_timeout(engine.settings.shutdown_timeout);
    monitor.run_with_signal(async move {
        shutdown.cancelled().await;
        Ok(())
    })
}

/// The end of a worker, after a stop or a failure: the loops' ends, the process's jobs put
/// back, the beat stopped last; the first `failure` (or a panic met here) is its reason.
async fn wind_down(
    engine: &Arc<Engine>,
    loops: [tokio::task::JoinHandle<()>; 7],
    beat_stop: tokio_util::sync::CancellationToken,
    beat: tokio::task::JoinHandle<()>,
    mut failure: Option<anyhow::Error>,
) -> anyhow::Result<()> {
    for handle in loops {
        if let Err(e) = handle.await {
            failure.get_or_insert(anyhow::Error::new(e).context("a maintenance loop panicked"));
        }
    }
    match Rescuer::new(engine).release_own().await {
        Ok(jobs) if !jobs.is_empty() => {
            tracing::info!(
                jobs = jobs.len(),
                "unfinished chain jobs put back in the queue"
            )
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "could not put this worker's unfinished jobs back; the rescuer of another will"
        ),
    }
    beat_stop.cancel();
    if let Err(e) = beat.await {
        failure.get_or_insert(anyhow::Error::new(e).context("the heartbeat panicked"));
    }
    match failure {
        Some(reason) => Err(reason),
        None => {
            tracing::info!("worker stopped");
            Ok(())
        }
    }
}

/// Spawns a maintenance loop that runs until the engine's shutdown.
fn spawn_loop<F, Fut>(engine: &Arc<Engine>, body: F) -> tokio::task::JoinHandle<()>
where
    F: FnOnce(Arc<Engine>, tokio_util::sync::CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(body(engine.clone(), engine.shutdown.clone()))
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub fn cancel_on_signal(token: tokio_util::sync::CancellationToken) {
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
