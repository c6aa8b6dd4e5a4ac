//! Retention: removes what has ended longer ago than the retention period
//! (`COURIER_RETENTION_DAYS`, default 7): delivered and suppressed deliveries with their
//! ledger rows, finished runs and finished target jobs no ledger row refers to any more,
//! and finished jobs of the chain queue. Pending, exhausted and rejected deliveries stay, with their history (they
//! are what an operator may still retry).
//!
//! It deletes in bounded batches ([`BATCH`] rows per statement, each its own short
//! transaction, yielding between them), through partial indexes on the end times, so
//! delivery never waits on it for long. What it never breaks:
//! - `depends_on` and suppression read `delivered_records` (the last payload delivered per
//!   key), which retention leaves alone: a pending delivery waiting for a key delivered
//!   long ago still sees it delivered.
//! - A run still named by ledger rows of a kept delivery stays (the ledger would
//!   otherwise lose those rows with it); it goes once they do.
//! - A queue job an active run names stays, however old.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{engine::Engine, queue::CHAIN_QUEUE};

/// Rows deleted per statement at most.
pub const BATCH: i64 = 1_000;
/// How often retention runs at most (a short retention period runs it more often).
pub const RETAIN_EVERY: Duration = Duration::from_secs(60);

/// What one pass removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// Delivered and suppressed deliveries (their ledger rows go with them).
    pub deliveries: u64,
    /// Ledger rows removed with them.
    pub ledger: u64,
    /// Finished runs.
    pub runs: u64,
    /// Finished jobs of the chain queue.
    pub jobs: u64,
    /// Finished jobs at the targets (`target_jobs`).
    pub target_jobs: u64,
    /// Delete statements it took.
    pub batches: u64,
    /// The most rows of one table one statement removed (at most the batch size, plus the
    /// ledger rows of that many deliveries).
    pub largest: u64,
}

impl Removed {
    /// Whether anything was removed.
    pub fn any(&self) -> bool {
        self.deliveries + self.runs + self.jobs + self.target_jobs > 0
    }
}

/// The tables whose rows retention removes once they ended, after the deliveries.
#[derive(Clone, Copy)]
enum Ended {
    Runs,
    QueueJobs,
    TargetJobs,
}

/// Removes old finished rows.
pub struct Retention<'a> {
    /// Shared process state.
    engine: &'a Engine,
    /// Rows per statement.
    batch: i64,
}

impl<'a> Retention<'a> {
    /// Retention over `engine`, with its settings' period.
    pub fn new(engine: &'a Engine) -> Self {
        Self {
            engine,
            batch: BATCH,
        }
    }

    /// The same with `batch` rows per statement (tests use small ones).
    pub fn with_batch(engine: &'a Engine, batch: i64) -> Self {
        Self {
            engine,
            batch: batch.max(1),
        }
    }

