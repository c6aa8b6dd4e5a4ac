//! Every statement on `erasures`, `erasure_targets` and `erased_identities`, and the bulk
//! statements an erasure runs over courier's other tables: each sweeps or purges every
//! delivery of the people at hand at once (one scan, never one statement per record). The
//! person's identities are matched in the database, where `courier_identity` normalizes
//! them, in clear while their erasure is open; after, only by keyed hash ([`super::gate`]).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor, PgPool};

use super::ErasureKey;

/// Hashes the identities of open erasures not yet hashed, under `key`, into
/// `erased_identities` (a later erasure of the same identity takes its hash over); returns
/// how many erasures were hashed.
pub async fn hash_open(pool: &PgPool, key: &ErasureKey) -> Result<usize, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT e.id, i.kind || ':' || i.value AS "identity!"
           FROM erasures e CROSS JOIN LATERAL courier_person_identities(e.identities) i
           WHERE e.status = 'open' AND NOT e.hashed"#
    )
    .fetch_all(pool)
    .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let hashes: Vec<String> = rows.iter().map(|r| key.hash(&r.identity)).collect();
    let mut erasures = ids.clone();
    erasures.dedup();
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO erased_identities (hash, erasure_id)
         SELECT DISTINCT ON (h) h, e FROM unnest($1::text[], $2::bigint[]) AS x(h, e)
         ORDER BY h, e DESC
         ON CONFLICT (hash) DO UPDATE SET erasure_id = EXCLUDED.erasure_id",
        &hashes,
        &ids
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE erasures SET hashed = true WHERE id = ANY($1)",
        &erasures
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(erasures.len())
}

/// Marks every delivery naming the person of an open erasure (`only`, or every one not yet
/// swept) with that erasure, suppressing and emptying those still pending: one scan of
/// `deliveries` for all of them. Returns the deliveries marked.
pub async fn sweep(
    db: &mut PgConnection,
    only: Option<&[i64]>,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if only.is_none() {
        let unswept = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM erasures WHERE status = 'open' AND NOT swept)
                   AS "unswept!""#
        )
        .fetch_one(&mut *db)
        .await?;
        if !unswept {
            return Ok(0);
        }
    }
    let marked = sqlx::query_scalar!(
        r#"WITH chosen AS MATERIALIZED (
               SELECT e.id, e.identities FROM erasures e
               WHERE e.status = 'open'
                 AND CASE WHEN $1::bigint[] IS NULL THEN NOT e.swept ELSE e.id = ANY($1) END),
           -- The people's identities and every delivery's, each side once, then one hash
           -- join (never a delivery against each person).
           wanted AS MATERIALIZED (
               SELECT c.id AS erasure_id, i.kind, i.value
               FROM chosen c CROSS JOIN LATERAL courier_person_identities(c.identities) i),
           named AS MATERIALIZED (
               SELECT d.id, x.kind, x.value
               FROM deliveries d JOIN rules r ON r.id = d.rule_id
               CROSS JOIN LATERAL courier_delivery_identities(r.identities, d.record_key, d.payload) x
               WHERE EXISTS (SELECT 1 FROM chosen)),
           found AS (
               SELECT DISTINCT ON (n.id) n.id, w.erasure_id
               FROM named n JOIN wanted w ON w.kind = n.kind AND w.value = n.value
               ORDER BY n.id, w.erasure_id DESC),
           marked AS (
               UPDATE deliveries d SET
                   erasure_id = f.erasure_id,
                   status = CASE WHEN d.status = 'pending' THEN 'suppressed' ELSE d.status END,
                   payload = CASE WHEN d.status = 'pending' THEN '{}'::jsonb ELSE d.payload END,
                   last_error = CASE WHEN d.status = 'pending'
                       THEN format('its person is erased (erasure %s)', f.erasure_id)
                       ELSE d.last_error END,
                   finished_at = CASE WHEN d.status = 'pending' THEN $2 ELSE d.finished_at END,
                   updated_at = $2
               FROM found f WHERE d.id = f.id
               RETURNING d.id),
           -- Every erasure chosen is swept, those naming nobody courier holds too; each
           -- connection's part waits for the runs active there now (they may have claimed
           -- the person's records before the gate knew of them).
           swept AS (
               UPDATE erasures SET swept = true
               WHERE id IN (SELECT id FROM chosen) AND NOT swept
               RETURNING id),
           runs_now AS (
               UPDATE erasure_targets t SET waits_for_runs = ARRAY(
                   SELECT x.id FROM runs x JOIN rules r ON r.id = x.rule_id
                   WHERE r.connection_id = t.connection_id AND x.active)
               WHERE t.erasure_id IN (SELECT id FROM swept))
           SELECT count(*) AS "n!" FROM marked"#,
        only,
        now
    )
    .fetch_one(&mut *db)
    .await?;
    Ok(marked as u64)
}

