//! The chain queue's rows in apalis' table (`apalis.jobs`): the queue's name, its job
//! payload, pushing a job inside the caller's transaction, re-scheduling a running job for
//! later without counting a failure, waking the fetchers, setting aside rows apalis cannot
//! read, and how the table's rows stand (counted, or one read back) for tooling.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};

/// apalis-postgres' channel announcing inserted jobs (its trigger's name for it).
pub const INSERT_CHANNEL: &str = "apalis::job::insert";

/// The apalis queue (`apalis.jobs.job_type`) holding chain jobs.
pub const CHAIN_QUEUE: &str = "courier.chain";
/// apalis attempts per chain job: a job that errors (a database failure) is tried again;
/// past this, its run is left to the reaper.
pub const CHAIN_JOB_MAX_ATTEMPTS: usize = 3;

/// The payload of a chain job: ids only, so a payload can never go stale or grow. Pushed
/// jobs are encoded in SQL by `courier_chain_job` ([`push`]); read back by serde.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct ChainJob {
    /// The run this job belongs to.
    pub run_id: i64,
    /// The run's rule (denormalised so logs and locks need no lookup).
    pub rule_id: i64,
}

/// A fresh apalis job id (a ULID, as apalis-postgres requires). Ids are chosen before the
/// push so the run can name its current job in the same transaction.
pub fn new_job_id() -> String {
    ulid::Ulid::generate().to_string()
}

/// Pushes chain jobs with the given ids, due now, inside the caller's transaction, so a
/// job exists exactly when the state that asked for it was committed. One statement whose
/// only arrays are the ids and payloads (apalis-postgres' own `push_tasks` also binds an
/// hstore, a priority, a run time and an idempotency key per job); the columns left out
/// take the schema's defaults (status `Pending`, no attempts, priority 0, due now), which
/// is what `push_tasks` writes for a task built with only an id and attempts. A run's first
/// job is written by [`runs::start`](crate::runs::start) instead, in the run's statement.
pub async fn push(tx: &mut PgConnection, jobs: &[(ChainJob, String)]) -> Result<(), sqlx::Error> {
    if jobs.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = jobs.iter().map(|(_, id)| id.as_str()).collect();
    let runs: Vec<i64> = jobs.iter().map(|(job, _)| job.run_id).collect();
    let rules: Vec<i64> = jobs.iter().map(|(job, _)| job.rule_id).collect();
    sqlx::query!(
        "INSERT INTO apalis.jobs (id, job_type, job, max_attempts)
         SELECT u.id, $2, courier_chain_job(u.run, u.rule), $5
         FROM unnest($1::text[], $3::bigint[], $4::bigint[]) AS u(id, run, rule)",
        &ids as &[&str],
        CHAIN_QUEUE,
        &runs,
        &rules,
        CHAIN_JOB_MAX_ATTEMPTS as i32
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Snoozes a running job: puts it back in the queue to run at `at`, as if it had never
/// been fetched: no failure, no attempt counted. The one way a chain job "runs later"
/// (a busy lease, a rate-limit wait). The worker's own acknowledgement afterwards matches
/// only rows still locked by it, so it leaves this row alone. This leans on
/// apalis-postgres' schema; the tests cover it so an upgrade that breaks it fails loudly.
/// Callers wake the fetchers at `at` ([`wake_fetchers_at`]) once this is committed.
pub async fn snooze(
    db: impl PgExecutor<'_>,
    task_id: &str,
    at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let n = sqlx::query!(
        "UPDATE apalis.jobs
         SET status = 'Pending', run_at = $2, lock_by = NULL, lock_at = NULL, done_at = NULL,
             attempts = 0
         WHERE id = $1",
        task_id,
        at
    )
    .execute(db)
    .await?
    .rows_affected();
    if n != 1 {
        tracing::warn!(task = task_id, "the job to snooze is gone from the queue");
    }
    Ok(())
}

/// Wakes every worker's queue fetcher now (after jobs were put back by an UPDATE, which
/// apalis' insert trigger does not announce).
pub async fn wake_fetchers(db: impl PgExecutor<'_>) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "SELECT pg_notify($2,
                json_build_object('job_type', $1::text, 'id', 'courier-wake', 'run_at', now())::text)",
        CHAIN_QUEUE,
        INSERT_CHANNEL
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Wakes every worker's queue fetcher at `at`, the moment a job scheduled for then is due:
/// apalis' insert trigger only announces jobs due when inserted, so without this a waiting
/// chain would resume at the next poll. The poll (`COURIER_QUEUE_POLL_MS`) stays as the
/// safety net for a process that dies before its timer fires.
pub fn wake_fetchers_at(pool: sqlx::PgPool, clock: crate::clock::Clock, at: DateTime<Utc>) {
    tokio::spawn(async move {
        clock.sleep_until(at).await;
        if let Err(e) = wake_fetchers(&pool).await {
            tracing::warn!(error = %e, "could not wake the queue; the poll will pick the job up");
        }
    });
}

/// A row of the chain queue set aside because apalis cannot read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// The row's id, as stored.
    pub id: String,
    /// What is wrong with it (also in its `last_result`).
    pub reason: String,
}

/// Sets aside, in one statement, every waiting row of the chain queue (`Pending`, `Queued`
/// or `Failed`) that apalis cannot read (SQL function `courier_job_unreadable`: an id that
/// is not a ULID, a payload that is not UTF-8 JSON, a NULL metadata value, a timestamp
/// before 1970): status `Killed`, done now, the reason in `last_result`. Such a row would
/// fail every batch it is fetched in, and the worker with it. Each row is logged here, once:
/// a row set aside is never looked at again, by this or any other process.
pub async fn set_aside_unreadable(db: impl PgExecutor<'_>) -> Result<Vec<SetAside>, sqlx::Error> {
    let set_aside = sqlx::query_as!(
        SetAside,
        r#"WITH bad AS (
               SELECT j.id, courier_job_unreadable(j) AS reason FROM apalis.jobs j
               WHERE j.job_type = $1 AND j.status IN ('Pending', 'Queued', 'Failed')
           )
           UPDATE apalis.jobs j
           SET status = 'Killed', done_at = now(),
               last_result = jsonb_build_object('Err', $2 || bad.reason)
           FROM bad
           WHERE j.id = bad.id AND bad.reason IS NOT NULL
             AND j.status IN ('Pending', 'Queued', 'Failed')
           RETURNING j.id AS "id!", bad.reason AS "reason!""#,
        CHAIN_QUEUE,
        UNREADABLE
    )
    .fetch_all(db)
    .await?;
    for row in &set_aside {
        tracing::error!(job = %row.id, reason = %row.reason, "{UNREADABLE}set aside (status Killed)");
    }
    Ok(set_aside)
}

