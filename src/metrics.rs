//! Prometheus metrics of a worker process.
//!
//! Counters and histograms of what happens in this process (deliveries by outcome, calls
//! by HTTP status class, 429s, blocks set, enqueue-to-delivered latency, waits for a
//! pacer slot) are kept in [`Metrics`], held by the [`Engine`](crate::engine::Engine)
//! and updated where the events happen. Figures that belong to the database, shared by
//! every process (backlog, runs by status, budgets, blocks, circuits), are read at scrape
//! time by [`render`] with a few bulk statements under a short statement timeout.
//!
//! Labels name rules, connections, budgets, outcomes and states only: never a record key,
//! a payload or a secret.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use chrono::{DateTime, Utc};
use prometheus_client::{
    encoding::{EncodeLabelSet, text},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};
use sqlx::PgPool;

use crate::{
    breaker, catalog, ledger,
    ratelimit::{blocks, pacer},
    runs::{self, RunStatus},
};

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

/// `rule`, `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleOutcome {
    rule: String,
    outcome: String,
}

/// `connection`, `class` (`2xx`, `3xx`, `4xx`, `5xx`, or `none` when nothing answered).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionClass {
    connection: String,
    class: String,
}

/// `budget`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabel {
    budget: String,
}

/// `rule`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

/// `connection`, `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionState {
    connection: String,
    state: String,
}

