//! `courier status`: connections with their circuit, rules with their backlog and last run,
//! the target's jobs in flight, the open erasures, the live worker processes with where each serves its
//! metrics, and the most recent runs,
//! as data (the command line renders it as tables for people,
//! or as JSON for machines; the dashboard as HTML).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::{
    breaker::{self, CircuitLine},
    catalog::{self, Connection, Rule},
    ledger::{self, Backlog},
    runs,
};

pub mod budgets;

pub use budgets::{BudgetStatus, LimitUse, Pace, budget_pace};

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
    /// Records in the target's jobs in flight, their outcomes pending.
    pub accepted: i64,
    /// The target's jobs in flight holding them.
    pub jobs_in_flight: i64,
    /// Its outcomes over the runs kept: what its runs recorded and the target's jobs they
    /// handed records to reported (`accepted`: records handed to jobs, or taken unreported).
    pub totals: runs::Counters,
}

pub use crate::{jobs::InFlight as JobsLine, runs::RunLine, workers::WorkerLine};

/// Everything `courier status` shows.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Connections.
    pub connections: Vec<ConnectionStatus>,
    /// Every budget courier paces, one line each: connections', rules' own, jobs' polls'.
    pub budgets: Vec<BudgetStatus>,
    /// Rules.
    pub rules: Vec<RuleStatus>,
    /// The live worker processes, oldest first.
    pub workers: Vec<WorkerLine>,
    /// The 15 most recent runs.
    pub recent_runs: Vec<RunLine>,
    /// The target's asynchronous jobs in flight (and overdue) per rule.
    pub jobs: Vec<JobsLine>,
    /// Each of the target's jobs in flight, oldest first.
    pub jobs_in_flight: Vec<crate::jobs::JobLine>,
    /// The target's jobs that ended lately, newest first, with what each reported.
    pub jobs_ended: Vec<crate::jobs::JobLine>,
    /// Connections and rules left alone because they cannot be used, and why.
    pub problems: Vec<Problem>,
    /// The open erasures, oldest first, with each connection's part (never a person's
    /// identities).
    pub erasures: Vec<crate::erasure::store::Erasure>,
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
    // One snapshot: every figure of the report as of one moment.
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let db: &mut PgConnection = &mut tx;
    let listed = catalog::list_connections(&mut *db).await?;
    let rules = catalog::list_rules(&mut *db).await?;
    let budgets = budgets::lines(db, &listed, &rules, now).await?;
    let (jobs_in_flight, jobs_ended) = crate::jobs::lines(db, RECENT_JOBS, now).await?;
    let jobs = crate::jobs::in_flight(&mut *db).await?;
    let read = Catalog {
        by_id: (listed.iter().enumerate())
            .map(|(i, c)| (c.id, i))
            .collect(),
        connections: listed,
        rules: rules.into_iter().map(|r| (r.id, r)).collect(),
    };
    let report = Report {
        connections: connections(db, &read, &budgets).await?,
        rules: self::rules(db, &read, &budgets, &jobs, now).await?,
        budgets,
        jobs_in_flight,
        jobs_ended,
        workers: crate::workers::live(&mut *db, now, window).await?,
        recent_runs: runs::recent(&mut *db, RECENT_RUNS).await?,
        jobs,
        problems: problems(db, &read, now).await?,
        erasures: crate::erasure::store::erasures(&mut *db, None, now).await?,
    };
    tx.commit().await?;
    Ok(report)
}

