//! The retry policy of a rule: how many attempts a delivery gets and how long it waits
//! between them. Pure: the chain's classify stage asks it what a failed call leads to.

use chrono::Duration;

/// A rule's retry settings (columns `max_attempts`, `backoff_base_ms`, `backoff_max_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts a delivery gets before a transient failure exhausts it.
    pub max_attempts: i32,
    /// The first retry's delay, in milliseconds; each later one doubles it.
    pub backoff_base_ms: i32,
    /// The longest delay between two attempts, in milliseconds.
    pub backoff_max_ms: i32,
}

/// What a transient failure on attempt `attempt` leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Try again after this delay.
    After(Duration),
    /// That was the last attempt.
    Exhausted,
}

impl RetryPolicy {
    /// The verdict after transient failure number `attempt` (1-based); `unit` in 0..=1 is
    /// the jitter's random draw.
    pub fn after_failure(&self, attempt: i32, unit: f64) -> Retry {
        if attempt >= self.max_attempts {
            Retry::Exhausted
        } else {
            Retry::After(self.backoff(attempt, unit))
        }
    }

    /// The delay before retry number `attempt` (1-based): `base · 2^(attempt-1)`, capped
    /// at the maximum, with "equal jitter" (half fixed, half random) so retries of a burst
    /// spread out.
    pub fn backoff(&self, attempt: i32, unit: f64) -> Duration {
        let exp = (attempt.max(1) - 1).min(30) as u32;
        let full = i64::from(self.backoff_base_ms)
            .saturating_mul(1i64 << exp)
            .min(i64::from(self.backoff_max_ms));
        let half = full / 2;
        Duration::milliseconds(half + ((full - half) as f64 * unit.clamp(0.0, 1.0)) as i64)
    }

    /// How long a delivery waiting for its `depends_on` waits before the next look: half
    /// the time waited so far, between the backoff base and cap, so a dependency that
    /// never arrives costs a look now and then, not one every second.
    pub fn dependency_recheck(&self, waited: Duration) -> Duration {
        let base = i64::from(self.backoff_base_ms);
        let half = waited.num_milliseconds().max(0) / 2;
        Duration::milliseconds(half.clamp(base, i64::from(self.backoff_max_ms).max(base)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        backoff_base_ms: 1000,
        backoff_max_ms: 60_000,
    };

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        assert_eq!(POLICY.backoff(1, 0.0), Duration::milliseconds(500));
        assert_eq!(POLICY.backoff(1, 1.0), Duration::milliseconds(1000));
        assert_eq!(POLICY.backoff(3, 1.0), Duration::milliseconds(4000));
        assert_eq!(POLICY.backoff(30, 1.0), Duration::milliseconds(60_000));
        let huge = RetryPolicy {
            max_attempts: 5,
            backoff_base_ms: i32::MAX,
            backoff_max_ms: i32::MAX,
        };
        assert!(huge.backoff(99, 0.5).num_milliseconds() > 0);
    }

    #[test]
    fn the_last_attempt_exhausts() {
        assert_eq!(
            POLICY.after_failure(2, 1.0),
            Retry::After(Duration::milliseconds(2000))
        );
        assert_eq!(POLICY.after_failure(3, 1.0), Retry::Exhausted);
        assert_eq!(POLICY.after_failure(9, 1.0), Retry::Exhausted);
    }

    #[test]
    fn dependency_rechecks_grow_between_base_and_cap() {
        let at = |s| POLICY.dependency_recheck(Duration::seconds(s));
        assert_eq!(at(0), Duration::seconds(1));
        assert_eq!(at(10), Duration::seconds(5));
        assert_eq!(at(86_400), Duration::seconds(60));
    }
}
