//! The triage stage (pure): which claimed deliveries are suppressed (an erased person's
//! among them), which are held, and which go to the target. Nothing here asks the writer or takes a request slot.
//! A delete is never unchanged (the record is there to remove whatever its payload), and
//! a delete of a rule that states no `request.delete` is rejected here, never sent.

use chrono::{DateTime, Utc};

use super::claim::Claimed;
use crate::{
    enqueue::Op,
    erasure::gate::{self, Passage},
    ledger::{Entry, Outcome},
    retry::RetryPolicy,
};

/// A batch sorted by what happens to each delivery.
#[derive(Debug, Default)]
pub struct Triage {
    /// Outcomes decided without a call (suppressed, held).
    pub decided: Vec<Entry>,
    /// Indexes into the claimed batch of the deliveries to send.
    pub to_send: Vec<usize>,
}

/// How long a delivery may wait for its `depends_on`, counted from its enqueue.
#[derive(Clone, Copy, Debug)]
pub struct DependencyTimeout(pub chrono::Duration);

/// The reason a delete of a rule that states no `request.delete` is rejected with.
pub const NO_DELETE: &str =
    "a delete, and the rule states no request.delete (how its target deletes a record)";

/// Sorts `claimed` at `now` under the rule's `retry` policy; `deletes` when the rule
/// states how its target deletes a record.
pub fn triage(
    claimed: &[Claimed],
    retry: &RetryPolicy,
    dependency_timeout: DependencyTimeout,
    deletes: bool,
    now: DateTime<Utc>,
) -> Triage {
    let mut t = Triage::default();
    for (i, d) in claimed.iter().enumerate() {
        let decided = |outcome, error: &str, next_attempt_at| Entry {
            delivery_id: d.id,
            outcome,
            attempt: d.attempts,
            http_status: None,
            error: Some(error.into()),
            duration_ms: None,
            next_attempt_at,
            at: now,
        };
        if let Passage::Erased(erasure) = d.passage {
            let error = format!("its person is erased (erasure {erasure})");
            t.decided.push(decided(Outcome::Suppressed, &error, None));
        } else if d.passage == Passage::Unchecked {
            let next = now + chrono::Duration::minutes(1);
            t.decided
                .push(decided(Outcome::Held, gate::UNCHECKED, Some(next)));
        } else if d.superseded {
            t.decided.push(decided(
                Outcome::Suppressed,
                "superseded by a newer delivery",
                None,
            ));
        } else if d.op == Op::Delete && !deletes {
            t.decided.push(decided(Outcome::Rejected, NO_DELETE, None));
        } else if d.unchanged && d.op == Op::Upsert {
            t.decided.push(decided(
                Outcome::Suppressed,
                "unchanged since last delivered",
                None,
            ));
        } else if let Some(until) = d.hold_until.filter(|&t| t > now) {
            t.decided
                .push(decided(Outcome::Held, "hold_until ahead", Some(until)));
        } else if d.dependency_pending && now - d.created_at > dependency_timeout.0 {
            let key = d.depends_on.as_deref().unwrap_or_default();
            let error = format!(
                "depends_on {key:?} was not delivered within {} h of the enqueue",
                dependency_timeout.0.num_hours()
            );
            t.decided.push(decided(Outcome::Rejected, &error, None));
        } else if d.dependency_pending {
            let next = now + retry.dependency_recheck(now - d.created_at);
            t.decided
                .push(decided(Outcome::Held, "waiting for depends_on", Some(next)));
        } else {
            t.to_send.push(i);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn delivery(id: i64) -> Claimed {
        Claimed {
            id,
            record_key: format!("k{id}"),
            payload: serde_json::json!({}),
            op: Op::Upsert,
            attempts: 2,
            hold_until: None,
            created_at: Utc::now(),
            superseded: false,
            unchanged: false,
            depends_on: None,
            dependency_pending: false,
            identities: Vec::new(),
            passage: Passage::Clear,
        }
    }

    const RETRY: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        backoff_base_ms: 1_000,
        backoff_max_ms: 60_000,
    };

    #[test]
    fn sorts_suppressed_held_and_to_send() {
        let now = Utc::now();
        let far = DateTime::<Utc>::MAX_UTC - Duration::days(1);
        let claimed = vec![
            delivery(1),
            Claimed {
                superseded: true,
                ..delivery(2)
            },
            Claimed {
                unchanged: true,
                ..delivery(3)
            },
            Claimed {
                hold_until: Some(far),
                ..delivery(4)
            },
            Claimed {
                hold_until: Some(now - Duration::seconds(1)),
                ..delivery(5)
            },
            Claimed {
                dependency_pending: true,
                created_at: now - Duration::seconds(10),
                ..delivery(6)
            },
            Claimed {
                dependency_pending: true,
                depends_on: Some("customer:9".into()),
                created_at: now - Duration::hours(25),
                ..delivery(7)
            },
        ];
        let t = triage(
            &claimed,
            &RETRY,
            DependencyTimeout(Duration::hours(24)),
            true,
            now,
        );
        assert_eq!(t.to_send, vec![0, 4]);
        let got: Vec<_> = t
            .decided
            .iter()
            .map(|e| (e.delivery_id, e.outcome, e.attempt, e.next_attempt_at))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, Outcome::Suppressed, 2, None),
                (3, Outcome::Suppressed, 2, None),
                (4, Outcome::Held, 2, Some(far)),
                (6, Outcome::Held, 2, Some(now + Duration::seconds(5))),
                (7, Outcome::Rejected, 2, None),
            ]
        );
        let error = t.decided[4].error.as_deref().unwrap();
        assert!(
            error.contains("\"customer:9\"") && error.contains("24 h"),
            "{error}"
        );
    }

    #[test]
    fn a_delete_is_never_unchanged_and_needs_the_rules_delete() {
        let now = Utc::now();
        let delete = |id| Claimed {
            op: Op::Delete,
            unchanged: true,
            ..delivery(id)
        };
        let claimed = vec![
            delete(1),
            Claimed {
                superseded: true,
                ..delete(2)
            },
        ];
        let sort = |deletes| {
            triage(
                &claimed,
                &RETRY,
                DependencyTimeout(Duration::hours(24)),
                deletes,
                now,
            )
        };
        let t = sort(true);
        assert_eq!(t.to_send, vec![0]);
        assert_eq!(t.decided.len(), 1);
        assert_eq!(
            (t.decided[0].delivery_id, t.decided[0].outcome),
            (2, Outcome::Suppressed)
        );
        let t = sort(false);
        assert!(t.to_send.is_empty());
        let got: Vec<_> = t
            .decided
            .iter()
            .map(|e| (e.delivery_id, e.outcome, e.error.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Outcome::Rejected, Some(NO_DELETE)),
                (
                    2,
                    Outcome::Suppressed,
                    Some("superseded by a newer delivery")
                ),
            ]
        );
    }
}
