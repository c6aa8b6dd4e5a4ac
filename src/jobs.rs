//! A target's asynchronous jobs (table `target_jobs`): a rule's call that submitted a job
//! ([`crate::writer::job`]) leaves its records `accepted` and the job here, in the same
//! transaction; the [poller](crate::poller) polls each job when it is due, one process at a
//! time (a lease on the row), and settles its records when it reports. Every statement on
//! the table is here (retention removes ended jobs through [`remove_ended`]).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

/// A job the target named in its answer to a submit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The job's id at the target.
    pub target_id: String,
    /// The deliveries it carries, in the order submitted.
    pub delivery_ids: Vec<i64>,
    /// When its answer came.
    pub at: DateTime<Utc>,
    /// Seconds until its first poll.
    pub first_poll_seconds: u32,
}

/// Writes `job`, submitted by run `run_id` of rule `rule_id`, in the transaction that
/// writes its records' `accepted` rows (which name it). Returns its id.
pub async fn submitted(
    tx: &mut PgConnection,
    rule_id: i64,
    run_id: i64,
    job: &Submitted,
) -> Result<i64, sqlx::Error> {
    let every_ms = i32::try_from(u64::from(job.first_poll_seconds) * 1000).unwrap_or(i32::MAX);
    let id = sqlx::query_scalar!(
        "INSERT INTO target_jobs (rule_id, run_id, target_id, delivery_ids, submitted_at,
                                  next_poll_at, poll_every_ms)
         VALUES ($1, $2, $3, $4, $5::timestamptz,
                 $5::timestamptz + make_interval(secs => $6::int / 1000.0), $6)
         RETURNING id",
        rule_id,
        run_id,
        job.target_id,
        &job.delivery_ids,
        job.at,
        every_ms
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(id)
}

/// A job to poll, leased to this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// Its id.
    pub id: i64,
    /// Its rule.
    pub rule_id: i64,
    /// The run that submitted it.
    pub run_id: i64,
    /// Its id at the target.
    pub target_id: String,
    /// Its deliveries, in the order submitted.
    pub delivery_ids: Vec<i64>,
    /// When it was submitted.
    pub submitted_at: DateTime<Utc>,
    /// The wait before this poll, in milliseconds.
    pub poll_every_ms: i32,
    /// Polls so far.
    pub polls: i32,
}

/// Leases up to `limit` jobs due at `now` to `owner` until `until`: a job another process
/// holds an unexpired lease on is left to it, unless that process is dead as the rescuer
/// judges processes (its beat older than `dead_after`, or, its session gone, than two
/// fifths of it); one whose lease lapsed is taken over.
pub async fn lease_due(
    db: impl PgExecutor<'_>,
    owner: &str,
    (now, until): (DateTime<Utc>, DateTime<Utc>),
    dead_after: chrono::Duration,
    limit: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    sqlx::query_as!(
        Due,
        "UPDATE target_jobs j SET lease_owner = $1, lease_until = $3
         WHERE j.id IN (SELECT t.id FROM target_jobs t
                        WHERE t.status = 'submitted' AND t.next_poll_at <= $2
                          AND (t.lease_until IS NULL OR t.lease_until < $2
                               OR EXISTS (SELECT 1 FROM workers w
                                          WHERE w.name = t.lease_owner
                                            AND NOT courier_worker_alive(w, $5, $6)))
                        ORDER BY t.next_poll_at LIMIT $4 FOR UPDATE SKIP LOCKED)
         RETURNING j.id, j.rule_id, j.run_id, j.target_id, j.delivery_ids, j.submitted_at,
                   j.poll_every_ms, j.polls",
        owner,
        now,
        until,
        limit,
        now - dead_after,
        now - dead_after * 2 / 5
    )
    .fetch_all(db)
    .await
}

/// When the next job falls due (its next poll, or its lease's end), if any is submitted.
pub async fn next_due(db: impl PgExecutor<'_>) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT min(GREATEST(next_poll_at, COALESCE(lease_until, next_poll_at)))
         FROM target_jobs WHERE status = 'submitted'"
    )
    .fetch_one(db)
    .await
}

