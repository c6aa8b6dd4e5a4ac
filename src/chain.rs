//! One chain job: the unit of work of a run. It takes its rule's lease, claims a batch of
//! due deliveries, decides the suppressed and held ones without calling the writer, calls
//! the writer for the rest (up to the connection's max in flight), records every outcome in
//! bulk, and then enqueues the next job or finishes the run. No transaction is open while
//! the writer is called; the lease (owner + expiry on the rule) keeps two jobs of one rule
//! from executing at once.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use chrono::{DateTime, Duration, Utc};
use futures::{StreamExt, stream};
use tracing::Instrument;

use crate::{
    breaker::{self, Circuit},
    catalog::Connection,
    ledger::{self, Entry, Outcome},
    queue::{self, ChainJob},
    runs::{self, Counters, RunStatus},
    throttle::{self, Decision},
    worker::Engine,
    writer::{self, Outgoing, WriteError},
};

/// How long a job waits before trying again when another job holds its rule's lease.
const LEASE_BUSY_RETRY: Duration = Duration::seconds(1);

/// What a chain job did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// It handled a batch and enqueued the next job.
    Continued,
    /// It ended the run with this status.
    Finished(RunStatus),
    /// Its run was no longer active (finished or reaped): it did nothing.
    Skipped,
    /// Another job held the rule's lease; it put itself back in the queue for this time.
    Rescheduled(DateTime<Utc>),
    /// The connection is blocked by a rate limit; the chain resumes at this time.
    Waiting(DateTime<Utc>),
}

/// A chain job that could not complete; apalis retries it.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The database failed.
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

/// The rule, connection and circuit a job works with, read in one statement.
struct JobContext {
    run_status: String,
    cursor_id: i64,
    rule_enabled: bool,
    weight: i32,
    path: String,
    batch_size: i32,
    max_attempts: i32,
    backoff_base_ms: i32,
    backoff_max_ms: i32,
    connection: Connection,
    circuit: Circuit,
    probe_run_id: Option<i64>,
    blocked_until: Option<DateTime<Utc>>,
}

/// A claimed delivery and what the database already knows about it.
struct Claimed {
    id: i64,
    record_key: String,
    payload: serde_json::Value,
    attempts: i32,
    hold_until: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    superseded: bool,
    unchanged: bool,
    dependency_pending: bool,
}

/// Executes one chain job. `task_id` is the apalis job's id (used to re-schedule it);
/// tests that drive a chain step by step pass `None`.
pub async fn execute(
    engine: &Engine,
    job: ChainJob,
    task_id: Option<&str>,
) -> Result<JobOutcome, ChainError> {
    let now = engine.clock.now();
    let Some(ctx) = load(engine, job.run_id).await? else {
        return Ok(JobOutcome::Skipped);
    };
    if !matches!(ctx.run_status.as_str(), "running" | "waiting") {
        tracing::info!(run = job.run_id, status = %ctx.run_status, "late job of a finished run: nothing to do");
        return Ok(JobOutcome::Skipped);
    }
    // The lease belongs to this job (a retry of the same apalis job may take it again);
    // the next job of the chain, even in this process, waits for it.
    let owner = format!("{}/{}", engine.worker_name, task_id.unwrap_or("direct"));
    if !acquire_lease(engine, job.rule_id, &owner, now).await? {
        let at = now + LEASE_BUSY_RETRY;
        if let Some(id) = task_id {
            queue::reschedule(&engine.pool, id, at).await?;
            queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), at);
        }
        return Ok(JobOutcome::Rescheduled(at));
    }
    let span = tracing::info_span!("chain", run = job.run_id, rule = job.rule_id, connection = %ctx.connection.name);
    let result = run_batch(engine, job, &ctx, &owner, now)
        .instrument(span)
        .await;
    // The outcome is committed (or the job failed); a lease left behind only expires.
    if let Err(e) = release_lease(engine, job.rule_id, &owner).await {
        tracing::warn!(rule = job.rule_id, error = %e, "could not release the rule's lease; it expires");
    }
    result
}

