//! Rate limits as a signal (ADR-0036): a 429 blocks the whole connection, and every
//! connection sharing its budget key (table `connection_blocks`), for the wait it asked for, capped at one day, or 60 s when it named
//! none. A later 429 may extend a block, never shorten it. A chain that meets a block sits
//! it out when the wait is at most `throttle_max_wait` and otherwise ends its run as
//! `throttled`; the dispatcher skips every rule of a blocked connection.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::writer::{DEFAULT_RATE_LIMIT_WAIT, MAX_RATE_LIMIT_WAIT};

/// The shortest block a 429 sets: a target answering `retry-after: 0` is not hammered.
pub const MIN_BLOCK: Duration = Duration::from_secs(1);

/// The block a rate-limit response sets, from the wait it named: 60 s when it named none,
/// at least [`MIN_BLOCK`], at most one day.
pub fn block_length(wait: Option<Duration>) -> Duration {
    wait.unwrap_or(DEFAULT_RATE_LIMIT_WAIT)
        .clamp(MIN_BLOCK, MAX_RATE_LIMIT_WAIT)
}

/// What a chain does about a block ending at `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No block: go on.
    Proceed,
    /// Sit it out: run again at this time.
    Wait(DateTime<Utc>),
    /// Too long: end the run as throttled.
    Throttle(DateTime<Utc>),
}

/// Decides between going on, waiting and ending the run.
pub fn decide(until: Option<DateTime<Utc>>, now: DateTime<Utc>, max_wait: Duration) -> Decision {
    match until {
        Some(t) if t > now => {
            let wait = (t - now).to_std().unwrap_or_default();
            if wait <= max_wait {
                Decision::Wait(t)
            } else {
                Decision::Throttle(t)
            }
        }
        _ => Decision::Proceed,
    }
}

/// Where a 429 came from.
#[derive(Clone, Copy, Debug)]
pub struct Cause<'a> {
    /// The budget (and so the connections) the block holds back.
    pub budget_key: &'a str,
    /// The connection whose call met the 429.
    pub connection_id: i64,
    /// The rule whose call met it.
    pub rule_id: i64,
    /// The run whose call met it.
    pub run_id: i64,
}

/// Blocks a budget until `now + length`, unless it is already blocked for longer (a block
/// is extended, never shortened); returns the block's end as it now stands.
pub async fn block(
    db: impl PgExecutor<'_>,
    cause: &Cause<'_>,
    length: Duration,
    raw: Option<&str>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let until = now + chrono::Duration::from_std(length).expect("capped at a day");
    sqlx::query_scalar!(
        "INSERT INTO connection_blocks
            (budget_key, connection_id, blocked_until, rule_id, run_id, retry_after_raw, set_at)
         VALUES ($7, $1, $2, $3, $4, $5, $6)
         ON CONFLICT (budget_key) DO UPDATE SET
            connection_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                                 THEN EXCLUDED.connection_id ELSE connection_blocks.connection_id END,
            blocked_until = GREATEST(connection_blocks.blocked_until, EXCLUDED.blocked_until),
            rule_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                           THEN EXCLUDED.rule_id ELSE connection_blocks.rule_id END,
            run_id = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                          THEN EXCLUDED.run_id ELSE connection_blocks.run_id END,
            retry_after_raw = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                                   THEN EXCLUDED.retry_after_raw ELSE connection_blocks.retry_after_raw END,
            set_at = CASE WHEN EXCLUDED.blocked_until > connection_blocks.blocked_until
                          THEN EXCLUDED.set_at ELSE connection_blocks.set_at END
         RETURNING blocked_until",
        cause.connection_id,
        until,
        cause.rule_id,
        cause.run_id,
        raw,
        now,
        cause.budget_key
    )
    .fetch_one(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_up_to_the_bound_are_sat_out() {
        let now = Utc::now();
        let max = Duration::from_secs(300);
        let at = |s: i64| Some(now + chrono::Duration::seconds(s));
        assert_eq!(decide(None, now, max), Decision::Proceed);
        assert_eq!(decide(at(0), now, max), Decision::Proceed);
        assert_eq!(decide(at(1), now, max), Decision::Wait(at(1).unwrap()));
        assert_eq!(decide(at(300), now, max), Decision::Wait(at(300).unwrap()));
        assert_eq!(
            decide(at(301), now, max),
            Decision::Throttle(at(301).unwrap())
        );
        assert_eq!(block_length(None), Duration::from_secs(60));
        assert_eq!(
            block_length(Some(Duration::from_secs(86_401))),
            Duration::from_secs(86_400)
        );
        assert_eq!(block_length(Some(Duration::ZERO)), MIN_BLOCK);
    }
}
