//! Runs (table `runs`): one pass of a rule over its due deliveries, executed as a chain of
//! apalis jobs. This module creates runs, records each job's progress on them (counters,
//! cursor, heartbeat), finishes them, and reaps those whose heartbeat went quiet.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};

use crate::{
    ledger::Outcome,
    queue::{self, ChainJob, new_job_id},
};

/// The channel that wakes the dispatcher (deliveries inserted, a run finished).
pub const WAKE_CHANNEL: &str = "courier_deliveries";

/// How a run stands or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum RunStatus {
    /// A chain job is queued or executing.
    Running,
    /// The chain sits out a rate-limit block.
    Waiting,
    /// It visited every due delivery.
    Completed,
    /// It met an open circuit and stopped calling the target.
    CircuitOpen,
    /// It met a rate-limit block too long to sit out.
    Throttled,
    /// Its heartbeat went quiet; the reaper ended it.
    Stale,
    /// It could not go on (e.g. the connection's API key is missing).
    Failed,
    /// Its rule or connection was paused; it stopped at a batch boundary, its backlog
    /// left pending for the run after the resume.
    Paused,
}

impl RunStatus {
    /// The name stored in the database (what `sqlx::Type` reads and writes).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::CircuitOpen => "circuit_open",
            RunStatus::Throttled => "throttled",
            RunStatus::Stale => "stale",
            RunStatus::Failed => "failed",
            RunStatus::Paused => "paused",
        }
    }

    /// Every status, for tests that check the database agrees.
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::CircuitOpen,
        RunStatus::Throttled,
        RunStatus::Stale,
        RunStatus::Failed,
        RunStatus::Paused,
    ];

    /// Whether a run in this status still holds its rule; the database's generated column
    /// `runs.active` says the same.
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Running | RunStatus::Waiting)
    }
}

/// What one chain job adds to its run's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Deliveries delivered.
    pub delivered: i32,
    /// Deliveries submitted in a target's job whose outcome is pending.
    pub accepted: i32,
    /// Transient failures that will be retried.
    pub failed: i32,
    /// Transient failures that used the last attempt.
    pub exhausted: i32,
    /// Permanent failures.
    pub rejected: i32,
    /// Superseded or unchanged deliveries, not sent.
    pub suppressed: i32,
    /// Deliveries held back by `hold_until` or `depends_on`.
    pub held: i32,
}

impl Counters {
    /// Counts one outcome.
    pub fn count(&mut self, outcome: Outcome) {
        let n = match outcome {
            Outcome::Delivered => &mut self.delivered,
            // The target has them; no fate of theirs was reported by the run's end.
            Outcome::Accepted | Outcome::Unconfirmed => &mut self.accepted,
            Outcome::Failed => &mut self.failed,
            Outcome::Exhausted => &mut self.exhausted,
            Outcome::Rejected => &mut self.rejected,
            Outcome::Suppressed => &mut self.suppressed,
            Outcome::Held => &mut self.held,
            // Not an outcome of a run.
            Outcome::Retried => return,
        };
        *n += 1;
    }
}

/// A run just started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    /// The run.
    pub run_id: i64,
    /// Its rule.
    pub rule_id: i64,
}

/// Starts a run for each rule in `rule_ids` that has none active (the unique partial index
/// decides races), each with its first chain job, due now ([`queue::push`]); returns the
/// runs started. Two statements, however many runs a pass starts.
pub async fn start(
    tx: &mut PgConnection,
    rule_ids: &[i64],
    started_by: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Started>, sqlx::Error> {
    let job_ids: Vec<String> = rule_ids.iter().map(|_| new_job_id()).collect();
    let rows = sqlx::query!(
        r#"INSERT INTO runs (rule_id, job_id, started_by, started_at, heartbeat_at)
           SELECT u.r, u.j, $3, $4, $4 FROM unnest($1::bigint[], $2::text[]) AS u(r, j)
           ON CONFLICT (rule_id) WHERE active DO NOTHING
           RETURNING id, rule_id, job_id AS "job_id!""#,
        rule_ids,
        &job_ids,
        started_by,
        now
    )
    .fetch_all(&mut *tx)
    .await?;
    let jobs: Vec<(ChainJob, String)> = rows
        .iter()
        .map(|r| {
            let job = ChainJob {
                run_id: r.id,
                rule_id: r.rule_id,
            };
            (job, r.job_id.clone())
        })
        .collect();
    queue::push(tx, &jobs).await?;
    Ok(rows
        .into_iter()
        .map(|r| Started {
            run_id: r.id,
            rule_id: r.rule_id,
        })
        .collect())
}

/// What one chain job leaves on its run.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Outcomes to add to the run's counters.
    pub counters: Counters,
    /// The highest delivery id handled (the cursor only moves forward).
    pub cursor_id: i64,
    /// The run's status afterwards; a final one finishes the run.
    pub status: RunStatus,
    /// Why the run ended, when it failed or was cut short.
    pub error: Option<&'a str>,
    /// When a waiting run resumes, or when the block that throttled it ends.
    pub until: Option<DateTime<Utc>>,
    /// The job that carries the run on from here, when a new one was pushed.
    pub next_job: Option<&'a str>,
}

