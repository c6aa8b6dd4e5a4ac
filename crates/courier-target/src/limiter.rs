//! The target's rate limiter and its peak meter. Both take the time as a parameter, so
//! their tests step through time without sleeping.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use crate::emulation::{self, RateHeaderNames, TimeUnit, Timed};

/// How the limiter counts requests against its budget (the limiter kind).
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
    /// GCRA, a leaky bucket with no burst unless one is set: requests are spaced at least
    /// `period / limit` apart; one arriving before its theoretical arrival time is refused
    /// with the remaining gap as its wait.
    Gcra,
    /// A token bucket holding `burst` tokens (the limit unless set), refilled at `limit` per
    /// period: a full bucket lets `burst` requests through at once.
    TokenBucket,
}

impl Window {
    /// Every kind, by the name the command line uses.
    pub const ALL: [(&'static str, Window); 4] = [
        ("fixed", Window::Fixed),
        ("sliding", Window::Sliding),
        ("gcra", Window::Gcra),
        ("token-bucket", Window::TokenBucket),
    ];

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, w)| *w == self)
            .map_or("?", |(n, _)| n)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Window {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "fixed" => Ok(Window::Fixed),
            "sliding" => Ok(Window::Sliding),
            "gcra" | "leaky-bucket" => Ok(Window::Gcra),
            "token-bucket" | "token_bucket" => Ok(Window::TokenBucket),
            other => Err(format!(
                "limiter must be fixed, sliding, gcra (leaky-bucket) or token-bucket, not {other:?}"
            )),
        }
    }
}

/// What a limiter has left at one moment: what rate-limit headers state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Requests allowed per period (the sustained rate; a token bucket's burst aside).
    pub limit: u32,
    /// The period.
    pub period: Duration,
    /// Requests that would pass right now, one after the other.
    pub remaining: u32,
    /// With nothing remaining: how long until the next request passes. Otherwise: how
    /// long until the whole budget is back (zero when it already is).
    pub reset: Duration,
}

/// A limit of `limit` requests per `period`, of one [`Window`] kind; the limit may change
/// while it runs ([`Limiter::set_limit`], or a schedule of changes).
#[derive(Clone, Debug)]
pub struct Limiter {
    /// Requests allowed per period.
    limit: u32,
    /// The period.
    period: Duration,
    /// The limiter kind.
    window: Window,
    /// The burst set for GCRA and token bucket; `None`: GCRA 1 (none), token bucket the
    /// limit.
    burst: Option<u32>,
    /// Fixed windows: where the current window started and how many it let through.
    fixed: Option<(Instant, u32)>,
    /// Sliding log: arrival times of the requests let through within the last period.
    log: VecDeque<Instant>,
    /// GCRA and token bucket: the theoretical arrival time of the next request (`None`
    /// before the first).
    tat: Option<Instant>,
    /// Limit changes still to come, in time order: from that moment, that limit.
    schedule: VecDeque<(Instant, u32)>,
}

impl Limiter {
    /// A limiter letting `limit` requests (at least 1) through per `period`.
    pub fn new(limit: u32, period: Duration, window: Window) -> Self {
        Self {
            limit: limit.max(1),
            period: period.max(Duration::from_millis(1)),
            window,
            burst: None,
            fixed: None,
            log: VecDeque::new(),
            tat: None,
            schedule: VecDeque::new(),
        }
    }

    /// Sets the burst of a GCRA or token bucket limiter (at least 1; the others ignore it).
    pub fn with_burst(mut self, burst: Option<u32>) -> Self {
        self.burst = burst.map(|b| b.max(1));
        self
    }

    /// Changes the limit at the given moments (`(at, limit)` in any order), as another
    /// client starting or stopping on the workspace would.
    pub fn with_schedule(mut self, changes: impl IntoIterator<Item = (Instant, u32)>) -> Self {
        let mut changes: Vec<_> = changes.into_iter().collect();
        changes.sort_by_key(|(at, _)| *at);
        self.schedule = changes.into();
        self
    }

    /// The kind.
    pub fn window(&self) -> Window {
        self.window
    }

    /// The limit per period in force (after any scheduled change due by the last call).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The burst in force: how many requests a rested limiter lets through at once.
    pub fn burst(&self) -> u32 {
        match self.window {
            Window::Fixed | Window::Sliding => self.limit,
            Window::Gcra => self.burst.unwrap_or(1),
            Window::TokenBucket => self.burst.unwrap_or(self.limit),
        }
    }