async fn load(engine: &Engine, run_id: i64) -> Result<Option<JobContext>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT r.status AS run_status, r.cursor_id, ru.enabled, ru.path, ru.batch_size,
                  ru.max_attempts, ru.backoff_base_ms, ru.backoff_max_ms,
                  c.id AS connection_id, c.name, c.writer, c.base_url, c.api_key_env, c.headers,
                  c.requests_per_minute, c.max_in_flight, c.timeout_ms, ru.weight,
                  courier_budget_key(c) AS "budget_key!",
                  ci.state, ci.consecutive_failures, ci.times_opened, ci.open_until, ci.probe_run_id,
                  b.blocked_until AS "blocked_until?"
           FROM runs r
           JOIN rules ru ON ru.id = r.rule_id
           JOIN connections c ON c.id = ru.connection_id
           JOIN circuits ci ON ci.connection_id = c.id
           LEFT JOIN connection_blocks b ON b.budget_key = courier_budget_key(c)
           WHERE r.id = $1"#,
        run_id
    )
    .fetch_optional(&engine.pool)
    .await?;
    Ok(row.map(|r| JobContext {
        run_status: r.run_status,
        cursor_id: r.cursor_id,
        rule_enabled: r.enabled,
        weight: r.weight,
        path: r.path,
        batch_size: r.batch_size,
        max_attempts: r.max_attempts,
        backoff_base_ms: r.backoff_base_ms,
        backoff_max_ms: r.backoff_max_ms,
        connection: Connection {
            id: r.connection_id,
            name: r.name,
            writer: r.writer,
            base_url: r.base_url,
            api_key_env: r.api_key_env,
            headers: r.headers,
            requests_per_minute: r.requests_per_minute,
            max_in_flight: r.max_in_flight,
            timeout_ms: r.timeout_ms,
            budget_key: r.budget_key,
        },
        circuit: Circuit {
            state: breaker::State::parse(&r.state),
            consecutive_failures: r.consecutive_failures,
            times_opened: r.times_opened,
            open_until: r.open_until,
        },
        probe_run_id: r.probe_run_id,
        blocked_until: r.blocked_until,
    }))
}

async fn acquire_lease(
    engine: &Engine,
    rule_id: i64,
    owner: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let until = now + lease_length(engine);
    let got = sqlx::query_scalar!(
        "UPDATE rules SET lease_owner = $2, lease_until = $3
         WHERE id = $1 AND (lease_owner IS NULL OR lease_until < $4 OR lease_owner = $2)
         RETURNING id",
        rule_id,
        owner,
        until,
        now
    )
    .fetch_optional(&engine.pool)
    .await?;
    Ok(got.is_some())
}

/// How long a lease (and a heartbeat) holds without renewal: the staleness window.
fn lease_length(engine: &Engine) -> Duration {
    Duration::from_std(engine.settings.chain_stale_after).unwrap_or(Duration::MAX)
}

/// Extends the lease and the run's heartbeat while a batch is still calling the target,
/// so a slow batch (a low rate, a slowed-down pacer) is never taken for dead and its
/// deliveries are never claimed again by a new run.
async fn renew(engine: &Engine, job: ChainJob, owner: &str) -> Result<(), sqlx::Error> {
    let now = engine.clock.now();
    sqlx::query!(
        "WITH l AS (UPDATE rules SET lease_until = $3 WHERE id = $1 AND lease_owner = $2)
         UPDATE runs SET heartbeat_at = $4 WHERE id = $5 AND status IN ('running', 'waiting')",
        job.rule_id,
        owner,
        now + lease_length(engine),
        now,
        job.run_id
    )
    .execute(&engine.pool)
    .await?;
    Ok(())
}

async fn release_lease(engine: &Engine, rule_id: i64, owner: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2",
        rule_id,
        owner
    )
    .execute(&engine.pool)
    .await?;
    Ok(())
}

