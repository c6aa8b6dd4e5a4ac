//! Declared limits: `N/window` strings (`10/s`, `100/10s`, `300/min`, `100000/day`) and the
//! reserve a long window keeps for other clients, parsed and checked once, with an error
//! that names what is wrong.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

/// The shortest window a limit may declare.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest window a limit may declare (31 days: a monthly quota).
pub const MAX_WINDOW: Duration = Duration::from_secs(31 * 86_400);
/// The largest quota a limit may declare.
pub const MAX_QUOTA: u32 = 1_000_000_000;
/// The largest reserve, in percent: a budget keeps at least a tenth of each long window.
pub const MAX_RESERVE: u8 = 90;
/// Requests per minute a connection allows when it declares no limit.
pub const DEFAULT_REQUESTS_PER_MINUTE: u32 = 600;
/// The longest a rate-limit answer may block a budget.
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(86_400);
/// The shortest block a rate-limit answer sets, whatever wait it names (`0`, a date
/// already past).
pub const MIN_RATE_LIMIT_WAIT: Duration = Duration::from_secs(1);
/// The block a rate-limit answer sets when it names no wait.
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);
/// Windows at least this long keep the budget's reserve for other clients (an hourly or a
/// daily quota is shared with whatever else uses the account; a burst window is not).
pub const RESERVE_FROM: Duration = Duration::from_secs(60);

/// `quota` requests in any `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Limit {
    /// Requests allowed in any window of `window`.
    pub quota: u32,
    /// The window's length, a whole number of seconds within [`MIN_WINDOW`]..=[`MAX_WINDOW`].
    pub window: Duration,
}

/// Why a limit or a reserve was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Not `N/window`.
    #[error("limit {0:?}: expected N/window, such as 10/s, 100/10s, 300/min, 5000/h or 100000/day")]
    Shape(String),
    /// The quota is not a whole number from 1 to [`MAX_QUOTA`].
    #[error("limit {0:?}: the quota must be a whole number from 1 to {MAX_QUOTA}")]
    Quota(String),
    /// The window's unit is unknown.
    #[error(
        "limit {0:?}: unknown window unit {1:?} (use s, min, h or day, optionally after a count: 10s, 2h)"
    )]
    Unit(String, String),
    /// The window is shorter than a second or longer than 31 days.
    #[error("limit {0:?}: the window must lie between 1 s and 31 days")]
    Window(String),
    /// Two limits name the same window.
    #[error("limits {0} and {1} name the same window")]
    SameWindow(Limit, Limit),
    /// The reserve is not a percentage from 0 to [`MAX_RESERVE`].
    #[error("reserve {0:?}: expected a percentage from 0% to {MAX_RESERVE}%")]
    Reserve(String),
}

impl Limit {
    /// `quota` per `window` seconds.
    pub fn new(quota: u32, window_secs: u64) -> Self {
        Self {
            quota,
            window: Duration::from_secs(window_secs),
        }
    }

    /// The limit's average rate in requests per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.quota) / self.window.as_secs_f64()
    }

    /// The one-limit shorthand: `rpm` requests per minute.
    pub fn per_minute(rpm: u32) -> Self {
        Self::new(rpm, 60)
    }
}

impl FromStr for Limit {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let raw = s.trim();
        let (quota, window) = raw
            .split_once('/')
            .ok_or_else(|| LimitError::Shape(raw.to_owned()))?;
        let quota = quota
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|q| (1..=MAX_QUOTA).contains(q))
            .ok_or_else(|| LimitError::Quota(raw.to_owned()))?;
        let window = window.trim();
        let digits = window.len()
            - window
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        let (count, unit) = window.split_at(digits);
        let count: u64 = match count {
            "" => 1,
            n => n.parse().map_err(|_| LimitError::Window(raw.to_owned()))?,
        };
        let unit_secs: u64 = match unit.trim() {
            "s" | "sec" | "second" => 1,
            "min" | "minute" | "m" => 60,
            "h" | "hour" => 3_600,
            "day" | "d" => 86_400,
            other => return Err(LimitError::Unit(raw.to_owned(), other.to_owned())),
        };
        let window = count
            .checked_mul(unit_secs)
            .map(Duration::from_secs)
            .filter(|w| (MIN_WINDOW..=MAX_WINDOW).contains(w))
            .ok_or_else(|| LimitError::Window(raw.to_owned()))?;
        Ok(Self { quota, window })
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.window.as_secs();
        let (count, unit) = [(86_400, "day"), (3_600, "h"), (60, "min"), (1, "s")]
            .into_iter()
            .find(|(u, _)| secs.is_multiple_of(*u))
            .map(|(u, name)| (secs / u, name))
            .unwrap_or((secs, "s"));
        if count == 1 {
            write!(f, "{}/{unit}", self.quota)
        } else {
            write!(f, "{}/{count}{unit}", self.quota)
        }
    }
}

