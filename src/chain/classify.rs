//! The judgement of one answer (pure): what a call's answer means for each record it
//! carried ([`judge`]) and for the circuit breaker (whether the target answered at all).
//! What it means for the budget is the pacer's to hear ([`crate::paced`]).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::claim::Claimed;
use crate::{
    jobs::Submitted,
    ledger::{Entry, Outcome},
    profile::RuleProfile,
    retry::{Retry, RetryPolicy},
    writer::{Receipt, WriteError, Written, answer::AnswerMap, job::JobShape},
};

/// What one answer means for the records it carried and for the breaker.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// One ledger entry per record the answer decides, in the call's order.
    pub entries: Vec<Entry>,
    /// Records it leaves undecided: they stay pending, untouched.
    pub undecided: Vec<i64>,
    /// What the breaker hears of the call: whether the target answered (`None`: the call
    /// was never sent, which says nothing about the target).
    pub reachable: Option<bool>,
}

/// A job rule's submit answered `result`: a 2xx that names its job gives the job's id; one
/// that names none is, for every record it carried, a transient failure that says so (the
/// target may hold them: they are sent again, and may then be held twice). A submit whose
/// every record was refused before sending made no job: each record's refusal stands.
pub fn submitted(
    shape: &JobShape,
    result: Result<Written, WriteError>,
) -> (Result<Written, WriteError>, Option<String>) {
    match result {
        Ok(w) if w.items.iter().all(Option::is_some) => (Ok(w), None),
        Ok(w) => match shape.target_id(&w.receipt) {
            Ok(id) => (Ok(w), Some(id)),
            Err(why) => (
                Err(WriteError::Transient {
                    status: w.receipt.http_status,
                    message: format!("{why}: the target may hold these records; sent again"),
                }),
                None,
            ),
        },
        Err(e) => (Err(e), None),
    }
}

/// What the target reported of the records `judged` delivered: `accepted` into the job the
/// submit's answer named (the job, to keep), or `unconfirmed` for a rule whose answers are
/// `unreported`; else delivered, as judged.
pub fn as_reported(
    judged: &mut Judgement,
    profile: &RuleProfile,
    target_id: Option<String>,
    at: DateTime<Utc>,
) -> Option<Submitted> {
    let job = match (target_id, &profile.job) {
        (Some(id), Some(shape)) => accepted(judged, id, at, shape),
        _ => None,
    };
    if AnswerMap::unreported(profile.answer.as_ref()) {
        unconfirmed(judged);
    }
    job
}

/// The records a rule's `unreported` answer took: each the answer delivered is
/// `unconfirmed` instead (the target never tells its fate).
fn unconfirmed(judged: &mut Judgement) {
    for e in &mut judged.entries {
        if e.outcome == Outcome::Delivered {
            e.outcome = Outcome::Unconfirmed;
        }
    }
}

/// The records of a submit whose answer named job `target_id`: each the answer delivered
/// is `accepted` instead (its fate is the job's to tell), and the job carries them in the
/// order they were sent; `None` when it carries none.
fn accepted(
    judged: &mut Judgement,
    target_id: String,
    at: DateTime<Utc>,
    shape: &JobShape,
) -> Option<Submitted> {
    let mut delivery_ids = Vec::new();
    for e in &mut judged.entries {
        if e.outcome == Outcome::Delivered {
            e.outcome = Outcome::Accepted;
            delivery_ids.push(e.delivery_id);
        }
    }
    (!delivery_ids.is_empty()).then_some(Submitted {
        target_id,
        delivery_ids,
        at,
        first_poll_seconds: shape.first_poll_seconds,
    })
}

/// Judges the answer `result` to a call that carried `records` (in the call's order),
/// took `elapsed` and ended at `at`; `jitter` draws each backoff's random part (0..=1).
/// A 429 is not judged here: its records stay pending and the budget hears it.
pub fn judge<'c>(
    records: impl Iterator<Item = &'c Claimed>,
    result: &Result<Written, WriteError>,
    elapsed: Duration,
    retry: &RetryPolicy,
    at: DateTime<Utc>,
    mut jitter: impl FnMut() -> f64,
) -> Judgement {
    let mut judgement = Judgement {
        entries: Vec::new(),
        undecided: Vec::new(),
        reachable: crate::paced::reachable(result),
    };
    for (j, d) in records.enumerate() {
        let item = match result {
            Ok(w) => match w.items.get(j) {
                Some(Some(e)) => Err(e.clone()),
                _ => Ok(Receipt {
                    http_status: w.receipt.http_status,
                    ..Receipt::default()
                }),
            },
            Err(e) => Err(e.clone()),
        };
        match classify(d, item, elapsed, retry, at, jitter()) {
            Some(entry) => judgement.entries.push(entry),
            // A 429 for one item (a whole call's only): left pending, untouched.
            None => judgement.undecided.push(d.id),
        }
    }
    judgement
}

