//! The worker process: the chain-job service stack (the [`throttle`](crate::throttle)
//! layer around the chain job), the apalis worker that executes it, the queue listener,
//! the maintenance loops, and a graceful stop on SIGTERM or Ctrl-C (stop taking work, let
//! in-flight calls finish within the shutdown timeout, record them).
//!
//! Start-up order: the first heartbeat; then the loops, the queue listener and the apalis
//! worker (which fetches once it registered, and again each time the listener subscribes);
//! the dispatcher only once the listener listens, so no job it pushes is announced to
//! nobody. "worker started" is logged then.

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
    chain::{self, JobOutcome},
    maintenance::{
        dispatcher::Dispatcher, heartbeat::Heartbeat, pruner::Pruner, quarantine::Quarantine,
        reaper::Reaper, rescuer::Rescuer, retention::Retention,
    },
    queue::{self, ChainBackend, Fetcher},
    throttle::{Admitted, ThrottleLayer},
};

/// The chain job itself, behind the throttle: runs the admitted job.
#[derive(Clone)]
pub struct ChainService {
    engine: Arc<Engine>,
}

impl Service<Task<serde_json::Value>> for ChainService {
    type Response = JobOutcome;
    type Error = BoxDynError;
    type Future = BoxFuture<'static, Result<JobOutcome, BoxDynError>>;

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
    Response = JobOutcome,
    Error = BoxDynError,
    Future = BoxFuture<'static, Result<JobOutcome, BoxDynError>>,
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
    // The first beat precedes any job this process takes: a job locked by a process
    // without a beat would be taken for a dead one's.
    Heartbeat::new(&engine).run_once().await?;
    crate::breaker::forget_unusable(&engine.pool).await?;
    // The beat goes on until the jobs in flight have finished (a stop waits for them):
    // a process that stopped beating first would see them taken for a dead one's.
    let beat_stop = tokio_util::sync::CancellationToken::new();
    let beat = {
        let (engine, token) = (engine.clone(), beat_stop.clone());
        tokio::spawn(async move { Heartbeat::new(&engine).run(token).await })
    };
    let loops = [
        spawn_loop(&engine, |e, token| async move {
            Rescuer::new(&e).run(token).await
        }),
        spawn_loop(&engine, |e, token| async move {
            Reaper::new(&e).run(token).await
        }),
        spawn_loop(&engine, |e, token| async move {
            Pruner::new(&e).run(token).await
        }),
        spawn_loop(&engine, |e, token| async move {
            Retention::new(&e).run(token).await
        }),
        spawn_loop(&engine, |e, token| async move {
            Quarantine::new(&e).run(token).await
        }),
        tokio::spawn(queue::listen(
            engine.pool.clone(),
            engine.worker_name.clone(),
            fetcher.clone(),
            shutdown.clone(),
        )),
    ];
    let mut dispatcher = {
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
    };

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
    let token = shutdown.clone();
    let monitor = monitor.run_with_signal(async move {
        token.cancelled().await;
        Ok(())
    });
    let mut monitor = std::pin::pin!(monitor);
    // Whichever ends first: the queue worker (stopped, or failed for good) or the
    // dispatcher (which returns before a stop only when it could not start).
    let (monitor_done, dispatched) = tokio::select! {
        ran = &mut monitor => {
            ran?;
            (true, None)
        }
        ended = &mut dispatcher => (false, Some(ended)),
    };
    let dispatcher_ended = dispatched.is_some();
    let failure = match dispatched {
        Some(Ok(Ok(()))) | None => None,
        Some(Ok(Err(e))) => Some(anyhow::Error::new(e).context("the dispatcher could not run")),
        Some(Err(e)) => Some(anyhow::Error::new(e).context("the dispatcher panicked")),
    };
    shutdown.cancel();
    if !monitor_done {
        monitor.await?;
    }
    if !dispatcher_ended {
        dispatcher.await??;
    }
    for handle in loops {
        handle.await?;
    }
    match Rescuer::new(&engine).release_own().await {
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
    beat.await?;
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
