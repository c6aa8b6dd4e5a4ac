//! Whether this process can reach its database, as far as it knows: an outage is logged
//! once when it starts and once when it ends, not on every failed statement; and how far
//! the rescuer may judge other processes: right after an outage every process looks dead
//! until it beats again, so a process that has been cut off judges others only once it has
//! been healthy for a whole liveness window again (see
//! [`Rescuer`](crate::maintenance::rescuer::Rescuer)). Time comes from the engine's
//! [`Clock`].

use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::clock::Clock;

/// The database's reachability as this process saw it last.
#[derive(Debug)]
pub struct Health {
    /// Where "now" comes from.
    clock: Clock,
    /// Since when statements have succeeded (`None` while in an outage).
    healthy_since: Mutex<Option<DateTime<Utc>>>,
    /// When the current outage began.
    down_since: Mutex<Option<DateTime<Utc>>>,
    /// Whether this process has met an outage since it started: until then, others'
    /// beats and sessions as it reads them are as current as its own.
    ever_cut_off: std::sync::atomic::AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        Self::new(Clock::system())
    }
}

impl Health {
    /// Healthy from now on `clock` (a process starts once it has reached the database).
    pub fn new(clock: Clock) -> Self {
        Self {
            healthy_since: Mutex::new(Some(clock.now())),
            down_since: Mutex::new(None),
            ever_cut_off: Default::default(),
            clock,
        }
    }

    /// A statement succeeded.
    pub fn ok(&self) {
        let mut healthy = self.healthy_since.lock().expect("health lock");
        if healthy.is_none() {
            let now = self.clock.now();
            *healthy = Some(now);
            if let Some(since) = self.down_since.lock().expect("health lock").take() {
                let outage = (now - since).to_std().unwrap_or_default();
                tracing::warn!(?outage, "database answers again");
            }
        }
    }

    /// A statement failed because the database could not be reached.
    pub fn failed(&self, error: &sqlx::Error) {
        let mut healthy = self.healthy_since.lock().expect("health lock");
        self.ever_cut_off
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if healthy.take().is_some() {
            *self.down_since.lock().expect("health lock") = Some(self.clock.now());
            tracing::error!(%error, "database unreachable; retrying until it answers");
        }
    }

    /// Whether statements have succeeded for at least `window`.
    pub fn healthy_for(&self, window: std::time::Duration) -> bool {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
        self.healthy_since
            .lock()
            .expect("health lock")
            .is_some_and(|t| self.clock.now() - t >= window)
    }

    /// Whether this process has reached the database ever since it started (no outage
    /// met), and for at least `window`.
    pub fn never_cut_off_for(&self, window: std::time::Duration) -> bool {
        !self.ever_cut_off.load(std::sync::atomic::Ordering::Relaxed) && self.healthy_for(window)
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

    use std::time::Duration;

    #[test]
    fn an_outage_resets_the_healthy_window() {
        let clock = Clock::manual(Utc::now());
        let h = Health::new(clock.clone());
        assert!(h.healthy_for(Duration::ZERO));
        assert!(!h.healthy_for(Duration::from_secs(6)));
        clock.advance(chrono::Duration::seconds(6));
        assert!(h.healthy_for(Duration::from_secs(6)));
        assert!(h.never_cut_off_for(Duration::from_secs(6)));
        h.failed(&sqlx::Error::PoolTimedOut);
        assert!(!h.healthy_for(Duration::ZERO));
        h.ok();
        assert!(h.healthy_for(Duration::ZERO));
        clock.advance(chrono::Duration::seconds(60));
        assert!(h.healthy_for(Duration::from_secs(60)));
        assert!(
            !h.never_cut_off_for(Duration::ZERO),
            "an outage, once met, is remembered"
        );
    }

    #[test]
    fn refusals_are_not_outages() {
        assert!(is_outage(&sqlx::Error::PoolTimedOut));
        assert!(!is_outage(&sqlx::Error::RowNotFound));
    }
}
