//! The engine's notion of "now". Every time-dependent decision (due deliveries, backoff,
//! breaker cooldowns, leases, staleness) reads it from a [`Clock`] and passes it to SQL as a
//! parameter, so tests can move time forward instead of sleeping.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

/// How close to its deadline [`Clock::sleep_until_precise`] hands over from tokio's timer
/// to a blocking thread's sleep: more than the timer's lateness, little enough that the
/// blocking pool is barely used.
pub const PRECISE_WITHIN: std::time::Duration = std::time::Duration::from_millis(3);

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

    /// Waits until `at` on the system clock to within a fraction of a millisecond, for a
    /// request slot: a limiter with no burst refuses a call that arrives a little early
    /// after one that arrived a little late, and tokio's timer wakes up to a millisecond
    /// or two after its deadline (whole-millisecond ticks), a spread as wide as the pacer's
    /// headroom at 10 requests/s. Tokio's timer brings the wait near; a blocking thread's
    /// sleep (the OS's fine-grained timer) does the last [`PRECISE_WITHIN`]. A manual clock
    /// does not wait.
    pub async fn sleep_until_precise(&self, at: DateTime<Utc>) {
        if self.manual.is_some() {
            return;
        }
        let near = at - Duration::from_std(PRECISE_WITHIN).expect("fits");
        if let Ok(wait) = (near - Utc::now()).to_std() {
            tokio::time::sleep(wait).await;
        }
        if let Ok(rest) = (at - Utc::now()).to_std() {
            // A runtime shutting down cancels the sleep: the caller goes a little early.
            let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
        }
    }

    /// Moves a manual clock forward; does nothing to the system clock.
    pub fn advance(&self, by: Duration) {
        if let Some(t) = &self.manual {
            *t.lock().expect("clock mutex poisoned") += by;
        }
    }
}