impl<'a> Progress<'a> {
    /// A status change with no outcomes.
    pub fn status(status: RunStatus) -> Self {
        Self {
            counters: Counters::default(),
            cursor_id: 0,
            status,
            error: None,
            until: None,
            next_job: None,
        }
    }
}

/// Job `job_id` of run `run_id` took the rule's lease at `now`: its heartbeat, and a
/// waiting run reads `running` again. False when the run is carried by another job.
pub async fn resume(
    db: impl PgExecutor<'_>,
    run_id: i64,
    job_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let n = sqlx::query!(
        "UPDATE runs SET heartbeat_at = $3,
             status = CASE WHEN status = 'waiting' THEN 'running' ELSE status END,
             resume_at = CASE WHEN status = 'waiting' THEN NULL ELSE resume_at END
         WHERE id = $1 AND job_id IS NOT DISTINCT FROM $2",
        run_id,
        job_id,
        now
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Job `job_id` of run `run_id` beats at `now` while it calls. False when the run is
/// over or carried by another job.
pub async fn beat(
    db: impl PgExecutor<'_>,
    run_id: i64,
    job_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let n = sqlx::query!(
        "UPDATE runs SET heartbeat_at = $3
         WHERE id = $1 AND active AND job_id IS NOT DISTINCT FROM $2",
        run_id,
        job_id,
        now
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// A running run whose job went quiet, as [`stalled`] finds it.
#[derive(Clone, Debug)]
pub struct Stalled {
    /// The run.
    pub id: i64,
    /// Its rule.
    pub rule_id: i64,
    /// The job that carries it.
    pub job_id: Option<String>,
}

/// Running runs whose heartbeat is older than `cutoff` and whose job ended without moving
/// them on (or is gone), or was fetched before `fetched_before` by a process that never
/// started it. A job `Running` in a live process is its business (it beats while it
/// calls; a slow database only delays the beat), and a job `Queued` may wait in its
/// process's buffer for a free slot for a while under load.
pub async fn stalled(
    db: impl PgExecutor<'_>,
    cutoff: DateTime<Utc>,
    fetched_before: DateTime<Utc>,
) -> Result<Vec<Stalled>, sqlx::Error> {
    sqlx::query_as!(
        Stalled,
        r#"SELECT r.id, r.rule_id, r.job_id FROM runs r
           LEFT JOIN apalis.jobs j ON j.id = r.job_id
           WHERE r.status = 'running' AND r.heartbeat_at < $1
             AND (j.id IS NULL OR j.status IN ('Done', 'Killed', 'Failed')
                  OR (j.status = 'Queued' AND j.lock_at < $2))"#,
        cutoff,
        fetched_before
    )
    .fetch_all(db)
    .await
}

/// Moves each run in `stalled` on to the new job id beside it (heartbeat `now`), if it is
/// still as it was read: running, quiet since before `cutoff`, carried by the same job (a
/// job that beat meanwhile keeps its run). Returns the chain jobs to push.
pub async fn move_on(
    db: impl PgExecutor<'_>,
    stalled: &[Stalled],
    now: DateTime<Utc>,
    cutoff: DateTime<Utc>,
) -> Result<Vec<(ChainJob, String)>, sqlx::Error> {
    let runs: Vec<i64> = stalled.iter().map(|r| r.id).collect();
    let old: Vec<Option<String>> = stalled.iter().map(|r| r.job_id.clone()).collect();
    let ids: Vec<String> = stalled.iter().map(|_| new_job_id()).collect();
    let moved = sqlx::query!(
        r#"WITH u AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])
                      AS u(run, job, old)),
                r AS (UPDATE runs SET job_id = u.job, heartbeat_at = $4
                      FROM u
                      WHERE runs.id = u.run AND runs.status = 'running'
                        AND runs.heartbeat_at < $5
                        AND runs.job_id IS NOT DISTINCT FROM u.old
                      RETURNING runs.id, runs.rule_id, u.job)
           SELECT id AS "id!", rule_id AS "rule_id!", job AS "job!" FROM r"#,
        &runs,
        &ids,
        &old as &[Option<String>],
        now,
        cutoff
    )
    .fetch_all(db)
    .await?;
    Ok(moved
        .into_iter()
        .map(|m| {
            let job = ChainJob {
                run_id: m.id,
                rule_id: m.rule_id,
            };
            (job, m.job)
        })
        .collect())
}

/// Adds job `job_id`'s counters to its active run, moves its cursor and heartbeat, and
/// sets its status (finishing it when the status is final). Returns the run's counters
/// now, or `None` when the run was no longer active (reaped meanwhile) or has moved on to
/// another job (resumed elsewhere after this job's process was taken for dead): the
/// caller must not continue the chain.
pub async fn record_job(
    db: impl PgExecutor<'_>,
    run_id: i64,
    job_id: &str,
    p: &Progress<'_>,
    now: DateTime<Utc>,
) -> Result<Option<Counters>, sqlx::Error> {
    let c = &p.counters;
    let updated = sqlx::query_as!(
        Counters,
        "UPDATE runs SET
            jobs = jobs + 1,
            delivered = delivered + $2, failed = failed + $3, exhausted = exhausted + $4,
            rejected = rejected + $5, suppressed = suppressed + $6, held = held + $7,
            accepted = accepted + $16,
            cursor_id = GREATEST(cursor_id, $8), heartbeat_at = $9::timestamptz, status = $10::text,
            finished_at = CASE WHEN $13 THEN NULL ELSE $9::timestamptz END,
            error = COALESCE($11, error),
            resume_at = CASE WHEN $10 = 'waiting' THEN $12::timestamptz END,
            throttled_until = CASE WHEN $10 = 'throttled' THEN $12::timestamptz ELSE throttled_until END,
            job_id = COALESCE($15, job_id)
         WHERE id = $1 AND active AND job_id IS NOT DISTINCT FROM $14
         RETURNING delivered, accepted, failed, exhausted, rejected, suppressed, held",
        run_id,
        c.delivered,
        c.failed,
        c.exhausted,
        c.rejected,
        c.suppressed,
        c.held,
        p.cursor_id,
        now,
        p.status.as_str(),
        p.error,
        p.until,
        p.status.is_active(),
        job_id,
        p.next_job,
        c.accepted
    )
    .fetch_optional(db)
    .await?;
    Ok(updated)
}

/// Adds outcomes job `job_id` committed while its batch is still calling (and refreshes
/// the heartbeat) without counting a job or changing the status. With no outcomes it is
/// the job's heartbeat. Returns false when the run is no longer active or no longer
/// carried by this job.
pub async fn add_progress(
    db: impl PgExecutor<'_>,
    run_id: i64,
    job_id: &str,
    c: &Counters,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query_scalar!(
        "UPDATE runs SET
            delivered = delivered + $2, failed = failed + $3, exhausted = exhausted + $4,
            rejected = rejected + $5, suppressed = suppressed + $6, held = held + $7,
            accepted = accepted + $10, heartbeat_at = $8
         WHERE id = $1 AND active AND job_id IS NOT DISTINCT FROM $9
         RETURNING id",
        run_id,
        c.delivered,
        c.failed,
        c.exhausted,
        c.rejected,
        c.suppressed,
        c.held,
        now,
        job_id,
        c.accepted
    )
    .fetch_optional(db)
    .await?;
    Ok(updated.is_some())
}

/// Adds the outcomes a target's job reported to run `run_id`, which handed the job its
/// records, whatever its status now.
pub async fn add_reported(
    db: impl PgExecutor<'_>,
    run_id: i64,
    c: &Counters,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE runs SET
            delivered = delivered + $2, failed = failed + $3, exhausted = exhausted + $4,
            rejected = rejected + $5
         WHERE id = $1",
        run_id,
        c.delivered,
        c.failed,
        c.exhausted,
        c.rejected
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Each rule's outcomes over the runs still kept, by rule id: what its runs and the
/// target's jobs they handed records to recorded.
pub async fn totals(
    db: impl PgExecutor<'_>,
) -> Result<std::collections::HashMap<i64, Counters>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT rule_id, sum(delivered)::int AS "delivered!", sum(accepted)::int AS "accepted!",
                  sum(failed)::int AS "failed!", sum(exhausted)::int AS "exhausted!",
                  sum(rejected)::int AS "rejected!", sum(suppressed)::int AS "suppressed!",
                  sum(held)::int AS "held!"
           FROM runs GROUP BY rule_id"#
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| {
        let c = Counters {
            delivered: r.delivered,
            accepted: r.accepted,
            failed: r.failed,
            exhausted: r.exhausted,
            rejected: r.rejected,
            suppressed: r.suppressed,
            held: r.held,
        };
        (r.rule_id, c)
    })
    .collect())
}

/// Wakes dispatchers: a finished run may leave its rule with more due work.
pub async fn wake(db: impl PgExecutor<'_>) -> Result<(), sqlx::Error> {
    sqlx::query!("SELECT pg_notify($1, 'run')", WAKE_CHANNEL)
        .execute(db)
        .await?;
    Ok(())
}

/// Marks every active run whose heartbeat is older than `cutoff` as stale, freeing its
/// rule for a new run. Returns the reaped run ids.
pub async fn reap_stale(
    db: impl PgExecutor<'_>,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "UPDATE runs SET status = 'stale', finished_at = $2,
                error = 'no heartbeat since ' || heartbeat_at::text
         WHERE active AND heartbeat_at < $1
         RETURNING id",
        cutoff,
        now
    )
    .fetch_all(db)
    .await
}

