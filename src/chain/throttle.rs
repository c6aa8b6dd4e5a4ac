//! The throttle: a tower [`Layer`] on the apalis chain-job service. Before a
//! chain job runs, it reads the job's run (rule and connection come from the run row, not
//! the payload) and the block on the connection's budget from [`Blocks`](crate::ratelimit::blocks::Blocks),
//! the in-memory copy kept current by NOTIFY. A wait up to `throttle_max_wait` snoozes
//! **the same apalis job** until the block ends and marks the run `waiting`; a longer one
//! finishes the run `throttled`. Only jobs that may call reach the chain job itself, which
//! in turn only reports a 429 it met (the block it sets).

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use apalis::prelude::{AbortError, BoxDynError, Task};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tower::{Layer, Service};

use crate::{
    chain::{
        ChainOutcome,
        context::{self, ChainContext},
        settle::{self, Next, Tally},
    },
    engine::Engine,
    queue::{self, ChainJob},
    runs::RunStatus,
};

/// What a chain does about a block ending at `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No block: go on.
    Proceed,
    /// Sit it out: run again at this time.
    Wait(DateTime<Utc>),
    /// Too long: end the run as throttled.
    Throttle(DateTime<Utc>),
}

/// Decides between going on, waiting and ending the run.
pub fn decide(until: Option<DateTime<Utc>>, now: DateTime<Utc>, max_wait: Duration) -> Decision {
    match until {
        Some(t) if t > now => {
            let wait = (t - now).to_std().unwrap_or_default();
            if wait <= max_wait {
                Decision::Wait(t)
            } else {
                Decision::Throttle(t)
            }
        }
        _ => Decision::Proceed,
    }
}

/// A budget booked by other processes further ahead than this makes a job wait for it in
/// the queue; it is let go half this long before the budget is free again.
pub const PACING_SNOOZE_AFTER: chrono::Duration = chrono::Duration::seconds(2);

/// What the throttle hands the chain job: its run, read and cleared to call.
#[derive(Clone, Debug)]
pub struct Admitted {
    /// The run, its rule, connection and circuit.
    pub ctx: Arc<ChainContext>,
    /// The apalis job's id (to snooze it).
    pub task_id: String,
}

/// Wraps the chain-job service with the throttle.
#[derive(Clone)]
pub struct ThrottleLayer {
    engine: Arc<Engine>,
}

impl ThrottleLayer {
    /// A throttle reading `engine`'s blocks and settings.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            engine: self.engine.clone(),
        }
    }
}

/// The throttle around a chain-job service `S`.
#[derive(Clone)]
pub struct Throttle<S> {
    inner: S,
    engine: Arc<Engine>,
}

impl<S> Service<Task<serde_json::Value>> for Throttle<S>
where
    S: Service<Task<serde_json::Value>, Response = ChainOutcome, Error = BoxDynError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = ChainOutcome;
    type Error = BoxDynError;
    type Future = BoxFuture<'static, Result<ChainOutcome, BoxDynError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut task: Task<serde_json::Value>) -> Self::Future {
        // The clone that was made ready is the one to call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let engine = self.engine.clone();
        Box::pin(async move {
            match gate(&engine, &task).await? {
                Gate::Done(outcome) => Ok(outcome),
                Gate::Pass(admitted) => {
                    task.inject_data(admitted);
                    inner.call(task).await
                }
            }
        })
    }
}

enum Gate {
    /// The job may call: hand it on.
    Pass(Admitted),
    /// The throttle (or a gone run) decided the job: this is what it did.
    Done(ChainOutcome),
}

/// Whether this job carries run `ctx`: the run is active, names this job, and is of the
/// rule the payload names; a job that does not does nothing (said in the log).
fn carries(ctx: &ChainContext, job: &ChainJob, task_id: &str) -> bool {
    if !ctx.run_status.is_active() {
        tracing::info!(run = job.run_id, status = ?ctx.run_status, "late job of a finished run: nothing to do");
        return false;
    }
    if ctx
        .job_id
        .as_deref()
        .is_some_and(|current| current != task_id)
    {
        tracing::info!(run = job.run_id, task = %task_id, current = ?ctx.job_id,
            "the run has moved on to another job: nothing to do");
        return false;
    }
    if ctx.rule_id != job.rule_id {
        tracing::warn!(
            run = job.run_id,
            rule = ctx.rule_id,
            payload_rule = job.rule_id,
            "chain job names another rule than its run: ignored"
        );
        return false;
    }
    true
}

