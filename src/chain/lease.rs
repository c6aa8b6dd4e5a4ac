//! The rule's lease: which job may execute for the rule now (owner + expiry on
//! `rules`), taken, renewed with the run's heartbeat, and given back; and freed by the
//! rescuer for processes that are gone. Every statement on the lease columns is here, and
//! only here is the owner's form known: `<worker>/<job id>`.

use chrono::{DateTime, Duration, Utc};
use sqlx::{PgExecutor, PgPool};

use super::context::ChainContext;
use crate::runs;

/// The owner of a lease taken by job `task_id` of process `worker`: the job's own (a retry
/// of the same apalis job may take it again), not the process's.
pub fn owner(worker: &str, task_id: &str) -> String {
    format!("{worker}/{task_id}")
}

/// Takes the rule's lease for `owner` until `now + length`, unless another owner holds
/// an unexpired one, and beats on the job's run at once ([`runs::resume`]), so a run
/// resumed after a wait is not taken for stalled before its first renewal and a waiting
/// run reads `running` again while it calls. One transaction: when the run is carried by
/// another job, the lease is not taken either.
pub async fn acquire(
    pool: &PgPool,
    ctx: &ChainContext,
    task_id: &str,
    owner: &str,
    now: DateTime<Utc>,
    length: Duration,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let taken = sqlx::query_scalar!(
        "UPDATE rules SET lease_owner = $2, lease_until = $3
         WHERE id = $1 AND (lease_owner IS NULL OR lease_until < $4 OR lease_owner = $2)
         RETURNING id",
        ctx.rule_id,
        owner,
        now + length,
        now
    )
    .fetch_optional(&mut *tx)
    .await?
    .is_some();
    if !(taken && runs::resume(&mut *tx, ctx.run_id, task_id, now).await?) {
        return Ok(false); // dropping the transaction rolls it back
    }
    tx.commit().await?;
    Ok(true)
}

/// Extends the lease until `until` and beats on the run ([`runs::beat`]) while a batch is
/// still calling the target, so a slow batch is never taken for dead and its deliveries
/// are never claimed again. Returns false when the run is over or carried by another job.
pub async fn renew(
    pool: &PgPool,
    ctx: &ChainContext,
    task_id: &str,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let extend = sqlx::query!(
        "UPDATE rules SET lease_until = $3 WHERE id = $1 AND lease_owner = $2",
        ctx.rule_id,
        owner,
        until
    )
    .execute(pool);
    let (_, beat) = tokio::try_join!(extend, runs::beat(pool, ctx.run_id, task_id, now))?;
    Ok(beat)
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

/// A rule's lease held now: the process whose job holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The process (`<worker>` of the owner `<worker>/<job id>`).
    pub worker: String,
    /// The rule leased.
    pub rule: String,
}

/// Every lease held now (expired or not: until it is given back or freed).
pub async fn holders(db: impl PgExecutor<'_>) -> Result<Vec<Holder>, sqlx::Error> {
    sqlx::query_as!(
        Holder,
        r#"SELECT split_part(lease_owner, '/', 1) AS "worker!", name AS rule
           FROM rules WHERE lease_owner IS NOT NULL ORDER BY name"#
    )
    .fetch_all(db)
    .await
}
