//! The background loops that keep a worker process's house (the dispatcher, which starts
//! the work, is [`crate::dispatcher`]). Each has the same shape: a struct over the
//! [`Engine`](crate::engine::Engine), a `run_once` that tests call directly, and a `run(shutdown)` that repeats
//! it until the process stops.
//!
//! - [`heartbeat`]: this process's beat in table `workers`.
//! - [`rescuer`]: resumes the runs of dead processes, and runs whose job was lost.
//! - [`reaper`]: ends runs whose heartbeat went quiet for the whole staleness window.
//! - [`pruner`]: forgets call counts and dead processes nobody reads any more.
//! - [`quarantine`]: sets aside rows of the chain queue apalis cannot read.
//! - [`retention`]: removes deliveries, ledger rows, runs and queue jobs that ended longer
//!   ago than `COURIER_RETENTION_DAYS`, in bounded batches.

pub mod heartbeat;
pub mod pruner;
pub mod quarantine;
pub mod reaper;
pub mod rescuer;
pub mod retention;

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::health::{Health, is_outage};

/// Repeats `pass` every `period` until `shutdown`; a failed pass is logged (an outage
/// once, through `health`) and the next one tried at its time: a database outage must
/// not end the loop.
pub(crate) async fn every<F, Fut, T>(
    what: &str,
    period: Duration,
    health: &Health,
    shutdown: CancellationToken,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pass().await {
            failed(health, what, &e);
        }
    }
}

/// Logs a failed pass: an outage once for the whole process, anything else every time.
pub(crate) fn failed(health: &Health, what: &str, e: &sqlx::Error) {
    if is_outage(e) {
        health.failed(e);
    } else {
        tracing::error!(error = %e, "{what} pass failed");
    }
}