/// The outcome of one record from its share of the answer (`None`: a 429, no outcome).
/// `jitter` in 0..=1 is the backoff's random draw.
pub fn classify(
    d: &Claimed,
    result: Result<Receipt, WriteError>,
    elapsed: Duration,
    retry: &RetryPolicy,
    at: DateTime<Utc>,
    jitter: f64,
) -> Option<Entry> {
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
        Ok(receipt) => Some(entry(Outcome::Delivered, receipt.http_status, None, None)),
        Err(WriteError::RateLimited { .. }) => None,
        Err(e) => {
            let (outcome, next) = match &e {
                WriteError::Permanent { .. } => (Outcome::Rejected, None),
                _ => match retry.after_failure(attempt, jitter) {
                    Retry::Exhausted => (Outcome::Exhausted, None),
                    Retry::After(delay) => (Outcome::Failed, Some(at + delay)),
                },
            };
            Some(entry(outcome, e.http_status(), Some(e.to_string()), next))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{paced::answered, ratelimit::answer::Answered};

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
            op: crate::enqueue::Op::Upsert,
            attempts,
            hold_until: None,
            created_at: Utc::now(),
            superseded: false,
            unchanged: false,
            depends_on: None,
            dependency_pending: false,
            identities: Vec::new(),
            passage: Default::default(),
        }
    }

    fn outcome(c: Option<Entry>) -> (Outcome, i32, Option<DateTime<Utc>>) {
        let entry = c.expect("an outcome");
        (entry.outcome, entry.attempt, entry.next_attempt_at)
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

        assert_eq!(outcome(c(delivery(0), ok)), (Outcome::Delivered, 1, None));
        assert_eq!(
            outcome(c(delivery(0), transient())),
            (Outcome::Failed, 1, Some(at + chrono::Duration::seconds(1)))
        );
        assert_eq!(
            outcome(c(delivery(2), transient())),
            (Outcome::Exhausted, 3, None)
        );
        let rejected = Err(WriteError::Permanent {
            status: Some(422),
            message: "bad".into(),
        });
        assert_eq!(
            outcome(c(delivery(0), rejected)),
            (Outcome::Rejected, 1, None)
        );
        let refused = Err(WriteError::Permanent {
            status: None,
            message: "no id".into(),
        });
        assert_eq!(
            outcome(c(delivery(0), refused)),
            (Outcome::Rejected, 1, None)
        );
        let limited = Err(WriteError::RateLimited {
            wait: Some(Duration::from_secs(3)),
            raw: Some("3".into()),
            rate_headers: Default::default(),
        });
        assert_eq!(c(delivery(0), limited), None);
    }

    #[test]
    fn the_breaker_and_the_budget_hear_the_call_once() {
        let written = |items| {
            Ok(Written {
                receipt: Receipt {
                    http_status: Some(207),
                    ..Receipt::default()
                },
                items,
            })
        };
        let refused = WriteError::Permanent {
            status: Some(422),
            message: "bad email".into(),
        };
        // A batch answer with one item refused: the target answered; one entry each.
        let ds = [delivery(0), delivery(1)];
        let result = written(vec![None, Some(refused)]);
        let j = judge(
            ds.iter(),
            &result,
            Duration::ZERO,
            &RETRY,
            Utc::now(),
            || 0.5,
        );
        let outcomes: Vec<_> = j.entries.iter().map(|e| e.outcome).collect();
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Rejected]);
        assert_eq!(j.reachable, Some(true));
        assert_eq!(answered(&result), Answered::NotRefused);
        // Refused by the writer before sending: the breaker hears nothing.
        let unsent: Result<Written, _> = Err(WriteError::Permanent {
            status: None,
            message: "no id".into(),
        });
        let j = judge(
            ds.iter(),
            &unsent,
            Duration::ZERO,
            &RETRY,
            Utc::now(),
            || 0.5,
        );
        assert_eq!(
            (j.reachable, answered(&unsent)),
            (None, Answered::NotRefused)
        );
        // A timeout: the breaker hears the target down; the budget counts the call.
        let down: Result<Written, _> = Err(WriteError::Transient {
            status: None,
            message: "timeout".into(),
        });
        let j = judge(ds.iter(), &down, Duration::ZERO, &RETRY, Utc::now(), || 0.5);
        assert_eq!(
            (j.reachable, answered(&down)),
            (Some(false), Answered::NotRefused)
        );
    }
}
