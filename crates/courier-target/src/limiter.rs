//! The target's rate limiter and its peak meter. Both take the time as a parameter, so
//! their tests step through time without sleeping.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// How the limiter counts requests against its budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// Fixed windows of one period, aligned to the first request: the count resets at
    /// each window's end (so a burst may straddle two windows).
    #[default]
    Fixed,
    /// A sliding log: a request passes when fewer than the limit arrived in the last period
    /// (Django REST Framework's throttle works this way).
    Sliding,
}

impl std::str::FromStr for Window {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fixed" => Ok(Window::Fixed),
            "sliding" => Ok(Window::Sliding),
            other => Err(format!("window must be fixed or sliding, not {other:?}")),
        }
    }
}

/// A limit of `limit` requests per `period`, in one of two window kinds.
#[derive(Clone, Debug)]
pub struct Limiter {
    /// Requests allowed per period.
    limit: u32,
    /// The period (1 s for User.com).
    period: Duration,
    /// The window kind.
    window: Window,
    /// Fixed windows: where the current window started and how many it let through.
    fixed: Option<(Instant, u32)>,
    /// Sliding log: arrival times of the requests let through within the last period.
    log: VecDeque<Instant>,
}

impl Limiter {
    /// A limiter letting `limit` requests (at least 1) through per `period`.
    pub fn new(limit: u32, period: Duration, window: Window) -> Self {
        Self {
            limit: limit.max(1),
            period: period.max(Duration::from_millis(1)),
            window,
            fixed: None,
            log: VecDeque::new(),
        }
    }

    /// Admits a request arriving at `now`, or answers how long until one would pass.
    pub fn check(&mut self, now: Instant) -> Result<(), Duration> {
        match self.window {
            Window::Fixed => {
                let (start, count) = self.fixed.get_or_insert((now, 0));
                if now >= *start + self.period {
                    // Move to the window holding `now`, aligned to the first one.
                    let periods = (now - *start).as_nanos() / self.period.as_nanos();
                    *start += self.period * periods as u32;
                    *count = 0;
                }
                if *count < self.limit {
                    *count += 1;
                    Ok(())
                } else {
                    Err(*start + self.period - now)
                }
            }
            Window::Sliding => {
                while self.log.front().is_some_and(|&t| t + self.period <= now) {
                    self.log.pop_front();
                }
                if (self.log.len() as u32) < self.limit {
                    self.log.push_back(now);
                    Ok(())
                } else {
                    Err(self.log[0] + self.period - now)
                }
            }
        }
    }
}

/// A wait in whole seconds, rounded up (at least 1), as DRF's `Retry-After` gives it.
pub fn whole_seconds_up(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// The most requests seen in any sliding second and any sliding minute.
#[derive(Clone, Debug, Default)]
pub struct PeakMeter {
    /// Arrival times within the last minute.
    log: VecDeque<Instant>,
    /// Highest count in any one-second span so far.
    pub per_second: u64,
    /// Highest count in any one-minute span so far.
    pub per_minute: u64,
}

impl PeakMeter {
    /// Records a request arriving at `now` (times must not go backwards).
    pub fn record(&mut self, now: Instant) {
        const MINUTE: Duration = Duration::from_secs(60);
        const SECOND: Duration = Duration::from_secs(1);
        while self.log.front().is_some_and(|&t| t + MINUTE <= now) {
            self.log.pop_front();
        }
        self.log.push_back(now);
        let in_second = self.log.len() - self.log.partition_point(|&t| t + SECOND <= now);
        self.per_second = self.per_second.max(in_second as u64);
        self.per_minute = self.per_minute.max(self.log.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fixed_window_refuses_the_eleventh_and_resets_at_the_boundary() {
        let t0 = Instant::now();
        let mut l = Limiter::new(10, S, Window::Fixed);
        for i in 0..10 {
            assert_eq!(l.check(t0 + ms(i * 10)), Ok(()), "request {i}");
        }
        assert_eq!(l.check(t0 + ms(300)), Err(ms(700)));
        assert_eq!(whole_seconds_up(ms(700)), 1);
        // The window started at t0: at t0 + 1 s a new one opens with a full budget.
        for i in 0..10 {
            assert_eq!(l.check(t0 + S + ms(i)), Ok(()), "second window {i}");
        }
        assert_eq!(l.check(t0 + ms(1999)), Err(ms(1)));
        // A quiet spell skips whole windows, staying aligned.
        assert_eq!(l.check(t0 + ms(5_500)), Ok(()));
        for _ in 0..9 {
            assert_eq!(l.check(t0 + ms(5_600)), Ok(()));
        }
        assert_eq!(l.check(t0 + ms(5_600)), Err(ms(400)));
    }

    #[test]
    fn sliding_log_waits_for_the_oldest_to_leave() {
        let t0 = Instant::now();
        let mut l = Limiter::new(3, S, Window::Sliding);
        assert_eq!(l.check(t0), Ok(()));
        assert_eq!(l.check(t0 + ms(400)), Ok(()));
        assert_eq!(l.check(t0 + ms(800)), Ok(()));
        assert_eq!(l.check(t0 + ms(900)), Err(ms(100)));
        // A fixed window would reset at t0 + 1 s; the log frees one slot only.
        assert_eq!(l.check(t0 + ms(1000)), Ok(()));
        assert_eq!(l.check(t0 + ms(1000)), Err(ms(400)));
        assert_eq!(l.check(t0 + ms(1400)), Ok(()));
    }

    #[test]
    fn longer_periods_round_up_to_whole_seconds() {
        let t0 = Instant::now();
        let mut l = Limiter::new(2, Duration::from_secs(60), Window::Sliding);
        l.check(t0).unwrap();
        l.check(t0 + ms(100)).unwrap();
        let wait = l.check(t0 + ms(30_500)).unwrap_err();
        assert_eq!(wait, ms(29_500));
        assert_eq!(whole_seconds_up(wait), 30);
        assert_eq!(whole_seconds_up(Duration::ZERO), 1);
        assert_eq!(whole_seconds_up(S * 2), 2);
    }

    #[test]
    fn peaks_cover_any_sliding_second_and_minute() {
        let t0 = Instant::now();
        let mut p = PeakMeter::default();
        // 5 requests in [0.6 s, 1.4 s): no aligned second holds them all, a sliding one does.
        for i in 0..5 {
            p.record(t0 + ms(600 + i * 200));
        }
        assert_eq!(p.per_second, 5);
        p.record(t0 + ms(2_500));
        assert_eq!(p.per_second, 5);
        assert_eq!(p.per_minute, 6);
        p.record(t0 + ms(61_000));
        assert_eq!(p.per_minute, 6, "the early ones left the minute");
    }
}