    /// Changes the limit from `now` on (at least 1). What was already let through still
    /// counts: a fixed window over the new limit refuses until it ends; a bucket keeps the
    /// requests it owes, spaced at the new rate.
    pub fn set_limit(&mut self, limit: u32, now: Instant) {
        let limit = limit.max(1);
        if let Some(tat) = self.tat {
            // The debt in requests stays, its length in time follows the new spacing.
            let owed =
                tat.saturating_duration_since(now).as_secs_f64() / self.emission().as_secs_f64();
            self.limit = limit;
            self.tat = Some(now + self.emission().mul_f64(owed));
        }
        self.limit = limit;
    }

    /// The spacing of requests at the sustained rate, `period / limit`.
    fn emission(&self) -> Duration {
        (self.period / self.limit).max(Duration::from_nanos(1))
    }

    /// How far ahead of its spacing a GCRA or token bucket request may come.
    fn tolerance(&self) -> Duration {
        self.emission() * (self.burst() - 1)
    }

    /// Applies the scheduled changes due at `now`.
    fn apply_schedule(&mut self, now: Instant) {
        while let Some(&(at, limit)) = self.schedule.front().filter(|(at, _)| *at <= now) {
            self.schedule.pop_front();
            self.set_limit(limit, at.min(now));
        }
    }

    /// The start of the fixed window holding `now`, aligned to the first one.
    fn fixed_window(&mut self, now: Instant) -> &mut (Instant, u32) {
        let period = self.period;
        let (start, count) = self.fixed.get_or_insert((now, 0));
        if now >= *start + period {
            let periods = (now - *start).as_nanos() / period.as_nanos();
            *start += period * periods as u32;
            *count = 0;
        }
        self.fixed.as_mut().expect("set above")
    }

    /// Admits a request arriving at `now`, or answers how long until one would pass.
    pub fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.apply_schedule(now);
        match self.window {
            Window::Fixed => {
                let (limit, period) = (self.limit, self.period);
                let (start, count) = self.fixed_window(now);
                if *count < limit {
                    *count += 1;
                    Ok(())
                } else {
                    Err(*start + period - now)
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
            Window::Gcra | Window::TokenBucket => {
                let tat = self.tat.map_or(now, |t| t.max(now));
                let allowed_from = tat.checked_sub(self.tolerance()).unwrap_or(now);
                if allowed_from > now {
                    Err(allowed_from - now)
                } else {
                    self.tat = Some(tat + self.emission());
                    Ok(())
                }
            }
        }
    }

    /// What the limiter has left at `now`, without taking anything.
    pub fn budget(&mut self, now: Instant) -> Budget {
        self.apply_schedule(now);
        let (limit, period) = (self.limit, self.period);
        let (remaining, reset) = match self.window {
            Window::Fixed if self.fixed.is_none() => (limit, Duration::ZERO),
            Window::Fixed => {
                let (start, count) = *self.fixed_window(now);
                (limit.saturating_sub(count), start + period - now)
            }
            Window::Sliding => {
                while self.log.front().is_some_and(|&t| t + period <= now) {
                    self.log.pop_front();
                }
                let remaining = limit.saturating_sub(self.log.len() as u32);
                let reset = match (remaining, self.log.front(), self.log.back()) {
                    (0, Some(&oldest), _) => oldest + period - now,
                    (_, _, Some(&newest)) => newest + period - now,
                    _ => Duration::ZERO,
                };
                (remaining, reset)
            }
            Window::Gcra | Window::TokenBucket => {
                let owed = self
                    .tat
                    .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
                let room = (self.tolerance() + self.emission()).saturating_sub(owed);
                let remaining = (room.as_nanos() / self.emission().as_nanos()) as u32;
                let reset = if remaining == 0 {
                    owed.saturating_sub(self.tolerance())
                } else {
                    owed
                };
                (remaining.min(self.burst()), reset)
            }
        };
        Budget {
            limit,
            period,
            remaining,
            reset,
        }
    }
}

/// Which rate-limit headers a workspace's answers carry: none, one of the two generic
/// standards, or those an emulation file names (`presets/<name>.target.json`'s
/// `rate_headers`, chosen by the file's name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(into = "String")]
pub enum RateHeaders {
    /// None.
    #[default]
    None,
    /// The IETF draft's (-10/-11) `RateLimit-Policy: "default";q=L;w=W` and
    /// `RateLimit: "default";r=R;t=T`.
    Ietf,
    /// The common `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` in
    /// seconds from now.
    XRateLimit,
    /// The same with `X-RateLimit-Reset` as the UTC epoch second (GitHub's form).
    XRateLimitEpoch,
    /// Those the emulation file of this name states.
    Emulated(&'static str),
}

/// The common `X-RateLimit-*` fields, with their reset in `unit`.
fn x_ratelimit(unit: TimeUnit) -> RateHeaderNames {
    RateHeaderNames {
        source: "the common X-RateLimit-* fields".into(),
        limit: "x-ratelimit-limit".into(),
        remaining: "x-ratelimit-remaining".into(),
        reset: Some(Timed {
            header: "x-ratelimit-reset".into(),
            unit,
        }),
        window: None,
    }
}

impl RateHeaders {
    /// The generic kinds, by the name the command line uses.
    const GENERIC: [(&'static str, RateHeaders); 4] = [
        ("none", RateHeaders::None),
        ("ietf", RateHeaders::Ietf),
        ("x-ratelimit", RateHeaders::XRateLimit),
        ("x-ratelimit-epoch", RateHeaders::XRateLimitEpoch),
    ];

    /// The name the command line uses: a generic kind's, or the emulation file's.
    pub fn name(self) -> &'static str {
        match self {
            RateHeaders::Emulated(name) => name,
            kind => Self::GENERIC
                .iter()
                .find(|(_, k)| *k == kind)
                .map_or("?", |(n, _)| n),
        }
    }

