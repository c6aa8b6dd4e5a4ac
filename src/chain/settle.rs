//! The settle stage: the one path by which a chain job commits. Outcomes collect in a
//! [`Tally`] while calls answer and are committed in bulk every [`FLUSH_EVERY`] or
//! [`FLUSH_AFTER`] records (so a crash re-sends at most the calls in flight and about a
//! second's worth), and once more when the job ends, together with what comes next: a
//! [`Next`] decides whether the chain continues, waits, or finishes.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::context::ChainContext;
use crate::{
    breaker, catalog,
    engine::Engine,
    jobs,
    ledger::{self, Entry},
    paced::Heard,
    queue::{self, ChainJob},
    ratelimit::{answer::Verdict, blocks},
    runs::{self, Counters, Progress, RunStatus},
};

/// What a chain job did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainOutcome {
    /// It handled a batch and enqueued the next job.
    Continued,
    /// It ended the run with this status.
    Finished(RunStatus),
    /// Its run was no longer active (finished or reaped), or not its own: it did nothing.
    Skipped,
    /// Another job held the rule's lease; it put itself back in the queue for this time.
    Rescheduled(DateTime<Utc>),
    /// The connection is blocked by a rate limit; this job runs again at this time.
    Waiting(DateTime<Utc>),
}

/// Committed at least this often while a batch is calling.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Committed at least every this many records' outcomes while a batch is calling (one
/// commit at a time: what answers during a commit goes into the next).
pub const FLUSH_AFTER: usize = 50;

/// Outcomes and call results not yet committed.
#[derive(Debug)]
pub struct Tally {
    /// Ledger entries (and the delivery state they imply).
    entries: Vec<Entry>,
    /// Jobs the target named in answers to submits, whose records' entries are
    /// `accepted`: written with them.
    jobs: Vec<jobs::Submitted>,
    /// What the calls' verdicts leave to write: the breaker's record, the calls made,
    /// blocks.
    heard: Heard,
    /// When the tally was last committed.
    since: Instant,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            jobs: Vec::new(),
            heard: Heard::default(),
            since: Instant::now(),
        }
    }
}

impl Tally {
    /// Adds an outcome decided without a call.
    pub fn decided(&mut self, entries: Vec<Entry>) {
        self.entries.extend(entries);
    }

    /// Adds the outcomes of one call (one per record it carried), the pacer's `verdict` on
    /// it, and what the breaker hears of it (`reachable`), if anything.
    pub fn answered(&mut self, entries: Vec<Entry>, reachable: Option<bool>, verdict: &Verdict) {
        self.heard.heard(verdict, reachable);
        if let Some(e) = entries.iter().rev().find_map(|e| e.error.as_ref()) {
            self.heard.last_error = Some(e.clone());
        }
        self.entries.extend(entries);
    }

    /// Adds a call that decided no record (a 429): its verdict alone.
    pub fn heard(&mut self, verdict: &Verdict, reachable: Option<bool>) {
        self.heard.heard(verdict, reachable);
    }

    /// Adds the calls a job's submit in steps made besides the one its answer counts.
    pub fn more_calls(&mut self, n: u32) {
        self.heard.more_calls(n);
    }

    /// Adds a job the target named in its answer to a submit (its records' `accepted`
    /// entries came with the call's outcomes).
    pub fn submitted(&mut self, job: jobs::Submitted) {
        self.jobs.push(job);
    }

    /// Whether it is time to commit what was collected: a block at once (other processes
    /// hold back from then on), outcomes in batches.
    pub fn due(&self) -> bool {
        self.heard.blocks()
            || (!self.entries.is_empty() || self.heard.spent.is_some())
                && (self.entries.len() >= FLUSH_AFTER || self.since.elapsed() >= FLUSH_EVERY)
    }

    fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for e in &self.entries {
            c.count(e.outcome);
        }
        c
    }

    /// Writes outcomes, breaker, call count and block inside `tx`; returns the block's end
    /// when a 429 set one.
    async fn write(
        &self,
        tx: &mut PgConnection,
        engine: &Engine,
        ctx: &ChainContext,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let conn = &ctx.connection;
        let mut submitted = Vec::with_capacity(self.jobs.len());
        for job in &self.jobs {
            let id = jobs::submitted(tx, ctx.rule_id, ctx.run_id, job).await?;
            submitted.push((id, job.delivery_ids.as_slice()));
        }
        let (run, rule, entries) = (ctx.run_id, ctx.rule_id, &self.entries);
        ledger::record(tx, run, rule, conn.id, entries, &submitted, now).await?;
        let cause = blocks::Cause {
            budget_key: &conn.budget_key,
            connection_id: conn.id,
            rule_id: Some(ctx.rule_id),
            run_id: Some(ctx.run_id),
        };
        self.heard.write(tx, engine, &cause, now).await
    }

    /// What was collected, leaving the tally empty.
    pub fn take(&mut self) -> Tally {
        std::mem::take(self)
    }
}

/// Commits what `tally` collected while calls go on (through a database outage, by
/// retrying). Returns false when the run is no longer active or no longer carried by this
/// job: the batch should stop calling.
pub async fn flush(
    engine: &Engine,
    ctx: &ChainContext,
    task_id: &str,
    tally: Tally,
) -> Result<bool, sqlx::Error> {
    let (blocked, active) = engine
        .retry_outage(|| commit_progress(engine, ctx, task_id, &tally))
        .await?;
    if let Some(until) = blocked {
        note_block(engine, ctx, until);
    }
    Ok(active)
}

async fn commit_progress(
    engine: &Engine,
    ctx: &ChainContext,
    task_id: &str,
    tally: &Tally,
) -> Result<(Option<DateTime<Utc>>, bool), sqlx::Error> {
    let now = engine.clock.now();
    let mut tx = engine.pool.begin().await?;
    let blocked = tally.write(&mut tx, engine, ctx, now).await?;
    let active = runs::add_progress(&mut *tx, ctx.run_id, task_id, &tally.counters(), now).await?;
    tx.commit().await?;
    Ok((blocked, active))
}

/// How long a connection or rule that cannot be used is left alone after its failed run,
/// unless the catalog changes first.
pub const UNUSABLE_COOLDOWN: chrono::Duration = chrono::Duration::minutes(5);

/// What cannot be used: the whole connection, or one rule of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// Its writer cannot be built.
    Connection,
    /// Its writer cannot serve the rule's path.
    Rule,
}

/// What a job leaves its chain to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Queue the next job now.
    Continue,
    /// Sit out a block: this same job runs again at this time; the run shows `waiting`.
    WaitUntil(DateTime<Utc>),
    /// End the run with this status; `until` is the end of the block that throttled it.
    Finish {
        /// The final status.
        status: RunStatus,
        /// Why, when it did not simply complete.
        error: Option<String>,
        /// The block's end, for a throttled run.
        until: Option<DateTime<Utc>>,
    },
    /// End the run `failed` because the connection or rule cannot be used; the dispatcher
    /// leaves it alone for [`UNUSABLE_COOLDOWN`] or until the catalog changes.
    Unusable(Unusable, String),
}

impl Next {
    /// Ends the run with `status` and no further detail.
    pub fn finish(status: RunStatus) -> Self {
        Next::Finish {
            status,
            error: None,
            until: None,
        }
    }
}

/// Commits the job: its remaining outcomes, the run's progress (counters, `cursor_id`,
/// status) and what comes next, in one transaction (through a database outage, by
/// retrying).
pub async fn settle(
    engine: &Engine,
    ctx: &ChainContext,
    task_id: &str,
    tally: Tally,
    cursor_id: i64,
    next: Next,
) -> Result<ChainOutcome, sqlx::Error> {
    let next_job = matches!(next, Next::Continue).then(queue::new_job_id);
    let step = Step {
        task_id,
        cursor_id,
        next: &next,
        next_job: next_job.as_deref(),
    };
    let (blocked, outcome) = engine
        .retry_outage(|| commit_job(engine, ctx, &tally, &step))
        .await?;
    if let Some(until) = blocked {
        note_block(engine, ctx, until);
    }
    if let ChainOutcome::Waiting(t) = outcome {
        queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), t);
    }
    Ok(outcome)
}

