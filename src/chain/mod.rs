//! One chain job: the unit of work of a run, in stages.
//!
//! 1. **admit** ([`admit`]): the rule's lease, then whether this run may call at all
//!    (rule enabled, circuit, a writer that can be built). Rate-limit blocks are checked
//!    before the job gets here, by the [`throttle`] layer, the chain's first gate.
//! 2. **claim** ([`claim`]): the next batch of due deliveries.
//! 3. **triage** ([`triage`], pure): suppressed, held, or to send; to send, upserts go into
//!    calls as the rule's profile groups them, and each delete is a call of its own.
//! 4. **call** ([`call`]): a pacer slot, then the writer, up to max in flight.
//! 5. **classify** ([`classify`], pure): an answer to an outcome, with the retry policy.
//! 6. **settle** ([`settle`]): outcomes committed as calls answer, then one commit of the
//!    run's progress and what comes next ([`settle::Next`]).
//!
//! No transaction is open while the writer is called; the lease (owner + expiry on the
//! rule) keeps two jobs of one rule from executing at once.

pub mod call;
pub mod claim;
pub mod classify;
pub mod context;
pub mod lease;
pub mod settle;
mod submit;
pub mod throttle;
pub mod triage;

pub use settle::ChainOutcome;

use chrono::Duration;
use futures::StreamExt;
use tracing::Instrument;

use std::sync::Arc;

use self::{
    call::Stop,
    claim::{ClaimScope, Claimed},
    context::ChainContext,
    settle::{Next, Tally, Unusable},
    triage::DependencyTimeout,
};
use crate::{
    breaker::{self, Circuit},
    engine::Engine,
    enqueue::Op,
    profile::RuleProfile,
    queue,
    ratelimit::answer::Verdict,
    runs::RunStatus,
    writer::Writer,
};

/// How long a job waits before trying again when another job holds its rule's lease.
const LEASE_BUSY_RETRY: Duration = Duration::seconds(1);

/// A chain job that could not complete; apalis retries it.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The database failed.
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

/// Executes one chain job of the run `ctx` describes (loaded and checked against blocks
/// by the throttle layer). `task_id` is the apalis job's id, used to re-schedule it.
pub async fn execute(
    engine: &Arc<Engine>,
    ctx: &ChainContext,
    task_id: &str,
) -> Result<ChainOutcome, ChainError> {
    let now = engine.clock.now();
    // The lease belongs to this job; the next job of the chain, even in this process,
    // waits for it.
    let owner = lease::owner(&engine.worker_name, task_id);
    let lease_for = lease_length(engine);
    let leased = engine
        .retry_outage(|| lease::acquire(&engine.pool, ctx, task_id, &owner, now, lease_for))
        .await?;
    if !leased {
        // The run is carried by another job (the rescuer moved it on) or another owner
        // holds the lease. A lease this job's earlier attempt took is given back, or it
        // would hold the rule until it expires.
        release_lease(engine, ctx, task_id).await;
        let at = now + LEASE_BUSY_RETRY;
        queue::snooze(&engine.pool, task_id, at).await?;
        queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), at);
        return Ok(ChainOutcome::Rescheduled(at));
    }
    let span = tracing::info_span!("chain", run = ctx.run_id, rule = ctx.rule_id, connection = %ctx.connection.name);
    let result = run_batch(engine, ctx, task_id, &owner)
        .instrument(span)
        .await;
    release_lease(engine, ctx, task_id).await;
    result
}

/// Gives back the rule's lease this job holds (after its outcome is committed, or after
/// it failed); a lease left behind only expires.
pub async fn release_lease(engine: &Engine, ctx: &ChainContext, task_id: &str) {
    let owner = lease::owner(&engine.worker_name, task_id);
    if let Err(e) = lease::release(&engine.pool, ctx.rule_id, &owner).await {
        tracing::warn!(rule = ctx.rule_id, error = %e, "could not release the rule's lease; it expires");
    }
}