/// Ends the run without a batch (circuit open, blocked too long, rule disabled, writer
/// unusable). `until` is the end of the block that throttled it.
async fn finish(
    engine: &Engine,
    job: ChainJob,
    status: RunStatus,
    error: Option<&str>,
    until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<JobOutcome, ChainError> {
    let mut tx = engine.pool.begin().await?;
    let none = Counters::default();
    runs::record_job(&mut *tx, job.run_id, &none, 0, status, error, until, now).await?;
    runs::wake(&mut *tx).await?;
    tx.commit().await?;
    Ok(JobOutcome::Finished(status))
}

/// Sits out a block: the run shows as waiting until `until`, its heartbeat refreshed, and
/// the next job is queued for then (holding neither a worker slot nor the rule's lease).
async fn wait(
    engine: &Engine,
    job: ChainJob,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<JobOutcome, ChainError> {
    let mut tx = engine.pool.begin().await?;
    let none = Counters::default();
    let waiting = RunStatus::Waiting;
    let active = runs::record_job(
        &mut *tx,
        job.run_id,
        &none,
        0,
        waiting,
        None,
        Some(until),
        now,
    )
    .await?;
    if active {
        queue::push(&mut tx, &[job], Some(wake_time(until))).await?;
    }
    tx.commit().await?;
    if active {
        queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), wake_time(until));
    }
    Ok(if active {
        JobOutcome::Waiting(until)
    } else {
        JobOutcome::Skipped
    })
}

/// apalis schedules in whole seconds: round up so a job never wakes before the block ends.
fn wake_time(until: DateTime<Utc>) -> DateTime<Utc> {
    let whole = until.timestamp() + i64::from(until.timestamp_subsec_nanos() > 0);
    DateTime::from_timestamp(whole, 0).unwrap_or(until)
}

async fn claim(
    engine: &Engine,
    rule_id: i64,
    connection_id: i64,
    cursor_id: i64,
    limit: i32,
    now: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT d.id, d.record_key, d.payload, d.attempts, d.hold_until, d.created_at,
                  -- The newest pending delivery of the key, read backwards off
                  -- deliveries_pending_key: this shape keeps that plan even when the
                  -- statistics still think the table small (an EXISTS with id > d.id
                  -- did not: 327 ms instead of 1.4 ms for 500 of 5,000 fresh rows).
                  COALESCE((SELECT n.id FROM deliveries n
                            WHERE n.rule_id = d.rule_id AND n.record_key = d.record_key
                              AND n.status = 'pending'
                            ORDER BY n.id DESC LIMIT 1) > d.id, false) AS "superseded!",
                  COALESCE(dr.payload = d.payload, false) AS "unchanged!",
                  (d.depends_on IS NOT NULL AND NOT EXISTS (
                      SELECT 1 FROM delivered_records x
                      WHERE x.connection_id = $2 AND x.record_key = d.depends_on)) AS "dependency_pending!"
           FROM deliveries d
           LEFT JOIN delivered_records dr ON dr.rule_id = d.rule_id AND dr.record_key = d.record_key
           WHERE d.rule_id = $1 AND d.status = 'pending' AND d.id > $3 AND d.next_attempt_at <= $4
           ORDER BY d.id
           LIMIT $5
           FOR UPDATE OF d SKIP LOCKED"#,
        rule_id,
        connection_id,
        cursor_id,
        now,
        limit as i64
    )
    .fetch_all(&engine.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Claimed {
            id: r.id,
            record_key: r.record_key,
            payload: r.payload,
            attempts: r.attempts,
            hold_until: r.hold_until,
            created_at: r.created_at,
            superseded: r.superseded,
            unchanged: r.unchanged,
            dependency_pending: r.dependency_pending,
        })
        .collect())
}

/// The delay before retry number `attempt` (1-based): `base · 2^(attempt-1)`, capped at
/// `max`, with "equal jitter" (half fixed, half random) so retries of a burst spread out.
pub fn backoff(attempt: i32, base_ms: i32, max_ms: i32, unit: f64) -> Duration {
    let exp = (attempt.max(1) - 1).min(30) as u32;
    let full = (base_ms as i64)
        .saturating_mul(1i64 << exp)
        .min(max_ms as i64);
    let half = full / 2;
    Duration::milliseconds(half + ((full - half) as f64 * unit.clamp(0.0, 1.0)) as i64)
}

