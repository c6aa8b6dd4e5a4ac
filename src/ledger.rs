//! The ledger (table `ledger`): one append-only row per outcome of one delivery in one run,
//! and the delivery state each outcome implies (status, attempts, next attempt), written
//! for a whole batch in three bulk statements.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

/// Where a delivery stands (`deliveries.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Waiting to be sent (again) at `next_attempt_at`.
    Pending,
    /// Submitted in a target's asynchronous job whose outcome is pending.
    Accepted,
    /// The target accepted it.
    Delivered,
    /// The target refused it for good.
    Rejected,
    /// Every attempt failed.
    Exhausted,
    /// Never sent: superseded or unchanged.
    Suppressed,
    /// The target took it and reports no fate of its own: final, never read as delivered.
    Unconfirmed,
}

impl DeliveryStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Accepted => "accepted",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Rejected => "rejected",
            DeliveryStatus::Exhausted => "exhausted",
            DeliveryStatus::Suppressed => "suppressed",
            DeliveryStatus::Unconfirmed => "unconfirmed",
        }
    }
}

/// What happened to one delivery in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Outcome {
    /// The target accepted it.
    Delivered,
    /// Submitted in one of the target's asynchronous jobs (`ledger.target_job`): the
    /// target has it, its fate is pending until the job reports.
    Accepted,
    /// A transient failure; it will be retried at `next_attempt_at`.
    Failed,
    /// A transient failure on the last attempt; no more retries.
    Exhausted,
    /// A permanent failure; no retry.
    Rejected,
    /// Not sent: superseded by a newer delivery, or unchanged since the last delivery.
    Suppressed,
    /// Not sent yet: `hold_until` is ahead or `depends_on` is not delivered.
    Held,
    /// Made pending again by hand (`courier retry`, the dashboard) after it was exhausted
    /// or rejected; recorded without a run, naming who asked (`ledger.actor`).
    Retried,
    /// The target took it (a 2xx) and reports nothing of its fate, now or later (a rule
    /// whose answer is `unreported`, such as a job with nothing to poll): final, and never
    /// read as delivered.
    Unconfirmed,
}

impl Outcome {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Accepted => "accepted",
            Outcome::Failed => "failed",
            Outcome::Exhausted => "exhausted",
            Outcome::Rejected => "rejected",
            Outcome::Suppressed => "suppressed",
            Outcome::Held => "held",
            Outcome::Retried => "retried",
            Outcome::Unconfirmed => "unconfirmed",
        }
    }

    /// The delivery status this outcome leaves behind.
    pub fn delivery_status(self) -> DeliveryStatus {
        match self {
            Outcome::Delivered => DeliveryStatus::Delivered,
            Outcome::Accepted => DeliveryStatus::Accepted,
            Outcome::Failed | Outcome::Held | Outcome::Retried => DeliveryStatus::Pending,
            Outcome::Exhausted => DeliveryStatus::Exhausted,
            Outcome::Rejected => DeliveryStatus::Rejected,
            Outcome::Suppressed => DeliveryStatus::Suppressed,
            Outcome::Unconfirmed => DeliveryStatus::Unconfirmed,
        }
    }
}

/// One outcome to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The delivery.
    pub delivery_id: i64,
    /// What happened.
    pub outcome: Outcome,
    /// The delivery's attempt count after this outcome (unchanged for held/suppressed).
    pub attempt: i32,
    /// The target's HTTP status, when it answered.
    pub http_status: Option<i16>,
    /// What went wrong.
    pub error: Option<String>,
    /// How long the call took.
    pub duration_ms: Option<i32>,
    /// When the delivery is due again (failed, held); `None` leaves it unchanged.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the outcome happened: the call's answer, or the decision not to call.
    pub at: DateTime<Utc>,
}

