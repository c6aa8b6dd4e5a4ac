//! `courier status`: connections with their circuit, rules with their backlog and last run,
//! the live worker processes with where each serves its metrics, and the most recent runs,
//! as data (the command line renders it as tables for people,
//! or as JSON for machines; the dashboard as HTML).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::{
    catalog::Connection,
    ratelimit::{
        budget::BudgetState,
        controller::PARAMS,
        limits::{Limit, usable_quota},
    },
};

/// One connection's line.
#[derive(Debug, Serialize)]
pub struct ConnectionStatus {
    /// Name.
    pub name: String,
    /// Writer kind.
    pub writer: String,
    /// The budget it spends from (its own, or a key shared with other connections).
    pub budget_key: String,
    /// Declared requests per minute.
    pub requests_per_minute: i32,
    /// Each declared limit: its use in its window, and when a spent one frees.
    pub limits: Vec<LimitUse>,
    /// Calls made against its budget in the last 60 s (429s included).
    pub used_last_minute: i64,
    /// The rate its budget learned from 429s, while below the declared rate.
    pub learned_rpm: Option<f64>,
    /// The rate the target's rate-limit headers state, while the statement holds.
    pub advertised_rpm: Option<f64>,
    /// The rate its budget paces at: the least of declared, learned and advertised.
    pub effective_rpm: f64,
    /// The last 429 met on its budget.
    pub last_429_at: Option<DateTime<Utc>>,
    /// `closed`, `open` or `half_open`.
    pub circuit: String,
    /// When an open circuit allows a probe.
    pub open_until: Option<DateTime<Utc>>,
    /// Unreachable failures in a row.
    pub consecutive_failures: i32,
    /// End of the rate-limit block, while one holds.
    pub blocked_until: Option<DateTime<Utc>>,
    /// The rule whose call met the 429.
    pub blocked_by: Option<String>,
    /// The raw `retry-after` value of that 429.
    pub retry_after_raw: Option<String>,
    /// Paused by an operator: none of its rules gets a run.
    pub paused: bool,
}

/// A declared limit's use.
#[derive(Debug, Serialize)]
pub struct LimitUse {
    /// The limit (`N/window`).
    pub limit: String,
    /// What the budget may spend of it (its quota less the reserve).
    pub quota: u32,
    /// Calls counted in the window ending now; `None` for the shortest window, which is
    /// paced (its slots never exceed it) rather than counted.
    pub used: Option<u32>,
    /// Whether it is spent.
    pub spent: bool,
    /// When a spent window frees (its oldest calls leave it).
    pub frees_at: Option<DateTime<Utc>>,
}

/// One rule's line.
#[derive(Debug, Serialize)]
pub struct RuleStatus {
    /// Name.
    pub name: String,
    /// Its connection.
    pub connection: String,
    /// Whether runs are started for it.
    pub enabled: bool,
    /// The most deliveries one of its calls carries.
    pub records_per_call: i32,
    /// Paused by an operator (`rule`, `connection`, or both), or `None`.
    pub paused: Option<String>,
    /// Pending deliveries.
    pub pending: i64,
    /// Pending deliveries due now.
    pub due: i64,
    /// Pending deliveries held until their `depends_on` is delivered.
    pub waiting_on_dependency: i64,
    /// The budget it spends from (its own key, or its connection's).
    pub budget_key: String,
    /// Seconds its backlog takes at its share of its budget's pace (after a block or wait
    /// it is in), if it has one; a spent long window comes on top.
    pub drain_secs: Option<f64>,
    /// `running`, `waiting`, `disabled`, `paused` (it or its connection), `throttled` (its
    /// connection is blocked), `stale`, or `idle`.
    pub state: String,
    /// While waiting: when its run resumes.
    pub resume_at: Option<DateTime<Utc>>,
    /// While its connection is blocked: when the block lapses.
    pub blocked_until: Option<DateTime<Utc>>,
    /// The rule whose call met the 429 that set the block.
    pub blocked_by_rule: Option<String>,
    /// The latest run's id and status.
    pub last_run: Option<i64>,
    /// The latest run's status.
    pub last_run_status: Option<String>,
}