/// Records a block this job set in the process's copy; a new block (not an extension of
/// one this process knew) is logged once, here, and its end once by the throttle layer.
fn note_block(engine: &Engine, ctx: &ChainContext, until: DateTime<Utc>) {
    let key = &ctx.connection.budget_key;
    let now = engine.clock.now();
    if engine.blocks.announce(key, until, now) {
        tracing::info!(budget = %key, %until, rule = ctx.rule_id, "rate-limit block set by a 429");
    }
    engine.blocks.written(key, until);
    engine.metrics.block_set(key);
}

/// Where a job leaves its run.
struct Step<'a> {
    task_id: &'a str,
    cursor_id: i64,
    next: &'a Next,
    next_job: Option<&'a str>,
}

async fn commit_job(
    engine: &Engine,
    ctx: &ChainContext,
    tally: &Tally,
    step: &Step<'_>,
) -> Result<(Option<DateTime<Utc>>, ChainOutcome), sqlx::Error> {
    let now = engine.clock.now();
    let mut tx = engine.pool.begin().await?;
    let blocked = tally.write(&mut tx, engine, ctx, now).await?;
    let (status, error, until) = match step.next {
        Next::Continue => (RunStatus::Running, None, None),
        Next::WaitUntil(t) => (RunStatus::Waiting, None, Some(*t)),
        Next::Finish {
            status,
            error,
            until,
        } => (*status, error.as_deref(), *until),
        Next::Unusable(what, error) => {
            mark_unusable(&mut tx, ctx, *what, error, now).await?;
            (RunStatus::Failed, Some(error.as_str()), None)
        }
    };
    let progress = Progress {
        counters: tally.counters(),
        cursor_id: step.cursor_id,
        status,
        error,
        until,
        next_job: step.next_job,
    };
    let totals = runs::record_job(&mut *tx, ctx.run_id, step.task_id, &progress, now).await?;
    let active = totals.is_some();
    let job = ChainJob {
        run_id: ctx.run_id,
        rule_id: ctx.rule_id,
    };
    let outcome = match (step.next, step.next_job) {
        _ if !active => ChainOutcome::Skipped,
        (Next::Continue, Some(id)) => {
            queue::push(&mut tx, &[(job, id.to_owned())]).await?;
            ChainOutcome::Continued
        }
        (Next::WaitUntil(t), _) => {
            queue::snooze(&mut *tx, step.task_id, *t).await?;
            ChainOutcome::Waiting(*t)
        }
        (_, _) => ChainOutcome::Finished(status),
    };
    if !matches!(outcome, ChainOutcome::Continued | ChainOutcome::Waiting(_)) {
        // A finished run may leave its rule with more due work.
        runs::wake(&mut *tx).await?;
    }
    tx.commit().await?;
    // The one line a run writes at `info` (its start and batches are `debug`).
    if let (ChainOutcome::Finished(status), Some(c)) = (&outcome, totals) {
        tracing::info!(
            run = ctx.run_id,
            rule = ctx.rule_id,
            status = status.as_str(),
            delivered = c.delivered,
            failed = c.failed,
            exhausted = c.exhausted,
            rejected = c.rejected,
            suppressed = c.suppressed,
            held = c.held,
            reason = error.unwrap_or_default(),
            "run finished"
        );
    }
    Ok((blocked, outcome))
}

/// Records why a connection or rule cannot be used, and until when it is left alone.
async fn mark_unusable(
    tx: &mut PgConnection,
    ctx: &ChainContext,
    what: Unusable,
    error: &str,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let until = now + UNUSABLE_COOLDOWN;
    match what {
        Unusable::Connection => breaker::set_unusable(tx, ctx.connection.id, error, until).await,
        Unusable::Rule => catalog::set_rule_unusable(tx, ctx.rule_id, error, until).await,
    }
}