/// `status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The in-process metrics of a worker: one per [`Engine`](crate::engine::Engine).
pub struct Metrics {
    registry: Registry,
    deliveries: Family<RuleOutcome, Counter>,
    calls: Family<ConnectionClass, Counter>,
    rate_limited: Family<BudgetLabel, Counter>,
    blocks_set: Family<BudgetLabel, Counter>,
    delivery_latency: Family<RuleLabel, Histogram>,
    pacer_wait: Family<BudgetLabel, Histogram>,
    records_per_call: Family<RuleLabel, Histogram>,
    splits: Family<RuleLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A fresh set of counters, all empty.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("courier");
        let deliveries = Family::<RuleOutcome, Counter>::default();
        registry.register(
            "deliveries",
            "Outcomes recorded by this process, by rule and outcome (delivered, failed, exhausted, rejected, suppressed, held)",
            deliveries.clone(),
        );
        let calls = Family::<ConnectionClass, Counter>::default();
        registry.register(
            "calls",
            "Calls to targets made by this process, by connection and HTTP status class (none: no answer)",
            calls.clone(),
        );
        let rate_limited = Family::<BudgetLabel, Counter>::default();
        registry.register(
            "rate_limited",
            "HTTP 429 answers met by this process, by budget",
            rate_limited.clone(),
        );
        let blocks_set = Family::<BudgetLabel, Counter>::default();
        registry.register(
            "blocks_set",
            "Rate-limit blocks this process set or extended, by budget",
            blocks_set.clone(),
        );
        let delivery_latency =
            Family::<RuleLabel, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register_with_unit(
            "delivery_latency",
            "Time from a delivery's enqueue to its delivery, by rule",
            Unit::Seconds,
            delivery_latency.clone(),
        );
        let pacer_wait =
            Family::<BudgetLabel, Histogram>::new_with_constructor(wait_histogram as fn() -> _);
        registry.register_with_unit(
            "pacer_wait",
            "Time a call waited for its request slot, by budget",
            Unit::Seconds,
            pacer_wait.clone(),
        );
        let records_per_call =
            Family::<RuleLabel, Histogram>::new_with_constructor(records_histogram as fn() -> _);
        registry.register(
            "records_per_call",
            "Records each call of this process carried, by rule",
            records_per_call.clone(),
        );
        let splits = Family::<RuleLabel, Counter>::default();
        registry.register(
            "calls_split",
            "Calls of several records refused as a whole and split in halves, by rule",
            splits.clone(),
        );
        Self {
            registry,
            deliveries,
            calls,
            rate_limited,
            blocks_set,
            delivery_latency,
            pacer_wait,
            records_per_call,
            splits,
        }
    }

    /// `n` outcomes `outcome` recorded for `rule`.
    pub fn outcomes(&self, rule: &str, outcome: &str, n: u64) {
        self.deliveries
            .get_or_create(&RuleOutcome {
                rule: rule.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc_by(n);
    }

    /// One call on `connection` answered with `status` (`None`: no answer).
    pub fn call(&self, connection: &str, status: Option<u16>) {
        self.calls
            .get_or_create(&ConnectionClass {
                connection: connection.to_owned(),
                class: status_class(status).to_owned(),
            })
            .inc();
    }

    /// One call of `rule` carried `records` records.
    pub fn records_per_call(&self, rule: &str, records: usize) {
        self.records_per_call
            .get_or_create(&RuleLabel {
                rule: rule.to_owned(),
            })
            .observe(records as f64);
    }

    /// A call of `rule` refused as a whole was split in halves.
    pub fn split(&self, rule: &str) {
        self.splits
            .get_or_create(&RuleLabel {
                rule: rule.to_owned(),
            })
            .inc();
    }

    /// A 429 met on `budget`.
    pub fn rate_limited(&self, budget: &str) {
        self.rate_limited
            .get_or_create(&BudgetLabel {
                budget: budget.to_owned(),
            })
            .inc();
    }

    /// A block set (or extended) on `budget`.
    pub fn block_set(&self, budget: &str) {
        self.blocks_set
            .get_or_create(&BudgetLabel {
                budget: budget.to_owned(),
            })
            .inc();
    }

    /// A delivery of `rule` delivered `latency` after its enqueue.
    pub fn delivered_after(&self, rule: &str, latency: chrono::Duration) {
        let seconds = latency.num_milliseconds().max(0) as f64 / 1000.0;
        self.delivery_latency
            .get_or_create(&RuleLabel {
                rule: rule.to_owned(),
            })
            .observe(seconds);
    }

    /// A call on `budget` waited `wait` for its request slot.
    pub fn pacer_waited(&self, budget: &str, wait: Duration) {
        self.pacer_wait
            .get_or_create(&BudgetLabel {
                budget: budget.to_owned(),
            })
            .observe(wait.as_secs_f64());
    }
}

fn latency_histogram() -> Histogram {
    // 10 ms .. about 3 days.
    Histogram::new(exponential_buckets(0.01, 4.0, 14))
}

fn records_histogram() -> Histogram {
    // 1, 2, 4 .. 1024 records.
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

fn wait_histogram() -> Histogram {
    // 1 ms .. about 4 min.
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

/// `2xx`, `3xx`, `4xx`, `5xx`, or `none` (no answer: a timeout, a refused connection, a
/// payload refused before sending).
pub fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        Some(_) => "other",
        None => "none",
    }
}

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

/// The whole exposition: this process's counters, then the database's figures as gauges.
pub async fn render(
    metrics: &Metrics,
    pool: &PgPool,
    now: DateTime<Utc>,
) -> Result<String, ScrapeError> {
    let shared = read_shared(pool, now).await?;
    let mut gauges = Registry::with_prefix("courier");
    let pending = Family::<RuleLabel, Gauge>::default();
    let due = Family::<RuleLabel, Gauge>::default();
    for (rule, p, d) in &shared.backlog {
        let label = RuleLabel { rule: rule.clone() };
        pending.get_or_create(&label).set(*p);
        due.get_or_create(&label).set(*d);
    }
    gauges.register("backlog_pending", "Pending deliveries, by rule", pending);
    gauges.register("backlog_due", "Pending deliveries due now, by rule", due);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        assert_eq!(status_class(Some(204)), "2xx");
        assert_eq!(status_class(Some(429)), "4xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "none");
    }

    #[test]
    fn counters_use_prometheus_names() {
        let m = Metrics::new();
        m.outcomes("customers", "delivered", 3);
        m.call("shop", Some(200));
        m.rate_limited("connection:1");
        m.delivered_after("customers", chrono::Duration::milliseconds(1500));
        m.pacer_waited("connection:1", Duration::from_millis(20));
        let mut out = String::new();
        text::encode_registry(&mut out, &m.registry).unwrap();
        assert!(
            out.contains(r#"courier_deliveries_total{rule="customers",outcome="delivered"} 3"#),
            "{out}"
        );
        assert!(out.contains(r#"courier_calls_total{connection="shop",class="2xx"} 1"#));
        assert!(out.contains(r#"courier_rate_limited_total{budget="connection:1"} 1"#));
        assert!(out.contains("courier_delivery_latency_seconds_count{rule=\"customers\"} 1"));
        assert!(out.contains("courier_pacer_wait_seconds_bucket"));
    }
}