/// Writes a batch's outcomes: delivery rows, ledger rows, and the last delivered payload
/// per record key (for suppression and `depends_on`). `jobs` names the target's job each
/// `accepted` delivery went in (`(job, its deliveries)`; written before, in `tx`).
pub async fn record(
    tx: &mut PgConnection,
    run_id: i64,
    rule_id: i64,
    connection_id: i64,
    entries: &[Entry],
    jobs: &[(i64, &[i64])],
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let job_of: std::collections::HashMap<i64, i64> = jobs
        .iter()
        .flat_map(|&(job, ids)| ids.iter().map(move |&id| (id, job)))
        .collect();
    let columns = Columns::of(entries, |id| job_of.get(&id).copied());
    update_deliveries(&mut *tx, &columns, connection_id, now).await?;
    append_ledger(&mut *tx, &columns, run_id, rule_id).await?;
    record_delivered(&mut *tx, entries, connection_id, now).await
}

/// A batch's entries as the columns the bulk statements unnest.
struct Columns<'a> {
    ids: Vec<i64>,
    outcomes: Vec<&'a str>,
    statuses: Vec<&'a str>,
    attempts: Vec<i32>,
    next_at: Vec<Option<DateTime<Utc>>>,
    errors: Vec<Option<&'a str>>,
    http: Vec<Option<i16>>,
    durations: Vec<Option<i32>>,
    ats: Vec<DateTime<Utc>>,
    jobs: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    /// The entries' columns; `job_of` names each delivery's job, if it has one.
    fn of(entries: &'a [Entry], job_of: impl Fn(i64) -> Option<i64>) -> Self {
        Self {
            jobs: entries.iter().map(|e| job_of(e.delivery_id)).collect(),
            ids: entries.iter().map(|e| e.delivery_id).collect(),
            outcomes: entries.iter().map(|e| e.outcome.as_str()).collect(),
            statuses: entries
                .iter()
                .map(|e| e.outcome.delivery_status().as_str())
                .collect(),
            attempts: entries.iter().map(|e| e.attempt).collect(),
            next_at: entries.iter().map(|e| e.next_attempt_at).collect(),
            errors: entries.iter().map(|e| e.error.as_deref()).collect(),
            http: entries.iter().map(|e| e.http_status).collect(),
            durations: entries.iter().map(|e| e.duration_ms).collect(),
            ats: entries.iter().map(|e| e.at).collect(),
        }
    }
}

