//! What a response says about the target's rate limit, read from its headers by a pure
//! function ([`read`]), so pacing can act on it before any 429.
//!
//! Formats read, the first that yields a field wins, field by field:
//! 1. IETF draft-ietf-httpapi-ratelimit-headers -10/-11: `RateLimit-Policy`
//!    (`"burst";q=100;w=60, "daily";q=1000;w=86400`, a structured-field list; the most
//!    restrictive per-minute policy is taken) and `RateLimit` (`"burst";r=50;t=30`;
//!    remaining `r`, seconds to reset `t`, a delta). Older drafts' forms are read too:
//!    a policy given as a bare integer (`10;w=1`) and `RateLimit` as a dictionary
//!    (`limit=10, remaining=5, reset=4`).
//! 2. The older draft's trio `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`
//!    (reset in seconds, a delta).
//! 3. The common `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`; the
//!    reset is a delta or UTC epoch seconds (GitHub) as the writer's [`ResetKind`] says.
//!
//! 4. A connection's own [`RateSignals`]: headers of its target's names (HubSpot's
//!    window in milliseconds, Brevo's `x-sib-ratelimit-*`, Salesforce's
//!    `Sforce-Limit-Info: api-usage=18/5000`), declared as data in its preset.
//!
//! A limit is a quota only with a window: `RateLimit-Limit` and `X-RateLimit-Limit` state
//! one when they carry a `;w=` parameter (`100;w=60`, as the older drafts allowed), else
//! the limit alone says no rate and the statement has no quota.
//!
//! A 429's wait is read here too ([`rate_limit_wait`]): `Retry-After` (seconds or an
//! HTTP-date), else a reset header.
//!
//! Malformed, negative, huge or non-UTF-8 values are ignored field by field, never a panic:
//! a quota or remaining count must fit a `u32`, a window must lie within [`MAX_WINDOW`],
//! a reset within [`MAX_RESET`] (an epoch reset in the past reads as zero).

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

use super::limits::{Limit, MAX_RATE_LIMIT_WAIT, MAX_WINDOW, MIN_WINDOW};
/// The longest reset read: the cap a 429's wait has too. A longer one is ignored.
pub const MAX_RESET: Duration = MAX_RATE_LIMIT_WAIT;

/// How a connection's target means `X-RateLimit-Reset`
/// ([`RateSignals::reset`](super::signals::RateSignals::reset)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetKind {
    /// Seconds from now until the window resets (the IETF fields always mean this).
    #[default]
    Delta,
    /// The UTC epoch second at which the window resets (GitHub).
    #[serde(rename = "epoch")]
    EpochSeconds,
}

/// A quota: `limit` requests per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Requests allowed per window.
    pub limit: u32,
    /// The window the limit applies to (never zero).
    pub window: Duration,
}

impl Quota {
    /// Requests per minute this quota allows on average.
    pub fn per_minute(&self) -> f64 {
        f64::from(self.limit) * 60.0 / self.window.as_secs_f64()
    }
}

/// What one response stated about the rate limit; every field is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Statement {
    /// The quota in force (the most restrictive per minute when several were stated).
    pub quota: Option<Quota>,
    /// Every quota stated (a `RateLimit-Policy` naming several policies states several).
    pub quotas: Vec<Quota>,
    /// Requests left in the current window (the lowest when several were stated).
    pub remaining: Option<u32>,
    /// Time until the window of `remaining` resets.
    pub reset: Option<Duration>,
}

impl Statement {
    /// Whether the response stated nothing usable.
    pub fn is_empty(&self) -> bool {
        self.quota.is_none() && self.remaining.is_none() && self.reset.is_none()
    }

    /// When the response says the budget is spent (remaining 0 with a reset), measured
    /// from `at`: the reset.
    pub fn spent_until(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match (self.remaining, self.reset) {
            (Some(0), Some(reset)) if !reset.is_zero() => {
                Some(at + chrono::Duration::from_std(reset).ok()?)
            }
            _ => None,
        }
    }

