//! What a chain job works with, read from each table's owner: its run, the run's rule and
//! connection, the connection's circuit. Rule and connection come from the run, never
//! from the job's payload.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::{
    breaker::{self, Circuit},
    catalog::{self, Connection},
    engine::Engine,
    invalid::Invalid,
    profile::RuleProfile,
    ratelimit::limits::Limit,
    retry::RetryPolicy,
    runs::{self, RunStatus},
};

/// A run and everything its next job needs.
#[derive(Clone, Debug)]
pub struct ChainContext {
    /// The run.
    pub run_id: i64,
    /// Its status when read: only an active run does anything.
    pub run_status: RunStatus,
    /// Its rule.
    pub rule_id: i64,
    /// The rule's name (for metrics).
    pub rule_name: String,
    /// The highest delivery id the run has handled.
    pub cursor_id: i64,
    /// Whether the rule is enabled (a disabled rule's run completes at once).
    pub rule_enabled: bool,
    /// Whether the rule or its connection is paused, and which (a paused run ends at its
    /// next batch boundary).
    pub paused: Option<&'static str>,
    /// The rule's share of its budget against other rules.
    pub weight: i32,
    /// The rule's path (the writer's operation).
    pub path: String,
    /// Deliveries claimed per batch (at least a call's worth per call in flight: see
    /// [`ChainContext::claim_limit`]).
    pub batch_size: i32,
    /// What the rule's calls are, parsed once per change of the rule (`Engine::profile`); or why its stored profile cannot be
    /// used (the run then ends with the rule unusable, its backlog untouched).
    pub profile: Result<Arc<RuleProfile>, Invalid>,
    /// Attempts and backoff.
    pub retry: RetryPolicy,
    /// The connection the rule delivers into.
    pub connection: Connection,
    /// The limits the connection declares ([`Connection::declared_limits`], read once per
    /// job).
    pub limits: Vec<Limit>,
    /// The connection's circuit.
    pub circuit: Circuit,
    /// Whether this run may call through the circuit (`courier_circuit_admits` when the
    /// run was read): closed, cooled down, or half-open with no other run probing it.
    pub circuit_admits: bool,
    /// The apalis job carrying the run now: no other job may move it on.
    pub job_id: Option<String>,
}

/// Why a run stops at its next batch boundary: its rule or its connection is paused.
fn paused(rule: bool, connection: bool) -> Option<&'static str> {
    if rule {
        Some("rule paused")
    } else if connection {
        Some("connection paused")
    } else {
        None
    }
}

/// Reads run `run_id` (from `runs`), its rule and connection (from the catalog) and the
/// connection's circuit (whether it admits the run at `now`); `None` when the run or its
/// rule is gone.
pub async fn load(
    engine: &Engine,
    run_id: i64,
    now: DateTime<Utc>,
) -> Result<Option<ChainContext>, sqlx::Error> {
    let pool = &engine.pool;
    let Some(run) = runs::get(pool, run_id).await? else {
        return Ok(None);
    };
    let Some((rule, connection)) = catalog::rule_with_connection(pool, run.rule_id).await? else {
        return Ok(None);
    };
    let (circuit, circuit_admits) = breaker::for_run(pool, connection.id, run_id, now).await?;
    let profile = engine.profile(&rule, &connection);
    Ok(Some(ChainContext {
        run_id,
        run_status: run.status,
        rule_id: run.rule_id,
        rule_name: rule.name,
        cursor_id: run.cursor_id,
        rule_enabled: rule.enabled,
        paused: paused(rule.paused, connection.paused),
        weight: rule.weight,
        path: rule.path,
        batch_size: rule.batch_size,
        profile,
        retry: RetryPolicy {
            max_attempts: rule.max_attempts,
            backoff_base_ms: rule.backoff_base_ms,
            backoff_max_ms: rule.backoff_max_ms,
        },
        limits: connection.declared_limits(),
        connection,
        circuit,
        circuit_admits,
        job_id: run.job_id,
    }))
}

/// The most deliveries one claim takes.
pub const MAX_CLAIM: i32 = 10_000;

impl ChainContext {
    /// The budget the rule's calls spend from, and the rule's turn in it.
    pub fn budget(&self) -> crate::paced::Budget<'_> {
        crate::paced::Budget {
            key: &self.connection.budget_key,
            limits: &self.limits,
            reserve: self.connection.reserve(),
            rule_id: self.rule_id,
            weight: self.weight.max(1) as u32,
        }
    }

    /// How many deliveries a batch claims for a rule of `profile`: the rule's batch size,
    /// and at least enough for every call the connection may have in flight to carry a
    /// full call of records.
    pub fn claim_limit(&self, profile: &RuleProfile) -> i32 {
        let per_call = i32::try_from(profile.records_per_call).unwrap_or(i32::MAX);
        let full_calls = per_call.saturating_mul(self.connection.max_in_flight);
        self.batch_size.max(full_calls).min(MAX_CLAIM)
    }
}
