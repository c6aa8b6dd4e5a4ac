//! What the database holds of each budget for the reports and the pacer's neighbours: the
//! calls made against it (`budget_calls`, counted per job and pruned), its calls over time,
//! its shared state as stored (`budgets`) and the pace each process paced at. The pacer
//! ([`super::pacer`]) hands out slots; this module only counts and reads.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::{budget::BudgetState, limits::Limit};

/// Counts the calls one job made against a budget (429s included), for "used in the last
/// minute" in `courier status`.
pub async fn record_calls(
    db: impl sqlx::PgExecutor<'_>,
    key: &str,
    calls: i32,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if calls > 0 {
        sqlx::query!(
            "INSERT INTO budget_calls (budget_key, at, calls) VALUES ($1, $2, $3)",
            key,
            now,
            calls
        )
        .execute(db)
        .await?;
    }
    Ok(())
}

/// Forgets call counts older than `before` (the reaper calls this).
pub async fn prune_calls(
    db: impl sqlx::PgExecutor<'_>,
    before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query!("DELETE FROM budget_calls WHERE at < $1", before)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

/// Calls per budget over time, for the dashboard's chart: one point per `step_secs`
/// bucket (its start, in Unix seconds) with the calls counted in it, the last
/// `window_secs` before `now`; buckets without calls are left out.
#[derive(Debug, Serialize)]
pub struct RatePoint {
    /// The budget.
    pub budget_key: String,
    /// The bucket's start (Unix seconds).
    pub bucket: i64,
    /// Calls in the bucket (429s included).
    pub calls: i64,
}

/// Reads [`RatePoint`]s from `budget_calls` (kept for an hour by the pruner).
pub async fn rate_series(
    pool: &PgPool,
    now: DateTime<Utc>,
    window_secs: i32,
    step_secs: i32,
) -> Result<Vec<RatePoint>, sqlx::Error> {
    sqlx::query_as!(
        RatePoint,
        r#"SELECT budget_key,
                  (floor(extract(epoch FROM at) / $3::integer) * $3::integer)::bigint AS "bucket!",
                  sum(calls)::bigint AS "calls!"
           FROM budget_calls
           WHERE at > $1::timestamptz - make_interval(secs => $2) AND at <= $1
           GROUP BY 1, 2 ORDER BY 1, 2"#,
        now,
        f64::from(window_secs),
        step_secs
    )
    .fetch_all(pool)
    .await
}

/// Every budget's shared state, by key.
pub async fn states(
    db: impl sqlx::PgExecutor<'_>,
) -> Result<HashMap<String, BudgetState>, sqlx::Error> {
    Ok(sqlx::query!("SELECT budget_key, state FROM budgets")
        .fetch_all(db)
        .await?
        .into_iter()
        .map(|r| (r.budget_key, BudgetState::from_row(Some(r.state))))
        .collect())
}

/// A budget the pacer has paced: its shared state, and the limits and reserve its last
/// lease paced by.
#[derive(Clone, Debug)]
pub struct Paced {
    /// The budget's key.
    pub budget_key: String,
    /// Its shared state.
    pub state: BudgetState,
    /// The limits it was paced by (declared; shortest window first).
    pub limits: Vec<Limit>,
    /// Percent of each long window kept for other clients.
    pub reserve: u8,
}

/// Every budget a lease has paced by declared limits (a budget row holds them from its
/// first lease on), by key.
pub async fn paced(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<Paced>, sqlx::Error> {
    Ok(sqlx::query!(
        "SELECT budget_key, state, limits, reserve_percent FROM budgets
         WHERE limits <> '{}' ORDER BY budget_key"
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| Paced {
        budget_key: r.budget_key,
        state: BudgetState::from_row(Some(r.state)),
        limits: r.limits.iter().filter_map(|l| l.parse().ok()).collect(),
        reserve: r.reserve_percent.max(0) as u8,
    })
    .collect())
}

/// Calls made against each budget in the 60 s before `now` (429s included), by key.
pub async fn calls_last_minute(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<HashMap<String, i64>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT budget_key, sum(calls)::bigint AS "calls!" FROM budget_calls
           WHERE at > $1::timestamptz - interval '60 seconds' GROUP BY budget_key"#,
        now
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.budget_key, r.calls))
    .collect())
}
