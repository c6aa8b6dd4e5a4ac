//! Whether this process can reach its database, as far as it knows: an outage is logged
//! once when it starts and once when it ends, not on every failed statement; and the
//! rescuer judges other processes only after this one has been healthy for a whole
//! liveness window (right after an outage every process looks dead until it beats again).

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// The database's reachability as this process saw it last.
#[derive(Debug)]
pub struct Health {
    /// Since when statements have succeeded (`None` while in an outage).
    healthy_since: Mutex<Option<Instant>>,
    /// When the current outage began.
    down_since: Mutex<Option<Instant>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            healthy_since: Mutex::new(Some(Instant::now())),
            down_since: Mutex::new(None),
        }
    }
}

impl Health {
    /// A statement succeeded.
    pub fn ok(&self) {
        let mut healthy = self.healthy_since.lock().expect("health lock");
        if healthy.is_none() {
            *healthy = Some(Instant::now());
            if let Some(since) = self.down_since.lock().expect("health lock").take() {
                tracing::warn!(outage = ?since.elapsed(), "database answers again");
            }
        }
    }

    /// A statement failed because the database could not be reached.
    pub fn failed(&self, error: &sqlx::Error) {
        let mut healthy = self.healthy_since.lock().expect("health lock");
        if healthy.take().is_some() {
            *self.down_since.lock().expect("health lock") = Some(Instant::now());
            tracing::error!(%error, "database unreachable; retrying until it answers");
        }
    }

    /// Whether statements have succeeded for at least `window`.
    pub fn healthy_for(&self, window: Duration) -> bool {
        self.healthy_since
            .lock()
            .expect("health lock")
            .is_some_and(|t| t.elapsed() >= window)
    }
}

/// Whether `e` says the database could not be reached (as opposed to a statement it
/// refused): worth retrying the same statement once it answers.
pub fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        // admin_shutdown, crash_shutdown, cannot_connect_now, connection exceptions.
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_resets_the_healthy_window() {
        let h = Health::default();
        assert!(h.healthy_for(Duration::ZERO));
        h.failed(&sqlx::Error::PoolTimedOut);
        assert!(!h.healthy_for(Duration::ZERO));
        h.ok();
        assert!(h.healthy_for(Duration::ZERO));
        assert!(!h.healthy_for(Duration::from_secs(60)));
    }

    #[test]
    fn refusals_are_not_outages() {
        assert!(is_outage(&sqlx::Error::PoolTimedOut));
        assert!(!is_outage(&sqlx::Error::RowNotFound));
    }
}
