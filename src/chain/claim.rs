//! The claim stage: the next batch of a run's due deliveries, with what the database
//! already knows about each (superseded, unchanged since last delivered, dependency still
//! pending). The claim reads one range of `deliveries_pending` and, per claimed row, one
//! probe of `delivered_records` (two with a `depends_on`): supersession was decided when
//! the newer delivery was enqueued (trigger `deliveries_supersede`), so no plan, however
//! wrong the planner's statistics, reads other deliveries per claimed row.
//!
//! Every claimed delivery passes the erasure gate ([`crate::erasure::gate`]) before the
//! batch is handed on: one whose person is erased is suppressed, its payload emptied.
//!
//! No row lock is taken: the rule's lease (owner + expiry on `rules`) is what keeps two
//! jobs of one rule from claiming the same deliveries, and every later write to a delivery
//! is guarded by `status = 'pending'`. A lock here would end with the statement anyway,
//! since no transaction is held across the calls that follow.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use sqlx::PgExecutor;

use crate::{
    engine::Engine,
    enqueue::Op,
    erasure::gate::{self, Passage},
};

/// A claimed delivery and what the database already knows about it.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The delivery.
    pub id: i64,
    /// Its record key.
    pub record_key: String,
    /// What to send.
    pub payload: serde_json::Value,
    /// An upsert, or a delete of the record.
    pub op: Op,
    /// Attempts used so far.
    pub attempts: i32,
    /// Not before this time (clamped into years 1..9999: `infinity` holds until 9999).
    pub hold_until: Option<DateTime<Utc>>,
    /// When it was enqueued (clamped likewise).
    pub created_at: DateTime<Utc>,
    /// A newer delivery of the same rule and key was enqueued while it was pending.
    pub superseded: bool,
    /// Its payload equals the last one delivered for the key.
    pub unchanged: bool,
    /// The record key it waits for, if any.
    pub depends_on: Option<String>,
    /// Its `depends_on` names a key not yet delivered on the connection.
    pub dependency_pending: bool,
    /// The person's identities it names (`kind:value`, as its rule says where they sit,
    /// and its record key), for the erasure gate.
    pub identities: Vec<String>,
    /// What the erasure gate says of it.
    pub passage: Passage,
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

/// Up to `scope.limit` pending deliveries of the rule due by `now`, in id order, each
/// through the erasure gate.
pub async fn claim(
    engine: &Engine,
    scope: ClaimScope,
    now: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let mut batch = read(&engine.pool, scope, now).await?;
    let identities: Vec<(i64, &[String])> = batch
        .iter()
        .map(|d| (d.id, d.identities.as_slice()))
        .collect();
    let passages = gate::check(engine, &identities, now).await?;
    for (d, passage) in batch.iter_mut().zip(passages) {
        d.passage = passage;
        if matches!(passage, Passage::Erased(_)) {
            d.payload = serde_json::json!({});
        }
    }
    Ok(batch)
}

/// The claim's read ([`claim`] without the gate: every passage clear).
pub async fn read(
    db: impl PgExecutor<'_>,
    scope: ClaimScope,
    now: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT d.id, d.record_key, d.payload, d.attempts, d.depends_on,
                  d.op AS "op: Op",
                  courier_ts(d.hold_until) AS hold_until,
                  courier_ts(d.created_at) AS "created_at!",
                  -- Decided when the newer delivery was enqueued (trigger
                  -- deliveries_supersede): nothing here reads another delivery.
                  d.superseded AS "superseded!",
                  -- One probe of delivered_records' key per claimed row, as a scalar
                  -- subquery so that no plan can read the whole table instead.
                  COALESCE((SELECT dr.payload = d.payload FROM delivered_records dr
                            WHERE dr.rule_id = d.rule_id AND dr.record_key = d.record_key),
                           false) AS "unchanged!",
                  (d.depends_on IS NOT NULL AND NOT EXISTS (
                      SELECT 1 FROM delivered_records x
                      WHERE x.connection_id = $2 AND x.record_key = d.depends_on)) AS "dependency_pending!",
                  -- The person's identities as the rule says where they sit, and the key
                  -- (`courier_delivery_identities`' kinds, as plain expressions: a function
                  -- over the rule's identities per row cost the claim 28 us a row).
                  array_remove(ARRAY[
                      'email:' || courier_identity('email', d.payload #>> ru.email),
                      'phone:' || courier_identity('phone', d.payload #>> ru.phone),
                      'external_id:' || (d.payload #>> ru.external_id),
                      'key:' || d.record_key], NULL) AS "identities!"
           FROM deliveries d CROSS JOIN (
               SELECT CASE WHEN r.identities ? 'email' THEN courier_pointer(r.identities ->> 'email') END AS email,
                      CASE WHEN r.identities ? 'phone' THEN courier_pointer(r.identities ->> 'phone') END AS phone,
                      CASE WHEN r.identities ? 'external_id'
                           THEN courier_pointer(r.identities ->> 'external_id') END AS external_id
               FROM rules r WHERE r.id = $1) ru
           WHERE d.rule_id = $1 AND d.status = 'pending' AND d.id > $3 AND d.next_attempt_at <= $4
             -- A pause (the catalog's condition) stops a job between its batches, not
             -- only at its start.
             AND NOT EXISTS (SELECT 1 FROM rules r JOIN connections c ON c.id = r.connection_id
                             WHERE r.id = $1 AND courier_rule_paused(r, c))
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
    let mut batch: Vec<Claimed> = rows
        .into_iter()
        .map(|r| Claimed {
            id: r.id,
            record_key: r.record_key,
            payload: r.payload,
            op: r.op,
            attempts: r.attempts,
            hold_until: r.hold_until,
            created_at: r.created_at,
            superseded: r.superseded,
            unchanged: r.unchanged,
            depends_on: r.depends_on,
            dependency_pending: r.dependency_pending,
            identities: r.identities,
            passage: Passage::Clear,
        })
        .collect();
    supersede_within(&mut batch);
    Ok(batch)
}

/// Marks superseded each delivery of `batch` (in id order) whose key comes again later in
/// it. The trigger decides supersession from what its insert can see: two transactions
/// enqueuing the same key at once each miss the other's row, and both commit unmarked.
/// Caught here when they are claimed together (the usual case: a backlog is claimed a
/// batch at a time), so the older is not sent alongside the newer.
fn supersede_within(batch: &mut [Claimed]) {
    let mut seen = HashSet::new();
    let again: Vec<bool> = batch
        .iter()
        .rev()
        .map(|d| !seen.insert(d.record_key.as_str()))
        .collect();
    for (d, again) in batch.iter_mut().rev().zip(again) {
        d.superseded |= again;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(id: i64, key: &str, superseded: bool) -> Claimed {
        Claimed {
            id,
            record_key: key.into(),
            payload: serde_json::json!({}),
            op: Op::Upsert,
            attempts: 0,
            hold_until: None,
            created_at: Utc::now(),
            superseded,
            unchanged: false,
            depends_on: None,
            dependency_pending: false,
            identities: Vec::new(),
            passage: Passage::Clear,
        }
    }

    #[test]
    fn a_key_again_later_in_the_batch_supersedes_the_earlier() {
        let mut batch = vec![
            claimed(1, "a", false),
            claimed(2, "b", false),
            claimed(3, "a", false),
            claimed(4, "c", true),
            claimed(5, "a", false),
        ];
        supersede_within(&mut batch);
        let got: Vec<_> = batch.iter().map(|d| (d.id, d.superseded)).collect();
        assert_eq!(
            got,
            vec![(1, true), (2, false), (3, true), (4, true), (5, false)]
        );
    }
}
