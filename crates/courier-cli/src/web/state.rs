//! What the dashboard shows, read once per page or `/api/state`: the status report, each
//! connection's rates and its calls over time.

use chrono::{DateTime, Utc};
use courier::{
    engine::Engine,
    status::{self, ConnectionStatus, Problem, RuleStatus, RunLine},
};
use serde::Serialize;

/// How far back the dashboard's rate chart reaches, and its bucket.
pub const CHART_WINDOW_SECS: i32 = 300;
/// One point of the chart per this many seconds.
pub const CHART_STEP_SECS: i32 = 5;
/// A time as the dashboard shows it (the script formats the same way).
pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// One connection on the dashboard: its status line, its rates and its calls over time.
#[derive(Debug, Serialize)]
pub struct ConnectionView {
    /// What `courier status` shows.
    #[serde(flatten)]
    pub status: ConnectionStatus,
    /// The declared pace (the shortest window's rate), requests per second.
    pub declared_per_second: f64,
    /// Its declared limits with their use, as the table shows them.
    pub limits_text: String,
    /// The rate this process paces the budget at, requests per second.
    pub effective_per_second: f64,
    /// `[bucket start (Unix s), calls per second]`, oldest first.
    pub series: Vec<(i64, f64)>,
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
    pub connections: Vec<ConnectionView>,
    /// Rules with backlog and state.
    pub rules: Vec<RuleStatus>,
    /// The most recent runs.
    pub runs: Vec<RunLine>,
    /// Connections and rules left alone, and why.
    pub problems: Vec<Problem>,
    /// The target's jobs in flight per rule.
    pub jobs: Vec<courier::status::JobsLine>,
    /// Whether actions are enabled (a token is set).
    pub actions: bool,
}

/// Reads the dashboard's state.
pub async fn read_state(engine: &Engine) -> Result<DashboardState, sqlx::Error> {
    let now = engine.clock.now();
    let report = status::report_with(&engine.pool, now, engine.settings.worker_dead_after).await?;
    let series = status::rate_series(&engine.pool, now, CHART_WINDOW_SECS, CHART_STEP_SECS).await?;
    let step = f64::from(CHART_STEP_SECS);
    let connections = report
        .connections
        .into_iter()
        .map(|c| {
            let declared = c
                .limits
                .first()
                .and_then(|l| l.limit.parse::<courier::ratelimit::limits::Limit>().ok())
                .map_or(f64::from(c.requests_per_minute) / 60.0, |l| l.per_second());
            let limits_text = crate::tables::limits_cell(&c, time);
            let effective = c.effective_rpm / 60.0;
            let series = series
                .iter()
                .filter(|p| p.budget_key == c.budget_key)
                .map(|p| (p.bucket, p.calls as f64 / step))
                .collect();
            ConnectionView {
                status: c,
                declared_per_second: declared,
                limits_text,
                effective_per_second: effective,
                series,
            }
        })
        .collect();
    Ok(DashboardState {
        now,
        chart_window: CHART_WINDOW_SECS,
        chart_step: CHART_STEP_SECS,
        connections,
        rules: report.rules,
        runs: report.recent_runs,
        problems: report.problems,
        jobs: report.jobs,
        actions: engine.settings.http_token.is_some(),
    })
}