    /// The three headers it states, unless it is none or the IETF draft's.
    fn names(self) -> Option<RateHeaderNames> {
        match self {
            RateHeaders::None | RateHeaders::Ietf => None,
            RateHeaders::XRateLimit => Some(x_ratelimit(TimeUnit::Seconds)),
            RateHeaders::XRateLimitEpoch => Some(x_ratelimit(TimeUnit::EpochSeconds)),
            RateHeaders::Emulated(name) => emulation::named(name)?.1.rate_headers.clone(),
        }
    }
}

impl From<RateHeaders> for String {
    fn from(r: RateHeaders) -> String {
        r.name().to_owned()
    }
}

impl<'de> serde::Deserialize<'de> for RateHeaders {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for RateHeaders {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some((_, kind)) = Self::GENERIC.iter().find(|(n, _)| *n == s) {
            return Ok(*kind);
        }
        match emulation::named(s) {
            Some((name, e)) if e.rate_headers.is_some() => Ok(RateHeaders::Emulated(name)),
            _ => {
                let emulated: Vec<&str> = emulation::emulations()
                    .iter()
                    .filter(|(_, e)| e.rate_headers.is_some())
                    .map(|(n, _)| *n)
                    .collect();
                Err(format!(
                    "rate headers must be none, ietf, x-ratelimit, x-ratelimit-epoch or an \
                     emulation stating its own ({}), not {s:?}",
                    emulated.join(", ")
                ))
            }
        }
    }
}

/// The headers stating `budget` in `mode`; `now` is the wall-clock time an epoch reset is
/// counted from. Times are whole, as the formats have them, and rounded up, so a client
/// that waits the reset never comes back early. The policy's window is the period in whole
/// seconds (at least one) and its quota the limit over that window.
pub fn rate_headers(
    budget: &Budget,
    mode: RateHeaders,
    now: std::time::SystemTime,
) -> Vec<(String, String)> {
    let secs_up = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let window = Duration::from_secs(secs_up(budget.period).max(1));
    let quota =
        (u128::from(budget.limit) * window.as_nanos() / budget.period.as_nanos().max(1)) as u64;
    if mode == RateHeaders::Ietf {
        return vec![
            (
                "ratelimit-policy".into(),
                format!("\"default\";q={quota};w={}", window.as_secs()),
            ),
            (
                "ratelimit".into(),
                format!(
                    "\"default\";r={};t={}",
                    budget.remaining,
                    secs_up(budget.reset)
                ),
            ),
        ];
    }
    let Some(names) = mode.names() else {
        return Vec::new();
    };
    let mut stated = vec![
        (names.limit.to_lowercase(), quota.to_string()),
        (names.remaining.to_lowercase(), budget.remaining.to_string()),
    ];
    let timed = [(names.reset, budget.reset), (names.window, window)];
    for (header, span) in timed.into_iter().filter_map(|(h, d)| Some((h?, d))) {
        stated.push((
            header.header.to_lowercase(),
            in_unit(span, header.unit, now),
        ));
    }
    stated
}

/// A span from `now` in `unit`, rounded up: whole seconds or milliseconds of the span, or
/// the epoch second of its end.
fn in_unit(span: Duration, unit: TimeUnit, now: std::time::SystemTime) -> String {
    let up = |d: Duration, per: u128| d.as_nanos().div_ceil(1_000_000_000 / per);
    match unit {
        TimeUnit::Seconds => up(span, 1).to_string(),
        TimeUnit::Milliseconds => up(span, 1_000).to_string(),
        TimeUnit::EpochSeconds => {
            let at = (now + span)
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            up(at, 1).to_string()
        }
    }
}

/// Limits on the paths a pattern matches, outside any workspace (as a vendor limits each
/// endpoint, e.g. 350/s and 3,500/min), each a fixed window.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathLimit {
    /// The paths: segments, `*` for one, `**` for any number.
    pub pattern: String,
    /// Each `(limit, period)`.
    pub limits: Vec<(u32, Duration)>,
}

impl PathLimit {
    /// `PATTERN=LIMIT[,LIMIT...]`, each limit `N/s`, `N/min` or `N/h`:
    /// `**/events=350/s,3500/min`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("path limit {s:?}: {why} (e.g. **/events=350/s,3500/min)");
        let (pattern, limits) = s.split_once('=').ok_or_else(|| bad("no ="))?;
        let limits = limits
            .split(',')
            .map(|l| parse_rate(l).map_err(|e| bad(&e)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            pattern: pattern.trim().to_owned(),
            limits,
        })
    }