    /// The stated quotas as limits, one per window (the least quota of a window), each
    /// window whole seconds of at least one; what a [`Limit`] cannot hold is left out.
    pub fn limits(&self) -> Vec<Limit> {
        let mut limits: Vec<Limit> = Vec::new();
        for q in &self.quotas {
            let secs = q.window.as_secs();
            let limit = Limit::new(q.limit, secs);
            if q.limit == 0
                || q.window.subsec_nanos() != 0
                || !(MIN_WINDOW..=MAX_WINDOW).contains(&limit.window)
            {
                continue;
            }
            match limits.iter_mut().find(|l| l.window == limit.window) {
                Some(l) => l.quota = l.quota.min(limit.quota),
                None => limits.push(limit),
            }
        }
        limits.sort_by_key(|l| l.window);
        limits
    }

    /// This statement, field by field, where it says something, else `other`'s (whose
    /// quotas count only when this one states none).
    pub fn or(self, other: Statement) -> Statement {
        let (quota, quotas) = match self.quotas.is_empty() {
            true => (other.quota, other.quotas),
            false => (self.quota, self.quotas),
        };
        Statement {
            quota,
            quotas,
            remaining: self.remaining.or(other.remaining),
            reset: self.reset.or(other.reset),
        }
    }

    /// Requests per minute the quota allows, if one was stated.
    pub fn quota_per_minute(&self) -> Option<f64> {
        self.quota.map(|q| q.per_minute())
    }
}

/// Reads the rate-limit statement of a response's `headers` in the standard forms;
/// `reset_kind` says how `X-RateLimit-Reset` is meant, `now` is the time an epoch reset is
/// measured from. A connection's own headers are read by
/// [`RateSignals::read`](super::signals::RateSignals::read), which falls back on these.
pub fn read(headers: &HeaderMap, reset_kind: ResetKind, now: DateTime<Utc>) -> Statement {
    let ietf = ietf_remaining(headers);
    let quotas = Some(ietf_policy(headers))
        .filter(|q| !q.is_empty())
        .or_else(|| Some(limit_quota(headers, "ratelimit-limit")).filter(|q| !q.is_empty()))
        .or_else(|| Some(limit_quota(headers, "x-ratelimit-limit")).filter(|q| !q.is_empty()))
        .unwrap_or_default();
    let quota = quotas
        .iter()
        .copied()
        .min_by(|a, b| a.per_minute().total_cmp(&b.per_minute()));
    let remaining = ietf
        .and_then(|(r, _)| r)
        .or_else(|| scalar(headers, "ratelimit-remaining").and_then(count))
        .or_else(|| scalar(headers, "x-ratelimit-remaining").and_then(count));
    let reset = ietf
        .and_then(|(_, t)| t)
        .or_else(|| scalar(headers, "ratelimit-reset").and_then(delta))
        .or_else(|| {
            let raw = scalar(headers, "x-ratelimit-reset")?;
            match reset_kind {
                ResetKind::Delta => delta(raw),
                // An instant on the target's clock: read against the answer's `Date`
                // (its clock too), so a host whose clock is off reads the same wait.
                ResetKind::EpochSeconds => epoch(raw, answered_at(headers).unwrap_or(now)),
            }
        });
    Statement {
        quota,
        quotas,
        remaining,
        reset,
    }
}

/// The quotas of `RateLimit-Policy` (every line of it).
fn ietf_policy(headers: &HeaderMap) -> Vec<Quota> {
    let members = list(headers, "ratelimit-policy");
    members
        .iter()
        .filter_map(|m| {
            // A unit other than requests (content-bytes, concurrent-requests) is no rate.
            if m.param("qu").is_some_and(|u| u != "requests") {
                return None;
            }
            let limit = match m.param("q") {
                Some(q) => count(q)?,
                // Older drafts: the quota is the item itself (`10;w=1`).
                None => count(m.item.as_str())?,
            };
            Some(Quota {
                limit,
                window: window(m.param("w")?)?,
            })
        })
        .collect()
}

