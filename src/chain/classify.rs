//! The classify stage (pure): what one answered call means for its delivery, for the
//! circuit breaker, and for the connection's budget.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::claim::Claimed;
use crate::{
    ledger::{Entry, Outcome},
    retry::{Retry, RetryPolicy},
    writer::{Receipt, WriteError},
};

/// One call's answer as the rest of the job needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Classified {
    /// An outcome to record. `reachable` is what the breaker hears (`None`: the writer
    /// refused the payload before sending, which says nothing about the target).
    Outcome {
        /// The ledger entry.
        entry: Entry,
        /// Whether the call proved the target reachable.
        reachable: Option<bool>,
    },
    /// HTTP 429: nothing is recorded against the delivery; the budget gets blocked. A 429
    /// proves the target reachable.
    RateLimited {
        /// The wait the response asked for.
        wait: Option<Duration>,
        /// The raw header value that named it.
        raw: Option<String>,
    },
}

/// Classifies the answer to the call for `d`, which took `elapsed` and ended at `at`.
/// `jitter` in 0..=1 is the backoff's random draw.
pub fn classify(
    d: &Claimed,
    result: Result<Receipt, WriteError>,
    elapsed: Duration,
    retry: &RetryPolicy,
    at: DateTime<Utc>,
    jitter: f64,
) -> Classified {
    let attempt = d.attempts.saturating_add(1);
    let entry = |outcome, http_status: Option<u16>, error, next_attempt_at| Entry {
        delivery_id: d.id,
        outcome,
        attempt,
        http_status: http_status.map(|s| s as i16),
        error,
        duration_ms: Some(elapsed.as_millis().min(i32::MAX as u128) as i32),
        next_attempt_at,
        at,
    };
    match result {
        Ok(receipt) => Classified::Outcome {
            entry: entry(Outcome::Delivered, receipt.http_status, None, None),
            reachable: Some(true),
        },
        Err(WriteError::RateLimited { wait, raw, .. }) => Classified::RateLimited { wait, raw },
        Err(e) => {
            let reachable = match &e {
                WriteError::Permanent { status: None, .. } => None,
                other => Some(other.proves_reachable()),
            };
            let (outcome, next) = match &e {
                WriteError::Permanent { .. } => (Outcome::Rejected, None),
                _ => match retry.after_failure(attempt, jitter) {
                    Retry::Exhausted => (Outcome::Exhausted, None),
                    Retry::After(delay) => (Outcome::Failed, Some(at + delay)),
                },
            };
            Classified::Outcome {
                entry: entry(outcome, e.http_status(), Some(e.to_string()), next),
                reachable,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        backoff_base_ms: 1_000,
        backoff_max_ms: 60_000,
    };

    fn delivery(attempts: i32) -> Claimed {
        Claimed {
            id: 7,
            record_key: "k".into(),
            payload: serde_json::json!({}),
            attempts,
            hold_until: None,
            created_at: Utc::now(),
            superseded: false,
            unchanged: false,
            depends_on: None,
            dependency_pending: false,
        }
    }

    fn outcome(c: Classified) -> (Outcome, i32, Option<bool>, Option<DateTime<Utc>>) {
        match c {
            Classified::Outcome { entry, reachable } => (
                entry.outcome,
                entry.attempt,
                reachable,
                entry.next_attempt_at,
            ),
            other => panic!("not an outcome: {other:?}"),
        }
    }

    #[test]
    fn answers_map_to_outcomes() {
        let at = Utc::now();
        let ms = Duration::from_millis(5);
        let ok = Ok(Receipt {
            http_status: Some(200),
            ..Receipt::default()
        });
        let transient = || {
            Err(WriteError::Transient {
                status: Some(503),
                message: "down".into(),
            })
        };
        let c = |d: Claimed, r| classify(&d, r, ms, &RETRY, at, 1.0);

        assert_eq!(
            outcome(c(delivery(0), ok)),
            (Outcome::Delivered, 1, Some(true), None)
        );
        assert_eq!(
            outcome(c(delivery(0), transient())),
            (
                Outcome::Failed,
                1,
                Some(false),
                Some(at + chrono::Duration::seconds(1))
            )
        );
        assert_eq!(
            outcome(c(delivery(2), transient())),
            (Outcome::Exhausted, 3, Some(false), None)
        );
        let rejected = Err(WriteError::Permanent {
            status: Some(422),
            message: "bad".into(),
        });
        assert_eq!(
            outcome(c(delivery(0), rejected)),
            (Outcome::Rejected, 1, Some(true), None)
        );
        let refused = Err(WriteError::Permanent {
            status: None,
            message: "no id".into(),
        });
        assert_eq!(
            outcome(c(delivery(0), refused)),
            (Outcome::Rejected, 1, None, None)
        );
        let limited = Err(WriteError::RateLimited {
            wait: Some(Duration::from_secs(3)),
            raw: Some("3".into()),
            rate_headers: Default::default(),
        });
        assert_eq!(
            c(delivery(0), limited),
            Classified::RateLimited {
                wait: Some(Duration::from_secs(3)),
                raw: Some("3".into())
            }
        );
    }
}