    /// Its limiters, fresh.
    pub fn limiters(&self) -> Vec<Limiter> {
        self.limits
            .iter()
            .map(|&(n, period)| Limiter::new(n, period, Window::Fixed))
            .collect()
    }
}

/// `N/s`, `N/min` or `N/h`: a limit of N requests per second, minute or hour.
pub fn parse_rate(s: &str) -> Result<(u32, Duration), String> {
    let (n, unit) = s
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("a limit is N/unit, not {s:?}"))?;
    let n: u32 = n
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("N must be a positive integer, not {n:?}"))?;
    let period = match unit {
        "s" => Duration::from_secs(1),
        "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(format!("the unit is s, min or h, not {unit:?}")),
    };
    Ok((n, period))
}

/// Parses a schedule of limit changes, `AFTER:LIMIT[,AFTER:LIMIT...]`, where AFTER is a
/// time since the start such as `10s`, `1500ms` or `2m` (bare numbers are seconds):
/// `10s:5` means "after 10 s the limit becomes 5 per period".
pub fn parse_limit_schedule(s: &str) -> Result<Vec<(Duration, u32)>, String> {
    let item = |part: &str| -> Result<(Duration, u32), String> {
        let bad = || format!("limit schedule item {part:?} must be AFTER:LIMIT, e.g. 10s:5");
        let (after, limit) = part.split_once(':').ok_or_else(bad)?;
        let after = after.trim();
        let (digits, unit) = after
            .find(|c: char| !c.is_ascii_digit())
            .map_or((after, "s"), |i| after.split_at(i));
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let after = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            _ => return Err(bad()),
        };
        let limit: u32 = limit.trim().parse().map_err(|_| bad())?;
        if limit == 0 {
            return Err(format!(
                "limit schedule item {part:?}: the limit must be at least 1"
            ));
        }
        Ok((after, limit))
    };
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(item)
        .collect()
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

