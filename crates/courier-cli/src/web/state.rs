//! What the dashboard shows, read once per page or `/api/state`: the status report, each
//! budget's rates and its calls over time, and the tables laid out as `courier status`
//! lays them out.

use chrono::{DateTime, Utc};
use courier::{
    engine::Engine,
    jobs::JobLine,
    status::{self, BudgetStatus, ConnectionStatus, Problem, RuleStatus, RunLine},
};
use serde::Serialize;

use crate::tables;

/// How far back the dashboard's rate chart reaches, and its bucket.
pub const CHART_WINDOW_SECS: i32 = 300;
/// One point of the chart per this many seconds.
pub const CHART_STEP_SECS: i32 = 5;
/// A time as the dashboard shows it (the script formats the same way).
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// One budget on the dashboard: its status line, its rates and its calls over time.
#[derive(Debug, Serialize)]
pub struct BudgetView {
    /// What `courier status` shows.
    #[serde(flatten)]
    pub status: BudgetStatus,
    /// The declared pace (the shortest window's rate), requests per second.
    pub declared_per_second: f64,
    /// The rate it is paced at, requests per second.
    pub effective_per_second: f64,
    /// Whether it was called within the chart's window (it gets a chart).
    pub busy: bool,
    /// `[bucket start (Unix s), calls per second]`, oldest first.
    pub series: Vec<(i64, f64)>,
}

/// A table as the page shows it: its headers and its rows' cells, laid out on the server
/// by the same functions as `courier status`.
#[derive(Debug, Serialize)]
pub struct Table {
    /// Column headers.
    pub headers: Vec<&'static str>,
    /// Each row's cells.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    fn new<T>(headers: &[&'static str], items: &[T], cells: impl Fn(&T) -> Vec<String>) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: items.iter().map(cells).collect(),
        }
    }
}

/// The page's tables, laid out.
#[derive(Debug, Serialize)]
pub struct Tables {
    /// Every budget.
    pub budgets: Table,
    /// Every rule.
    pub rules: Table,
    /// The target's jobs in flight.
    pub jobs_in_flight: Table,
    /// The target's jobs that ended lately.
    pub jobs_ended: Table,
    /// The open erasures.
    pub erasures: Table,
    /// The most recent runs.
    pub runs: Table,
}

/// Everything the dashboard shows.
#[derive(Debug, Serialize)]
pub struct DashboardState {
    /// When it was read.
    pub now: DateTime<Utc>,
    /// The chart's window and step (s).
    pub chart_window: i32,
    /// The chart's bucket (s).
    pub chart_step: i32,
    /// Connections.
    pub connections: Vec<ConnectionStatus>,
    /// Every budget, with its calls over time.
    pub budgets: Vec<BudgetView>,
    /// Rules with backlog and state.
    pub rules: Vec<RuleStatus>,
    /// The most recent runs.
    pub runs: Vec<RunLine>,
    /// Connections and rules left alone, and why.
    pub problems: Vec<Problem>,
    /// The target's jobs in flight, and those that ended lately.
    pub jobs_in_flight: Vec<JobLine>,
    /// The target's jobs that ended lately.
    pub jobs_ended: Vec<JobLine>,
    /// The open erasures.
    pub erasures: Vec<courier::erasure::store::Erasure>,
    /// The tables, laid out.
    pub tables: Tables,
    /// Whether actions are enabled (a token is set).
    pub actions: bool,
}

/// Reads the dashboard's state.
pub async fn read_state(engine: &Engine) -> Result<DashboardState, sqlx::Error> {
    let now = engine.clock.now();
    let report = status::report_with(&engine.pool, now, engine.settings.worker_dead_after).await?;
    let series = status::rate_series(&engine.pool, now, CHART_WINDOW_SECS, CHART_STEP_SECS).await?;
    let step = f64::from(CHART_STEP_SECS);
    let budgets: Vec<BudgetView> = report
        .budgets
        .into_iter()
        .map(|b| {
            let series: Vec<(i64, f64)> = series
                .iter()
                .filter(|p| p.budget_key == b.key)
                .map(|p| (p.bucket, p.calls as f64 / step))
                .collect();
            BudgetView {
                declared_per_second: b.declared_rpm / 60.0,
                effective_per_second: b.effective_rpm / 60.0,
                busy: series.iter().any(|(_, calls)| *calls > 0.0),
                series,
                status: b,
            }
        })
        .collect();
    let tables = Tables {
        budgets: Table::new(&tables::BUDGET_HEADERS, &budgets, |b| {
            tables::budget_cells(&b.status, time)
        }),
        rules: Table::new(&tables::RULE_HEADERS, &report.rules, |r| {
            tables::rule_cells(r, time)
        }),
        jobs_in_flight: Table::new(&tables::JOB_HEADERS, &report.jobs_in_flight, |j| {
            tables::job_cells(j, time)
        }),
        jobs_ended: Table::new(&tables::ENDED_JOB_HEADERS, &report.jobs_ended, |j| {
            tables::ended_job_cells(j, time)
        }),
        erasures: Table::new(&tables::ERASURE_HEADERS, &report.erasures, |e| {
            tables::erasure_cells(e, time)
        }),
        runs: Table::new(&tables::RUN_HEADERS, &report.recent_runs, |r| {
            tables::run_cells(r, time)
        }),
    };
    Ok(DashboardState {
        now,
        chart_window: CHART_WINDOW_SECS,
        chart_step: CHART_STEP_SECS,
        connections: report.connections,
        budgets,
        rules: report.rules,
        runs: report.recent_runs,
        problems: report.problems,
        jobs_in_flight: report.jobs_in_flight,
        jobs_ended: report.jobs_ended,
        erasures: report.erasures,
        tables,
        actions: engine.settings.http_token.is_some(),
    })
}