/// How long a lease (and a heartbeat) holds without renewal: the staleness window.
fn lease_length(engine: &Engine) -> Duration {
    Duration::from_std(engine.settings.chain_stale_after).unwrap_or(Duration::MAX)
}

/// Whether this run may call the target now: the writer to call with and the rule's
/// profile, or how the run ends instead.
fn admit<'c>(
    engine: &Engine,
    ctx: &'c ChainContext,
) -> Result<(Arc<dyn Writer>, &'c RuleProfile), Next> {
    if !ctx.rule_enabled {
        return Err(Next::Finish {
            status: RunStatus::Completed,
            error: Some("rule disabled".into()),
            until: None,
        });
    }
    // A pause ends the run at this batch boundary; its backlog stays pending.
    if let Some(why) = ctx.paused {
        return Err(Next::Finish {
            status: RunStatus::Paused,
            error: Some(why.into()),
            until: None,
        });
    }
    // Half-open: one run probes; every other run of the connection ends as if open.
    if !ctx.circuit_admits {
        return Err(Next::finish(RunStatus::CircuitOpen));
    }
    let writer = engine.writer(&ctx.connection).map_err(|e| {
        tracing::error!(error = %e, "cannot build the connection's writer; leaving it alone until it changes");
        Next::Unusable(Unusable::Connection, e.to_string())
    })?;
    // A profile that does not parse (a rule written by plain SQL past the catalog) leaves
    // the backlog pending, untouched: the rule is wrong, not its records.
    let profile = ctx.profile.as_ref().map_err(|e| {
        tracing::error!(error = %e, field = e.field, "the rule is unusable; leaving it alone until it changes");
        let reason = match e.field {
            "path" => format!("rule path {:?}: {e}", ctx.path),
            _ => e.to_string(),
        };
        Next::Unusable(Unusable::Rule, reason)
    })?;
    Ok((writer, profile))
}

async fn run_batch(
    engine: &Arc<Engine>,
    ctx: &ChainContext,
    task_id: &str,
    owner: &str,
) -> Result<ChainOutcome, ChainError> {
    let settle = |tally, cursor, next| settle::settle(engine, ctx, task_id, tally, cursor, next);
    let now = engine.clock.now();
    let (writer, profile) = match admit(engine, ctx) {
        Ok(admitted) => admitted,
        Err(end) => return Ok(settle(Tally::default(), 0, end).await?),
    };
    let scope = ClaimScope {
        rule_id: ctx.rule_id,
        connection_id: ctx.connection.id,
        after_id: ctx.cursor_id,
        limit: ctx.claim_limit(profile),
    };
    let claimed = engine
        .retry_outage(|| claim::claim(engine, scope, now))
        .await?;
    if claimed.is_empty() {
        return Ok(settle(Tally::default(), 0, Next::finish(RunStatus::Completed)).await?);
    }
    let mut tally = Tally::default();
    let job = Job {
        engine,
        ctx,
        profile,
        task_id,
        owner,
    };
    let called = job
        .deliver(writer.as_ref(), claimed, scope, &mut tally)
        .await?;
    let (cursor, next) = called.next_step(ctx);
    Ok(settle(tally, cursor, next).await?)
}

/// Batches one job claims at most: the next one is claimed while the tail of the current
/// one is in flight, so a slow target's latency does not leave the budget unused between
/// batches; after this many the job settles and the chain goes on with a new job.
pub const BATCHES_PER_JOB: usize = 4;

/// After a commit of outcomes: when it found the run no longer active, or no longer carried
/// by this job (reaped or resumed elsewhere), stop calling; what is committed stays.
fn committed(active: bool, called: &mut Called, stop: &Stop) {
    if !active {
        called.run_ended = true;
        stop.stop();
    }
}

/// The job at hand, for the stages that need all of it.
struct Job<'a> {
    engine: &'a Arc<Engine>,
    ctx: &'a ChainContext,
    profile: &'a RuleProfile,
    task_id: &'a str,
    owner: &'a str,
}