/// One run's line, as `courier status` shows it.
#[derive(Debug, Serialize)]
pub struct RunLine {
    /// Run id.
    pub id: i64,
    /// Its rule.
    pub rule: String,
    /// Status.
    pub status: String,
    /// Counters.
    pub delivered: i32,
    /// Records handed to the target's jobs (or taken unreported).
    pub accepted: i32,
    /// Transient failures retried.
    pub failed: i32,
    /// Exhausted deliveries.
    pub exhausted: i32,
    /// Rejected deliveries.
    pub rejected: i32,
    /// Suppressed deliveries.
    pub suppressed: i32,
    /// Held deliveries.
    pub held: i32,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// Last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// End.
    pub finished_at: Option<DateTime<Utc>>,
}

/// The `n` most recent runs, newest first.
pub async fn recent(db: impl PgExecutor<'_>, n: i64) -> Result<Vec<RunLine>, sqlx::Error> {
    sqlx::query_as!(
        RunLine,
        r#"SELECT x.id, r.name AS rule, x.status, x.delivered, x.accepted, x.failed, x.exhausted, x.rejected,
                x.suppressed, x.held, courier_ts(x.started_at) AS "started_at!",
                courier_ts(x.heartbeat_at) AS "heartbeat_at!", courier_ts(x.finished_at) AS finished_at
         FROM runs x JOIN rules r ON r.id = x.rule_id ORDER BY x.id DESC LIMIT $1"#,
        n
    )
    .fetch_all(db)
    .await
}

