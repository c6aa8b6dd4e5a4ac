//! The circuit breaker of each connection (table `circuits`), kept in PostgreSQL so every
//! worker process agrees. Closed → open after N consecutive failures that do not prove the
//! target reachable; open for a cooldown that doubles on each reopening (capped); then
//! half-open, where one run probes: a reachable answer closes it, a failure reopens it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::config::BreakerSettings;

/// Where a circuit stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum State {
    /// Calls flow.
    Closed,
    /// No calls until `open_until`.
    Open,
    /// One probing run may call.
    HalfOpen,
}

impl State {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// A circuit's state as the breaker reasons about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circuit {
    /// Closed, open or half-open.
    pub state: State,
    /// Unreachable failures since the last reachable answer (kept while open: the
    /// failures that opened it, and any failed probe since).
    pub consecutive_failures: i32,
    /// Openings since the circuit last closed: the cooldown's exponent.
    pub times_opened: i32,
    /// End of the current open period.
    pub open_until: Option<DateTime<Utc>>,
}

impl Circuit {
    /// Takes one call's result into account; returns true when this call opened the
    /// circuit. `reachable` is true for a success and for an error that proves the target
    /// answered.
    pub fn observe(
        &mut self,
        reachable: bool,
        settings: &BreakerSettings,
        now: DateTime<Utc>,
    ) -> bool {
        if reachable {
            if self.state != State::Closed {
                self.times_opened = 0;
            }
            self.state = State::Closed;
            self.consecutive_failures = 0;
            self.open_until = None;
            return false;
        }
        self.consecutive_failures += 1;
        let trips = match self.state {
            State::Closed => self.consecutive_failures >= settings.failure_threshold as i32,
            // A failed probe reopens at once; so does a failure met by a run that was
            // already under way when the circuit opened (its cooldown starts again).
            State::HalfOpen | State::Open => true,
        };
        if trips {
            self.open(settings, now);
        }
        trips
    }

    fn open(&mut self, settings: &BreakerSettings, now: DateTime<Utc>) {
        let factor = 1u32 << self.times_opened.clamp(0, 20);
        let cooldown = settings
            .cooldown
            .saturating_mul(factor)
            .min(settings.max_cooldown);
        self.state = State::Open;
        self.times_opened += 1;
        self.open_until = Some(now + chrono::Duration::from_std(cooldown).expect("cooldown fits"));
    }
}

/// Forgets which connections were found unusable: a process that starts may see a
/// different environment (an API key variable now set), so each gets one run again.
pub async fn forget_unusable(db: impl sqlx::PgExecutor<'_>) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query!(
        "UPDATE circuits SET unusable_error = NULL, unusable_until = NULL
         WHERE unusable_until IS NOT NULL"
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// Marks connection `connection_id` unusable until `until` (its writer cannot be built):
/// the dispatcher leaves it alone meanwhile, unless the catalog changes first.
pub async fn set_unusable(
    db: impl sqlx::PgExecutor<'_>,
    connection_id: i64,
    error: &str,
    until: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE circuits SET unusable_error = $2, unusable_until = $3 WHERE connection_id = $1",
        connection_id,
        error,
        until
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Makes run `run_id` the probe of connection `connection_id` (the circuit half-open) if
/// the circuit wants one at `now` (`courier_circuit_wants_probe`: open and cooled down, or
/// half-open with no active probe); false when another process started the probe first.
pub async fn start_probe(
    db: impl sqlx::PgExecutor<'_>,
    connection_id: i64,
    run_id: i64,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let claimed = sqlx::query!(
        "UPDATE circuits c SET state = 'half_open', probe_run_id = $2, updated_at = $3
         WHERE c.connection_id = $1 AND courier_circuit_wants_probe(c, $3, $2)",
        connection_id,
        run_id,
        now
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(claimed == 1)
}

/// Reads a connection's circuit, locking its row until the transaction ends.
pub async fn lock(tx: &mut PgConnection, connection_id: i64) -> Result<Circuit, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT state AS "state: State", consecutive_failures, times_opened,
                  courier_ts(open_until) AS open_until
         FROM circuits WHERE connection_id = $1 FOR UPDATE"#,
        connection_id
    )
    .fetch_one(tx)
    .await?;
    Ok(Circuit {
        state: row.state,
        consecutive_failures: row.consecutive_failures,
        times_opened: row.times_opened,
        open_until: row.open_until,
    })
}

/// Replays one batch's call results (in completion order) onto the stored circuit inside
/// the caller's transaction; returns the circuit as it now stands.
pub async fn record(
    tx: &mut PgConnection,
    connection_id: i64,
    results: &[bool],
    last_error: Option<&str>,
    settings: &BreakerSettings,
    now: DateTime<Utc>,
) -> Result<Circuit, sqlx::Error> {
    let mut circuit = lock(&mut *tx, connection_id).await?;
    if results.is_empty() {
        return Ok(circuit);
    }
    let was = circuit.state;
    let mut opened = false;
    for &reachable in results {
        opened |= circuit.observe(reachable, settings, now);
    }
    // A fault is said once when it starts and once when it ends.
    if opened && was == State::Closed {
        tracing::warn!(connection_id, until = ?circuit.open_until, "circuit opened");
    } else if opened {
        tracing::debug!(connection_id, until = ?circuit.open_until, "circuit reopened: the probe failed");
    } else if was != State::Closed && circuit.state == State::Closed {
        tracing::info!(connection_id, "circuit closed: the target answers again");
    }
    sqlx::query!(
        "UPDATE circuits SET state = $2, consecutive_failures = $3, times_opened = $4,
                open_until = $5, last_error = COALESCE($6, last_error), updated_at = $7,
                probe_run_id = CASE WHEN $2 = 'half_open' THEN probe_run_id END
         WHERE connection_id = $1",
        connection_id,
        circuit.state.as_str(),
        circuit.consecutive_failures,
        circuit.times_opened,
        circuit.open_until,
        last_error,
        now
    )
    .execute(tx)
    .await?;
    Ok(circuit)
}

/// A connection's circuit as `courier status` and the metrics show it.
#[derive(Debug)]
pub struct CircuitLine {
    /// The connection.
    pub connection_id: i64,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// When an open circuit allows a probe.
    pub open_until: Option<DateTime<Utc>>,
    /// Unreachable failures in a row.
    pub consecutive_failures: i32,
}

/// Every connection's circuit.
pub async fn lines(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<CircuitLine>, sqlx::Error> {
    sqlx::query_as!(
        CircuitLine,
        r#"SELECT connection_id, state::text AS "state!", courier_ts(open_until) AS open_until,
                  consecutive_failures
           FROM circuits"#
    )
    .fetch_all(db)
    .await
}

/// The connections left alone as unusable at `now`: `(connection, why, until when)`.
pub async fn unusable(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<(i64, String, DateTime<Utc>)>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT connection_id, unusable_error AS "reason!", unusable_until AS "until!"
           FROM circuits WHERE unusable_until > $1"#,
        now
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.connection_id, r.reason, r.until))
    .collect())
}