/// A quota from a limit field that states its window (`100;w=60`, several allowed).
fn limit_quota(headers: &HeaderMap, name: &str) -> Vec<Quota> {
    let members = list(headers, name);
    members
        .iter()
        .filter_map(|m| {
            Some(Quota {
                limit: count(m.item.as_str())?,
                window: window(m.param("w")?)?,
            })
        })
        .collect()
}

/// `RateLimit`'s remaining and reset: of several items the one with the fewest requests
/// left (the longest reset among equals), since any exhausted policy stops requests.
/// Returns `None` when the field states no remaining count at all.
fn ietf_remaining(headers: &HeaderMap) -> Option<(Option<u32>, Option<Duration>)> {
    let members = list(headers, "ratelimit");
    // Older drafts' dictionary form: `limit=10, remaining=5, reset=4`.
    let dict = |key: &str| members.iter().find(|m| m.key.as_deref() == Some(key));
    if let Some(r) = dict("remaining") {
        let reset = dict("reset").and_then(|m| delta(&m.item));
        return Some((count(&r.item), reset));
    }
    members
        .iter()
        .filter(|m| m.key.is_none())
        .filter_map(|m| Some((count(m.param("r")?)?, m.param("t").and_then(delta))))
        .min_by(|(r1, t1), (r2, t2)| r1.cmp(r2).then(t2.cmp(t1)))
        .map(|(r, t)| (Some(r), t))
}

/// A count: a non-negative integer that fits a `u32`.
fn count(raw: &str) -> Option<u32> {
    let s = raw.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A window in whole seconds, from one second to [`MAX_WINDOW`].
fn window(raw: &str) -> Option<Duration> {
    let secs: u64 = count(raw)?.into();
    let w = Duration::from_secs(secs);
    (secs > 0 && w <= MAX_WINDOW).then_some(w)
}

/// Non-negative seconds, whole or fractional, up to `max` (any, for [`Duration::MAX`]).
fn seconds(raw: &str, max: Duration) -> Option<f64> {
    let s = raw.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let secs: f64 = s.parse().ok()?;
    let within = max == Duration::MAX || secs <= max.as_secs_f64();
    (secs.is_finite() && secs >= 0.0 && within).then_some(secs)
}

/// A delta reset: seconds from now, up to [`MAX_RESET`].
fn delta(raw: &str) -> Option<Duration> {
    seconds(raw, MAX_RESET).map(Duration::from_secs_f64)
}

/// An epoch reset: the UTC second the window resets at, as a wait from `now` (zero when
/// past, ignored when more than [`MAX_RESET`] ahead).
fn epoch(raw: &str, now: DateTime<Utc>) -> Option<Duration> {
    // Any epoch before year 10000 fits; beyond is garbage.
    let at = seconds(raw, Duration::from_secs(253_402_300_800))?;
    let now = now.timestamp_micros() as f64 / 1e6;
    let wait = (at - now).max(0.0);
    (wait <= MAX_RESET.as_secs_f64()).then(|| Duration::from_secs_f64(wait))
}

/// When the target answered, by its own clock: the answer's `Date` field (RFC 9110 asks
/// every origin server with a clock to send it).
pub fn answered_at(headers: &HeaderMap) -> Option<DateTime<Utc>> {
    let raw = headers.get(reqwest::header::DATE)?.to_str().ok()?;
    Some(httpdate::parse_http_date(raw.trim()).ok()?.into())
}

/// The first comma-separated value of a field that holds one number.
fn scalar<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let value = headers.get(name)?.to_str().ok()?;
    value.split([',', ';']).next()
}

/// One member of a structured-field list (RFC 9651), read leniently.
#[derive(Clone, Debug, Default, PartialEq)]
struct Member {
    /// The dictionary key, when the member is `key=value`.
    key: Option<String>,
    /// The item: a string's content, a token or a number, as text.
    item: String,
    /// Parameters in order; a key without a value is `?1` (true).
    params: Vec<(String, String)>,
}

impl Member {
    fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every member of the field `name` over all its lines; lines that are not UTF-8 are
/// skipped.
fn list(headers: &HeaderMap, name: &str) -> Vec<Member> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(split_outside_quotes)
        .filter_map(|m| parse_member(&m))
        .collect()
}

