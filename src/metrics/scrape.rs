//! The scrape: this process's [`Metrics`] and the figures that belong to the database,
//! shared by every process (backlog, runs by status, budgets, blocks, circuits), read with a
//! few bulk statements under a short statement timeout.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use prometheus_client::{
    encoding::text,
    metrics::{family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};
use sqlx::PgPool;

use crate::{
    breaker, catalog, ledger,
    runs::{self, RunStatus},
    status::BudgetStatus,
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
    /// Every budget, as `courier status` shows it.
    pub budgets: Vec<BudgetStatus>,
    /// `(connection, circuit state)`.
    pub circuits: Vec<(String, String)>,
    /// The target's jobs in flight per rule.
    pub jobs: Vec<crate::jobs::InFlight>,
    /// The rules left alone as unusable now.
    pub unusable: Vec<String>,
    /// Worker processes alive.
    pub workers_live: i64,
    /// Every rule's name.
    pub rules: Vec<String>,
    /// Every connection's name.
    pub connections: Vec<String>,
    /// The erasures' figures.
    pub erasures: crate::erasure::store::Figures,
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
    let budgets = crate::status::budgets::lines(&mut tx, &connections, &rules, now).await?;
    let unusable = (catalog::unusable_rules(&mut *tx, now).await?)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    let window = chrono::Duration::seconds(crate::config::DEFAULT_WORKER_DEAD_AFTER_SECS as i64);
    let workers_live = crate::workers::live(&mut *tx, now, window).await?.len() as i64;
    let mut circuits: HashMap<i64, String> = (breaker::lines(&mut *tx).await?)
        .into_iter()
        .map(|l| (l.connection_id, l.state))
        .collect();
    let circuits = connections
        .iter()
        .filter_map(|c| Some((c.name.clone(), circuits.remove(&c.id)?)))
        .collect();
    let erasures = crate::erasure::store::figures(&mut *tx, now).await?;
    tx.commit().await?;
    Ok(Shared {
        erasures,
        backlog,
        runs,
        budgets,
        circuits,
        jobs,
        unusable,
        workers_live,
        rules: rules.into_iter().map(|r| r.name).collect(),
        connections: connections.into_iter().map(|c| c.name).collect(),
    })
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
    let (jobs, accepted, oldest, overdue) = (
        Family::<RuleLabel, Gauge>::default(),
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
        overdue.get_or_create(&label).set(j.overdue);
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
    gauges.register(
        "jobs_overdue",
        "The target's jobs that never reported within the rule's bound, their records still accepted, by rule",
        overdue,
    );
}

/// The whole exposition: this process's counters, then the database's figures as gauges.
pub async fn render(
    metrics: &Metrics,
    pool: &PgPool,
    now: DateTime<Utc>,
) -> Result<String, ScrapeError> {
    let shared = read_shared(pool, now).await?;
    let budget_keys: Vec<String> = shared.budgets.iter().map(|b| b.key.clone()).collect();
    metrics.known(&shared.rules, &shared.connections, &budget_keys);
    let mut gauges = Registry::with_prefix("courier");
    register_backlog(&mut gauges, &shared.backlog);
    register_jobs(&mut gauges, &every_rules_jobs(&shared), now);
    register_rules(&mut gauges, &shared);
    register_runs(&mut gauges, &shared.runs);
    register_budgets(&mut gauges, &shared.budgets, now);
    register_circuits(&mut gauges, &shared.circuits);
    register_erasures(&mut gauges, &shared.erasures);
    let mut out = String::new();
    text::encode_registry(&mut out, &metrics.registry)?;
    text::encode_registry(&mut out, &gauges)?;
    text::encode_eof(&mut out)?;
    Ok(out)
}

/// Each rule's jobs in flight, at zero for a rule with none (its series there before its
/// first job).
fn every_rules_jobs(shared: &Shared) -> Vec<crate::jobs::InFlight> {
    (shared.rules.iter())
        .map(|rule| {
            let found = shared.jobs.iter().find(|j| &j.rule == rule);
            found.cloned().unwrap_or(crate::jobs::InFlight {
                rule: rule.clone(),
                jobs: 0,
                records: 0,
                oldest: None,
                last_poll: None,
                last_said: None,
                overdue: 0,
            })
        })
        .collect()
}

/// Whether each rule is left alone as unusable, and the workers alive.
fn register_rules(gauges: &mut Registry, shared: &Shared) {
    let unusable = Family::<RuleLabel, Gauge>::default();
    for rule in &shared.rules {
        let label = RuleLabel { rule: rule.clone() };
        unusable
            .get_or_create(&label)
            .set(i64::from(shared.unusable.contains(rule)));
    }
    gauges.register(
        "rule_unusable",
        "1 while the rule is left alone because its last run could not use it (see courier status), 0 otherwise",
        unusable,
    );
    let live = Gauge::<i64>::default();
    live.set(shared.workers_live);
    gauges.register(
        "workers_live",
        "Worker processes alive, by their beats",
        live,
    );
}

/// The erasures: connections' parts by outcome, those open and the oldest's age (what an
/// alert on the deadline reads).
fn register_erasures(gauges: &mut Registry, figures: &crate::erasure::store::Figures) {
    let by_outcome = Family::<OutcomeLabel, Gauge>::default();
    for (outcome, n) in &figures.by_outcome {
        by_outcome
            .get_or_create(&OutcomeLabel {
                outcome: outcome.clone(),
            })
            .set(*n);
    }
    gauges.register(
        "erasure_targets",
        "Connections' parts of erasures in the database, by outcome (pending, erased, unknown, queued, no_operation, no_identity, failed)",
        by_outcome,
    );
    let open = Gauge::<i64>::default();
    open.set(figures.open);
    gauges.register(
        "erasures_open",
        "Erasures not yet answered by every target",
        open,
    );
    let oldest = FloatGauge::default();
    oldest.set(figures.oldest_open_seconds);
    gauges.register_with_unit(
        "erasure_oldest_open",
        "Age of the oldest open erasure (0: none open)",
        Unit::Seconds,
        oldest,
    );
}

/// Runs by status, every status (one with no run reads 0 rather than vanishing).
fn register_runs(gauges: &mut Registry, counted: &[(String, i64)]) {
    let runs = Family::<StatusLabel, Gauge>::default();
    for status in RunStatus::ALL {
        let n = counted
            .iter()
            .find(|(s, _)| s == status.as_str())
            .map_or(0, |(_, n)| *n);
        runs.get_or_create(&StatusLabel {
            status: status.as_str().to_owned(),
        })
        .set(n);
    }
    gauges.register("runs", "Runs in the database, by status", runs);
}

/// Each budget's declared and paced rate, its calls of the last minute and its block.
fn register_budgets(gauges: &mut Registry, budgets: &[BudgetStatus], now: DateTime<Utc>) {
    let declared = Family::<BudgetLabel, FloatGauge>::default();
    let effective = Family::<BudgetLabel, FloatGauge>::default();
    let block_left = Family::<BudgetLabel, FloatGauge>::default();
    let used = Family::<BudgetLabel, Gauge>::default();
    for b in budgets {
        let label = BudgetLabel {
            budget: b.key.clone(),
        };
        declared.get_or_create(&label).set(b.declared_rpm);
        effective.get_or_create(&label).set(b.effective_rpm);
        let until = b.blocked_until;
        let left = until.map_or(0.0, |u| (u - now).num_milliseconds().max(0) as f64 / 1000.0);
        block_left.get_or_create(&label).set(left);
        used.get_or_create(&label).set(b.used_last_minute);
    }
    gauges.register(
        "budget_declared_requests_per_minute",
        "Requests per minute of the budget's shortest declared limit (a connection's, a rule's own, a job's polls')",
        declared,
    );
    gauges.register(
        "budget_calls_last_minute",
        "Calls made against the budget in the last 60 s by every process (429s included)",
        used,
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
}

/// Each connection's circuit: 1 for its state, 0 for the others.
fn register_circuits(gauges: &mut Registry, circuits: &[(String, String)]) {
    let family = Family::<ConnectionState, Gauge>::default();
    for (connection, state) in circuits {
        for s in CIRCUIT_STATES {
            family
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
        family,
    );
}
