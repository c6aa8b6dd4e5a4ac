//! The engine's notion of "now". Every time-dependent decision (due deliveries, backoff,
//! breaker cooldowns, leases, staleness, blocks, pacing slots) reads it from a [`Clock`]
//! and passes it to SQL as a parameter, so tests can move time forward instead of
//! sleeping.
//!
//! # One clock for the fleet
//! Instants that several processes compare are stamped by processes on different hosts,
//! whose wall clocks never agree exactly. So a process's clock is the database server's:
//! [`Clock::sync`] asks the server for its time (`clock_timestamp()`) and takes the answer
//! to stand halfway through the round trip, as NTP does; from then on "now" is that
//! instant plus the time elapsed on this host's monotonic clock, which no wall-clock step
//! moves. The heartbeat syncs at every beat, so the monotonic clock's drift never adds up,
//! and records how far this host's wall clock is off (`workers.clock_offset_ms`, shown by
//! `courier status`). SQL that reads `now()` reads the same clock.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicI64, Ordering},
};

use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// The timer's resolution (tokio's tick): a slot this late is still on time, and no wait
/// is shorter.
pub const RESOLUTION: std::time::Duration = std::time::Duration::from_millis(1);

/// How close to its deadline [`Clock::sleep_until_precise`] hands over from tokio's timer
/// to a blocking thread's sleep: the timer rounds a deadline up to its next tick and wakes
/// the task within a tick more, so three ticks are always more than its lateness.
pub const PRECISE_WITHIN: std::time::Duration = RESOLUTION.saturating_mul(3);

/// A wall clock further than this from the database's is worth a warning (once per
/// process): the process keeps working on the database's clock, but the host's logs and
/// anything else on it read another time.
pub const WARN_OFFSET: Duration = Duration::seconds(1);

/// A measurement that puts the database's clock further behind the followed one than this
/// (µs) is a step of the server's clock, taken as it is; a smaller one is the error of an
/// earlier measurement, and "now" stands still until the clock catches up.
const STEP_MICROS: i64 = 1_000_000;

/// Either the database's clock, followed on this host, or a manual one that only moves
/// when told to.
#[derive(Clone, Debug)]
pub struct Clock {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    /// The database server's clock, measured by [`Clock::sync`] and followed on this
    /// host's monotonic clock in between.
    Database(Arc<Followed>),
    /// The manual time.
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

/// The database's clock as this process follows it.
#[derive(Debug)]
struct Followed {
    /// What this host's wall clock is off by beyond the truth: zero but in tests, which
    /// play a host whose clock is wrong ([`Clock::skewed`]).
    skew: Duration,
    /// The last accepted measurement.
    anchor: Mutex<Anchor>,
    /// The latest time handed out (µs since the epoch): "now" never goes back, not even
    /// when a new measurement puts the database's clock a little behind the followed one.
    latest: AtomicI64,
    /// Whether the wall clock's offset has been warned about.
    warned: AtomicBool,
}

/// One measurement of the database's clock.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    /// When it was taken, on the monotonic clock.
    at: std::time::Instant,
    /// The database's time then.
    db: DateTime<Utc>,
    /// Its round trip: the measurement is good to half of it. `None` before the first
    /// measurement, when the wall clock stands in.
    round_trip: Option<std::time::Duration>,
    /// How far this host's wall clock was ahead of the database's (negative: behind).
    wall_offset: Option<Duration>,
}