async fn run_batch(
    engine: &Engine,
    job: ChainJob,
    ctx: &JobContext,
    owner: &str,
    now: DateTime<Utc>,
) -> Result<JobOutcome, ChainError> {
    if !ctx.rule_enabled {
        return finish(
            engine,
            job,
            RunStatus::Completed,
            Some("rule disabled"),
            None,
            now,
        )
        .await;
    }
    // Half-open: one run probes; every other run of the connection ends as if open.
    let probing_elsewhere = ctx.circuit.state == breaker::State::HalfOpen
        && ctx.probe_run_id.is_some_and(|p| p != job.run_id);
    if !ctx.circuit.allows_calls(now) || probing_elsewhere {
        return finish(engine, job, RunStatus::CircuitOpen, None, None, now).await;
    }
    match throttle::decide(ctx.blocked_until, now, engine.settings.throttle_max_wait) {
        Decision::Proceed => {}
        Decision::Wait(until) => return wait(engine, job, until, now).await,
        Decision::Throttle(until) => {
            return finish(engine, job, RunStatus::Throttled, None, Some(until), now).await;
        }
    }
    let writer = match writer::build(&ctx.connection, &engine.http) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the connection's writer");
            return finish(
                engine,
                job,
                RunStatus::Failed,
                Some(&e.to_string()),
                None,
                now,
            )
            .await;
        }
    };

    let claimed = claim(
        engine,
        job.rule_id,
        ctx.connection.id,
        ctx.cursor_id,
        ctx.batch_size,
        now,
    )
    .await?;
    if claimed.is_empty() {
        return finish(engine, job, RunStatus::Completed, None, None, now).await;
    }

    let mut entries = Vec::with_capacity(claimed.len());
    let mut counters = Counters::default();
    let mut to_send = Vec::new();
    for (i, d) in claimed.iter().enumerate() {
        if d.superseded || d.unchanged {
            counters.suppressed += 1;
            entries.push(Entry {
                delivery_id: d.id,
                outcome: Outcome::Suppressed,
                attempt: d.attempts,
                http_status: None,
                error: Some(
                    if d.superseded {
                        "superseded by a newer delivery"
                    } else {
                        "unchanged since last delivered"
                    }
                    .into(),
                ),
                duration_ms: None,
                next_attempt_at: None,
                at: now,
            });
        } else if d.hold_until.is_some_and(|t| t > now) || d.dependency_pending {
            counters.held += 1;
            let next = match d.hold_until {
                Some(t) if t > now => t,
                // Waiting for a dependency: look again after half the time waited so far
                // (between the rule's backoff base and cap), so a dependency that never
                // arrives costs a run now and then, not one every second.
                _ => {
                    let waited = (now - d.created_at).num_milliseconds().max(0) / 2;
                    let base = i64::from(ctx.backoff_base_ms);
                    now + Duration::milliseconds(
                        waited.clamp(base, i64::from(ctx.backoff_max_ms).max(base)),
                    )
                }
            };
            entries.push(Entry {
                delivery_id: d.id,
                outcome: Outcome::Held,
                attempt: d.attempts,
                http_status: None,
                error: Some(
                    if d.dependency_pending {
                        "waiting for depends_on"
                    } else {
                        "hold_until ahead"
                    }
                    .into(),
                ),
                duration_ms: None,
                next_attempt_at: Some(next),
                at: now,
            });
        } else {
            to_send.push(i);
        }
    }

    // Call the writer with no transaction open. A call that opens the circuit stops the
    // rest of the batch; so does a shutdown (calls already in flight finish).
    let stop = AtomicBool::new(false);
    let max_in_flight = writer.max_in_flight().max(1);
    let rpm = writer.requests_per_minute();
    let weight = ctx.weight.max(1) as u32;
    let (writer, stop, claimed_ref) = (&writer, &stop, &claimed);
    let halted = || stop.load(Ordering::Relaxed) || engine.shutdown.is_cancelled();
    let mut calls = stream::iter(to_send)
        .map(|i| {
            let path = ctx.path.as_str();
            async move {
                let d = &claimed_ref[i];
                if halted() {
                    return (d, None);
                }
                // One request of the budget per call, in fair turn with other rules.
                let key = &ctx.connection.budget_key;
                let wait_for_slot = async {
                    let slot = engine.pacer.acquire(key, rpm, job.rule_id, weight).await?;
                    engine.clock.sleep_until(slot).await;
                    Ok::<_, crate::pacer::PacerError>(())
                };
                // A stop does not wait for slots: the delivery stays pending, untouched.
                tokio::select! {
                    waited = wait_for_slot => if let Err(e) = waited {
                        tracing::error!(error = %e, "no request slot; delivery left pending");
                        return (d, None);
                    },
                    _ = engine.shutdown.cancelled() => return (d, None),
                }
                // A 429 or a stop may have come in while this call waited for its slot.
                if halted() {
                    return (d, None);
                }
                let started = Instant::now();
                let result = writer
                    .write(Outgoing {
                        delivery_id: d.id,
                        record_key: &d.record_key,
                        path,
                        payload: &d.payload,
                    })
                    .await;
                (d, Some((result, started.elapsed())))
            }
        })
        .buffer_unordered(max_in_flight);

    let mut live_circuit = ctx.circuit.clone();
    let mut reachability = Vec::new();
    let mut not_attempted = Vec::new();
    let mut rate_limited = None;
    let mut calls_429 = 0usize;
    let mut circuit_opened = false;
    let mut last_error = None;
    let mut renewal = tokio::time::interval(engine.settings.chain_stale_after / 4);
    renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renewal.tick().await; // the first tick is immediate; the lease was just taken
    loop {
        let next = tokio::select! {
            next = calls.next() => next,
            _ = renewal.tick() => {
                if let Err(e) = renew(engine, job, owner).await {
                    tracing::warn!(error = %e, "could not renew the lease and heartbeat");
                }
                continue;
            }
        };
        let Some((d, call)) = next else { break };
        let Some((result, elapsed)) = call else {
            not_attempted.push(d.id);
            continue;
        };
        // A payload the writer refused before sending anything (no HTTP status) says
        // nothing about the target: the breaker does not hear of it.
        let refused_locally = matches!(result, Err(WriteError::Permanent { status: None, .. }));
        if !refused_locally {
            let reachable = result
                .as_ref()
                .map_or_else(WriteError::proves_reachable, |_| true);
            reachability.push(reachable);
            if live_circuit.observe(reachable, &engine.settings.breaker, now) {
                circuit_opened = true;
                stop.store(true, Ordering::Relaxed);
            }
        }
        let duration_ms = Some(elapsed.as_millis().min(i32::MAX as u128) as i32);
        let attempt = d.attempts + 1;
        let entry = match result {
            Ok(receipt) => {
                counters.delivered += 1;
                Entry {
                    delivery_id: d.id,
                    outcome: Outcome::Delivered,
                    attempt,
                    http_status: receipt.http_status.map(|s| s as i16),
                    error: None,
                    duration_ms,
                    next_attempt_at: None,
                    at: engine.clock.now(),
                }
            }
            Err(WriteError::RateLimited { wait, raw }) => {
                // Not a failure of the record: nothing is recorded against it.
                tracing::info!(delivery = d.id, ?wait, raw = ?raw, "target rate-limited the connection");
                rate_limited = Some((wait, raw));
                calls_429 += 1;
                stop.store(true, Ordering::Relaxed);
                not_attempted.push(d.id);
                continue;
            }
            Err(e) => {
                let message = e.to_string();
                last_error = Some(message.clone());
                let (outcome, next) = match e {
                    WriteError::Permanent { .. } => {
                        counters.rejected += 1;
                        (Outcome::Rejected, None)
                    }
                    _ if attempt >= ctx.max_attempts => {
                        counters.exhausted += 1;
                        (Outcome::Exhausted, None)
                    }
                    _ => {
                        counters.failed += 1;
                        let delay = backoff(
                            attempt,
                            ctx.backoff_base_ms,
                            ctx.backoff_max_ms,
                            rand::random(),
                        );
                        (Outcome::Failed, Some(engine.clock.now() + delay))
                    }
                };
                Entry {
                    delivery_id: d.id,
                    outcome,
                    attempt,
                    http_status: e.http_status().map(|s| s as i16),
                    error: Some(message),
                    duration_ms,
                    next_attempt_at: next,
                    at: engine.clock.now(),
                }
            }
        };
        entries.push(entry);
    }
    drop(calls);

    // Deliveries not attempted stay pending and untouched; the cursor stops below them so
    // the run (or the next one) visits them again.
    let cursor = match not_attempted.iter().min() {
        Some(min) => min - 1,
        None => claimed.last().map_or(ctx.cursor_id, |d| d.id),
    };
    let status = if circuit_opened {
        RunStatus::CircuitOpen
    } else if not_attempted.is_empty() && (claimed.len() as i32) < ctx.batch_size {
        RunStatus::Completed
    } else {
        RunStatus::Running
    };

    // Adapt this process's pace: slower after a 429, back towards the declared rate with
    // every call answered otherwise.
    let key = &ctx.connection.budget_key;
    let answered = reachability.len() - calls_429;
    engine.pacer.answered(key, answered as u32);
    if rate_limited.is_some() {
        engine.pacer.throttled(key);
    }
    // Outcomes, blocks and the breaker are stamped with the time the calls ended.
    let now = engine.clock.now();
    let mut tx = engine.pool.begin().await?;
    ledger::record(
        &mut tx,
        job.run_id,
        job.rule_id,
        ctx.connection.id,
        &entries,
        now,
    )
    .await?;
    let circuit = breaker::record(
        &mut tx,
        ctx.connection.id,
        &reachability,
        last_error.as_deref(),
        &engine.settings.breaker,
        now,
    )
    .await?;
    let calls_made = reachability.len() as i32;
    crate::pacer::record_calls(&mut *tx, &ctx.connection.budget_key, calls_made, now).await?;
    let mut status = if status == RunStatus::Running && !circuit.allows_calls(now) {
        RunStatus::CircuitOpen
    } else {
        status
    };
    let mut until = None;
    if let Some((wait, raw)) = rate_limited {
        // Nothing is recorded against the delivery; the whole connection is blocked.
        let cause = throttle::Cause {
            budget_key: &ctx.connection.budget_key,
            connection_id: ctx.connection.id,
            rule_id: job.rule_id,
            run_id: job.run_id,
        };
        let blocked_until = throttle::block(
            &mut *tx,
            &cause,
            throttle::block_length(wait),
            raw.as_deref(),
            now,
        )
        .await?;
        if status == RunStatus::Running {
            let max_wait = engine.settings.throttle_max_wait;
            (status, until) = match throttle::decide(Some(blocked_until), now, max_wait) {
                Decision::Wait(t) => (RunStatus::Waiting, Some(t)),
                Decision::Throttle(t) => (RunStatus::Throttled, Some(t)),
                Decision::Proceed => (RunStatus::Running, None),
            };
        }
    }
    let active = runs::record_job(
        &mut *tx, job.run_id, &counters, cursor, status, None, until, now,
    )
    .await?;
    let outcome = if active && status == RunStatus::Running {
        queue::push(&mut tx, &[job], None).await?;
        JobOutcome::Continued
    } else if let (true, RunStatus::Waiting, Some(t)) = (active, status, until) {
        queue::push(&mut tx, &[job], Some(wake_time(t))).await?;
        JobOutcome::Waiting(t)
    } else {
        runs::wake(&mut *tx).await?;
        if active {
            JobOutcome::Finished(status)
        } else {
            JobOutcome::Skipped
        }
    };
    tx.commit().await?;
    if let JobOutcome::Waiting(t) = outcome {
        queue::wake_fetchers_at(engine.pool.clone(), engine.clock.clone(), wake_time(t));
    }
    tracing::debug!(run = job.run_id, ?counters, ?outcome, "chain job done");
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        assert_eq!(backoff(1, 1000, 60_000, 0.0), Duration::milliseconds(500));
        assert_eq!(backoff(1, 1000, 60_000, 1.0), Duration::milliseconds(1000));
        assert_eq!(backoff(3, 1000, 60_000, 1.0), Duration::milliseconds(4000));
        assert_eq!(
            backoff(30, 1000, 60_000, 1.0),
            Duration::milliseconds(60_000)
        );
        assert!(backoff(99, i32::MAX, i32::MAX, 0.5).num_milliseconds() > 0);
    }
}