/// The deliveries' new state. A delivery held for its `depends_on` whose dependency was
/// delivered meanwhile (its batch was triaged before) is due now: the statement that
/// recorded the dependency found it claimed, due already, and left it alone.
///
/// Each row is found by its primary key. The guard reads `IS NOT DISTINCT FROM 'pending'`
/// (the same as `= 'pending'`: `status` is never NULL) so that no partial index on pending
/// deliveries matches it: without statistics the planner underestimates the pending rows,
/// and a plan through such an index reads every pending delivery of every rule for each
/// batch rather than probe the key.
async fn update_deliveries(
    tx: &mut PgConnection,
    c: &Columns<'_>,
    connection_id: i64,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE deliveries d SET
            status = u.status, attempts = u.attempt,
            next_attempt_at = CASE
                WHEN u.outcome = 'held' AND d.depends_on IS NOT NULL
                     AND (d.hold_until IS NULL OR d.hold_until <= $6::timestamptz)
                     AND EXISTS (SELECT 1 FROM delivered_records x
                                 WHERE x.connection_id = $8 AND x.record_key = d.depends_on)
                THEN $6::timestamptz
                ELSE COALESCE(u.next_at, d.next_attempt_at) END,
            last_error = COALESCE(u.error, d.last_error), updated_at = $6::timestamptz,
            finished_at = CASE WHEN u.status IN ('pending', 'accepted') THEN NULL ELSE u.at END
         FROM unnest($1::bigint[], $2::text[], $3::int[], $4::timestamptz[], $5::text[],
                     $7::timestamptz[], $9::text[])
              AS u(id, status, attempt, next_at, error, at, outcome)
         WHERE d.id = u.id AND d.status IS NOT DISTINCT FROM 'pending'",
        &c.ids,
        &c.statuses as &[&str],
        &c.attempts,
        &c.next_at as &[Option<DateTime<Utc>>],
        &c.errors as &[Option<&str>],
        now,
        &c.ats,
        connection_id,
        &c.outcomes as &[&str]
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// One ledger row per entry.
async fn append_ledger(
    tx: &mut PgConnection,
    c: &Columns<'_>,
    run_id: i64,
    rule_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO ledger (run_id, rule_id, delivery_id, outcome, attempt, http_status, error,
                             duration_ms, created_at, target_job)
         SELECT $1, $2, u.*
         FROM unnest($3::bigint[], $4::text[], $5::int[], $6::smallint[], $7::text[], $8::int[],
                     $9::timestamptz[], $10::bigint[]) AS u",
        run_id,
        rule_id,
        &c.ids,
        &c.outcomes as &[&str],
        &c.attempts,
        &c.http as &[Option<i16>],
        &c.errors as &[Option<&str>],
        &c.durations as &[Option<i32>],
        &c.ats,
        &c.jobs as &[Option<i64>]
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// One statement: the delivered keys, then the deliveries held for one of them
/// (`depends_on`, on any rule of the connection), made due now rather than at their
/// next look, which comes after half the time they have waited; the dispatchers
/// hear of it with the commit (trigger `deliveries_due_sooner`). The held deliveries are
/// found by one probe of `deliveries_waiting_on` per delivered key: the probe is a
/// LATERAL subquery with OFFSET 0, which keeps the rule and time filters outside it, so
/// no other index can serve it. Filters beside the key (or a join to `rules`) would let a
/// planner without statistics walk `deliveries_due` instead, every pending delivery of
/// the connection due later, for every batch.
///
/// Each key's newest delivery of the entries decides: an upsert writes the key's row (unless
/// a newer one did), a delete removes it (unless a newer upsert wrote it), so an upsert that
/// makes the record again is not suppressed as unchanged and a `depends_on` on the key
/// waits again. An upsert superseded by a delete already delivered (both in flight at once)
/// writes nothing: the record is gone.
async fn record_delivered(
    tx: &mut PgConnection,
    entries: &[Entry],
    connection_id: i64,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let delivered: Vec<i64> = entries
        .iter()
        // A record the target took unconfirmed frees its dependents as one delivered does.
        .filter(|e| matches!(e.outcome, Outcome::Delivered | Outcome::Unconfirmed))
        .map(|e| e.delivery_id)
        .collect();
    if delivered.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        "WITH newest AS (
             SELECT DISTINCT ON (d.record_key) d.rule_id, d.record_key, d.payload, d.id, d.op,
                    d.superseded
             FROM deliveries d WHERE d.id = ANY($1)
             ORDER BY d.record_key, d.id DESC),
         removed AS (
             DELETE FROM delivered_records r USING newest n
             WHERE n.op = 'delete' AND r.rule_id = n.rule_id AND r.record_key = n.record_key
               AND r.delivery_id < n.id),
         recorded AS (
             INSERT INTO delivered_records (rule_id, record_key, connection_id, payload,
                                            delivery_id, delivered_at)
             SELECT n.rule_id, n.record_key, $2, n.payload, n.id, $3
             FROM newest n
             WHERE n.op = 'upsert'
               AND NOT (n.superseded AND EXISTS (
                   SELECT 1 FROM deliveries x
                   WHERE x.record_key = n.record_key AND x.rule_id = n.rule_id
                     AND x.id > n.id AND x.op = 'delete' AND x.status = 'delivered'))
             ON CONFLICT (rule_id, record_key) DO UPDATE SET
                payload = EXCLUDED.payload, delivery_id = EXCLUDED.delivery_id,
                delivered_at = EXCLUDED.delivered_at
             WHERE delivered_records.delivery_id < EXCLUDED.delivery_id
             RETURNING record_key)
         UPDATE deliveries w SET next_attempt_at = $3, updated_at = $3
         WHERE w.id = ANY(ARRAY(
                   SELECT x.id FROM recorded k
                   CROSS JOIN LATERAL (SELECT d.id, d.rule_id, d.next_attempt_at
                                       FROM deliveries d
                                       WHERE d.depends_on = k.record_key AND d.status = 'pending'
                                       OFFSET 0) x
                   WHERE x.rule_id = ANY(ARRAY(SELECT id FROM rules WHERE connection_id = $2))
                     AND x.next_attempt_at > $3))
           AND w.status = 'pending' AND w.next_attempt_at > $3",
        &delivered,
        connection_id,
        now
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Of `delivery_ids`, those still `accepted`, with their attempts, locked until the
/// transaction ends (the job that carries them is settled once).
pub async fn accepted(
    tx: &mut PgConnection,
    delivery_ids: &[i64],
) -> Result<Vec<(i64, i32)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT id, attempts FROM deliveries
         WHERE id = ANY($1) AND status = 'accepted' ORDER BY id FOR UPDATE",
        delivery_ids
    )
    .fetch_all(tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.attempts)).collect())
}