/// Each connection with its circuit, and its budget as its line in `budgets` reads.
async fn connections(
    db: &mut PgConnection,
    read: &Catalog,
    budgets: &[BudgetStatus],
) -> Result<Vec<ConnectionStatus>, sqlx::Error> {
    let circuits: HashMap<i64, CircuitLine> = breaker::lines(&mut *db)
        .await?
        .into_iter()
        .map(|c| (c.connection_id, c))
        .collect();
    Ok(read
        .connections
        .iter()
        .map(|c| {
            let circuit = circuits.get(&c.id);
            let budget = budgets.iter().find(|b| b.key == c.budget_key);
            ConnectionStatus {
                name: c.name.clone(),
                writer: c.writer.clone(),
                budget_key: c.budget_key.clone(),
                requests_per_minute: c.rpm() as i32,
                limits: budget.map(|b| b.limits.clone()).unwrap_or_default(),
                used_last_minute: budget.map_or(0, |b| b.used_last_minute),
                learned_rpm: budget.and_then(|b| b.learned_rpm),
                advertised_rpm: budget.and_then(|b| b.advertised_rpm),
                effective_rpm: budget.map_or(0.0, |b| b.effective_rpm),
                last_429_at: budget.and_then(|b| b.last_429_at),
                circuit: circuit.map_or_else(|| "closed".to_owned(), |c| c.state.clone()),
                open_until: circuit.and_then(|c| c.open_until),
                consecutive_failures: circuit.map_or(0, |c| c.consecutive_failures),
                blocked_until: budget.and_then(|b| b.blocked_until),
                blocked_by: budget.and_then(|b| b.blocked_by.clone()),
                retry_after_raw: budget.and_then(|b| b.block_reason.clone()),
                paused: c.paused,
            }
        })
        .collect())
}

/// What the report reads once: the catalog.
struct Catalog {
    /// The connections, by name.
    connections: Vec<Connection>,
    /// Where each connection stands in `connections`, by id.
    by_id: HashMap<i64, usize>,
    /// The rules, by id.
    rules: HashMap<i64, Rule>,
}

impl Catalog {
    /// Connection `id`.
    fn connection(&self, id: i64) -> Option<&Connection> {
        self.by_id.get(&id).map(|&i| &self.connections[i])
    }
}

/// A rule's state for [`rules`], as the view `rule_states` reads it.
struct RuleState {
    rule_id: i64,
    name: String,
    connection: String,
    enabled: bool,
    budget_key: String,
    paused: Option<String>,
    state: String,
    resume_at: Option<DateTime<Utc>>,
    blocked_until: Option<DateTime<Utc>>,
    blocked_by_rule: Option<String>,
    last_run: Option<i64>,
    last_run_status: Option<String>,
}

/// A rule's line in the making: its state, what the catalog says of it, its backlog.
struct RuleRow {
    state: RuleState,
    weight: i32,
    records_per_call: i32,
    backlog: Backlog,
    accepted: i64,
    jobs_in_flight: i64,
    totals: runs::Counters,
}

/// Each rule with its backlog, state, last run and estimated drain time.
async fn rules(
    db: &mut PgConnection,
    read: &Catalog,
    budgets: &[BudgetStatus],
    jobs: &[JobsLine],
    now: DateTime<Utc>,
) -> Result<Vec<RuleStatus>, sqlx::Error> {
    let backlog = ledger::backlog(&mut *db, now).await?;
    let totals = runs::totals(&mut *db).await?;
    let rows: Vec<RuleRow> = rule_states(&mut *db)
        .await?
        .into_iter()
        .filter_map(|state| {
            let rule = read.rules.get(&state.rule_id)?;
            let in_jobs = jobs.iter().find(|j| j.rule == rule.name);
            Some(RuleRow {
                weight: rule.weight,
                records_per_call: rule.records_per_call,
                backlog: backlog.get(&rule.id).copied().unwrap_or_default(),
                accepted: in_jobs.map_or(0, |j| j.records),
                jobs_in_flight: in_jobs.map_or(0, |j| j.jobs),
                totals: totals.get(&rule.id).copied().unwrap_or_default(),
                state,
            })
        })
        .collect();
    // Each rule's budget's pace (requests per second), and the weight of the rules with a
    // backlog on each budget: a rule's share of the pace.
    let pace_of = |key: &str| {
        let line = budgets.iter().find(|b| b.key == key);
        line.map_or(0.0, |b| b.effective_rpm / 60.0)
    };
    let paces: Vec<f64> = rows.iter().map(|r| pace_of(&r.state.budget_key)).collect();
    let mut busy_weight: HashMap<&str, i64> = HashMap::new();
    for r in rows.iter().filter(|r| r.backlog.pending > 0) {
        *busy_weight.entry(&r.state.budget_key).or_default() += i64::from(r.weight);
    }
    Ok(rows
        .iter()
        .zip(paces)
        .map(|(r, pace)| {
            let busy = busy_weight.get(r.state.budget_key.as_str()).copied();
            r.status(pace, busy.unwrap_or(0), now)
        })
        .collect())
}