/// How `last_result` (and the log) introduce the reason a job was set aside.
pub const UNREADABLE: &str = "courier cannot read this job: ";

/// The processes executing a chain job now, one entry per job (`lock_by` of the running
/// rows: apalis' worker name, which is the process's).
pub async fn running_on(db: impl PgExecutor<'_>) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT lock_by AS "lock_by!" FROM apalis.jobs
           WHERE status = 'Running' AND job_type = $1 AND lock_by IS NOT NULL"#,
        CHAIN_QUEUE
    )
    .fetch_all(db)
    .await
}

/// Jobs of apalis queue `queue` done.
pub async fn done_in(db: impl PgExecutor<'_>, queue: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "done!" FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'"#,
        queue
    )
    .fetch_one(db)
    .await
}

/// How a row of apalis' table stands, as apalis (or the quarantine) left it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainRow {
    /// apalis' status (`Pending`, `Running`, `Done`, `Failed`, `Killed`, …).
    pub status: String,
    /// Attempts apalis counted.
    pub attempts: i32,
    /// The last result apalis (or [`set_aside_unreadable`]) wrote.
    pub last_result: Option<serde_json::Value>,
}

/// How the row with id `id` stands, if it is there (whatever its queue, and whether or
/// not apalis can read it).
pub async fn chain_row(db: impl PgExecutor<'_>, id: &str) -> Result<Option<ChainRow>, sqlx::Error> {
    sqlx::query_as!(
        ChainRow,
        "SELECT status, attempts, last_result FROM apalis.jobs WHERE id = $1",
        id
    )
    .fetch_optional(db)
    .await
}

/// Rows of apalis' table, every queue's, whatever their status.
pub async fn rows(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "rows!" FROM apalis.jobs"#)
        .fetch_one(db)
        .await
}
