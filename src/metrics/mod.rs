//! Prometheus metrics of a worker process.
//!
//! Counters and histograms of what happens in this process (deliveries by outcome, calls
//! by HTTP status class, 429s, blocks set, enqueue-to-delivered latency, waits for a
//! pacer slot) are kept in [`Metrics`], held by the [`Engine`](crate::engine::Engine)
//! and updated where the events happen. Figures that belong to the database are read at
//! scrape time by [`scrape::render`], which reads them from the tables' owners; the
//! counters depend on none of them.
//!
//! Labels name rules, connections, budgets, outcomes and states only: never a record key,
//! a payload or a secret.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

pub mod scrape;

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

/// `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
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
    erasure_answers: Family<OutcomeLabel, Counter>,
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
            "Outcomes recorded by this process, by rule and outcome (delivered, accepted, unconfirmed, failed, exhausted, rejected, suppressed, held), those the target's jobs reported among them",
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
        let erasure_answers = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "erasure_answers",
            "Targets' answers to erasures recorded by this process, by outcome (erased, unknown, queued, no_operation, no_identity, failed)",
            erasure_answers.clone(),
        );
        Self {
            registry,
            erasure_answers,
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

    /// Puts every series of the known rules, connections and budgets in the exposition at
    /// zero, so each family is there from the start and an alert has a series to compare
    /// before the first event.
    pub fn known(&self, rules: &[String], connections: &[String], budgets: &[String]) {
        for rule in rules {
            for outcome in OUTCOMES {
                let _ = self.deliveries.get_or_create(&RuleOutcome {
                    rule: rule.clone(),
                    outcome: outcome.to_owned(),
                });
            }
            let label = RuleLabel { rule: rule.clone() };
            let _ = self.delivery_latency.get_or_create(&label);
            let _ = self.records_per_call.get_or_create(&label);
            let _ = self.splits.get_or_create(&label);
        }
        for connection in connections {
            for class in CLASSES {
                let _ = self.calls.get_or_create(&ConnectionClass {
                    connection: connection.clone(),
                    class: class.to_owned(),
                });
            }
        }
        for budget in budgets {
            let label = BudgetLabel {
                budget: budget.clone(),
            };
            let _ = self.rate_limited.get_or_create(&label);
            let _ = self.blocks_set.get_or_create(&label);
            let _ = self.pacer_wait.get_or_create(&label);
        }
        // Every outcome a part of an erasure can end with ("pending" is not an end).
        for outcome in crate::erasure::store::OUTCOMES.iter().skip(1) {
            let _ = self.erasure_answers.get_or_create(&OutcomeLabel {
                outcome: (*outcome).to_owned(),
            });
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

    /// A target's part of an erasure ended `outcome`.
    pub fn erasure_answered(&self, outcome: &str) {
        self.erasure_answers
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
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

/// Every outcome a process records (`courier_deliveries_total`'s `outcome`).
pub const OUTCOMES: [&str; 8] = [
    "delivered",
    "accepted",
    "unconfirmed",
    "failed",
    "exhausted",
    "rejected",
    "suppressed",
    "held",
];

/// Every class of a call's answer (`courier_calls_total`'s `class`).
const CLASSES: [&str; 6] = ["2xx", "3xx", "4xx", "5xx", "other", "none"];

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
        prometheus_client::encoding::text::encode_registry(&mut out, &m.registry).unwrap();
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