/// Whether anyone is erased, or being erased.
pub async fn anyone(db: impl PgExecutor<'_>) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM erased_identities)
                   OR EXISTS (SELECT 1 FROM erasures WHERE status = 'open') AS "anyone!""#
    )
    .fetch_one(db)
    .await
}

/// The gate's mark (`erasure_gate.swept_to`), locked for this transaction; `None` while
/// another process holds it.
pub async fn gate_mark(tx: &mut PgConnection) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!("SELECT swept_to FROM erasure_gate FOR UPDATE SKIP LOCKED")
        .fetch_optional(tx)
        .await
}

/// Moves the gate's mark to `to`, or past every delivery there is.
pub async fn gate_moved(tx: &mut PgConnection, to: Option<i64>) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE erasure_gate SET swept_to = GREATEST(swept_to,
             COALESCE($1, (SELECT COALESCE(max(id), 0) FROM deliveries)))",
        to
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Up to `most` pending deliveries after id `after`, each with the identities it names
/// (`kind:value`, as its rule says where they sit, and its record key).
pub async fn new_deliveries(
    tx: &mut PgConnection,
    after: i64,
    most: i64,
) -> Result<Vec<(i64, Vec<String>)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT d.id,
                  ARRAY(SELECT i.kind || ':' || i.value
                        FROM courier_delivery_identities(r.identities, d.record_key, d.payload) i)
                      AS "identities!"
           FROM deliveries d JOIN rules r ON r.id = d.rule_id
           WHERE d.id > $1 AND d.status = 'pending'
           ORDER BY d.id LIMIT $2"#,
        after,
        most
    )
    .fetch_all(tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.identities)).collect())
}

/// Suppresses and empties pending deliveries `ids`, each its person's erasure's (`erasures`,
/// in turn); returns how many.
pub async fn suppress(
    tx: &mut PgConnection,
    ids: &[i64],
    erasures: &[i64],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query!(
        "UPDATE deliveries d SET status = 'suppressed', payload = '{}'::jsonb,
                erasure_id = x.erasure_id,
                last_error = format('its person is erased (erasure %s)', x.erasure_id),
                finished_at = $3, updated_at = $3
         FROM unnest($1::bigint[], $2::bigint[]) AS x(id, erasure_id)
         WHERE d.id = x.id AND d.status = 'pending'",
        ids,
        erasures,
        now
    )
    .execute(tx)
    .await?;
    Ok(done.rows_affected())
}

/// A connection's part of an erasure, leased to this process.
#[derive(Debug)]
pub struct Due {
    /// The `erasure_targets` row.
    pub id: i64,
    /// The erasure.
    pub erasure_id: i64,
    /// The connection (`None`: deleted since).
    pub connection_id: Option<i64>,
    /// Attempts so far.
    pub attempts: i32,
    /// When the erasure was asked.
    pub asked_at: DateTime<Utc>,
    /// The person, as the erasure names them (in clear while it is open).
    pub person: serde_json::Value,
}