/// Splits at commas that are not inside a quoted string.
fn split_outside_quotes(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in s.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// One member: `item;k=v;...` or a dictionary's `key=item;k=v`. `None` when empty.
fn parse_member(raw: &str) -> Option<Member> {
    let mut parts = split_params(raw).into_iter();
    let head = parts.next()?;
    let head = head.trim();
    if head.is_empty() {
        return None;
    }
    let (key, item) = match head.split_once('=') {
        Some((k, v)) if !head.starts_with('"') => (Some(k.trim().to_owned()), unquote(v)),
        _ => (None, unquote(head)),
    };
    let params = parts
        .filter_map(|p| {
            let p = p.trim();
            if p.is_empty() {
                return None;
            }
            Some(match p.split_once('=') {
                Some((k, v)) => (k.trim().to_owned(), unquote(v)),
                None => (p.to_owned(), "?1".to_owned()),
            })
        })
        .collect();
    Some(Member { key, item, params })
}

/// Splits at semicolons that are not inside a quoted string.
fn split_params(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in s.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// A bare item as text: a quoted string's content (escapes resolved), else trimmed.
fn unquote(raw: &str) -> String {
    let s = raw.trim();
    match s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' {
                    chars.next().unwrap_or('\\')
                } else {
                    c
                });
            }
            out
        }
        None => s.to_owned(),
    }
}

/// The standard header a 429's wait is read from when `Retry-After` is absent: the IETF
/// draft's `RateLimit-Reset` (delta seconds); a connection's signals may name more.
pub const RESET_HEADERS: &[&str] = &["ratelimit-reset"];

/// The wait a 429 asks for, in this order: `Retry-After` as seconds, `Retry-After` as an
/// HTTP-date, then `RateLimit-Reset` and each of `reset_headers` (the connection's signals')
/// (seconds); an unparsable header falls through
/// to the next. Returns the wait (capped at one day) and the raw value it came from;
/// when only garbage was sent, `(None, Some(raw))`.
pub fn rate_limit_wait<'r>(
    headers: &HeaderMap,
    reset_headers: impl IntoIterator<Item = &'r str>,
    now: SystemTime,
) -> (Option<Duration>, Option<String>) {
    let raw_of = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    // The first header that parses wins; a garbage one does not hide a later good one,
    // but is still reported when nothing parses.
    let mut garbage = None;
    if let Some(raw) = raw_of("retry-after") {
        match parse_retry_after(&raw, now) {
            Some(wait) => return (Some(wait), Some(raw)),
            None => garbage = Some(raw),
        }
    }
    for name in RESET_HEADERS.iter().copied().chain(reset_headers) {
        if let Some(raw) = raw_of(name) {
            match parse_seconds(&raw) {
                Some(wait) => return (Some(wait), Some(raw)),
                None => garbage = garbage.or(Some(raw)),
            }
        }
    }
    (None, garbage)
}

/// Parses a `Retry-After` value: delta-seconds or an HTTP-date.
pub fn parse_retry_after(raw: &str, now: SystemTime) -> Option<Duration> {
    parse_seconds(raw).or_else(|| {
        let at = httpdate::parse_http_date(raw.trim()).ok()?;
        Some(
            at.duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(MAX_RATE_LIMIT_WAIT),
        )
    })
}