/// One run's line.
#[derive(Debug, Serialize)]
pub struct RunLine {
    /// Run id.
    pub id: i64,
    /// Its rule.
    pub rule: String,
    /// Status.
    pub status: String,
    /// Counters.
    pub delivered: i32,
    /// Transient failures retried.
    pub failed: i32,
    /// Exhausted deliveries.
    pub exhausted: i32,
    /// Rejected deliveries.
    pub rejected: i32,
    /// Suppressed deliveries.
    pub suppressed: i32,
    /// Held deliveries.
    pub held: i32,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// Last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// End.
    pub finished_at: Option<DateTime<Utc>>,
}

/// One live worker process.
#[derive(Debug, Serialize)]
pub struct WorkerLine {
    /// Its unique name (`courier-<host>-<pid>-<random>`).
    pub name: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last beat.
    pub heartbeat_at: DateTime<Utc>,
    /// Where it serves `/metrics` and the dashboard (`None`: nowhere).
    pub http_addr: Option<String>,
    /// How far its host's wall clock is ahead of the database's, in milliseconds
    /// (negative: behind), at its last beat. It keeps time by the database's clock.
    pub clock_offset_ms: Option<f64>,
}

/// Everything `courier status` shows.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Connections.
    pub connections: Vec<ConnectionStatus>,
    /// Rules.
    pub rules: Vec<RuleStatus>,
    /// The live worker processes, oldest first.
    pub workers: Vec<WorkerLine>,
    /// The 15 most recent runs.
    pub recent_runs: Vec<RunLine>,
    /// Connections and rules left alone because they cannot be used, and why.
    pub problems: Vec<Problem>,
}

/// A connection or rule that cannot be used: its last run failed for this reason, and the
/// dispatcher leaves it alone until it changes or the time given.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// `connection NAME` or `rule NAME`.
    pub what: String,
    /// Why its run failed.
    pub reason: String,
    /// When it is tried again unless changed first.
    pub until: DateTime<Utc>,
}

/// Reads the report, judging workers alive by the default liveness window.
pub async fn report(pool: &PgPool, now: DateTime<Utc>) -> Result<Report, sqlx::Error> {
    let window = std::time::Duration::from_secs(crate::config::DEFAULT_WORKER_DEAD_AFTER_SECS);
    report_with(pool, now, window).await
}

/// Reads the report; a worker is listed while alive by `worker_dead_after`
/// (`COURIER_WORKER_DEAD_AFTER_SECONDS`), as the rescuer judges it.
pub async fn report_with(
    pool: &PgPool,
    now: DateTime<Utc>,
    worker_dead_after: std::time::Duration,
) -> Result<Report, sqlx::Error> {
    let window = chrono::Duration::from_std(worker_dead_after).unwrap_or(chrono::Duration::MAX);
    Ok(Report {
        connections: connections(pool, now).await?,
        rules: rules(pool, now).await?,
        workers: workers(pool, now, window).await?,
        recent_runs: recent_runs(pool).await?,
        problems: problems(pool, now).await?,
    })
}

/// The live workers: alive by `window` (`COURIER_WORKER_DEAD_AFTER_SECONDS`), or, their
/// session gone, by two beats of it, as the rescuer judges them.
async fn workers(
    pool: &PgPool,
    now: DateTime<Utc>,
    window: chrono::Duration,
) -> Result<Vec<WorkerLine>, sqlx::Error> {
    let grace = window * 2 / 5;
    sqlx::query_as!(
        WorkerLine,
        r#"SELECT w.name, w.started_at, w.heartbeat_at, w.http_addr, w.clock_offset_ms FROM workers w
           WHERE courier_worker_alive(w, $1, $2) ORDER BY w.started_at, w.name"#,
        now - window,
        now - grace
    )
    .fetch_all(pool)
    .await
}