/// Leases up to `most` connections' parts due at `now` (of erasures hashed and swept) to
/// `owner` until `until`.
pub async fn lease_due(
    pool: &PgPool,
    owner: &str,
    (now, until): (DateTime<Utc>, DateTime<Utc>),
    most: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    sqlx::query_as!(
        Due,
        r#"WITH due AS (
               SELECT t.id FROM erasure_targets t JOIN erasures e ON e.id = t.erasure_id
               WHERE t.outcome = 'pending' AND t.next_attempt_at <= $2
                 AND e.status = 'open' AND e.hashed AND e.swept
                 AND (t.lease_until IS NULL OR t.lease_until < $2)
               ORDER BY t.next_attempt_at LIMIT $4
               FOR UPDATE OF t SKIP LOCKED)
           UPDATE erasure_targets t SET lease_owner = $1, lease_until = $3
           FROM due, erasures e
           WHERE t.id = due.id AND e.id = t.erasure_id
           RETURNING t.id, t.erasure_id, t.connection_id, t.attempts, e.asked_at,
                     e.identities AS "person!""#,
        owner,
        now,
        until,
        most
    )
    .fetch_all(pool)
    .await
}

/// When the next part falls due (of an erasure ready to be sent), if any.
pub async fn next_due(db: impl PgExecutor<'_>) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT min(t.next_attempt_at) FROM erasure_targets t JOIN erasures e ON e.id = t.erasure_id
         WHERE t.outcome = 'pending' AND e.status = 'open'"
    )
    .fetch_one(db)
    .await
}

/// What may still carry the person to part `part`'s connection, which its erase must
/// wait for: a run active there when the erasure was swept (it may have claimed their
/// records before the gate knew of them), or a target job holding one of their records.
pub async fn in_flight(pool: &PgPool, part: &Due) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT COALESCE(
             (SELECT format('run %s of rule %s, under way when the erasure was asked', x.id, r.name)
              FROM erasure_targets t JOIN runs x ON x.id = ANY(t.waits_for_runs)
              JOIN rules r ON r.id = x.rule_id
              WHERE t.id = $1 AND x.active
              ORDER BY x.id LIMIT 1),
             (SELECT format('target job %s of rule %s, which holds their records', j.id, r.name)
              FROM target_jobs j JOIN rules r ON r.id = j.rule_id
              WHERE r.connection_id = $2 AND j.status = 'submitted'
                AND j.delivery_ids && ARRAY(SELECT d.id FROM deliveries d WHERE d.erasure_id = $3)
              ORDER BY j.id LIMIT 1))"#,
        part.id,
        part.connection_id,
        part.erasure_id
    )
    .fetch_one(pool)
    .await
}

/// How a connection's part ended, or when it is tried again.
#[derive(Debug)]
pub enum Step {
    /// Answered for good: `outcome` (`erased`, `unknown`, `queued`, `no_identity`,
    /// `failed`), the answer's status and what is worth keeping of it.
    Answered {
        /// The outcome.
        outcome: &'static str,
        /// The answer's HTTP status, if one came.
        http_status: Option<u16>,
        /// Why (a failure's error, sealed; scrubbed of the person's values when they are
        /// purged).
        error: Option<String>,
    },
    /// Not yet: tried again at `at`.
    Again {
        /// When.
        at: DateTime<Utc>,
        /// Whether an attempt was spent (a 429 or a wait spends none).
        spent: bool,
        /// What it waits for, or what went wrong.
        why: String,
    },
}

