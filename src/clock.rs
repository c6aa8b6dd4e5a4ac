//! The engine's notion of "now". Every time-dependent decision (due deliveries, backoff,
//! breaker cooldowns, leases, staleness) reads it from a [`Clock`] and passes it to SQL as a
//! parameter, so tests can move time forward instead of sleeping.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

/// Either the system clock or a manual one that only moves when told to.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// `None` reads the system clock; `Some` holds the manual time.
    manual: Option<Arc<Mutex<DateTime<Utc>>>>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self { manual: None }
    }

    /// A clock that stands still at `start` until [`Clock::advance`] moves it.
    pub fn manual(start: DateTime<Utc>) -> Self {
        Self {
            manual: Some(Arc::new(Mutex::new(start))),
        }
    }

    /// The current time.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.manual {
            None => Utc::now(),
            Some(t) => *t.lock().expect("clock mutex poisoned"),
        }
    }

    /// Waits until `at` on the system clock. A manual clock does not wait: its time only
    /// moves when a test moves it, and the test asserts on `at` itself.
    pub async fn sleep_until(&self, at: DateTime<Utc>) {
        if let (None, Ok(wait)) = (&self.manual, (at - Utc::now()).to_std()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Moves a manual clock forward; does nothing to the system clock.
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.manual {
            *t.lock().expect("clock mutex poisoned") += by;
        }
    }
}