/// Each connection with its budget, circuit and block.
async fn connections(
    pool: &PgPool,
    now: DateTime<Utc>,
) -> Result<Vec<ConnectionStatus>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT c.name, c.writer, courier_budget_key(c) AS "budget_key!",
                  c.requests_per_minute, c.limits, c.reserve_percent,
                  COALESCE((SELECT sum(u.calls) FROM budget_calls u
                            WHERE u.budget_key = courier_budget_key(c)
                              AND u.at > $1 - interval '60 seconds'), 0)::bigint AS "used_last_minute!",
                  bu.state AS "budget_state?",
                  ci.state AS circuit, courier_ts(ci.open_until) AS open_until, ci.consecutive_failures,
                  courier_ts(b.blocked_until) AS "blocked_until?", br.name AS "blocked_by?",
                  b.retry_after_raw AS "retry_after_raw?", c.paused
           FROM connections c JOIN circuits ci ON ci.connection_id = c.id
           LEFT JOIN connection_blocks b
                  ON b.budget_key = courier_budget_key(c) AND b.blocked_until > $1
           LEFT JOIN rules br ON br.id = b.rule_id
           LEFT JOIN budgets bu ON bu.budget_key = courier_budget_key(c)
           ORDER BY c.name"#,
        now
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let conn = Connection {
                requests_per_minute: r.requests_per_minute,
                limits: r.limits,
                reserve_percent: r.reserve_percent,
                ..Connection::default()
            };
            let state = BudgetState::from_row(r.budget_state);
            let pace = budget_pace(&state, &conn.declared_limits(), conn.reserve(), now);
            ConnectionStatus {
                name: r.name,
                writer: r.writer,
                budget_key: r.budget_key,
                requests_per_minute: conn.rpm() as i32,
                limits: pace.limits,
                used_last_minute: r.used_last_minute,
                learned_rpm: pace.learned_rpm,
                advertised_rpm: pace.advertised_rpm,
                effective_rpm: pace.effective_rpm,
                last_429_at: state.learned.last_429,
                circuit: r.circuit,
                open_until: r.open_until,
                consecutive_failures: r.consecutive_failures,
                blocked_until: r.blocked_until,
                blocked_by: r.blocked_by,
                retry_after_raw: r.retry_after_raw,
                paused: r.paused,
            }
        })
        .collect())
}

/// Where a budget's pace stands (see [`budget_pace`]).
pub struct Pace {
    /// Each declared limit's use.
    pub limits: Vec<LimitUse>,
    /// The learned rate (requests per minute), while below the declared pace.
    pub learned_rpm: Option<f64>,
    /// The advertised rate, while its statement holds.
    pub advertised_rpm: Option<f64>,
    /// The rate paced at.
    pub effective_rpm: f64,
}

/// A budget's pace at `now` from its shared state: what each limit has used in its window
/// and when that frees, the learned and the effective rate. Status and metrics read it
/// from here alone.
pub fn budget_pace(
    state: &BudgetState,
    declared: &[Limit],
    reserve: u8,
    now: DateTime<Utc>,
) -> Pace {
    let limits = state.limits(declared);
    let pace = limits.first().map_or(f64::MAX, Limit::per_second);
    let effective = state.rate(declared, &PARAMS, now);
    let uses = limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let quota = usable_quota(l, reserve);
            // The shortest window is paced, not counted (its slots never exceed it).
            let (used, frees_at) = match state.spent.iter().find(|s| s.limit == *l) {
                Some(s) => s.used(now),
                None => (0, None),
            };
            let spent = i > 0 && used >= quota;
            LimitUse {
                limit: l.to_string(),
                quota,
                used: (i > 0).then_some(used.min(quota)),
                spent,
                frees_at: frees_at.filter(|_| spent),
            }
        })
        .collect();
    Pace {
        limits: uses,
        // As the pace applies it (never under its floor).
        learned_rpm: state
            .learned
            .rate(&PARAMS, pace, now)
            .map(|_| state.learned.pace(&PARAMS, pace, now) * 60.0),
        advertised_rpm: state
            .advertised()
            .iter()
            .map(|l| l.per_second() * 60.0)
            .reduce(f64::min),
        effective_rpm: effective * 60.0,
    }
}