/// What one [`Clock::sync`] measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offset {
    /// How far this host's wall clock is ahead of the database's (negative: behind).
    pub wall: Duration,
    /// The round trip of the measurement (its error is at most half of it).
    pub round_trip: std::time::Duration,
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl Clock {
    /// The database's clock, followed on this host; until the first [`Clock::sync`], this
    /// host's wall clock stands in.
    pub fn system() -> Self {
        Self::skewed(Duration::zero())
    }

    /// [`Clock::system`] on a host whose wall clock is off by `skew`: what a test uses to
    /// play several hosts whose clocks disagree.
    pub fn skewed(skew: Duration) -> Self {
        let anchor = Anchor {
            at: std::time::Instant::now(),
            db: Utc::now() + skew,
            round_trip: None,
            wall_offset: None,
        };
        Self {
            source: Source::Database(Arc::new(Followed {
                skew,
                anchor: Mutex::new(anchor),
                latest: AtomicI64::new(i64::MIN),
                warned: AtomicBool::new(false),
            })),
        }
    }

    /// A clock that stands still at `start` until [`Clock::advance`] moves it.
    pub fn manual(start: DateTime<Utc>) -> Self {
        Self {
            source: Source::Manual(Arc::new(Mutex::new(start))),
        }
    }

    /// A clock synced to `pool`'s server, for a command that reads the time once or twice
    /// (`courier status`) rather than following it.
    pub async fn synced(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let clock = Self::system();
        clock.sync(pool).await?;
        Ok(clock)
    }

    /// The current time.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.source {
            Source::Database(f) => f.now(),
            Source::Manual(t) => *t.lock().expect("clock mutex poisoned"),
        }
    }

    /// Measures the database server's clock and follows it from now on (a manual clock
    /// stays as it is and measures nothing). A measurement whose round trip is much slower
    /// than the one followed (a busy pool, a loaded server) is not taken unless that one is
    /// old: its error would be larger. Logs one warning per process when this host's wall
    /// clock is off by more than [`WARN_OFFSET`].
    pub async fn sync(&self, pool: &PgPool) -> Result<Option<Offset>, sqlx::Error> {
        let Source::Database(f) = &self.source else {
            return Ok(None);
        };
        let mut conn = pool.acquire().await?;
        let sent = std::time::Instant::now();
        let db: DateTime<Utc> = sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "now!""#)
            .fetch_one(&mut *conn)
            .await?;
        let round_trip = sent.elapsed();
        drop(conn);
        let half = round_trip / 2;
        let at = sent + half;
        let wall = f.wall_at(at);
        let offset = Offset {
            wall: wall - db,
            round_trip,
        };
        {
            let mut anchor = f.anchor.lock().expect("clock mutex poisoned");
            let keep_old = anchor.round_trip.is_some_and(|old| {
                round_trip > old * 4 + std::time::Duration::from_millis(2)
                    && at.duration_since(anchor.at) < std::time::Duration::from_secs(300)
            });
            if !keep_old {
                let first = anchor.round_trip.is_none();
                *anchor = Anchor {
                    at,
                    db,
                    round_trip: Some(round_trip),
                    wall_offset: Some(offset.wall),
                };
                // "Now" never goes back by a measurement's error; the first measurement
                // (the wall clock stood in before it) or a step of the server's own clock
                // is taken as it is.
                let followed = (db + elapsed_since(at)).timestamp_micros();
                let latest = f.latest.load(Ordering::Relaxed);
                if first || latest - followed > STEP_MICROS {
                    f.latest.store(followed, Ordering::Relaxed);
                }
            }
        }
        if offset.wall.abs() > WARN_OFFSET && !f.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                offset_secs = offset.wall.as_seconds_f64(),
                "this host's wall clock is {:+.3} s off the database's; courier keeps time by the database's clock",
                offset.wall.as_seconds_f64()
            );
        }
        Ok(Some(offset))
    }

    /// How far this host's wall clock was off the database's at the measurement followed
    /// (`None` before the first, and for a manual clock).
    pub fn wall_offset(&self) -> Option<Duration> {
        match &self.source {
            Source::Database(f) => f.anchor.lock().expect("clock mutex poisoned").wall_offset,
            Source::Manual(_) => None,
        }
    }

    /// Waits until `at` on this clock. A manual clock does not wait: its time only moves
    /// when a test moves it, and the test asserts on `at` itself.
    pub async fn sleep_until(&self, at: DateTime<Utc>) {
        if let (Source::Database(_), Ok(wait)) = (&self.source, (at - self.now()).to_std()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until `at` on this clock to within a fraction of a millisecond, for a request
    /// slot: a limiter with no burst refuses a call that arrives a little early after one
    /// that arrived a little late, and tokio's timer wakes up to a millisecond or two after
    /// its deadline (whole-millisecond ticks), a spread as wide as the pacer's headroom at
    /// 10 requests/s. Tokio's timer brings the wait near; a blocking thread's sleep (the
    /// OS's fine-grained timer) does the last [`PRECISE_WITHIN`]. A manual clock does not
    /// wait.
    pub async fn sleep_until_precise(&self, at: DateTime<Utc>) {
        if let Source::Manual(_) = self.source {
            return;
        }
        let near = at - Duration::from_std(PRECISE_WITHIN).expect("fits");
        if let Ok(wait) = (near - self.now()).to_std() {
            tokio::time::sleep(wait).await;
        }
        if let Ok(rest) = (at - self.now()).to_std() {
            // A runtime shutting down cancels the sleep: the caller goes a little early.
            let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
        }
    }

    /// Moves a manual clock forward; does nothing to the database's.
    pub fn advance(&self, by: Duration) {
        if let Source::Manual(t) = &self.source {
            *t.lock().expect("clock mutex poisoned") += by;
        }
    }
}

impl Followed {
    /// The database's time now, as followed.
    fn now(&self) -> DateTime<Utc> {
        let anchor = *self.anchor.lock().expect("clock mutex poisoned");
        let followed = anchor.db + elapsed_since(anchor.at);
        // In whole microseconds, PostgreSQL's precision.
        let micros = followed.timestamp_micros();
        let latest = self.latest.fetch_max(micros, Ordering::Relaxed);
        DateTime::from_timestamp_micros(latest.max(micros)).expect("was a time")
    }

    /// This host's wall clock at monotonic instant `at` (recent, at most a round trip ago).
    fn wall_at(&self, at: std::time::Instant) -> DateTime<Utc> {
        Utc::now() + self.skew - elapsed_since(at)
    }
}

/// The monotonic time elapsed since `at`, as a chrono duration.
fn elapsed_since(at: std::time::Instant) -> Duration {
    Duration::from_std(at.elapsed()).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_clock_never_goes_back() {
        let clock = Clock::system();
        let Source::Database(f) = &clock.source else {
            unreachable!()
        };
        let first = clock.now();
        // A measurement that puts the database's clock a second behind the followed one.
        f.anchor.lock().unwrap().db -= Duration::seconds(1);
        let second = clock.now();
        assert!(second >= first, "{second} went back from {first}");
        assert!(second - first < Duration::milliseconds(100));
    }

    #[test]
    fn a_skewed_clock_reads_its_skew_until_synced() {
        let ahead = Clock::skewed(Duration::hours(1));
        let gap = ahead.now() - Utc::now();
        assert!(
            (gap - Duration::hours(1)).abs() < Duration::seconds(1),
            "{gap}"
        );
        assert_eq!(ahead.wall_offset(), None);
    }
}