    /// One pass: everything that ended before now minus the retention period, a batch at a
    /// time, until none is left. Does nothing when retention is off.
    pub async fn run_once(&self) -> Result<Removed, sqlx::Error> {
        let Some(keep) = self.engine.settings.retention else {
            return Ok(Removed::default());
        };
        let before = self.engine.clock.now()
            - chrono::Duration::from_std(keep).unwrap_or(chrono::Duration::MAX);
        let mut removed = Removed::default();
        loop {
            let (deliveries, ledger) = self.deliveries(before).await?;
            removed.batches += 1;
            removed.deliveries += deliveries;
            removed.ledger += ledger;
            removed.largest = removed.largest.max(deliveries);
            if deliveries < self.batch as u64 || self.engine.shutdown.is_cancelled() {
                break;
            }
            tokio::task::yield_now().await;
        }
        // The rows that only ended: each table in batches until one comes back short.
        for table in [Ended::Runs, Ended::QueueJobs, Ended::TargetJobs] {
            loop {
                let n = match table {
                    Ended::Runs => self.runs(before).await?,
                    Ended::QueueJobs => self.jobs(before).await?,
                    Ended::TargetJobs => self.target_jobs(before).await?,
                };
                removed.batches += 1;
                *match table {
                    Ended::Runs => &mut removed.runs,
                    Ended::QueueJobs => &mut removed.jobs,
                    Ended::TargetJobs => &mut removed.target_jobs,
                } += n;
                removed.largest = removed.largest.max(n);
                if n < self.batch as u64 || self.engine.shutdown.is_cancelled() {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        if removed.any() {
            tracing::debug!(?removed, %before, "retention removed old rows");
        }
        Ok(removed)
    }

    /// One batch of deliveries and their ledger rows: `(deliveries, ledger rows)`.
    async fn deliveries(&self, before: DateTime<Utc>) -> Result<(u64, u64), sqlx::Error> {
        let row = sqlx::query!(
            r#"WITH old AS (
                   SELECT id FROM deliveries
                   WHERE status IN ('delivered', 'unconfirmed', 'suppressed') AND finished_at < $1
                   LIMIT $2),
               l AS (DELETE FROM ledger WHERE delivery_id IN (SELECT id FROM old) RETURNING 1),
               d AS (DELETE FROM deliveries WHERE id IN (SELECT id FROM old) RETURNING 1)
               SELECT (SELECT count(*) FROM d) AS "deliveries!", (SELECT count(*) FROM l) AS "ledger!""#,
            before,
            self.batch
        )
        .fetch_one(&self.engine.pool)
        .await?;
        Ok((row.deliveries as u64, row.ledger as u64))
    }

    /// One batch of finished runs no ledger row names.
    async fn runs(&self, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query!(
            "DELETE FROM runs WHERE id IN (
                 SELECT x.id FROM runs x
                 WHERE NOT x.active AND x.finished_at < $1
                   AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.run_id = x.id)
                 LIMIT $2)",
            before,
            self.batch
        )
        .execute(&self.engine.pool)
        .await?
        .rows_affected())
    }

    /// One batch of target jobs that ended (complete, failed, overdue) and that no ledger
    /// row names: an overdue job's records stay `accepted`, with their rows, so it stays.
    async fn target_jobs(&self, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        crate::jobs::remove_ended(&self.engine.pool, before, self.batch).await
    }

    /// One batch of finished chain-queue jobs no active run names.
    async fn jobs(&self, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query!(
            "DELETE FROM apalis.jobs WHERE id IN (
                 SELECT j.id FROM apalis.jobs j
                 WHERE j.status IN ('Done', 'Killed') AND j.done_at < $1 AND j.job_type = $3
                   AND j.id NOT IN (SELECT x.job_id FROM runs x
                                    WHERE x.active AND x.job_id IS NOT NULL)
                 LIMIT $2)",
            before,
            self.batch,
            CHAIN_QUEUE
        )
        .execute(&self.engine.pool)
        .await?
        .rows_affected())
    }

    /// Runs passes until `shutdown`: every [`RETAIN_EVERY`], or a tenth of the retention
    /// period when that is shorter (at least every second).
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(keep) = self.engine.settings.retention else {
            return;
        };
        let period = (keep / 10).clamp(Duration::from_secs(1), RETAIN_EVERY);
        super::every("retention", period, &self.engine.health, shutdown, || {
            self.run_once()
        })
        .await;
    }
}

/// Deliveries retention should have removed by now: delivered, unconfirmed and suppressed
/// ones that finished longer than `age` ago (with `age` the retention period and a
/// margin, none should be left: what shows whether it keeps up).
pub async fn overdue(db: impl sqlx::PgExecutor<'_>, age: Duration) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "overdue!" FROM deliveries
           WHERE status IN ('delivered', 'unconfirmed', 'suppressed')
             AND finished_at < now() - make_interval(secs => $1)"#,
        age.as_secs_f64()
    )
    .fetch_one(db)
    .await
}
