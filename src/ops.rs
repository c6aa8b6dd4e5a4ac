//! Operator actions, shared by the command line (`courier retry`, `courier rule
//! pause|resume`, `courier connection pause|resume|unblock`, `courier history`) and the
//! dashboard: each is one short transaction, says what it changed, and names an unknown
//! rule or connection in its error.
//!
//! - A **pause** is a column (`rules.paused`, `connections.paused`): it survives restarts
//!   and every process sees it. The dispatcher starts no run for a paused rule nor for a
//!   rule on a paused connection; a run under way ends `paused` at its next batch
//!   boundary, its backlog left pending. Resuming wakes the dispatchers at once.
//! - A **retry** makes a rule's exhausted (or rejected) deliveries pending again, with
//!   their attempts reset so the rule's retry policy applies afresh, and records a ledger
//!   row `retried` naming who asked. Only the newest delivery of a key is retried: one
//!   whose key has a newer delivery, in any state, is left alone (the newer record wins).
//! - **Unblocking** deletes a budget's rate-limit block; a trigger tells every process's
//!   in-memory copy, and runs waiting the block out are woken.
//! - **History** lists one record key's deliveries and ledger rows, oldest first.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

pub use crate::ledger::HistoryEntry;
use crate::{
    catalog::{self, Paused},
    ledger::{self, DeliveryStatus, Outcome},
    ratelimit::blocks,
    runs,
};

/// Why an operator action could not be done.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// No rule or connection has that name.
    #[error("no {kind} named {name:?}")]
    NotFound {
        /// `rule` or `connection`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The request itself is wrong (e.g. retrying an outcome that cannot be retried).
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

/// What a pause or resume did: the state before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Changed {
    /// Whether it was paused before.
    pub was_paused: bool,
    /// Whether it is paused now.
    pub paused: bool,
}

impl Changed {
    /// Whether anything changed.
    pub fn changed(&self) -> bool {
        self.was_paused != self.paused
    }

    fn state(paused: bool) -> &'static str {
        if paused { "paused" } else { "active" }
    }
}

impl std::fmt::Display for Changed {
    /// `active → paused`, or `already paused` when nothing changed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.changed() {
            write!(
                f,
                "{} → {}",
                Self::state(self.was_paused),
                Self::state(self.paused)
            )
        } else {
            write!(f, "already {}", Self::state(self.paused))
        }
    }
}

/// Who asked, for the ledger: `courier CLI (user@host)` unless said otherwise.
pub fn default_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!("courier CLI ({user}@{host})")
}

/// Makes rule `rule`'s deliveries whose outcome is one of `outcomes` (exhausted, rejected)
/// pending again, due now, with attempts reset; with `since`, only those that ended at or
/// after it. Returns how many were made pending. The ledger names [`default_actor`].
pub async fn retry(
    pool: &PgPool,
    rule: &str,
    outcomes: &[Outcome],
    since: Option<DateTime<Utc>>,
) -> Result<u64, OpsError> {
    retry_as(pool, rule, outcomes, since, &default_actor()).await
}

/// [`retry`], recording `actor` as who asked (the dashboard names itself).
pub async fn retry_as(
    pool: &PgPool,
    rule: &str,
    outcomes: &[Outcome],
    since: Option<DateTime<Utc>>,
    actor: &str,
) -> Result<u64, OpsError> {
    let mut statuses = Vec::new();
    for o in outcomes {
        match o {
            Outcome::Exhausted => statuses.push(DeliveryStatus::Exhausted.as_str()),
            Outcome::Rejected => statuses.push(DeliveryStatus::Rejected.as_str()),
            other => {
                return Err(OpsError::Invalid(format!(
                    "only exhausted and rejected deliveries can be retried, not {}",
                    other.as_str()
                )));
            }
        }
    }
    if statuses.is_empty() {
        return Err(OpsError::Invalid(
            "name at least one outcome to retry (exhausted, rejected)".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    let rule_id = rule_id(&mut tx, rule).await?;
    // The deliveries are due now; a trigger on deliveries wakes the dispatchers.
    let n = ledger::retry(&mut tx, rule_id, &statuses, since, actor).await?;
    tx.commit().await?;
    Ok(n)
}

async fn rule_id(tx: &mut sqlx::PgConnection, rule: &str) -> Result<i64, OpsError> {
    catalog::rule_id(&mut *tx, rule)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            kind: "rule",
            name: rule.to_owned(),
        })
}

/// Pauses (or resumes) rule `rule`. Resuming wakes the dispatchers, so its backlog is
/// dispatched at once.
pub async fn set_rule_paused(pool: &PgPool, rule: &str, paused: bool) -> Result<Changed, OpsError> {
    set_paused(pool, Paused::Rule, rule, paused).await
}

/// Pauses (or resumes) connection `connection`: none of its rules gets a run while it is
/// paused. Resuming wakes the dispatchers.
pub async fn set_connection_paused(
    pool: &PgPool,
    connection: &str,
    paused: bool,
) -> Result<Changed, OpsError> {
    set_paused(pool, Paused::Connection, connection, paused).await
}

async fn set_paused(
    pool: &PgPool,
    what: Paused,
    name: &str,
    paused: bool,
) -> Result<Changed, OpsError> {
    let mut tx = pool.begin().await?;
    let was = catalog::set_paused(&mut tx, what, name, paused)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            kind: what.kind(),
            name: name.to_owned(),
        })?;
    // A resume wakes the dispatchers by the trigger on the column (rules_resumed,
    // connections_resumed), as a plain SQL update does.
    tx.commit().await?;
    Ok(Changed {
        was_paused: was,
        paused,
    })
}

/// Lifts the rate-limit block on connection `connection`'s budget (which every connection
/// sharing its budget key shares). Returns the number of blocks lifted (0 or 1). Every
/// process hears of it by NOTIFY; runs waiting the block out are due at once and the
/// dispatchers are woken for rules it had kept from starting.
pub async fn unblock_connection(pool: &PgPool, connection: &str) -> Result<u64, OpsError> {
    let mut tx = pool.begin().await?;
    let key = catalog::budget_key_of(&mut *tx, connection)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            kind: "connection",
            name: connection.to_owned(),
        })?;
    let lifted = blocks::lift(&mut *tx, &key).await?;
    if lifted > 0 {
        runs::wake(&mut *tx).await?;
    }
    // Committed first, so the processes' copies hear of it before the woken jobs arrive.
    tx.commit().await?;
    if lifted > 0 {
        runs::wake_waiting(pool, &key).await?;
    }
    Ok(lifted)
}

/// Record key `key`'s deliveries (every rule) and their ledger rows, oldest first (see
/// [`ledger::history`]).
pub async fn history(pool: &PgPool, key: &str) -> Result<Vec<HistoryEntry>, OpsError> {
    Ok(ledger::history(pool, key).await?)
}