impl TryFrom<String> for Limit {
    type Error = LimitError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Limit> for String {
    fn from(l: Limit) -> Self {
        l.to_string()
    }
}

/// Parses a reserve such as `10%` (or `10`): percent of each long window kept for others.
pub fn parse_reserve(s: &str) -> Result<u8, LimitError> {
    let raw = s.trim();
    raw.trim_end_matches('%')
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|r| *r <= MAX_RESERVE)
        .ok_or_else(|| LimitError::Reserve(raw.to_owned()))
}

/// Checks a set of limits: no two on one window. Sorted by window, shortest first.
pub fn check(mut limits: Vec<Limit>) -> Result<Vec<Limit>, LimitError> {
    limits.sort_by_key(|l| (l.window, l.quota));
    for pair in limits.windows(2) {
        if pair[0].window == pair[1].window {
            return Err(LimitError::SameWindow(pair[0], pair[1]));
        }
    }
    Ok(limits)
}

/// The quota a budget may spend of `limit` with `reserve` percent kept for other clients
/// (only on windows from [`RESERVE_FROM`]); at least 1.
pub fn usable_quota(limit: &Limit, reserve: u8) -> u32 {
    if limit.window < RESERVE_FROM {
        return limit.quota;
    }
    let kept = u64::from(limit.quota) * u64::from(100 - reserve.min(MAX_RESERVE)) / 100;
    (kept as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_and_print_back() {
        for (s, quota, secs, shown) in [
            ("10/s", 10, 1, "10/s"),
            ("100/10s", 100, 10, "100/10s"),
            ("300/min", 300, 60, "300/min"),
            ("300/60s", 300, 60, "300/min"),
            ("5000/h", 5000, 3600, "5000/h"),
            ("100000/day", 100_000, 86_400, "100000/day"),
            (" 7 / 2h ", 7, 7200, "7/2h"),
        ] {
            let l: Limit = s.parse().unwrap();
            assert_eq!((l.quota, l.window.as_secs()), (quota, secs), "{s}");
            assert_eq!(l.to_string(), shown);
            assert_eq!(shown.parse::<Limit>().unwrap(), l);
        }
    }

    #[test]
    fn bad_limits_are_refused_naming_what_is_wrong() {
        let err = |s: &str| s.parse::<Limit>().unwrap_err().to_string();
        assert!(
            err("0/s").contains("quota must be a whole number"),
            "{}",
            err("0/s")
        );
        assert!(err("-5/s").contains("\"-5/s\""));
        assert!(err("-5/s").contains("quota"));
        assert!(err("10/fortnight").contains("unknown window unit \"fortnight\""));
        assert!(err("10/0s").contains("between 1 s and 31 days"));
        assert!(err("10/400day").contains("between 1 s and 31 days"));
        assert!(err("10/99999999999999999999s").contains("between 1 s"));
        assert!(err("10").contains("expected N/window"));
        assert!(err("5000000000/s").contains("quota"));
        let same = check(vec!["10/s".parse().unwrap(), "20/1s".parse().unwrap()]);
        assert!(same.unwrap_err().to_string().contains("same window"));
    }

    #[test]
    fn reserves_are_percentages_up_to_90_on_long_windows() {
        assert_eq!(parse_reserve("10%"), Ok(10));
        assert_eq!(parse_reserve("0"), Ok(0));
        assert!(
            parse_reserve("91%")
                .unwrap_err()
                .to_string()
                .contains("0% to 90%")
        );
        assert!(parse_reserve("-1%").is_err());
        assert!(parse_reserve("ten").is_err());
        assert_eq!(usable_quota(&"100000/day".parse().unwrap(), 10), 90_000);
        assert_eq!(usable_quota(&"10/s".parse().unwrap(), 10), 10);
        assert_eq!(usable_quota(&"1/h".parse().unwrap(), 90), 1);
    }
}