/// Each rule's state, in the order of their names.
async fn rule_states(db: &mut PgConnection) -> Result<Vec<RuleState>, sqlx::Error> {
    sqlx::query_as!(
        RuleState,
        r#"SELECT s.rule_id AS "rule_id!", s.rule AS "name!", s.connection AS "connection!", s.enabled AS "enabled!",
                  s.budget_key AS "budget_key!",
                  CASE WHEN s.rule_paused AND s.connection_paused THEN 'rule, connection'
                       WHEN s.rule_paused THEN 'rule'
                       WHEN s.connection_paused THEN 'connection' END AS paused,
                  s.state AS "state!", courier_ts(s.resume_at) AS resume_at,
                  courier_ts(s.blocked_until) AS blocked_until, s.blocked_by_rule,
                  s.last_run_id AS "last_run?", s.last_run_status AS "last_run_status?"
           FROM rule_states s
           ORDER BY s.rule"#
    )
    .fetch_all(&mut *db)
    .await
}

impl RuleRow {
    /// Its line, given its budget's pace (requests per second) and the weight of the rules
    /// with a backlog on that budget.
    fn status(&self, pace: f64, busy_weight: i64, now: DateTime<Utc>) -> RuleStatus {
        let s = &self.state;
        let pending = self.backlog.pending;
        // Its backlog over its share of the budget's pace (calls of records_per_call),
        // after the block or wait it is in.
        let share = f64::from(self.weight) / busy_weight.max(1) as f64;
        let waits = s
            .blocked_until
            .or(s.resume_at)
            .map_or(0.0, |t| (t - now).as_seconds_f64().max(0.0));
        let per_second = pace * share * f64::from(self.records_per_call.max(1));
        let drain_secs = (pending > 0).then(|| waits + pending as f64 / per_second);
        RuleStatus {
            name: s.name.clone(),
            connection: s.connection.clone(),
            enabled: s.enabled,
            records_per_call: self.records_per_call,
            budget_key: s.budget_key.clone(),
            paused: s.paused.clone(),
            pending,
            due: self.backlog.due,
            waiting_on_dependency: self.backlog.waiting_on_dependency,
            drain_secs,
            state: s.state.clone(),
            resume_at: s.resume_at,
            blocked_until: s.blocked_until,
            blocked_by_rule: s.blocked_by_rule.clone(),
            last_run: s.last_run,
            last_run_status: s.last_run_status.clone(),
            accepted: self.accepted,
            jobs_in_flight: self.jobs_in_flight,
            totals: self.totals,
        }
    }
}

/// Connections and rules left alone as unusable, until when, and why.
async fn problems(
    db: &mut PgConnection,
    read: &Catalog,
    now: DateTime<Utc>,
) -> Result<Vec<Problem>, sqlx::Error> {
    let connections =
        breaker::unusable(&mut *db, now)
            .await?
            .into_iter()
            .map(|(id, reason, until)| {
                let name = read
                    .connection(id)
                    .map_or_else(|| id.to_string(), |c| c.name.clone());
                Problem {
                    what: format!("connection {name}"),
                    reason,
                    until,
                }
            });
    let rules = catalog::unusable_rules(&mut *db, now)
        .await?
        .into_iter()
        .map(|(name, reason, until)| Problem {
            what: format!("rule {name}"),
            reason,
            until,
        });
    let mut problems: Vec<Problem> = connections.chain(rules).collect();
    problems.sort_by(|a, b| a.what.cmp(&b.what));
    Ok(problems)
}

/// How many of the most recent runs the report shows.
const RECENT_RUNS: i64 = 15;
/// How many of the target's jobs that ended lately the report shows.
const RECENT_JOBS: i64 = 10;

pub use crate::ratelimit::report::{RatePoint, rate_series};