/// Writes the final outcomes of job `job_id`'s records (accepted until now): delivery
/// rows, ledger rows naming the job (of run `run_id`, which submitted it), and the
/// delivered payloads, as [`record`] does for a call's.
pub async fn record_job(
    tx: &mut PgConnection,
    run_id: i64,
    rule_id: i64,
    connection_id: i64,
    job_id: i64,
    entries: &[Entry],
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let c = Columns::of(entries, |_| Some(job_id));
    sqlx::query!(
        "UPDATE deliveries d SET
            status = u.status, next_attempt_at = COALESCE(u.next_at, d.next_attempt_at),
            last_error = COALESCE(u.error, d.last_error), updated_at = $5,
            finished_at = CASE WHEN u.status = 'pending' THEN NULL ELSE u.at END
         FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $6::timestamptz[])
              AS u(id, status, next_at, error, at)
         WHERE d.id = u.id AND d.status = 'accepted'",
        &c.ids,
        &c.statuses as &[&str],
        &c.next_at as &[Option<DateTime<Utc>>],
        &c.errors as &[Option<&str>],
        now,
        &c.ats,
    )
    .execute(&mut *tx)
    .await?;
    append_ledger(&mut *tx, &c, run_id, rule_id).await?;
    record_delivered(&mut *tx, entries, connection_id, now).await
}

/// Makes rule `rule_id`'s deliveries in one of `statuses` (exhausted, rejected) pending
/// again, due now, with attempts reset, each with a ledger row `retried` naming `actor`;
/// with `since`, only those that ended at or after it. Returns how many.
pub async fn retry(
    tx: &mut PgConnection,
    rule_id: i64,
    statuses: &[&str],
    since: Option<DateTime<Utc>>,
    actor: &str,
) -> Result<u64, sqlx::Error> {
    // One statement: the deliveries made pending and their ledger rows. A delivery whose
    // key has a newer delivery, in any state, stays as it is: the newer record wins (sent
    // or pending, the older one would overwrite it; refused, it is the one to retry). So
    // does one superseded while it was pending, and one older than the key's last
    // delivered record (the newer delivery may be gone with retention). Only the newest
    // delivery of a key can be retried, so a retry never needs to supersede another.
    let n = sqlx::query_scalar!(
        r#"WITH again AS (
               UPDATE deliveries d SET status = 'pending', attempts = 0, next_attempt_at = now(),
                      finished_at = NULL, updated_at = now()
               WHERE d.rule_id = $1 AND d.status = ANY($2::text[])
                 AND ($3::timestamptz IS NULL OR d.finished_at >= $3)
                 AND NOT d.superseded
                 AND NOT EXISTS (SELECT 1 FROM deliveries n
                                 WHERE n.record_key = d.record_key AND n.rule_id = d.rule_id
                                   AND n.id > d.id)
                 AND NOT EXISTS (SELECT 1 FROM delivered_records x
                                 WHERE x.rule_id = d.rule_id AND x.record_key = d.record_key
                                   AND x.delivery_id > d.id)
               RETURNING d.id),
           logged AS (
               INSERT INTO ledger (run_id, rule_id, delivery_id, outcome, attempt, actor, created_at)
               SELECT NULL, $1, again.id, 'retried', 0, $4, now() FROM again
               RETURNING 1)
           SELECT count(*) AS "n!" FROM logged"#,
        rule_id,
        statuses as &[&str],
        since,
        actor
    )
    .fetch_one(tx)
    .await?;
    Ok(n as u64)
}