/// Parses whole or fractional non-negative seconds, capped at one day.
pub fn parse_seconds(raw: &str) -> Option<Duration> {
    let secs = seconds(raw, Duration::MAX)?;
    Some(Duration::from_secs_f64(
        secs.min(MAX_RATE_LIMIT_WAIT.as_secs_f64()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("86401", now), Some(MAX_RATE_LIMIT_WAIT));
        assert_eq!(
            parse_retry_after("99999999999999999999999999", now),
            Some(MAX_RATE_LIMIT_WAIT)
        );
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("ｓ５", now), None);
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
    }

    /// The reset header Brevo's preset's signals name (`x-sib-ratelimit-reset`, seconds).
    fn sib() -> [&'static str; 1] {
        ["x-sib-ratelimit-reset"]
    }

    #[test]
    fn a_reset_header_the_signals_name_is_a_fallback() {
        let mut h = HeaderMap::new();
        h.insert("x-sib-ratelimit-reset", HeaderValue::from_static("12"));
        let now = SystemTime::now();
        assert_eq!(
            rate_limit_wait(&h, sib(), now),
            (Some(Duration::from_secs(12)), Some("12".into()))
        );
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(
            rate_limit_wait(&h, sib(), now).0,
            Some(Duration::from_secs(3))
        );
        assert_eq!(rate_limit_wait(&h, [], now).0, Some(Duration::from_secs(3)));
        h.remove("retry-after");
        assert_eq!(rate_limit_wait(&h, [], now), (None, None));
        assert_eq!(rate_limit_wait(&HeaderMap::new(), sib(), now), (None, None));
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics_nor_exceeds_a_day(raw in "\\PC{0,40}") {
            if let Some(d) = parse_retry_after(&raw, SystemTime::now()) {
                proptest::prop_assert!(d <= MAX_RATE_LIMIT_WAIT);
            }
        }

        #[test]
        fn negative_numbers_name_no_wait(n in 1u64..u64::MAX) {
            proptest::prop_assert_eq!(parse_retry_after(&format!("-{n}"), SystemTime::now()), None);
        }

        #[test]
        fn huge_numbers_are_capped(digits in "[1-9][0-9]{5,60}(\\.[0-9]{0,5})?") {
            // At least 100,000 seconds: always above the cap, so exactly the cap.
            let d = parse_retry_after(&digits, SystemTime::now());
            proptest::prop_assert_eq!(d, Some(MAX_RATE_LIMIT_WAIT));
        }

        #[test]
        fn any_http_date_is_capped(at in 0u64..253_402_300_799, now in 0u64..4_102_444_800) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now);
            let date = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(at));
            let d = parse_retry_after(&date, now).expect("a valid HTTP-date");
            proptest::prop_assert!(d <= MAX_RATE_LIMIT_WAIT);
        }

        #[test]
        fn raw_header_bytes_never_panic_nor_exceed_a_day(
            retry in proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..48)),
            reset in proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..48)),
        ) {
            let mut h = HeaderMap::new();
            // Bytes a header value cannot hold (controls) are refused by `from_bytes`; every
            // other byte, including non-ASCII ones, reaches the parser.
            if let Some(v) = retry.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
                h.insert("retry-after", v);
            }
            if let Some(v) = reset.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
                h.insert("x-sib-ratelimit-reset", v);
            }
            let (wait, raw) = rate_limit_wait(&h, sib(), SystemTime::now());
            if let Some(d) = wait {
                proptest::prop_assert!(d <= MAX_RATE_LIMIT_WAIT);
                proptest::prop_assert!(raw.is_some());
            }
            proptest::prop_assert_eq!(raw.is_some(), !h.is_empty());
        }

        #[test]
        fn whole_seconds_round_trip(n in 0u64..=86_400) {
            proptest::prop_assert_eq!(
                parse_retry_after(&n.to_string(), SystemTime::now()),
                Some(Duration::from_secs(n))
            );
        }
    }

    use proptest::prelude::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).expect("a header value"));
        }
        h
    }

    fn now() -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000, 0).unwrap()
    }

    /// What a preset's connection declares as its rate signals: vendor knowledge is data.
    fn preset(name: &str) -> crate::ratelimit::signals::RateSignals {
        let c = crate::presets::find(name)
            .unwrap()
            .connection(&serde_json::json!({}));
        crate::ratelimit::signals::RateSignals::parse(c.get("rate_signals")).unwrap()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn ietf_draft_examples() {
        // draft-ietf-httpapi-ratelimit-headers-10, section 3/4 examples.
        let h = headers(&[
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60,\"daily\";q=1000;w=86400",
            ),
            ("RateLimit", "\"default\";r=50;t=30"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(
            s.quota,
            Some(Quota {
                limit: 1000,
                window: secs(86_400)
            }),
            "1000/day is the tighter per-minute rate"
        );
        assert_eq!(s.remaining, Some(50));
        assert_eq!(s.reset, Some(secs(30)));
        assert!((s.quota_per_minute().unwrap() - 1000.0 / 1440.0).abs() < 1e-9);
        // Both policies are limits the budget keeps.
        assert_eq!(s.limits(), [Limit::new(100, 60), Limit::new(1000, 86_400)]);

        let h = headers(&[
            (
                "RateLimit-Policy",
                "\"default\";q=10;w=1;pk=:cHJvamVjdDEyMw==:",
            ),
            (
                "RateLimit-Policy",
                "\"hour\";q=50000;w=3600;qu=\"requests\"",
            ),
            ("RateLimit", "\"default\";r=0;t=1"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(s.quota_per_minute(), Some(600.0));
        assert_eq!((s.remaining, s.reset), (Some(0), Some(secs(1))));
    }

    #[test]
    fn several_ratelimit_items_take_the_fewest_left() {
        let h = headers(&[(
            "RateLimit",
            "\"minute\";r=40;t=20, \"day\";r=0;t=3600, \"other\";r=0;t=5",
        )]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!((s.remaining, s.reset), (Some(0), Some(secs(3600))));
    }

    #[test]
    fn units_other_than_requests_are_no_rate() {
        let h = headers(&[(
            "RateLimit-Policy",
            "\"bytes\";q=1;w=60;qu=\"content-bytes\", \"req\";q=120;w=60",
        )]);
        assert_eq!(
            read(&h, ResetKind::Delta, now()).quota_per_minute(),
            Some(120.0)
        );
    }

    #[test]
    fn older_drafts_forms() {
        // draft -03..-07: a bare-integer policy, a dictionary RateLimit.
        let h = headers(&[
            ("RateLimit-Policy", "10;w=1, 50;w=60"),
            ("RateLimit", "limit=10, remaining=5, reset=4"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(s.quota_per_minute(), Some(50.0));
        assert_eq!((s.remaining, s.reset), (Some(5), Some(secs(4))));

        // draft -00..-02 (and Klaviyo): the trio, reset a delta.
        let h = headers(&[
            ("RateLimit-Limit", "100, 100;w=60"),
            ("RateLimit-Remaining", "98"),
            ("RateLimit-Reset", "47"),
        ]);
        let s = read(&h, ResetKind::EpochSeconds, now());
        assert_eq!(
            s.quota,
            Some(Quota {
                limit: 100,
                window: secs(60)
            })
        );
        assert_eq!((s.remaining, s.reset), (Some(98), Some(secs(47))));
    }

    #[test]
    fn github_x_ratelimit_with_epoch_reset() {
        // As api.github.com answers: a limit with no window, reset as an epoch second.
        let h = headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4987"),
            ("x-ratelimit-reset", "1700000600"),
            ("x-ratelimit-used", "13"),
            ("x-ratelimit-resource", "core"),
        ]);
        let s = read(&h, ResetKind::EpochSeconds, now());
        assert_eq!(s.quota, None, "a limit without a window says no rate");
        assert_eq!((s.remaining, s.reset), (Some(4987), Some(secs(600))));
        // Read as a delta, an epoch is far beyond a day: ignored, not a day-long block.
        assert_eq!(read(&h, ResetKind::Delta, now()).reset, None);
        // An epoch already past reads as zero.
        let h = headers(&[("X-RateLimit-Reset", "1699999990")]);
        assert_eq!(
            read(&h, ResetKind::EpochSeconds, now()).reset,
            Some(secs(0))
        );
        // A fractional epoch (Discord-style) keeps its fraction.
        let h = headers(&[("X-RateLimit-Reset", "1700000001.250")]);
        assert_eq!(
            read(&h, ResetKind::EpochSeconds, now()).reset,
            Some(Duration::from_millis(1250))
        );
    }

    #[test]
    fn hubspot_states_its_ten_second_window_in_milliseconds_and_a_daily_pair() {
        let h = headers(&[
            ("X-HubSpot-RateLimit-Max", "100"),
            ("X-HubSpot-RateLimit-Remaining", "97"),
            ("X-HubSpot-RateLimit-Interval-Milliseconds", "10000"),
            ("X-HubSpot-RateLimit-Daily", "250000"),
            ("X-HubSpot-RateLimit-Daily-Remaining", "249000"),
        ]);
        assert!(read(&h, ResetKind::Delta, now()).is_empty());
        let s = preset("hubspot").read(&h, now());
        assert_eq!(
            s.limits(),
            [Limit::new(100, 10), Limit::new(250_000, 86_400)]
        );
        assert_eq!((s.remaining, s.reset), (Some(97), None));
    }

    #[test]
    fn brevo_states_what_is_left_and_when_it_resets_without_retry_after() {
        let h = headers(&[
            ("x-sib-ratelimit-limit", "10"),
            ("x-sib-ratelimit-remaining", "0"),
            ("x-sib-ratelimit-reset", "1"),
        ]);
        let s = preset("brevo").read(&h, now());
        assert_eq!(s.quota, None, "a limit without a window says no rate");
        assert_eq!(
            s.spent_until(now()),
            Some(now() + chrono::Duration::seconds(1))
        );
    }

    #[test]
    fn salesforce_states_a_days_allowance_and_its_use() {
        let h = headers(&[("Sforce-Limit-Info", "api-usage=4990/5000")]);
        let s = preset("salesforce").read(&h, now());
        assert_eq!(s.limits(), [Limit::new(5_000, 86_400)]);
        assert_eq!(s.remaining, Some(10));
    }

    #[test]
    fn an_epoch_reset_is_read_against_the_answers_date() {
        // The target's clock says 1700000000 (the answer's Date); ours is an hour ahead.
        let h = headers(&[
            ("X-RateLimit-Reset", "1700000030"),
            ("Date", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ]);
        let ours = now() + chrono::Duration::hours(1);
        assert_eq!(
            read(&h, ResetKind::EpochSeconds, ours).reset,
            Some(secs(30))
        );
    }

    #[test]
    fn x_ratelimit_delta_with_a_window() {
        let h = headers(&[
            ("X-RateLimit-Limit", "10;w=1"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(s.quota_per_minute(), Some(600.0));
        assert_eq!((s.remaining, s.reset), (Some(0), Some(secs(1))));
        assert!(!s.is_empty());
    }

    #[test]
    fn ietf_fields_win_over_the_older_ones() {
        let h = headers(&[
            ("RateLimit-Policy", "\"p\";q=5;w=1"),
            ("RateLimit", "\"p\";r=2;t=1"),
            ("X-RateLimit-Limit", "100;w=1"),
            ("X-RateLimit-Remaining", "99"),
            ("X-RateLimit-Reset", "9"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(s.quota_per_minute(), Some(300.0));
        assert_eq!((s.remaining, s.reset), (Some(2), Some(secs(1))));
    }

    #[test]
    fn bad_values_are_ignored_field_by_field() {
        let h = headers(&[
            (
                "RateLimit-Policy",
                "\"a\";q=-5;w=60, \"b\";q=10;w=0, \"c\";w=60",
            ),
            ("RateLimit", "\"x\";r=99999999999;t=3"),
            ("X-RateLimit-Limit", "10;w=99999999999"),
            ("X-RateLimit-Remaining", "7"),
            ("X-RateLimit-Reset", "-3"),
        ]);
        let s = read(&h, ResetKind::Delta, now());
        assert_eq!(s.quota, None);
        assert_eq!(s.remaining, Some(7), "the next source's remaining");
        assert_eq!(s.reset, None);
        let mut h = HeaderMap::new();
        h.insert(
            "x-ratelimit-remaining",
            HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        h.insert("x-ratelimit-reset", HeaderValue::from_static("NaN"));
        h.insert("ratelimit-reset", HeaderValue::from_static("inf"));
        h.insert("ratelimit", HeaderValue::from_static("\"unterminated;r=1"));
        let s = read(&h, ResetKind::Delta, now());
        assert!(s.is_empty(), "{s:?}");
        assert_eq!(s.quota_per_minute(), None);
        assert!(read(&HeaderMap::new(), ResetKind::Delta, now()).is_empty());
    }

    #[test]
    fn structured_field_strings_with_commas_and_escapes() {
        let h = headers(&[(
            "RateLimit-Policy",
            r#""a, \"b\"; c";q=30;w=60, "plain";q=60;w=60"#,
        )]);
        assert_eq!(
            read(&h, ResetKind::Delta, now()).quota_per_minute(),
            Some(30.0)
        );
        assert_eq!(
            parse_member(r#""a, \"b\"; c";q=30"#).unwrap().item,
            r#"a, "b"; c"#
        );
    }

    const NAMES: [&str; 8] = [
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];

    fn value_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            // Near-misses of the real syntax reach the deeper paths more often.
            "[\"a-z0-9;=,\\-. ?:*]{0,64}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_values_never_panic(
            values in proptest::collection::vec(proptest::option::of(value_bytes()), 8),
            epoch in any::<bool>(),
            now_secs in 0i64..253_402_300_799,
        ) {
            let mut h = HeaderMap::new();
            for (name, value) in NAMES.iter().zip(values) {
                if let Some(v) = value.and_then(|b| HeaderValue::from_bytes(&b).ok()) {
                    h.insert(*name, v);
                }
            }
            let kind = if epoch { ResetKind::EpochSeconds } else { ResetKind::Delta };
            let s = read(&h, kind, Utc.timestamp_opt(now_secs, 0).unwrap());
            if let Some(q) = s.quota {
                prop_assert!(!q.window.is_zero() && q.window <= MAX_WINDOW);
                prop_assert!(q.per_minute().is_finite());
            }
            if let Some(r) = s.reset {
                prop_assert!(r <= MAX_RESET);
            }
        }

        #[test]
        fn ietf_values_round_trip(
            policies in proptest::collection::vec((0u32..=u32::MAX, 1u64..=31 * 86_400), 1..4),
            remaining in any::<u32>(),
            reset in 0u64..=86_400,
        ) {
            let policy = policies
                .iter()
                .enumerate()
                .map(|(i, (q, w))| format!("\"p{i}\";q={q};w={w}"))
                .collect::<Vec<_>>()
                .join(", ");
            let h = headers(&[
                ("RateLimit-Policy", &policy),
                ("RateLimit", &format!("\"p0\";r={remaining};t={reset}")),
            ]);
            let s = read(&h, ResetKind::Delta, now());
            let want = policies
                .iter()
                .map(|&(q, w)| Quota { limit: q, window: secs(w) })
                .min_by(|a, b| a.per_minute().total_cmp(&b.per_minute()));
            prop_assert_eq!(s.quota_per_minute(), want.map(|q| q.per_minute()));
            prop_assert_eq!(s.remaining, Some(remaining));
            prop_assert_eq!(s.reset, Some(secs(reset)));
        }

        #[test]
        fn x_ratelimit_values_round_trip(
            limit in any::<u32>(),
            window in 1u64..=31 * 86_400,
            remaining in any::<u32>(),
            reset in 0u64..=86_400,
            epoch in any::<bool>(),
        ) {
            let (kind, reset_raw) = if epoch {
                (ResetKind::EpochSeconds, (now().timestamp() as u64 + reset).to_string())
            } else {
                (ResetKind::Delta, reset.to_string())
            };
            let h = headers(&[
                ("X-RateLimit-Limit", &format!("{limit};w={window}")),
                ("X-RateLimit-Remaining", &remaining.to_string()),
                ("X-RateLimit-Reset", &reset_raw),
            ]);
            let s = read(&h, kind, now());
            prop_assert_eq!(s.quota, Some(Quota { limit, window: secs(window) }));
            prop_assert_eq!(s.remaining, Some(remaining));
            prop_assert_eq!(s.reset, Some(secs(reset)));
        }
    }
}
