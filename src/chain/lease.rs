//! The rule's lease: which job may execute for the rule now (owner + expiry on
//! `rules`), taken, renewed with the run's heartbeat, and given back; and freed by the
//! rescuer for processes that are gone. Every statement on the lease columns is here, and
//! only here is the owner's form known: `<worker>/<job id>`.

use chrono::{DateTime, Duration, Utc};
use sqlx::PgExecutor;

use super::JobContext;

/// The owner of a lease taken by job `task_id` of process `worker`: the job's own (a retry
/// of the same apalis job may take it again), not the process's.
pub fn owner(worker: &str, task_id: &str) -> String {
    format!("{worker}/{task_id}")
}

/// Takes the rule's lease for `owner` until `now + length`, unless another owner holds
/// an unexpired one; a job that gets it beats on its run at once, so a run resumed
/// after a wait is not taken for stalled before its first renewal, and a waiting run
/// reads `running` again (not `waiting` until a time past) while it calls.
pub async fn acquire(
    db: impl PgExecutor<'_>,
    ctx: &JobContext,
    task_id: &str,
    owner: &str,
    now: DateTime<Utc>,
    length: Duration,
) -> Result<bool, sqlx::Error> {
    let got = sqlx::query_scalar!(
        "WITH l AS (
            UPDATE rules SET lease_owner = $2, lease_until = $3
            WHERE id = $1 AND (lease_owner IS NULL OR lease_until < $4 OR lease_owner = $2)
            RETURNING id)
         UPDATE runs SET heartbeat_at = $4,
             status = CASE WHEN status = 'waiting' THEN 'running' ELSE status END,
             resume_at = CASE WHEN status = 'waiting' THEN NULL ELSE resume_at END
         WHERE id = $5 AND job_id IS NOT DISTINCT FROM $6 AND EXISTS (SELECT 1 FROM l)
         RETURNING id",
        ctx.rule_id,
        owner,
        now + length,
        now,
        ctx.run_id,
        task_id
    )
    .fetch_optional(db)
    .await?;
    Ok(got.is_some())
}

/// Extends the lease and the run's heartbeat while a batch is still calling the
/// target, so a slow batch is never taken for dead and its deliveries are never
/// claimed again. Returns false when the run is over or carried by another job.
pub async fn renew(
    db: impl PgExecutor<'_>,
    ctx: &JobContext,
    task_id: &str,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let n = sqlx::query!(
        "WITH l AS (UPDATE rules SET lease_until = $3 WHERE id = $1 AND lease_owner = $2)
         UPDATE runs SET heartbeat_at = $4
         WHERE id = $5 AND active AND job_id IS NOT DISTINCT FROM $6",
        ctx.rule_id,
        owner,
        until,
        now,
        ctx.run_id,
        task_id
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Gives the lease back.
pub async fn release(
    db: impl PgExecutor<'_>,
    rule_id: i64,
    owner: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2",
        rule_id,
        owner
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Frees every lease a job of process `worker` holds (the process stops cleanly).
pub async fn release_all_of(db: impl PgExecutor<'_>, worker: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET lease_owner = NULL, lease_until = NULL
         WHERE split_part(lease_owner, '/', 1) = $1",
        worker
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Frees the leases held by processes that are dead: registered, and not alive by
/// `courier_worker_alive` (their beat older than `cutoff`, if given, or their session gone
/// since `grace`).
pub async fn release_of_dead(
    db: impl PgExecutor<'_>,
    cutoff: Option<DateTime<Utc>>,
    grace: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET lease_owner = NULL, lease_until = NULL
         WHERE lease_owner IS NOT NULL AND NOT EXISTS (
             SELECT 1 FROM workers w
             WHERE w.name = split_part(rules.lease_owner, '/', 1)
               AND courier_worker_alive(w, COALESCE($1::timestamptz, '-infinity'), $2))
           AND EXISTS (SELECT 1 FROM workers w WHERE w.name = split_part(rules.lease_owner, '/', 1))",
        cutoff,
        grace
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Locks the lease rows of `rules` (ascending id) inside the caller's transaction: taken
/// before their runs, the order of a chain job's lease statements, so the two never wait
/// on each other in a circle.
pub async fn lock(db: impl PgExecutor<'_>, rules: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "SELECT id FROM rules WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        rules
    )
    .fetch_all(db)
    .await?;
    Ok(())
}

/// Frees the leases of `rules`, whoever holds them (their runs were moved on to new jobs).
pub async fn release_rules(db: impl PgExecutor<'_>, rules: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET lease_owner = NULL, lease_until = NULL WHERE id = ANY($1)",
        rules
    )
    .execute(db)
    .await?;
    Ok(())
}