/// A rule's backlog: its pending deliveries.
#[derive(Debug, Default, Clone, Copy)]
pub struct Backlog {
    /// Pending deliveries.
    pub pending: i64,
    /// Pending deliveries due by now.
    pub due: i64,
    /// Pending deliveries held until their `depends_on` is delivered.
    pub waiting_on_dependency: i64,
}

/// Every rule's backlog at `now`, by rule id (rules with none left out).
pub async fn backlog(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<std::collections::HashMap<i64, Backlog>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT d.rule_id, count(*) AS "pending!",
                  count(*) FILTER (WHERE d.next_attempt_at <= $1) AS "due!",
                  count(*) FILTER (WHERE d.depends_on IS NOT NULL AND NOT EXISTS (
                      SELECT 1 FROM delivered_records x
                      WHERE x.connection_id = r.connection_id
                        AND x.record_key = d.depends_on)) AS "dependency!"
           FROM deliveries d JOIN rules r ON r.id = d.rule_id
           WHERE d.status = 'pending'
           GROUP BY d.rule_id"#,
        now
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| {
        let backlog = Backlog {
            pending: r.pending,
            due: r.due,
            waiting_on_dependency: r.dependency,
        };
        (r.rule_id, backlog)
    })
    .collect())
}

/// When the first pending delivery not yet due at `now` falls due.
pub async fn next_due(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT courier_ts(min(next_attempt_at)) FROM deliveries
         WHERE status = 'pending' AND next_attempt_at > $1",
        now
    )
    .fetch_one(db)
    .await
}

/// One step in a record's history: a delivery enqueued, or a ledger row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// When it happened.
    pub at: DateTime<Utc>,
    /// The rule of the delivery.
    pub rule: String,
    /// The delivery.
    pub delivery_id: i64,
    /// The ledger's outcome; `None` for the delivery being enqueued.
    pub outcome: Option<Outcome>,
    /// The run that recorded it (none for enqueues and retries).
    pub run_id: Option<i64>,
    /// The attempt count after it (ledger rows).
    pub attempt: Option<i32>,
    /// The target's HTTP status, when it answered.
    pub http_status: Option<i16>,
    /// What went wrong, who retried it, or the target's job it went in (`in job #12`, a
    /// row of `target_jobs`).
    pub detail: Option<String>,
    /// The delivery's status now.
    pub status: DeliveryStatus,
}

/// Record key `key`'s deliveries (every rule) and their ledger rows, oldest first: each
/// delivery in the order they were enqueued, followed by its ledger rows in the order they
/// were written. Empty when no delivery has the key (never enqueued, or removed by
/// retention).
pub async fn history(
    db: impl sqlx::PgExecutor<'_>,
    key: &str,
) -> Result<Vec<HistoryEntry>, sqlx::Error> {
    let rows = sqlx::query_as!(
        HistoryEntry,
        r#"SELECT at AS "at!", rule AS "rule!", delivery_id AS "delivery_id!",
                  outcome AS "outcome?: Outcome", run_id, attempt, http_status, detail,
                  status AS "status!: DeliveryStatus"
           FROM (
               SELECT courier_ts(d.created_at) AS at, r.name AS rule, d.id AS delivery_id,
                      NULL::text AS outcome, NULL::bigint AS run_id, NULL::int AS attempt,
                      NULL::smallint AS http_status, NULL::text AS detail, d.status,
                      0 AS seq, 0::bigint AS ledger_id
               FROM deliveries d JOIN rules r ON r.id = d.rule_id
               WHERE d.record_key = $1
               UNION ALL
               SELECT courier_ts(l.created_at), r.name, d.id, l.outcome, l.run_id, l.attempt,
                      l.http_status,
                      COALESCE(l.error, l.actor, 'in job #' || l.target_job), d.status, 1, l.id
               FROM deliveries d JOIN rules r ON r.id = d.rule_id
               JOIN ledger l ON l.delivery_id = d.id
               WHERE d.record_key = $1
           ) h
           ORDER BY delivery_id, seq, ledger_id"#,
        key
    )
    .fetch_all(db)
    .await?;
    Ok(rows)
}