/// A rule's row for [`rules`]: its backlog, state, last run and budget.
struct RuleRow {
    name: String,
    connection: String,
    enabled: bool,
    budget_key: String,
    weight: i32,
    records_per_call: i32,
    requests_per_minute: Option<i32>,
    limits: Vec<String>,
    reserve_percent: i16,
    budget_state: Option<serde_json::Value>,
    paused: Option<String>,
    pending: i64,
    due: i64,
    waiting_on_dependency: i64,
    state: String,
    resume_at: Option<DateTime<Utc>>,
    blocked_until: Option<DateTime<Utc>>,
    blocked_by_rule: Option<String>,
    last_run: Option<i64>,
    last_run_status: Option<String>,
}

/// Each rule with its backlog, state, last run and estimated drain time.
async fn rules(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<RuleStatus>, sqlx::Error> {
    let rows = rule_rows(pool, now).await?;
    // Each rule's budget's pace (requests per second), and the weight of the rules with a
    // backlog on each budget: a rule's share of the pace.
    let paces: Vec<f64> = rows.iter().map(|r| r.budget_rate(now)).collect();
    let busy_weight = |key: &str| -> i64 {
        rows.iter()
            .filter(|r| r.budget_key == key && r.pending > 0)
            .map(|r| i64::from(r.weight))
            .sum()
    };
    Ok(rows
        .iter()
        .zip(paces)
        .map(|(r, pace)| r.status(pace, busy_weight(&r.budget_key), now))
        .collect())
}

/// Each rule's row, in the order of their names.
async fn rule_rows(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<RuleRow>, sqlx::Error> {
    sqlx::query_as!(
        RuleRow,
        r#"SELECT s.rule AS "name!", s.connection AS "connection!", s.enabled AS "enabled!",
                  s.budget_key AS "budget_key!", ru.weight, ru.records_per_call,
                  c.requests_per_minute, c.limits,
                  c.reserve_percent, bu.state AS "budget_state?",
                  CASE WHEN s.rule_paused AND s.connection_paused THEN 'rule, connection'
                       WHEN s.rule_paused THEN 'rule'
                       WHEN s.connection_paused THEN 'connection' END AS paused,
                  COALESCE(p.pending, 0) AS "pending!", COALESCE(p.due, 0) AS "due!",
                  COALESCE(p.dependency, 0) AS "waiting_on_dependency!",
                  s.state AS "state!", courier_ts(s.resume_at) AS resume_at,
                  courier_ts(s.blocked_until) AS blocked_until, s.blocked_by_rule,
                  s.last_run_id AS "last_run?", s.last_run_status AS "last_run_status?"
           FROM rule_states s
           JOIN rules ru ON ru.id = s.rule_id
           JOIN connections c ON c.id = ru.connection_id
           LEFT JOIN budgets bu ON bu.budget_key = s.budget_key
           LEFT JOIN LATERAL (
               SELECT count(*) AS pending, count(*) FILTER (WHERE d.next_attempt_at <= $1) AS due,
                      count(*) FILTER (WHERE d.depends_on IS NOT NULL AND NOT EXISTS (
                          SELECT 1 FROM delivered_records x JOIN rules xr ON xr.id = x.rule_id
                          WHERE xr.connection_id = ru.connection_id
                            AND x.record_key = d.depends_on)) AS dependency
               FROM deliveries d WHERE d.rule_id = s.rule_id AND d.status = 'pending') p ON true
           ORDER BY s.rule"#,
        now
    )
    .fetch_all(pool)
    .await
}

impl RuleRow {
    /// Its budget's pace at `now` (requests per second), from the limits its connection
    /// declares and the budget's shared state.
    fn budget_rate(&self, now: DateTime<Utc>) -> f64 {
        let conn = Connection {
            requests_per_minute: self.requests_per_minute,
            limits: self.limits.clone(),
            reserve_percent: self.reserve_percent,
            ..Connection::default()
        };
        let state = BudgetState::from_row(self.budget_state.clone());
        budget_pace(&state, &conn.declared_limits(), conn.reserve(), now).effective_rpm / 60.0
    }

    /// Its line, given its budget's pace (requests per second) and the weight of the rules
    /// with a backlog on that budget.
    fn status(&self, pace: f64, busy_weight: i64, now: DateTime<Utc>) -> RuleStatus {
        // Its backlog over its share of the budget's pace (calls of records_per_call),
        // after the block or wait it is in.
        let share = f64::from(self.weight) / busy_weight.max(1) as f64;
        let waits = self
            .blocked_until
            .or(self.resume_at)
            .map_or(0.0, |t| (t - now).as_seconds_f64().max(0.0));
        let per_second = pace * share * f64::from(self.records_per_call.max(1));
        let drain_secs = (self.pending > 0).then(|| waits + self.pending as f64 / per_second);
        RuleStatus {
            name: self.name.clone(),
            connection: self.connection.clone(),
            enabled: self.enabled,
            records_per_call: self.records_per_call,
            budget_key: self.budget_key.clone(),
            paused: self.paused.clone(),
            pending: self.pending,
            due: self.due,
            waiting_on_dependency: self.waiting_on_dependency,
            drain_secs,
            state: self.state.clone(),
            resume_at: self.resume_at,
            blocked_until: self.blocked_until,
            blocked_by_rule: self.blocked_by_rule.clone(),
            last_run: self.last_run,
            last_run_status: self.last_run_status.clone(),
        }
    }
}

/// The 15 most recent runs.
async fn recent_runs(pool: &PgPool) -> Result<Vec<RunLine>, sqlx::Error> {
    sqlx::query_as!(
        RunLine,
        r#"SELECT x.id, r.name AS rule, x.status, x.delivered, x.failed, x.exhausted, x.rejected,
                x.suppressed, x.held, courier_ts(x.started_at) AS "started_at!",
                courier_ts(x.heartbeat_at) AS "heartbeat_at!", courier_ts(x.finished_at) AS finished_at
         FROM runs x JOIN rules r ON r.id = x.rule_id ORDER BY x.id DESC LIMIT 15"#
    )
    .fetch_all(pool)
    .await
}

/// Connections and rules left alone as unusable, until when, and why.
async fn problems(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<Problem>, sqlx::Error> {
    sqlx::query_as!(
        Problem,
        r#"SELECT 'connection ' || c.name AS "what!", ci.unusable_error AS "reason!",
                  ci.unusable_until AS "until!"
           FROM circuits ci JOIN connections c ON c.id = ci.connection_id
           WHERE ci.unusable_until > $1
           UNION ALL
           SELECT 'rule ' || r.name, r.unusable_error, r.unusable_until
           FROM rules r WHERE r.unusable_until > $1
           ORDER BY 1"#,
        now
    )
    .fetch_all(pool)
    .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learned_rate_shown_is_the_one_paced_never_under_its_floor() {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let declared = [Limit::new(10, 1)];
        let mut state = BudgetState::default();
        // Twenty deep cuts in a row: far below 5% of the declared 10/s.
        for i in 0..20 {
            let t = at + chrono::Duration::seconds(i);
            let paced = state.learned.rate(&PARAMS, 10.0, t).unwrap_or(10.0);
            state.refused(&PARAMS, paced, 0, t, t, t + chrono::Duration::seconds(1));
        }
        let now = at + chrono::Duration::seconds(21);
        let pace = budget_pace(&state, &declared, 0, now);
        assert_eq!(pace.learned_rpm, Some(pace.effective_rpm));
        assert!((pace.effective_rpm - 10.0 * PARAMS.floor * 60.0).abs() < 1e-9);
    }
}
