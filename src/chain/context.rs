//! What a chain job works with, read in one statement from its run row: the rule, its
//! connection, the connection's circuit and block. Rule and connection come from the run,
//! never from the job's payload.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::{
    breaker::{self, Circuit},
    catalog::Connection,
    ratelimit::limits::Limit,
    retry::RetryPolicy,
    runs::RunStatus,
    writer::{Call, Outgoing, answer::AnswerMap, request::RequestShape},
};

/// A run and everything its next job needs.
#[derive(Clone, Debug)]
pub struct JobContext {
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
    /// [`JobContext::claim_limit`]).
    pub batch_size: i32,
    /// The most deliveries one call carries.
    pub records_per_call: i32,
    /// The field wrapping the records of an `http_json` bulk call, if any.
    pub batch_envelope: Option<String>,
    /// How the rule's answers name each record's fate, or why its stored map cannot be
    /// read (the run then ends with the rule unusable).
    pub answer: Result<Option<AnswerMap>, String>,
    /// How the rule's requests are shaped, or why its stored shape cannot be used.
    pub request: Result<RequestShape, String>,
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

/// Reads run `run_id` with its rule, connection and circuit (whether it admits the run at
/// `now`); `None` when it is gone.
pub async fn load(
    db: impl PgExecutor<'_>,
    run_id: i64,
    now: DateTime<Utc>,
) -> Result<Option<JobContext>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT r.status AS "run_status: RunStatus", r.rule_id, r.cursor_id, r.job_id, ru.enabled,
                  ru.name AS rule_name,
                  ru.paused AS rule_paused, c.paused AS connection_paused,
                  ru.path, ru.batch_size, ru.records_per_call, ru.batch_envelope, ru.answer, ru.request, ru.max_attempts, ru.backoff_base_ms, ru.backoff_max_ms,
                  c.id AS connection_id, c.name, c.writer, c.base_url, c.api_key_env, c.auth, c.headers,
                  c.requests_per_minute, c.max_in_flight, c.timeout_ms, ru.weight,
                  courier_rule_budget_key(ru, c) AS "budget_key!", c.limits, c.reserve_percent,
                  ci.state AS "state: breaker::State", ci.consecutive_failures, ci.times_opened,
                  courier_ts(ci.open_until) AS open_until,
                  courier_circuit_admits(ci, r.id, $2) AS "circuit_admits!"
           FROM runs r
           JOIN rules ru ON ru.id = r.rule_id
           JOIN connections c ON c.id = ru.connection_id
           JOIN circuits ci ON ci.connection_id = c.id
           WHERE r.id = $1"#,
        run_id,
        now
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| {
        let request = RequestShape::parse(r.request.as_ref(), &r.path, r.records_per_call > 1);
        let connection = Connection {
            id: r.connection_id,
            name: r.name,
            writer: r.writer,
            base_url: r.base_url,
            api_key_env: r.api_key_env,
            auth: r.auth,
            headers: r.headers,
            requests_per_minute: r.requests_per_minute,
            max_in_flight: r.max_in_flight,
            timeout_ms: r.timeout_ms,
            budget_key: r.budget_key,
            limits: r.limits,
            reserve_percent: r.reserve_percent,
        };
        JobContext {
            run_id,
            run_status: r.run_status,
            rule_id: r.rule_id,
            rule_name: r.rule_name,
            cursor_id: r.cursor_id,
            rule_enabled: r.enabled,
            paused: paused(r.rule_paused, r.connection_paused),
            weight: r.weight,
            path: r.path,
            batch_size: r.batch_size,
            records_per_call: r.records_per_call,
            batch_envelope: r.batch_envelope,
            answer: r.answer.as_ref().map(AnswerMap::parse).transpose(),
            request,
            retry: RetryPolicy {
                max_attempts: r.max_attempts,
                backoff_base_ms: r.backoff_base_ms,
                backoff_max_ms: r.backoff_max_ms,
            },
            limits: connection.declared_limits(),
            connection,
            circuit: Circuit {
                state: r.state,
                consecutive_failures: r.consecutive_failures,
                times_opened: r.times_opened,
                open_until: r.open_until,
            },
            circuit_admits: r.circuit_admits,
            job_id: r.job_id,
        }
    }))
}

/// The most deliveries one claim takes.
pub const MAX_CLAIM: i32 = 10_000;

impl JobContext {
    /// A call of `records` as the rule shapes it: its envelope, bulk form, answer map and
    /// request shape.
    pub fn call<'a>(&'a self, records: &'a [Outgoing<'a>]) -> Call<'a> {
        Call {
            records,
            envelope: self.batch_envelope.as_deref(),
            bulk: self.records_per_call > 1,
            answer: self.answer.as_ref().ok().and_then(Option::as_ref),
            request: self.request.as_ref().ok(),
        }
    }

    /// How many deliveries a batch claims: the rule's batch size, and at least enough for
    /// every call the connection may have in flight to carry a full call of records.
    pub fn claim_limit(&self) -> i32 {
        let full_calls = self
            .records_per_call
            .saturating_mul(self.connection.max_in_flight);
        self.batch_size.max(full_calls).min(MAX_CLAIM)
    }
}