/// Records `step` of part `id`, still leased to `owner`.
pub async fn record(
    pool: &PgPool,
    id: i64,
    owner: &str,
    step: &Step,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    match step {
        Step::Answered {
            outcome,
            http_status,
            error,
        } => {
            sqlx::query!(
                "UPDATE erasure_targets SET outcome = $3, http_status = $4, error = $5,
                        answered_at = $6, attempts = attempts + 1, waiting_for = NULL,
                        lease_owner = NULL, lease_until = NULL
                 WHERE id = $1 AND lease_owner = $2",
                id,
                owner,
                outcome,
                http_status.map(|s| s as i16),
                error.as_deref(),
                now
            )
            .execute(pool)
            .await?;
        }
        Step::Again { at, spent, why } => {
            sqlx::query!(
                "UPDATE erasure_targets SET next_attempt_at = $3,
                        attempts = attempts + CASE WHEN $4 THEN 1 ELSE 0 END,
                        waiting_for = CASE WHEN $4 THEN NULL ELSE $5 END,
                        error = CASE WHEN $4 THEN $5 ELSE error END,
                        lease_owner = NULL, lease_until = NULL
                 WHERE id = $1 AND lease_owner = $2",
                id,
                owner,
                at,
                spent,
                why
            )
            .execute(pool)
            .await?;
        }
    }
    Ok(())
}

/// Closes every open erasure whose targets have all answered (up to `most` at once): the
/// people's deliveries (their ledger rows with them) and delivered records deleted, their
/// values scrubbed from every stored text, their identities in clear forgotten; one
/// transaction, one statement per table for all of them. Returns the erasures closed.
pub async fn close(pool: &PgPool, most: i64, now: DateTime<Utc>) -> Result<Vec<i64>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let ready: Vec<i64> = sqlx::query_scalar!(
        "SELECT e.id FROM erasures e
         WHERE e.status = 'open' AND e.hashed AND e.swept
           AND NOT EXISTS (SELECT 1 FROM erasure_targets t
                           WHERE t.erasure_id = e.id AND t.outcome = 'pending')
         ORDER BY e.id LIMIT $1
         FOR UPDATE SKIP LOCKED",
        most
    )
    .fetch_all(&mut *tx)
    .await?;
    if ready.is_empty() {
        return Ok(ready);
    }
    purge(&mut tx, &ready, now).await?;
    sqlx::query!(
        "UPDATE erasures SET status = 'done', finished_at = $2, identities = NULL
         WHERE id = ANY($1)",
        &ready,
        now
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(ready)
}

/// Purges the people of erasures `ready` from courier's tables: whatever named them since
/// the first sweep is marked too, then their deliveries (ledger rows with them) and
/// delivered records are deleted and their values scrubbed from stored texts.
async fn purge(
    tx: &mut PgConnection,
    ready: &[i64],
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    // Whatever named them since the first sweep (a later enqueue not yet claimed).
    sweep(&mut *tx, Some(ready), now).await?;
    // The runs that carried their records: the texts that may quote them were written
    // there (a call's error is every record's of the call).
    let runs: Vec<i64> = sqlx::query_scalar!(
        r#"SELECT DISTINCT l.run_id AS "run_id!" FROM ledger l
           WHERE l.run_id IS NOT NULL AND l.delivery_id IN (
               SELECT d.id FROM deliveries d WHERE d.erasure_id = ANY($1))"#,
        ready
    )
    .fetch_all(&mut *tx)
    .await?;
    sqlx::query!("DELETE FROM deliveries WHERE erasure_id = ANY($1)", ready)
        .execute(&mut *tx)
        .await?;
    sqlx::query!(
        "WITH wanted AS MATERIALIZED (
             SELECT i.kind, i.value
             FROM erasures e CROSS JOIN LATERAL courier_person_identities(e.identities) i
             WHERE e.id = ANY($1)),
         named AS MATERIALIZED (
             SELECT dr.rule_id, dr.record_key, x.kind, x.value
             FROM delivered_records dr JOIN rules r ON r.id = dr.rule_id
             CROSS JOIN LATERAL courier_delivery_identities(r.identities, dr.record_key, dr.payload) x)
         DELETE FROM delivered_records dr USING (
             SELECT DISTINCT n.rule_id, n.record_key
             FROM named n JOIN wanted w ON w.kind = n.kind AND w.value = n.value) g
         WHERE dr.rule_id = g.rule_id AND dr.record_key = g.record_key",
        ready
    )
    .execute(&mut *tx)
    .await?;
    let values: Vec<String> = sqlx::query_scalar!(
        r#"SELECT DISTINCT i.value AS "value!"
           FROM erasures e CROSS JOIN LATERAL courier_person_identities(e.identities) i
           WHERE e.id = ANY($1)"#,
        ready
    )
    .fetch_all(&mut *tx)
    .await?;
    scrub(tx, &values, &runs, ready).await?;
    Ok(())
}