async fn gate(engine: &Engine, task: &Task<serde_json::Value>) -> Result<Gate, BoxDynError> {
    let job: ChainJob = match serde_json::from_value(task.args.clone()) {
        Ok(job) => job,
        Err(e) => {
            tracing::error!(payload = %task.args, error = %e, "undecodable chain job dropped");
            return Err(Box::new(AbortError::new(e)));
        }
    };
    let Some(task_id) = task.task_id().map(ToString::to_string) else {
        return Err(Box::new(AbortError::new("a chain job without a task id")));
    };
    // Like every statement a job needs to keep its place, this rides out a database
    // restart: the job goes on a moment after the database answers again.
    let loaded = engine
        .retry_outage(|| context::load(engine, job.run_id, engine.clock.now()))
        .await?;
    let Some(ctx) = loaded.filter(|ctx| carries(ctx, &job, &task_id)) else {
        return Ok(Gate::Done(ChainOutcome::Skipped));
    };
    engine
        .blocks
        .ensure_listening(&engine.pool, &engine.shutdown)
        .await?;
    let now = engine.clock.now();
    let key = &ctx.connection.budget_key;
    let mut blocked = engine.blocks.until(key);
    if blocked.is_some_and(|t| t > now) {
        // About to wait: the copy may predate an operator's unblock (its NOTIFY still on
        // the way); one read of the table settles it.
        engine
            .retry_outage(|| engine.blocks.refresh(&engine.pool, key))
            .await?;
        blocked = engine.blocks.until(key);
    }
    let next = match decide(blocked, now, engine.settings.throttle_max_wait) {
        Decision::Proceed => {
            // No block in force: one this process met is over (lapsed or lifted).
            if let Some(until) = engine.blocks.take_announced(&ctx.connection.budget_key) {
                tracing::info!(budget = %ctx.connection.budget_key, %until, "rate-limit block over");
            }
            // The pacing window: a budget other processes have booked well ahead leaves
            // nothing to call with until then; wait for it in the queue, not in a worker
            // slot. The run stays running: this is pace, not a block.
            if let Some(free) = engine
                .pacer
                .next_free(&ctx.connection.budget_key)
                .filter(|&t| t - now > PACING_SNOOZE_AFTER)
            {
                let at = free - PACING_SNOOZE_AFTER / 2;
                queue::snooze(&engine.pool, &task_id, at).await?;
                queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), at);
                return Ok(Gate::Done(ChainOutcome::Rescheduled(at)));
            }
            return Ok(Gate::Pass(Admitted {
                ctx: Arc::new(ctx),
                task_id,
            }));
        }
        Decision::Wait(until) => Next::WaitUntil(until),
        Decision::Throttle(until) => Next::Finish {
            status: RunStatus::Throttled,
            error: None,
            until: Some(until),
        },
    };
    let outcome = settle::settle(engine, &ctx, &task_id, Tally::default(), 0, next).await?;
    Ok(Gate::Done(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_up_to_the_bound_are_sat_out() {
        let now = Utc::now();
        let max = Duration::from_secs(300);
        let at = |s: i64| Some(now + chrono::Duration::seconds(s));
        assert_eq!(decide(None, now, max), Decision::Proceed);
        assert_eq!(decide(at(0), now, max), Decision::Proceed);
        assert_eq!(decide(at(1), now, max), Decision::Wait(at(1).unwrap()));
        assert_eq!(decide(at(300), now, max), Decision::Wait(at(300).unwrap()));
        assert_eq!(
            decide(at(301), now, max),
            Decision::Throttle(at(301).unwrap())
        );
    }
}