/// What the call stage leaves behind.
#[derive(Debug)]
struct Called {
    /// The last delivery claimed.
    last_claimed: Option<i64>,
    /// Whether the last claim found a full batch (more may be due).
    last_full: bool,
    /// Deliveries not called (a stop, a 429, no slot): they stay pending, untouched.
    not_attempted: Vec<i64>,
    /// The run was reaped, or resumed by another job, meanwhile.
    run_ended: bool,
    /// The circuit as the batch's answers left it.
    circuit: Circuit,
    /// Whether an answer of this job opened it (it may have closed again since).
    tripped: bool,
}

impl Called {
    fn new(circuit: Circuit) -> Self {
        Self {
            last_claimed: None,
            last_full: false,
            not_attempted: Vec::new(),
            run_ended: false,
            circuit,
            tripped: false,
        }
    }
}

/// A claim in flight while calls go on.
type Claiming<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<Claimed>, sqlx::Error>> + Send + 'a>>;

/// What feeds the calls next.
enum Feed {
    /// This batch, claimed already.
    Batch(Vec<Claimed>),
    /// A batch to claim.
    Claim(ClaimScope),
    /// Nothing: the calls queued are the job's last.
    Done,
}

/// The deliveries a job claimed and the calls it queued for them.
struct Feeding {
    /// Every delivery claimed so far, in id order; calls name them by index.
    claimed: Vec<Arc<Claimed>>,
    /// Sends calls to the call stage; `None` once no batch is left (the calls stream ends
    /// when the queued ones have answered).
    tx: Option<futures::channel::mpsc::UnboundedSender<call::Group>>,
    /// Calls queued so far.
    queued: usize,
    /// Batches claimed so far.
    batches: usize,
    /// The batch claimed before the job started, until it is fed.
    first: Option<Vec<Claimed>>,
}

impl Feeding {
    fn new(first: Vec<Claimed>, tx: futures::channel::mpsc::UnboundedSender<call::Group>) -> Self {
        Self {
            claimed: Vec::new(),
            tx: Some(tx),
            queued: 0,
            batches: 0,
            first: Some(first),
        }
    }
}