/// Replaces `values` in every text courier stored that may quote the people of erasures
/// `erasures`: errors of the ledger, deliveries, runs and target jobs of `runs` (those that
/// carried their records), of circuits and of the erasures' parts, and a block's raw header;
/// one statement.
async fn scrub(
    tx: &mut PgConnection,
    values: &[String],
    runs: &[i64],
    erasures: &[i64],
) -> Result<(), sqlx::Error> {
    let values: Vec<String> = values.iter().filter(|v| !v.is_empty()).cloned().collect();
    if values.is_empty() {
        return Ok(());
    }
    // `%v%`, with LIKE's own characters escaped: which rows need a look.
    let like: Vec<String> = values
        .iter()
        .map(|v| {
            let escaped = v
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            format!("%{escaped}%")
        })
        .collect();
    // The ledger's trigger lets a scrub change its error text, and nothing else.
    sqlx::query_scalar!("SELECT set_config('courier.scrubbing', 'on', true)")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query!(
        "WITH ledger_rows AS (
             UPDATE ledger SET error = courier_scrub(error, $1)
             WHERE run_id = ANY($3) AND error ILIKE ANY($2)),
         delivery_rows AS (
             UPDATE deliveries SET last_error = courier_scrub(last_error, $1)
             WHERE id IN (SELECT l.delivery_id FROM ledger l WHERE l.run_id = ANY($3))
               AND last_error ILIKE ANY($2)),
         run_rows AS (
             UPDATE runs SET error = courier_scrub(error, $1)
             WHERE id = ANY($3) AND error ILIKE ANY($2)),
         job_rows AS (
             UPDATE target_jobs SET error = courier_scrub(error, $1),
                    last_said = courier_scrub(last_said, $1)
             WHERE run_id = ANY($3) AND (error ILIKE ANY($2) OR last_said ILIKE ANY($2))),
         circuit_rows AS (
             UPDATE circuits SET last_error = courier_scrub(last_error, $1),
                    unusable_error = courier_scrub(unusable_error, $1)
             WHERE last_error ILIKE ANY($2) OR unusable_error ILIKE ANY($2)),
         part_rows AS (
             UPDATE erasure_targets SET error = courier_scrub(error, $1),
                    waiting_for = courier_scrub(waiting_for, $1)
             WHERE erasure_id = ANY($4) AND (error ILIKE ANY($2) OR waiting_for ILIKE ANY($2))),
         block_rows AS (
             UPDATE connection_blocks SET retry_after_raw = courier_scrub(retry_after_raw, $1)
             WHERE retry_after_raw ILIKE ANY($2))
         SELECT 1 AS one",
        &values,
        &like,
        runs,
        erasures
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(())
}

/// One connection's part of an erasure, as status shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Part {
    /// The connection, by name.
    pub connection: String,
    /// `pending`, `erased`, `unknown`, `queued`, `no_operation`, `no_identity`, `failed`.
    pub outcome: String,
    /// Attempts spent.
    pub attempts: i32,
    /// What it waits for, if anything.
    pub waiting_for: Option<String>,
    /// The answer's status, if one came.
    pub http_status: Option<i16>,
    /// Why it failed, or what the target said.
    pub error: Option<String>,
    /// When the target answered.
    pub answered_at: Option<DateTime<Utc>>,
    /// The erase call, as its connection states it (`POST crm/v3/...`, by e-mail), while
    /// it is to be made.
    pub call: Option<String>,
}

/// An erasure, as status shows it: never the person's identities.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Erasure {
    /// Its id.
    pub id: i64,
    /// `open` or `done`.
    pub status: String,
    /// When it was asked, and by whom.
    pub asked_at: DateTime<Utc>,
    /// Who asked.
    pub asked_by: String,
    /// When it closed.
    pub finished_at: Option<DateTime<Utc>>,
    /// Seconds since it was asked (until it closed).
    pub age_seconds: f64,
    /// Each connection's part.
    pub targets: Vec<Part>,
}