/// How many deliveries of one rule stand in one status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatusCount {
    /// The rule's name.
    pub rule: String,
    /// The status.
    pub status: DeliveryStatus,
    /// Deliveries of the rule in it.
    pub deliveries: i64,
}

/// Every rule's deliveries by status: what
/// `SELECT rule_id, status, count(*) FROM deliveries GROUP BY 1, 2` shows, by rule name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatusCounts(pub Vec<StatusCount>);

impl StatusCounts {
    /// Deliveries in any of `statuses`, over every rule.
    pub fn total(&self, statuses: &[DeliveryStatus]) -> i64 {
        self.0
            .iter()
            .filter(|c| statuses.contains(&c.status))
            .map(|c| c.deliveries)
            .sum()
    }

    /// Deliveries of rule `rule` in any of `statuses`.
    pub fn of_rule(&self, rule: &str, statuses: &[DeliveryStatus]) -> i64 {
        self.0
            .iter()
            .filter(|c| c.rule == rule && statuses.contains(&c.status))
            .map(|c| c.deliveries)
            .sum()
    }
}

/// Every rule's deliveries by status, in one statement.
pub async fn status_counts(db: impl sqlx::PgExecutor<'_>) -> Result<StatusCounts, sqlx::Error> {
    let counts = sqlx::query_as!(
        StatusCount,
        r#"SELECT r.name AS rule, d.status AS "status!: DeliveryStatus", count(*) AS "deliveries!"
           FROM deliveries d JOIN rules r ON r.id = d.rule_id
           GROUP BY r.name, d.status"#
    )
    .fetch_all(db)
    .await?;
    Ok(StatusCounts(counts))
}

/// What every delivery and outcome so far comes to, over all rules: what a drained backlog
/// is judged by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Deliveries delivered.
    pub delivered: i64,
    /// Ledger rows of a failure (`failed`, `exhausted` or `rejected`).
    pub failures: i64,
    /// Ledger rows whose call the target answered 429.
    pub answered_429: i64,
    /// Attempts counted on deliveries beyond the ledger rows that end an attempt
    /// (`delivered`, `failed`, `exhausted`, `rejected`): attempts a call spent without an
    /// outcome, which a 429 must never cost.
    pub attempts_without_outcome: i64,
    /// Seconds from the first delivery enqueued to the last one finished.
    pub enqueued_to_finished_secs: f64,
    /// Seconds from the first ledger row to the last.
    pub first_to_last_outcome_secs: f64,
    /// Record keys delivered at least once (rows of `delivered_records`).
    pub records_delivered: i64,
}

/// The totals over every delivery and ledger row, in one statement.
pub async fn totals(db: impl sqlx::PgExecutor<'_>) -> Result<Totals, sqlx::Error> {
    sqlx::query_as!(
        Totals,
        r#"SELECT (SELECT count(*) FROM deliveries WHERE status = 'delivered') AS "delivered!",
                  (SELECT count(*) FROM ledger
                   WHERE outcome IN ('failed', 'exhausted', 'rejected')) AS "failures!",
                  (SELECT count(*) FROM ledger WHERE http_status = 429) AS "answered_429!",
                  (SELECT COALESCE(sum(attempts), 0) FROM deliveries)::bigint
                    - (SELECT count(*) FROM ledger
                       WHERE outcome IN ('delivered', 'failed', 'exhausted', 'rejected'))
                    AS "attempts_without_outcome!",
                  (SELECT COALESCE(extract(epoch FROM max(finished_at) - min(created_at)), 0)::float8
                   FROM deliveries) AS "enqueued_to_finished_secs!",
                  (SELECT COALESCE(extract(epoch FROM max(created_at) - min(created_at)), 0)::float8
                   FROM ledger) AS "first_to_last_outcome_secs!",
                  (SELECT count(*) FROM delivered_records) AS "records_delivered!""#
    )
    .fetch_one(db)
    .await
}

/// Ledger rows kept (every outcome recorded and not yet removed by retention).
pub async fn rows(db: impl sqlx::PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT count(*) AS "rows!" FROM ledger"#)
        .fetch_one(db)
        .await
}