/// Job `id` was polled at `now` and is still running (the target said `said`): polled
/// again after `every_ms`, its lease given back.
pub async fn polled(
    db: impl PgExecutor<'_>,
    id: i64,
    owner: &str,
    said: &str,
    every_ms: i32,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE target_jobs SET polls = polls + 1, last_poll_at = $4::timestamptz,
                last_said = left($3, 300), poll_every_ms = $5,
                next_poll_at = $4::timestamptz + make_interval(secs => $5::int / 1000.0),
                lease_owner = NULL, lease_until = NULL
         WHERE id = $1 AND lease_owner = $2 AND status = 'submitted'",
        id,
        owner,
        said,
        now,
        every_ms
    )
    .execute(db)
    .await?;
    Ok(())
}

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It reported its records' outcomes.
    Complete,
    /// It failed or was cancelled: its records are sent again.
    Failed,
    /// It did not finish within its rule's bound.
    Overdue,
}

impl Ended {
    fn as_str(self) -> &'static str {
        match self {
            Ended::Complete => "complete",
            Ended::Failed => "failed",
            Ended::Overdue => "overdue",
        }
    }
}

/// Ends job `id` (`said`: what the target said last; `error`: why, for a failed or
/// overdue job) in `tx`, the transaction that settles its records; false when this process
/// no longer holds it (another took it over, or it ended).
pub async fn end(
    tx: &mut PgConnection,
    id: i64,
    owner: &str,
    ended: Ended,
    said: &str,
    error: Option<&str>,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let n = sqlx::query!(
        "UPDATE target_jobs SET status = $3, polls = polls + 1, last_poll_at = $6,
                last_said = left($4, 300), error = left($5, 1000), finished_at = $6,
                lease_owner = NULL, lease_until = NULL
         WHERE id = $1 AND lease_owner = $2 AND status = 'submitted'",
        id,
        owner,
        ended.as_str(),
        said,
        error,
        now
    )
    .execute(tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// The jobs in flight of one rule, for status and metrics.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InFlight {
    /// The rule's name.
    pub rule: String,
    /// Jobs submitted and not ended.
    pub jobs: i64,
    /// Records they carry.
    pub records: i64,
    /// When the oldest was submitted.
    pub oldest: Option<DateTime<Utc>>,
    /// When one was last polled, and what the target said.
    pub last_poll: Option<DateTime<Utc>>,
    /// What the target said at the last poll.
    pub last_said: Option<String>,
    /// Jobs that ended overdue (never reported within the rule's bound), their records
    /// still accepted.
    pub overdue: i64,
}

/// Jobs in flight (and overdue ones) per rule, by rule name.
pub async fn in_flight(db: impl PgExecutor<'_>) -> Result<Vec<InFlight>, sqlx::Error> {
    sqlx::query_as!(
        InFlight,
        r#"SELECT r.name AS "rule!",
                  count(*) FILTER (WHERE j.status = 'submitted') AS "jobs!",
                  COALESCE(sum(cardinality(j.delivery_ids)) FILTER (WHERE j.status = 'submitted'), 0)::bigint AS "records!",
                  min(j.submitted_at) FILTER (WHERE j.status = 'submitted') AS oldest,
                  max(j.last_poll_at) AS last_poll,
                  (array_agg(j.last_said ORDER BY j.last_poll_at DESC NULLS LAST))[1] AS last_said,
                  count(*) FILTER (WHERE j.status = 'overdue') AS "overdue!"
           FROM target_jobs j JOIN rules r ON r.id = j.rule_id
           WHERE j.status IN ('submitted', 'overdue')
           GROUP BY r.name ORDER BY r.name"#
    )
    .fetch_all(db)
    .await
}

/// One target job, for status and the dashboard: in flight, or ended lately.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct JobLine {
    /// The rule.
    pub rule: String,
    /// The target's id for it.
    pub target_id: String,
    /// `submitted` (in flight), `complete`, `failed` or `overdue`.
    pub status: String,
    /// Records it carries.
    pub records: i64,
    /// When it was submitted.
    pub submitted_at: DateTime<Utc>,
    /// Its age when read (in flight), or how long it took (ended), in seconds.
    pub age_secs: f64,
    /// Polls so far.
    pub polls: i32,
    /// What the target said at the last poll.
    pub last_said: Option<String>,
    /// When it is polled next (in flight).
    pub next_poll_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Its records the job reported delivered.
    pub delivered: i64,
    /// Its records the job reported refused.
    pub rejected: i64,
    /// Its records whose fate the job did not tell.
    pub unconfirmed: i64,
    /// Its records sent again (failed or exhausted) after the job failed.
    pub failed: i64,
}

