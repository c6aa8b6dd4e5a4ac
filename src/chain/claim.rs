//! The claim stage: the next batch of a run's due deliveries, with what the database
//! already knows about each (superseded, unchanged since last delivered, dependency still
//! pending).
//!
//! No row lock is taken: the rule's lease (owner + expiry on `rules`) is what keeps two
//! jobs of one rule from claiming the same deliveries, and every later write to a delivery
//! is guarded by `status = 'pending'`. A lock here would end with the statement anyway,
//! since no transaction is held across the calls that follow.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

/// A claimed delivery and what the database already knows about it.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The delivery.
    pub id: i64,
    /// Its record key.
    pub record_key: String,
    /// What to send.
    pub payload: serde_json::Value,
    /// Attempts used so far.
    pub attempts: i32,
    /// Not before this time (clamped into years 1..9999: `infinity` holds until 9999).
    pub hold_until: Option<DateTime<Utc>>,
    /// When it was enqueued (clamped likewise).
    pub created_at: DateTime<Utc>,
    /// A newer pending delivery has the same rule and key.
    pub superseded: bool,
    /// Its payload equals the last one delivered for the key.
    pub unchanged: bool,
    /// The record key it waits for, if any.
    pub depends_on: Option<String>,
    /// Its `depends_on` names a key not yet delivered on the connection.
    pub dependency_pending: bool,
}

/// Where a claim starts and how much it takes.
#[derive(Clone, Copy, Debug)]
pub struct ClaimScope {
    /// The rule whose deliveries are claimed.
    pub rule_id: i64,
    /// Its connection (dependencies are looked up there).
    pub connection_id: i64,
    /// Only deliveries with a higher id (the run's cursor).
    pub after_id: i64,
    /// At most this many.
    pub limit: i32,
}

/// Up to `scope.limit` pending deliveries of the rule due by `now`, in id order.
pub async fn claim(
    db: impl PgExecutor<'_>,
    scope: ClaimScope,
    now: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT d.id, d.record_key, d.payload, d.attempts, d.depends_on,
                  courier_ts(d.hold_until) AS hold_until,
                  courier_ts(d.created_at) AS "created_at!",
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
             -- A pause stops a job between its batches, not only at its start.
             AND NOT EXISTS (SELECT 1 FROM rules r JOIN connections c ON c.id = r.connection_id
                             WHERE r.id = $1 AND (r.paused OR c.paused))
           ORDER BY d.id
           LIMIT $5"#,
        scope.rule_id,
        scope.connection_id,
        scope.after_id,
        now,
        i64::from(scope.limit)
    )
    .fetch_all(db)
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
            depends_on: r.depends_on,
            dependency_pending: r.dependency_pending,
        })
        .collect())
}