/// Connection `connection_id`'s circuit, and whether it admits run `run_id` at `now`
/// (`courier_circuit_admits`: closed, cooled down, or half-open for this run's probe).
pub async fn for_run(
    db: impl sqlx::PgExecutor<'_>,
    connection_id: i64,
    run_id: i64,
    now: DateTime<Utc>,
) -> Result<(Circuit, bool), sqlx::Error> {
    let r = sqlx::query!(
        r#"SELECT state AS "state: State", consecutive_failures, times_opened,
                  courier_ts(open_until) AS open_until,
                  courier_circuit_admits(circuits, $2, $3) AS "admits!"
           FROM circuits WHERE connection_id = $1"#,
        connection_id,
        run_id,
        now
    )
    .fetch_one(db)
    .await?;
    let circuit = Circuit {
        state: r.state,
        consecutive_failures: r.consecutive_failures,
        times_opened: r.times_opened,
        open_until: r.open_until,
    };
    Ok((circuit, r.admits))
}

/// The connections whose circuit is closed and that are not left alone as unusable at
/// `now`: their rules may start runs.
pub async fn closed(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT connection_id FROM circuits
         WHERE state = 'closed' AND (unusable_until IS NULL OR unusable_until <= $1)",
        now
    )
    .fetch_all(db)
    .await
}

/// The connections whose open circuit has cooled down (or whose probe ended without an
/// answer) and that are not left alone as unusable at `now`: one run each may probe.
pub async fn wanting_probe(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT connection_id FROM circuits c
         WHERE (c.unusable_until IS NULL OR c.unusable_until <= $1)
           AND courier_circuit_wants_probe(c, $1, NULL)",
        now
    )
    .fetch_all(db)
    .await
}

/// The first moment after `now` at which a circuit cools down or a connection stops being
/// left alone as unusable.
pub async fn next_change(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT courier_ts(LEAST(
             (SELECT min(open_until) FROM circuits WHERE state = 'open' AND open_until > $1),
             (SELECT min(unusable_until) FROM circuits WHERE unusable_until > $1)))",
        now
    )
    .fetch_one(db)
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn closed() -> Circuit {
        Circuit {
            state: State::Closed,
            consecutive_failures: 0,
            times_opened: 0,
            open_until: None,
        }
    }

    #[test]
    fn opens_after_threshold_and_cooldown_doubles_to_cap() {
        let s = BreakerSettings {
            failure_threshold: 3,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(100),
        };
        let now = Utc::now();
        let mut c = closed();
        assert!(!c.observe(false, &s, now));
        assert!(!c.observe(false, &s, now));
        assert!(c.observe(false, &s, now));
        assert_eq!(c.open_until, Some(now + chrono::Duration::seconds(30)));
        c.state = State::HalfOpen;
        assert!(c.observe(false, &s, now), "a failed probe reopens");
        assert_eq!(c.open_until, Some(now + chrono::Duration::seconds(60)));
        c.state = State::HalfOpen;
        c.observe(false, &s, now);
        assert_eq!(c.open_until, Some(now + chrono::Duration::seconds(100)));
        c.state = State::HalfOpen;
        assert!(!c.observe(true, &s, now));
        assert_eq!(c, closed(), "a good probe closes and resets the cooldown");
    }

    #[test]
    fn a_failure_while_open_reopens_for_longer() {
        let s = BreakerSettings::default();
        let now = Utc::now();
        let mut c = closed();
        for _ in 0..5 {
            c.observe(false, &s, now);
        }
        assert_eq!(c.state, State::Open);
        // A run already under way when it opened meets the dead target after the cooldown.
        let later = now + chrono::Duration::seconds(31);
        assert!(c.observe(false, &s, later), "it trips again at once");
        assert_eq!(c.open_until, Some(later + chrono::Duration::seconds(60)));
    }

    #[test]
    fn reachable_answers_reset_the_count() {
        let s = BreakerSettings::default();
        let now = Utc::now();
        let mut c = closed();
        for _ in 0..50 {
            for _ in 0..4 {
                assert!(!c.observe(false, &s, now));
            }
            assert!(!c.observe(true, &s, now));
        }
        assert_eq!(c.state, State::Closed);
    }
}