impl Job<'_> {
    /// Calls the writer for the deliveries of `first` (the job's first batch) with no
    /// transaction open, classifying each answer into `tally` and committing it as it
    /// comes (one commit at a time, the calls going on meanwhile), while beating on the
    /// run. Once every call of the batch has started (the tail is in flight) the next batch
    /// is claimed, the calls going on meanwhile, and its calls follow, up to
    /// [`BATCHES_PER_JOB`]. A 429 or a call that opens the circuit stops the rest; so does
    /// a shutdown (calls already in flight finish).
    async fn deliver(
        &self,
        writer: &dyn Writer,
        first: Vec<Claimed>,
        scope: ClaimScope,
        tally: &mut Tally,
    ) -> Result<Called, ChainError> {
        let (engine, ctx, profile) = (self.engine, self.ctx, self.profile);
        let stop = Stop::default();
        let (tx, source) = futures::channel::mpsc::unbounded::<call::Group>();
        let pulled = std::sync::atomic::AtomicUsize::new(0);
        let source = source.inspect(|_| {
            pulled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let mut calls = std::pin::pin!(call::calls(engine, ctx, profile, writer, source, &stop));
        let mut called = Called::new(ctx.circuit.clone());
        let mut feeding = Feeding::new(first, tx);
        let (mut claiming, mut flushing) = (None, None);
        let mut beat = tokio::time::interval(engine.settings.heartbeat_every());
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await; // the first tick is immediate; the lease was just taken
        loop {
            // Every queued call has started or waits for its slot: feed the next batch (again
            // when one queued no call: all of it decided without one).
            let pulled = || pulled.load(std::sync::atomic::Ordering::Relaxed);
            while claiming.is_none() && feeding.tx.is_some() && pulled() == feeding.queued {
                claiming = self.feed(&mut feeding, &mut called, scope, &stop, tally);
            }
            // One commit at a time, while the calls go on: a task of its own, so its
            // transaction goes on whatever this loop awaits (a renewal, an answer's
            // bookkeeping); a transaction nobody polls would hold its row locks, and the
            // renewal's beat waits for the run's row.
            if flushing.is_none() && tally.due() {
                flushing = Some(self.commit(tally.take()));
            }
            let next = tokio::select! {
                next = calls.next() => next,
                batch = async { claiming.as_mut().expect("a claim in flight").await },
                    if claiming.is_some() =>
                {
                    claiming = None;
                    match batch? {
                        batch if batch.is_empty() || stop.stopped() => feeding.tx = None,
                        batch => self.queue(&mut feeding, &mut called, batch, scope, tally),
                    }
                    continue;
                }
                active = async { flushing.as_mut().expect("a commit in flight").await },
                    if flushing.is_some() =>
                {
                    flushing = None;
                    committed(joined(active)?, &mut called, &stop);
                    continue;
                }
                _ = beat.tick() => {
                    if !self.renew().await {
                        called.run_ended = true;
                        stop.stop();
                    }
                    continue;
                }
            };
            let Some(answered) = next else { break };
            self.answered(&feeding.claimed, answered, &mut called, tally, &stop);
        }
        if let Some(commit) = flushing {
            committed(joined(commit.await)?, &mut called, &stop);
        }
        Ok(called)
    }

    /// Commits `tally` ([`settle::flush`]) in a task of its own.
    fn commit(&self, tally: Tally) -> tokio::task::JoinHandle<Result<bool, sqlx::Error>> {
        let engine = Arc::clone(self.engine);
        let (ctx, task_id) = (self.ctx.clone(), self.task_id.to_owned());
        tokio::spawn(async move { settle::flush(&engine, &ctx, &task_id, tally).await })
    }

    /// Feeds the calls: the next batch at once when it is claimed already, else the claim
    /// to await while the calls go on; or closes the source when there is none.
    fn feed(
        &self,
        feeding: &mut Feeding,
        called: &mut Called,
        scope: ClaimScope,
        stop: &Stop,
        tally: &mut Tally,
    ) -> Option<Claiming<'_>> {
        match self.next_batch(feeding, called, scope, stop) {
            Feed::Batch(batch) => self.queue(feeding, called, batch, scope, tally),
            Feed::Claim(scope) => {
                let (engine, now) = (self.engine, self.engine.clock.now());
                let claim = engine.retry_outage(move || claim::claim(engine, scope, now));
                return Some(Box::pin(claim));
            }
            Feed::Done => feeding.tx = None,
        }
        None
    }

    /// The next batch to feed: the job's first, else a claim past the last one while the
    /// job may take more ([`BATCHES_PER_JOB`], the last claim full, no stop).
    fn next_batch(
        &self,
        feeding: &mut Feeding,
        called: &Called,
        scope: ClaimScope,
        stop: &Stop,
    ) -> Feed {
        if let Some(first) = feeding.first.take() {
            return Feed::Batch(first);
        }
        if feeding.batches >= BATCHES_PER_JOB
            || !called.last_full
            || stop.stopped()
            || self.engine.shutdown.is_cancelled()
        {
            return Feed::Done;
        }
        Feed::Claim(ClaimScope {
            after_id: called.last_claimed.unwrap_or(scope.after_id),
            ..scope
        })
    }

    /// Triages `batch` (what is decided without a call goes into `tally`), puts the rest
    /// into calls as the rule's profile groups them, and queues those.
    fn queue(
        &self,
        feeding: &mut Feeding,
        called: &mut Called,
        batch: Vec<Claimed>,
        scope: ClaimScope,
        tally: &mut Tally,
    ) {
        let (engine, ctx) = (self.engine, self.ctx);
        feeding.batches += 1;
        called.last_full = batch.len() as i32 >= scope.limit;
        called.last_claimed = batch.last().map(|d| d.id);
        let timeout = chrono::Duration::from_std(engine.settings.dependency_timeout)
            .unwrap_or(chrono::Duration::MAX);
        let now = engine.clock.now();
        let deletes = self.profile.deletes();
        let sorted = triage::triage(&batch, &ctx.retry, DependencyTimeout(timeout), deletes, now);
        for entry in &sorted.decided {
            engine
                .metrics
                .outcomes(&ctx.rule_name, entry.outcome.as_str(), 1);
        }
        tally.decided(sorted.decided);
        let offset = feeding.claimed.len();
        feeding.claimed.extend(batch.into_iter().map(Arc::new));
        let claimed = &feeding.claimed;
        let tx = feeding.tx.as_ref().expect("fed while open");
        let record = |g: usize| {
            let d = &claimed[offset + sorted.to_send[g]];
            crate::writer::template::Record {
                delivery_id: d.id,
                record_key: &d.record_key,
                payload: &d.payload,
            }
        };
        // Deletes never share a call with upserts: each is a call of its own, after the
        // upserts' calls (a key comes once in a batch: the older are superseded).
        let (deletes, upserts): (Vec<usize>, Vec<usize>) = (0..sorted.to_send.len())
            .partition(|&g| claimed[offset + sorted.to_send[g]].op == Op::Delete);
        let request = &self.profile.request;
        let upsert = |u: usize| record(upserts[u]);
        let groups = self.profile.calls(upserts.len(), upsert);
        let upsert_calls = groups
            .into_iter()
            .flat_map(|g| request.cut(g, upsert))
            .map(|call| call.into_iter().map(|u| upserts[u]).collect::<Vec<_>>());
        let delete_calls = deletes.into_iter().map(|g| vec![g]);
        for group in upsert_calls.chain(delete_calls) {
            let group = group
                .into_iter()
                .map(|g| {
                    let i = offset + sorted.to_send[g];
                    (i, claimed[i].clone())
                })
                .collect();
            feeding.queued += 1;
            // The receiver lives in `calls`, as long as the job's loop does.
            let _ = tx.unbounded_send(group);
        }
    }

    /// Takes in one call's answer: the pacer's verdict on it first (it may stop the batch,
    /// or block the budget for a 429, whose records stay pending, untouched); then each
    /// record's outcome, and what the breaker hears of the call.
    fn answered(
        &self,
        claimed: &[Arc<Claimed>],
        answered: call::Answered,
        called: &mut Called,
        tally: &mut Tally,
        stop: &Stop,
    ) {
        let (engine, ctx) = (self.engine, self.ctx);
        let call::Answered { indices, answer } = answered;
        let ids = || indices.iter().map(|&i| claimed[i].id);
        let Some(call::Made {
            result,
            elapsed,
            verdict,
            requests,
            ..
        }) = answer
        else {
            called.not_attempted.extend(ids());
            return;
        };
        let at = engine.clock.now();
        tally.more_calls(requests.saturating_sub(1));
        if let Verdict::Spent {
            stop_batch: true, ..
        }
        | Verdict::Block { .. } = &verdict
        {
            stop.stop();
        }
        // A 429: its records stay pending, untouched; the budget is blocked.
        if let (Err(crate::writer::WriteError::RateLimited { .. }), Verdict::Block { until, raw }) =
            (&result, &verdict)
        {
            tracing::debug!(records = indices.len(), %until, raw = ?raw, "target rate-limited the connection");
            tally.heard(&verdict, None);
            called.not_attempted.extend(ids());
            return;
        }
        // A delete's answer is its own: never a job's submit, never read by the answer map.
        let delete = indices
            .first()
            .is_some_and(|&i| claimed[i].op == Op::Delete);
        // A submit's answer must name its job, or no record of it reads as accepted.
        let (result, job) = match &self.profile.job {
            Some(shape) if !delete => classify::submitted(shape, result),
            _ => (result, None),
        };
        let records = indices.iter().map(|&i| &*claimed[i]);
        let mut judged = classify::judge(records, &result, elapsed, &ctx.retry, at, rand::random);
        if !delete && let Some(job) = classify::as_reported(&mut judged, self.profile, job, at) {
            tally.submitted(job);
        }
        let metrics = &engine.metrics;
        for entry in &judged.entries {
            metrics.outcomes(&ctx.rule_name, entry.outcome.as_str(), 1);
            // The job's deliveries are claimed in id order, batch after batch.
            if entry.outcome == crate::ledger::Outcome::Delivered
                && let Ok(i) = claimed.binary_search_by_key(&entry.delivery_id, |d| d.id)
            {
                metrics.delivered_after(&ctx.rule_name, entry.at - claimed[i].created_at);
            }
        }
        called.not_attempted.extend(judged.undecided);
        if let Some(r) = judged.reachable
            && called.circuit.observe(r, &engine.settings.breaker, at)
        {
            called.tripped = true;
            stop.stop();
        }
        tally.answered(judged.entries, judged.reachable, &verdict);
    }

    /// Beats on the run and extends the lease; false when the run is over or carried by
    /// another job (a failed statement is only logged: the next beat tries again).
    async fn renew(&self) -> bool {
        let now = self.engine.clock.now();
        let until = now + lease_length(self.engine);
        let renewed = lease::renew(
            &self.engine.pool,
            self.ctx,
            self.task_id,
            self.owner,
            until,
            now,
        )
        .await;
        renewed.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not renew the lease and heartbeat");
            true
        })
    }
}