/// Every job in flight, oldest first, and the `ended` latest to end, newest first, as of
/// `now`.
pub async fn lines(
    db: &mut PgConnection,
    ended: i64,
    now: DateTime<Utc>,
) -> Result<(Vec<JobLine>, Vec<JobLine>), sqlx::Error> {
    let in_flight = sqlx::query_as!(
        JobLine,
        r#"SELECT r.name AS "rule!", j.target_id, j.status,
                  cardinality(j.delivery_ids)::bigint AS "records!", j.submitted_at,
                  greatest(extract(epoch FROM $1::timestamptz - j.submitted_at), 0)::float8
                      AS "age_secs!",
                  j.polls, j.last_said, j.next_poll_at AS "next_poll_at?", j.finished_at,
                  0::bigint AS "delivered!", 0::bigint AS "rejected!", 0::bigint AS "unconfirmed!",
                  0::bigint AS "failed!"
           FROM target_jobs j JOIN rules r ON r.id = j.rule_id
           WHERE j.status = 'submitted' ORDER BY j.submitted_at, j.id"#,
        now
    )
    .fetch_all(&mut *db)
    .await?;
    let ended = sqlx::query_as!(
        JobLine,
        r#"SELECT r.name AS "rule!", j.target_id, j.status,
                  cardinality(j.delivery_ids)::bigint AS "records!", j.submitted_at,
                  greatest(extract(epoch FROM j.finished_at - j.submitted_at), 0)::float8
                      AS "age_secs!",
                  j.polls, j.last_said, NULL::timestamptz AS "next_poll_at?", j.finished_at,
                  c.delivered AS "delivered!", c.rejected AS "rejected!",
                  c.unconfirmed AS "unconfirmed!", c.failed AS "failed!"
           FROM (SELECT * FROM target_jobs WHERE status <> 'submitted'
                 ORDER BY finished_at DESC, id DESC LIMIT $1) j
           JOIN rules r ON r.id = j.rule_id
           CROSS JOIN LATERAL (
               SELECT count(*) FILTER (WHERE l.outcome = 'delivered') AS delivered,
                      count(*) FILTER (WHERE l.outcome = 'rejected') AS rejected,
                      count(*) FILTER (WHERE l.outcome = 'unconfirmed') AS unconfirmed,
                      count(*) FILTER (WHERE l.outcome IN ('failed', 'exhausted')) AS failed
               FROM ledger l WHERE l.target_job = j.id) c
           ORDER BY j.finished_at DESC, j.id DESC"#,
        ended
    )
    .fetch_all(&mut *db)
    .await?;
    Ok((in_flight, ended))
}

/// The value at JSON `pointer` in each of `delivery_ids`' payloads, as text (absent:
/// `None`), in their order: the keys a job's errors name its records by.
pub async fn payload_keys(
    db: impl PgExecutor<'_>,
    delivery_ids: &[i64],
    pointer: &str,
) -> Result<Vec<Option<String>>, sqlx::Error> {
    let path: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    let rows = sqlx::query_scalar!(
        r#"SELECT d.payload #>> $2 AS "key"
           FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, n)
           LEFT JOIN deliveries d ON d.id = u.id
           ORDER BY u.n"#,
        delivery_ids,
        &path
    )
    .fetch_all(db)
    .await?;
    Ok(rows)
}

/// Every job submitted so far, whatever became of it, and the polls made of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Jobs submitted.
    pub jobs: i64,
    /// Polls made of them.
    pub polls: i64,
}

/// The jobs submitted so far and the polls made of them, in one statement.
pub async fn tally(db: impl PgExecutor<'_>) -> Result<Tally, sqlx::Error> {
    sqlx::query_as!(
        Tally,
        r#"SELECT count(*) AS "jobs!", COALESCE(sum(polls), 0)::bigint AS "polls!"
           FROM target_jobs"#
    )
    .fetch_one(db)
    .await
}

/// Removes up to `limit` jobs that ended (complete, failed, overdue) before `before` and
/// that no ledger row names (an overdue job's records stay `accepted`, with their rows, so
/// it stays); returns how many.
pub async fn remove_ended(
    db: impl PgExecutor<'_>,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query!(
        "DELETE FROM target_jobs WHERE id IN (
             SELECT t.id FROM target_jobs t
             WHERE t.status <> 'submitted' AND t.finished_at < $1
               AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.target_job = t.id)
             LIMIT $2)",
        before,
        limit
    )
    .execute(db)
    .await?
    .rows_affected())
}