/// Erasures `ids`, or every open one (`None`), oldest first.
pub async fn erasures(
    db: impl PgExecutor<'_>,
    ids: Option<&[i64]>,
    now: DateTime<Utc>,
) -> Result<Vec<Erasure>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT e.id, e.status, e.asked_at, e.asked_by, e.finished_at,
                  t.connection AS "connection?", t.outcome AS "outcome?",
                  t.attempts AS "attempts?", t.waiting_for, t.http_status, t.error,
                  t.answered_at, c.erase AS "erase?"
           FROM erasures e
           LEFT JOIN erasure_targets t ON t.erasure_id = e.id
           LEFT JOIN connections c ON c.id = t.connection_id
           WHERE CASE WHEN $1::bigint[] IS NULL THEN e.status = 'open' ELSE e.id = ANY($1) END
           ORDER BY e.asked_at, e.id, t.connection"#,
        ids
    )
    .fetch_all(db)
    .await?;
    let mut out: Vec<Erasure> = Vec::new();
    for r in rows {
        if out.last().is_none_or(|e| e.id != r.id) {
            let end = r.finished_at.unwrap_or(now);
            out.push(Erasure {
                id: r.id,
                status: r.status.clone(),
                asked_at: r.asked_at,
                asked_by: r.asked_by.clone(),
                finished_at: r.finished_at,
                age_seconds: (end - r.asked_at).num_milliseconds().max(0) as f64 / 1000.0,
                targets: Vec::new(),
            });
        }
        let (Some(connection), Some(outcome)) = (r.connection, r.outcome) else {
            continue;
        };
        let call = match (outcome.as_str(), &r.erase) {
            ("pending", Some(erase)) => crate::writer::erase::EraseShape::parse(erase)
                .ok()
                .map(|s| s.describe()),
            _ => None,
        };
        out.last_mut().expect("pushed above").targets.push(Part {
            connection,
            outcome,
            attempts: r.attempts.unwrap_or(0),
            waiting_for: r.waiting_for,
            http_status: r.http_status,
            error: r.error,
            answered_at: r.answered_at,
            call,
        });
    }
    Ok(out)
}

/// Database-wide figures of erasures, for the metrics.
#[derive(Debug, Default)]
pub struct Figures {
    /// Connections' parts by outcome (every outcome, none left out).
    pub by_outcome: Vec<(String, i64)>,
    /// Erasures open.
    pub open: i64,
    /// Seconds since the oldest open erasure was asked (0: none open).
    pub oldest_open_seconds: f64,
}

/// Every outcome a connection's part may have.
pub const OUTCOMES: [&str; 7] = [
    "pending",
    "erased",
    "unknown",
    "queued",
    "no_operation",
    "no_identity",
    "failed",
];

/// The erasures' [`Figures`] at `now`, in one statement.
pub async fn figures(db: impl PgExecutor<'_>, now: DateTime<Utc>) -> Result<Figures, sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT (SELECT COALESCE(jsonb_object_agg(outcome, n), '{}')
                   FROM (SELECT outcome, count(*) AS n FROM erasure_targets GROUP BY outcome) o)
                      AS "by_outcome!",
                  (SELECT count(*) FROM erasures WHERE status = 'open') AS "open!",
                  (SELECT min(asked_at) FROM erasures WHERE status = 'open') AS oldest"#
    )
    .fetch_one(db)
    .await?;
    Ok(Figures {
        by_outcome: OUTCOMES
            .iter()
            .map(|o| (o.to_string(), r.by_outcome[o].as_i64().unwrap_or(0)))
            .collect(),
        open: r.open,
        oldest_open_seconds: r.oldest.map_or(0.0, |at| {
            (now - at).num_milliseconds().max(0) as f64 / 1000.0
        }),
    })
}