/// A commit's result from its task. A commit that panicked is a failed one, said as a
/// panic (a fault of courier's, which no retry mends), never as a database outage; one
/// cancelled (the runtime shutting down) is as if the database went away mid-commit.
fn joined(
    result: Result<Result<bool, sqlx::Error>, tokio::task::JoinError>,
) -> Result<bool, sqlx::Error> {
    result.unwrap_or_else(|e| match e.is_panic() {
        true => {
            tracing::error!(error = %e, "a commit's task panicked");
            Err(sqlx::Error::AnyDriverError(
                format!("a commit's task panicked: {e}").into(),
            ))
        }
        false => Err(sqlx::Error::WorkerCrashed),
    })
}

impl Called {
    /// Where the run's cursor moves and what the chain does next (pure). Deliveries not
    /// attempted keep the cursor below them, so the run (or the next one) visits them
    /// again; a 429 met here was settled as a block, which the next job meets in the
    /// throttle layer.
    fn next_step(&self, ctx: &ChainContext) -> (i64, Next) {
        let cursor = match self.not_attempted.iter().min() {
            Some(min) => min - 1,
            None => self.last_claimed.unwrap_or(ctx.cursor_id),
        };
        let next = if self.run_ended {
            Next::finish(RunStatus::Stale)
        } else if self.tripped && self.circuit.state == breaker::State::Open {
            Next::finish(RunStatus::CircuitOpen)
        } else if self.not_attempted.is_empty() && !self.last_full {
            Next::finish(RunStatus::Completed)
        } else {
            Next::Continue
        };
        (cursor, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicked_commit_is_a_failure_and_not_an_outage() {
        let panicked = tokio::spawn(async { panic!("a bug in a commit") }).await;
        let e = joined(panicked.map(|()| Ok(true))).unwrap_err();
        assert!(!crate::health::is_outage(&e), "{e}");
        assert!(e.to_string().contains("panicked"), "{e}");
        let cancelled = tokio::spawn(std::future::pending::<()>());
        cancelled.abort();
        let e = joined(cancelled.await.map(|()| Ok(true))).unwrap_err();
        assert!(crate::health::is_outage(&e), "{e}");
    }
}