/// Runs by status: `(status, runs)`.
pub async fn count_by_status(db: impl PgExecutor<'_>) -> Result<Vec<(String, i64)>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT status::text AS "status!", count(*) AS "runs!" FROM runs GROUP BY status"#
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.status, r.runs))
    .collect())
}

/// A run as a job of its chain reads it.
#[derive(Debug)]
pub struct RunRow {
    /// How it stands.
    pub status: RunStatus,
    /// Its rule.
    pub rule_id: i64,
    /// The last delivery id it went past.
    pub cursor_id: i64,
    /// The job that carries it.
    pub job_id: Option<String>,
}

/// Run `run_id`; `None` when it is gone.
pub async fn get(db: impl PgExecutor<'_>, run_id: i64) -> Result<Option<RunRow>, sqlx::Error> {
    sqlx::query_as!(
        RunRow,
        r#"SELECT status AS "status: RunStatus", rule_id, cursor_id, job_id FROM runs WHERE id = $1"#,
        run_id
    )
    .fetch_optional(db)
    .await
}

/// The jobs of the runs waiting out a block on budget `key`.
pub async fn waiting_on(db: impl PgExecutor<'_>, key: &str) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT x.job_id AS "job_id!" FROM runs x
           JOIN rules r ON r.id = x.rule_id JOIN connections c ON c.id = r.connection_id
           WHERE x.status = 'waiting' AND courier_rule_budget_key(r, c) = $1
             AND x.job_id IS NOT NULL"#,
        key
    )
    .fetch_all(db)
    .await
}

