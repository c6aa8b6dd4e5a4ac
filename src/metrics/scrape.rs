//! The scrape: this process's [`Metrics`] and the figures that belong to the database,
//! shared by every process (backlog, runs by status, budgets, blocks, circuits), read with a
//! few bulk statements under a short statement timeout.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use chrono::{DateTime, Utc};
use prometheus_client::{
    encoding::text,
    metrics::{family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};
use sqlx::PgPool;

use crate::{
    breaker, catalog, ledger,
    ratelimit::{blocks, pacer},
    runs::{self, RunStatus},
};

use super::*;

/// The content type of [`render`]'s text (OpenMetrics, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The longest a scrape's statements may run before the scrape fails (with 503).
pub const SCRAPE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Every circuit state (one series each, 1 for the current one).
const CIRCUIT_STATES: [breaker::State; 3] = [
    breaker::State::Closed,
    breaker::State::Open,
    breaker::State::HalfOpen,
];

/// Why a scrape failed (answered with 503 and this text).
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// A statement failed or ran past [`SCRAPE_STATEMENT_TIMEOUT`].
    #[error("reading the database for metrics: {0}")]
    Database(#[from] sqlx::Error),
    /// Encoding failed (not expected).
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

/// The figures read from the database at scrape time.
#[derive(Debug, Default)]
pub struct Shared {
    /// `(rule, pending, due)`.
    pub backlog: Vec<(String, i64, i64)>,
    /// `(status, runs)`.
    pub runs: Vec<(String, i64)>,
    /// `(budget, declared and effective requests per minute, block end if blocked)`.
    pub budgets: Vec<(String, i64, f64, Option<DateTime<Utc>>)>,
    /// `(connection, circuit state)`.
    pub circuits: Vec<(String, String)>,
    /// The target's jobs in flight per rule.
    pub jobs: Vec<crate::jobs::InFlight>,
}

/// Reads [`Shared`] in one read-only transaction whose statements may run at most
/// [`SCRAPE_STATEMENT_TIMEOUT`], from each table's owner.
pub async fn read_shared(pool: &PgPool, now: DateTime<Utc>) -> Result<Shared, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let timeout = SCRAPE_STATEMENT_TIMEOUT.as_millis().to_string();
    sqlx::query!("SELECT set_config('statement_timeout', $1, true)", timeout)
        .fetch_one(&mut *tx)
        .await?;
    let rules = catalog::list_rules(&mut *tx).await?;
    let backlog = ledger::backlog(&mut *tx, now).await?;
    let backlog = rules
        .iter()
        .map(|r| {
            let b = backlog.get(&r.id).copied().unwrap_or_default();
            (r.name.clone(), b.pending, b.due)
        })
        .collect();
    let runs = runs::count_by_status(&mut *tx).await?;
    let jobs = crate::jobs::in_flight(&mut *tx).await?;
    let connections = catalog::list_connections(&mut *tx).await?;
    let budgets = budgets(&mut tx, &connections, now).await?;
    let mut circuits: HashMap<i64, String> = (breaker::lines(&mut *tx).await?)
        .into_iter()
        .map(|l| (l.connection_id, l.state))
        .collect();
    let circuits = connections
        .iter()
        .filter_map(|c| Some((c.name.clone(), circuits.remove(&c.id)?)))
        .collect();
    tx.commit().await?;
    Ok(Shared {
        backlog,
        runs,
        budgets,
        circuits,
        jobs,
    })
}

/// Each budget's declared and effective requests per minute and its block's end, if
/// blocked; connections sharing a budget declare the least of their rates.
async fn budgets(
    tx: &mut sqlx::PgConnection,
    connections: &[catalog::Connection],
    now: DateTime<Utc>,
) -> Result<Vec<(String, i64, f64, Option<DateTime<Utc>>)>, sqlx::Error> {
    let states = pacer::states(&mut *tx).await?;
    let blocks: HashMap<String, DateTime<Utc>> = (blocks::current(&mut *tx, now).await?)
        .into_iter()
        .map(|b| (b.budget_key, b.until))
        .collect();
    let mut sharing: BTreeMap<&str, Vec<&catalog::Connection>> = BTreeMap::new();
    for c in connections {
        sharing.entry(c.budget_key.as_str()).or_default().push(c);
    }
    Ok(sharing
        .into_iter()
        .map(|(key, sharing)| {
            let conn = catalog::Connection {
                requests_per_minute: sharing.iter().map(|c| c.rpm()).min().map(|x| x as i32),
                limits: sharing
                    .iter()
                    .map(|c| &c.limits)
                    .min()
                    .cloned()
                    .unwrap_or_default(),
                reserve_percent: sharing.iter().map(|c| c.reserve_percent).max().unwrap_or(0),
                ..Default::default()
            };
            let state = states.get(key).cloned().unwrap_or_default();
            let pace =
                crate::status::budget_pace(&state, &conn.declared_limits(), conn.reserve(), now);
            let blocked_until = blocks.get(key).copied();
            (
                key.to_owned(),
                i64::from(conn.rpm()),
                pace.effective_rpm,
                blocked_until,
            )
        })
        .collect())
}

/// Each rule's backlog, as gauges: pending deliveries and those due now.
fn register_backlog(gauges: &mut Registry, backlog: &[(String, i64, i64)]) {
    let pending = Family::<RuleLabel, Gauge>::default();
    let due = Family::<RuleLabel, Gauge>::default();
    for (rule, p, d) in backlog {
        let label = RuleLabel { rule: rule.clone() };
        pending.get_or_create(&label).set(*p);
        due.get_or_create(&label).set(*d);
    }
    gauges.register("backlog_pending", "Pending deliveries, by rule", pending);
    gauges.register("backlog_due", "Pending deliveries due now, by rule", due);
}

/// The target's jobs in flight per rule, as gauges: jobs, records accepted, the oldest's age.
fn register_jobs(gauges: &mut Registry, in_flight: &[crate::jobs::InFlight], now: DateTime<Utc>) {
    let (jobs, accepted, oldest) = (
        Family::<RuleLabel, Gauge>::default(),
        Family::<RuleLabel, Gauge>::default(),
        Family::<RuleLabel, Gauge>::default(),
    );
    for j in in_flight {
        let label = RuleLabel {
            rule: j.rule.clone(),
        };
        jobs.get_or_create(&label).set(j.jobs);
        accepted.get_or_create(&label).set(j.records);
        let age = j.oldest.map_or(0, |at| (now - at).num_seconds().max(0));
        oldest.get_or_create(&label).set(age);
    }
    gauges.register(
        "jobs_in_flight",
        "The target's jobs submitted and not ended, by rule",
        jobs,
    );
    gauges.register(
        "jobs_records_accepted",
        "Records in the target's jobs in flight, their outcomes pending, by rule",
        accepted,
    );
    gauges.register_with_unit(
        "jobs_oldest_age",
        "Age of the oldest job in flight, by rule",
        Unit::Seconds,
        oldest,
    );
}

/// The whole exposition: this process's counters, then the database's figures as gauges.
pub async fn render(
    metrics: &Metrics,
    pool: &PgPool,
    now: DateTime<Utc>,
) -> Result<String, ScrapeError> {
    let shared = read_shared(pool, now).await?;
    let mut gauges = Registry::with_prefix("courier");
    register_backlog(&mut gauges, &shared.backlog);
    register_jobs(&mut gauges, &shared.jobs, now);
    let runs = Family::<StatusLabel, Gauge>::default();
    // Every status, so a status with no run reads 0 rather than vanishing.
    for status in RunStatus::ALL {
        let n = shared
            .runs
            .iter()
            .find(|(s, _)| s == status.as_str())
            .map_or(0, |(_, n)| *n);
        runs.get_or_create(&StatusLabel {
            status: status.as_str().to_owned(),
        })
        .set(n);
    }
    gauges.register("runs", "Runs in the database, by status", runs);
    let declared = Family::<BudgetLabel, Gauge>::default();
    let effective = Family::<BudgetLabel, FloatGauge>::default();
    let block_left = Family::<BudgetLabel, FloatGauge>::default();
    for (budget, rpm, rate, until) in &shared.budgets {
        let label = BudgetLabel {
            budget: budget.clone(),
        };
        declared.get_or_create(&label).set(*rpm);
        effective.get_or_create(&label).set(*rate);
        let left = until.map_or(0.0, |u| (u - now).num_milliseconds().max(0) as f64 / 1000.0);
        block_left.get_or_create(&label).set(left);
    }
    gauges.register(
        "budget_declared_requests_per_minute",
        "Requests per minute the budget's connections declare",
        declared,
    );
    gauges.register(
        "budget_effective_requests_per_minute",
        "Requests per minute this process paces the budget at (lower after a 429, recovering)",
        effective,
    );
    gauges.register_with_unit(
        "block_remaining",
        "Time until the budget's rate-limit block ends (0: not blocked)",
        Unit::Seconds,
        block_left,
    );
    let circuits = Family::<ConnectionState, Gauge>::default();
    for (connection, state) in &shared.circuits {
        for s in CIRCUIT_STATES {
            circuits
                .get_or_create(&ConnectionState {
                    connection: connection.clone(),
                    state: s.as_str().to_owned(),
                })
                .set(i64::from(s.as_str() == state));
        }
    }
    gauges.register(
        "circuit_state",
        "1 for the connection's circuit state (closed, open, half_open), 0 for the others",
        circuits,
    );
    let mut out = String::new();
    text::encode_registry(&mut out, &metrics.registry)?;
    text::encode_registry(&mut out, &gauges)?;
    text::encode_eof(&mut out)?;
    Ok(out)
}