/// Whether every limiter of a call admits it at `now` (counted in each when all do); else
/// the longest wait one asks for, and nothing is counted: a window that refuses leaves the
/// others untouched.
pub fn admit_all(limiters: &mut Vec<Limiter>, now: Instant) -> Result<(), Duration> {
    let mut probe = limiters.clone();
    match probe.iter_mut().filter_map(|l| l.check(now).err()).max() {
        Some(wait) => Err(wait),
        None => {
            *limiters = probe;
            Ok(())
        }
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
    fn gcra_without_burst_spaces_requests_by_period_over_limit() {
        let t0 = Instant::now();
        let mut l = Limiter::new(10, S, Window::Gcra);
        assert_eq!(l.burst(), 1);
        assert_eq!(l.check(t0), Ok(()));
        // The next one may come 100 ms later, not earlier: the gap is the wait.
        assert_eq!(l.check(t0 + ms(1)), Err(ms(99)));
        assert_eq!(l.check(t0 + ms(60)), Err(ms(40)));
        assert_eq!(l.check(t0 + ms(100)), Ok(()));
        // A refused request takes nothing: the one at 200 ms still passes.
        assert_eq!(l.check(t0 + ms(150)), Err(ms(50)));
        assert_eq!(l.check(t0 + ms(200)), Ok(()));
        // A quiet spell saves nothing up: no burst after it.
        assert_eq!(l.check(t0 + ms(5_000)), Ok(()));
        assert_eq!(l.check(t0 + ms(5_000)), Err(ms(100)));
        // Exactly ten per second at a steady 100 ms spacing, none refused.
        let mut l = Limiter::new(10, S, Window::Gcra);
        let passed = (0..100)
            .filter(|i| l.check(t0 + ms(i * 100)).is_ok())
            .count();
        assert_eq!(passed, 100);
        // Two clients at 10/s each: half of the 20/s refused.
        let mut l = Limiter::new(10, S, Window::Gcra);
        let passed = (0..200)
            .filter(|i| l.check(t0 + ms(i * 50)).is_ok())
            .count();
        assert_eq!(passed, 100);
    }

    #[test]
    fn token_bucket_lets_a_burst_through_then_refills_at_the_rate() {
        let t0 = Instant::now();
        let mut l = Limiter::new(10, S, Window::TokenBucket).with_burst(Some(5));
        assert_eq!(l.burst(), 5);
        for i in 0..5 {
            assert_eq!(l.check(t0), Ok(()), "burst request {i}");
        }
        assert_eq!(l.check(t0), Err(ms(100)));
        assert_eq!(l.check(t0 + ms(100)), Ok(()), "one token refilled");
        assert_eq!(l.check(t0 + ms(150)), Err(ms(50)));
        // After a rest of 0.5 s the bucket is full again: 5 at once, not more.
        let rested = t0 + ms(700);
        for _ in 0..5 {
            assert_eq!(l.check(rested), Ok(()));
        }
        assert!(l.check(rested).is_err());
        // Unset, the burst is one period's worth.
        let mut l = Limiter::new(10, S, Window::TokenBucket);
        assert_eq!(l.burst(), 10);
        assert_eq!((0..20).filter(|_| l.check(t0).is_ok()).count(), 10);
        // Over 10 s a saturated bucket passes burst + 10/s, so ~10/s sustained.
        let mut l = Limiter::new(10, S, Window::TokenBucket).with_burst(Some(5));
        let passed = (0..1000)
            .filter(|i| l.check(t0 + ms(i * 10)).is_ok())
            .count();
        assert_eq!(passed, 5 + 99);
    }

    #[test]
    fn the_budget_states_what_is_really_left() {
        let t0 = Instant::now();
        let mut l = Limiter::new(3, S, Window::Fixed);
        assert_eq!(l.budget(t0).remaining, 3);
        l.check(t0).unwrap();
        l.check(t0 + ms(200)).unwrap();
        let b = l.budget(t0 + ms(200));
        assert_eq!(
            (b.limit, b.period, b.remaining, b.reset),
            (3, S, 1, ms(800))
        );
        l.check(t0 + ms(300)).unwrap();
        assert_eq!(l.budget(t0 + ms(300)).remaining, 0);
        assert_eq!(l.budget(t0 + ms(1_000)).remaining, 3, "a new window");

        let mut l = Limiter::new(3, S, Window::Sliding);
        l.check(t0).unwrap();
        l.check(t0 + ms(400)).unwrap();
        let b = l.budget(t0 + ms(500));
        assert_eq!(
            (b.remaining, b.reset),
            (1, ms(900)),
            "all back when the newest leaves"
        );
        l.check(t0 + ms(500)).unwrap();
        let b = l.budget(t0 + ms(500));
        assert_eq!(
            (b.remaining, b.reset),
            (0, ms(500)),
            "one back when the oldest leaves"
        );

        let mut l = Limiter::new(10, S, Window::Gcra);
        assert_eq!(l.budget(t0).remaining, 1);
        l.check(t0).unwrap();
        let b = l.budget(t0 + ms(30));
        assert_eq!((b.remaining, b.reset), (0, ms(70)));
        assert_eq!(l.budget(t0 + ms(100)).remaining, 1);

        let mut l = Limiter::new(10, S, Window::TokenBucket).with_burst(Some(4));
        assert_eq!(l.budget(t0).remaining, 4);
        l.check(t0).unwrap();
        l.check(t0).unwrap();
        let b = l.budget(t0);
        assert_eq!((b.remaining, b.reset), (2, ms(200)), "full again in 200 ms");
        l.check(t0).unwrap();
        l.check(t0).unwrap();
        let b = l.budget(t0 + ms(50));
        assert_eq!(
            (b.remaining, b.reset),
            (0, ms(50)),
            "the next token in 50 ms"
        );
        // Whatever the budget says is left passes, and no more.
        for kind in [
            Window::Fixed,
            Window::Sliding,
            Window::Gcra,
            Window::TokenBucket,
        ] {
            let mut l = Limiter::new(5, S, kind).with_burst(Some(3));
            for step in 0..40u64 {
                let now = t0 + ms(step * 37);
                let left = l.budget(now).remaining;
                for i in 0..left {
                    assert_eq!(l.check(now), Ok(()), "{kind} step {step}: {i} of {left}");
                }
                assert!(
                    l.check(now).is_err(),
                    "{kind} step {step}: more than {left}"
                );
            }
        }
    }

    #[test]
    fn the_limit_changes_while_running() {
        let t0 = Instant::now();
        // Another client starts at 2 s: the limit drops from 10 to 5 per second.
        let mut l = Limiter::new(10, S, Window::Sliding)
            .with_schedule([(t0 + ms(2_000), 5), (t0 + ms(4_000), 10)]);
        let per_second = |l: &mut Limiter, from: u64| {
            (0..100)
                .filter(|i| l.check(t0 + ms(from + i * 10)).is_ok())
                .count()
        };
        assert_eq!(per_second(&mut l, 0), 10);
        assert_eq!(per_second(&mut l, 1_000), 10);
        assert_eq!(l.limit(), 10);
        assert_eq!(per_second(&mut l, 2_000), 5);
        assert_eq!(l.limit(), 5);
        assert_eq!(per_second(&mut l, 3_000), 5);
        assert_eq!(per_second(&mut l, 4_000), 10, "and back");

        // A bucket keeps its debt in requests: one owed is 100 ms at 10/s, 200 ms at 5/s.
        let mut l = Limiter::new(10, S, Window::Gcra);
        for i in 0..3 {
            l.check(t0 + ms(i * 100)).unwrap();
        }
        l.set_limit(5, t0 + ms(200));
        assert_eq!(l.check(t0 + ms(250)), Err(ms(150)));
        assert_eq!(l.check(t0 + ms(400)), Ok(()));
        assert_eq!(l.check(t0 + ms(500)), Err(ms(100)));
        // A fixed window over its new limit refuses until it ends.
        let mut l = Limiter::new(10, S, Window::Fixed);
        for _ in 0..6 {
            l.check(t0).unwrap();
        }
        l.set_limit(5, t0 + ms(10));
        assert_eq!(l.check(t0 + ms(10)), Err(ms(990)));
        assert_eq!(l.check(t0 + S), Ok(()));
    }

    #[test]
    fn limiter_kinds_and_schedules_parse() {
        for (name, kind) in Window::ALL {
            assert_eq!(name.parse::<Window>(), Ok(kind));
            assert_eq!(kind.to_string(), name);
        }
        assert_eq!("leaky-bucket".parse::<Window>(), Ok(Window::Gcra));
        let e = "bucket".parse::<Window>().unwrap_err();
        assert!(
            e.contains("token-bucket") && e.contains("\"bucket\""),
            "{e}"
        );
        assert_eq!(
            parse_limit_schedule("10s:5, 1500ms:3,2m:10,7:1"),
            Ok(vec![
                (Duration::from_secs(10), 5),
                (ms(1500), 3),
                (Duration::from_secs(120), 10),
                (Duration::from_secs(7), 1)
            ])
        );
        for bad in ["10s", "x:5", "10h:5", "10s:0", "10s:-1", ":5"] {
            let e = parse_limit_schedule(bad).unwrap_err();
            assert!(e.contains("limit"), "{bad}: {e}");
        }
    }

    #[test]
    fn rate_headers_state_the_budget() {
        let now = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        let budget = Budget {
            limit: 10,
            period: S,
            remaining: 0,
            reset: ms(1_300),
        };
        assert!(rate_headers(&budget, RateHeaders::None, now).is_empty());
        let owned = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            rate_headers(&budget, RateHeaders::Ietf, now),
            owned(&[
                ("ratelimit-policy", "\"default\";q=10;w=1"),
                ("ratelimit", "\"default\";r=0;t=2"),
            ])
        );
        let x = |mode| rate_headers(&budget, mode, now);
        assert_eq!(
            x(RateHeaders::XRateLimit),
            owned(&[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "2"),
            ])
        );
        // 1_700_000_000.25 + 1.3 = 1_700_000_001.55, rounded up.
        assert_eq!(x(RateHeaders::XRateLimitEpoch)[2].1, "1700000002");
        assert_eq!(x(RateHeaders::XRateLimitEpoch)[0].1, "10");
        // A sub-second or odd period states its quota over whole seconds.
        let odd = Budget {
            limit: 3,
            period: ms(1_500),
            remaining: 3,
            reset: Duration::ZERO,
        };
        assert_eq!(
            rate_headers(&odd, RateHeaders::Ietf, now)[0].1,
            "\"default\";q=4;w=2"
        );
        for (name, mode) in RateHeaders::GENERIC {
            assert_eq!(name.parse(), Ok(mode));
            assert_eq!(mode.name(), name);
        }
        // An emulation stating none is no kind of rate headers.
        let e = "X".parse::<RateHeaders>().unwrap_err();
        assert!(e.contains("ietf") && e.contains("\"X\""), "{e}");
        assert!("styles".parse::<RateHeaders>().is_err());
    }

    #[test]
    fn a_unit_states_a_span_rounded_up() {
        let now = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        let span = Duration::from_micros(1_300_001);
        assert_eq!(in_unit(span, TimeUnit::Seconds, now), "2");
        assert_eq!(in_unit(span, TimeUnit::Milliseconds, now), "1301");
        assert_eq!(in_unit(ms(1_300), TimeUnit::Milliseconds, now), "1300");
        assert_eq!(in_unit(span, TimeUnit::EpochSeconds, now), "1700000002");
        assert_eq!(in_unit(Duration::ZERO, TimeUnit::Seconds, now), "0");
    }

    #[test]
    fn emulated_rate_headers_are_named_by_their_file() {
        let emulated: Vec<RateHeaders> = emulation::emulations()
            .iter()
            .filter(|(_, e)| e.rate_headers.is_some())
            .map(|(n, _)| n.parse().unwrap())
            .collect();
        assert!(!emulated.is_empty(), "some emulation states rate headers");
        let budget = Budget {
            limit: 4,
            period: Duration::from_secs(60),
            remaining: 1,
            reset: ms(20_500),
        };
        for mode in emulated {
            let RateHeaders::Emulated(name) = mode else {
                panic!("{mode:?}");
            };
            let names = emulation::named(name)
                .unwrap()
                .1
                .rate_headers
                .clone()
                .unwrap();
            assert!(names.source.len() > 20, "{name}: names no source");
            let stated = rate_headers(&budget, mode, std::time::SystemTime::now());
            let get = |h: &str| {
                stated
                    .iter()
                    .find(|(k, _)| *k == h.to_lowercase())
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(get(&names.limit), Some("4"), "{name}");
            assert_eq!(get(&names.remaining), Some("1"), "{name}");
            if let Some(w) = &names.window {
                let window = in_unit(Duration::from_secs(60), w.unit, std::time::UNIX_EPOCH);
                assert_eq!(get(&w.header), Some(window.as_str()), "{name}");
                assert_ne!(w.unit, TimeUnit::EpochSeconds, "{name}: a window is a span");
            }
            if let Some(r) = names
                .reset
                .as_ref()
                .filter(|r| r.unit != TimeUnit::EpochSeconds)
            {
                let reset = in_unit(ms(20_500), r.unit, std::time::UNIX_EPOCH);
                assert_eq!(get(&r.header), Some(reset.as_str()), "{name}");
            }
            assert_eq!(mode.name().parse(), Ok(mode));
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(serde_json::from_str::<RateHeaders>(&json).unwrap(), mode);
        }
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