/// Makes the jobs of runs waiting out a block on budget `key` due now (the block was
/// lifted), and wakes the fetchers.
pub async fn wake_waiting(pool: &sqlx::PgPool, key: &str) -> Result<u64, sqlx::Error> {
    let jobs = waiting_on(pool, key).await?;
    let n = sqlx::query!(
        "UPDATE apalis.jobs SET run_at = now()
         WHERE id = ANY($1) AND status = 'Pending' AND run_at > now()",
        &jobs
    )
    .execute(pool)
    .await?
    .rows_affected();
    queue::wake_fetchers(pool).await?;
    Ok(n)
}

/// How many runs of one rule stand in (or ended with) one status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleRuns {
    /// The rule's name.
    pub rule: String,
    /// The status.
    pub status: String,
    /// Its runs in it.
    pub runs: i64,
}

/// Runs by rule and status: every run, or those started at or after `started_since`.
pub async fn count_by_rule(
    db: impl PgExecutor<'_>,
    started_since: Option<DateTime<Utc>>,
) -> Result<Vec<RuleRuns>, sqlx::Error> {
    sqlx::query_as!(
        RuleRuns,
        r#"SELECT r.name AS rule, x.status AS "status!", count(*) AS "runs!"
           FROM runs x JOIN rules r ON r.id = x.rule_id
           WHERE x.started_at >= COALESCE($1::timestamptz, '-infinity')
           GROUP BY r.name, x.status ORDER BY r.name, x.status"#,
        started_since
    )
    .fetch_all(db)
    .await
}

/// A failed run's rule and why it failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Its rule.
    pub rule: String,
    /// Why it failed (`runs.error`).
    pub error: Option<String>,
}

/// The first `n` runs that failed among those started at or after `since`, oldest first.
pub async fn failures(
    db: impl PgExecutor<'_>,
    since: DateTime<Utc>,
    n: i64,
) -> Result<Vec<Failure>, sqlx::Error> {
    sqlx::query_as!(
        Failure,
        "SELECT r.name AS rule, x.error FROM runs x JOIN rules r ON r.id = x.rule_id
         WHERE x.status = 'failed' AND x.started_at >= $1 ORDER BY x.id LIMIT $2",
        since,
        n
    )
    .fetch_all(db)
    .await
}

/// A run that waits (or waited) out a rate-limit block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Wait {
    /// The run.
    pub id: i64,
    /// Its rule.
    pub rule: String,
    /// How it stands now.
    pub status: String,
    /// While waiting: when it resumes.
    pub resume_at: Option<DateTime<Utc>>,
}

/// The runs waiting now, and the runs `also` (seen waiting before) however they stand now.
pub async fn waits(db: impl PgExecutor<'_>, also: &[i64]) -> Result<Vec<Wait>, sqlx::Error> {
    sqlx::query_as!(
        Wait,
        r#"SELECT x.id, r.name AS rule, x.status, courier_ts(x.resume_at) AS resume_at
           FROM runs x JOIN rules r ON r.id = x.rule_id
           WHERE x.status = 'waiting' OR x.id = ANY($1)"#,
        also
    )
    .fetch_all(db)
    .await
}
