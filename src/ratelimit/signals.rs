//! A connection's rate signals, as data: the headers beyond the standard forms in which its
//! target states a quota, what is left of it and when it resets, a usage header read by a
//! pattern, and the answers other than 429 that mean "rate limited". Presets declare their
//! vendor's (`presets/hubspot.json`, `brevo.json`, `salesforce.json`); a target courier has
//! never seen is described the same way, without Rust. The IETF and `X-RateLimit-*` forms
//! ([`super::headers`]) are read for every connection.
//!
//! A connection's `rate_signals`:
//!
//! ```json
//! {"quotas": [{"limit": "X-HubSpot-RateLimit-Max",
//!              "window": "X-HubSpot-RateLimit-Interval-Milliseconds", "window_unit": "ms",
//!              "remaining": "X-HubSpot-RateLimit-Remaining"}],
//!  "usage": [{"header": "Sforce-Limit-Info", "pattern": "api-usage={used}/{limit}",
//!             "window_seconds": 86400}],
//!  "limited": [{"status": 403, "body_contains": "REQUEST_LIMIT_EXCEEDED"}]}
//! ```

use crate::invalid::Invalid;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderName};
use serde::{Deserialize, Serialize};

use super::headers::{Quota, ResetKind, Statement};
use super::limits::MAX_WINDOW;

/// What a connection's target says about its rate beyond the standard headers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSignals {
    /// How `X-RateLimit-Reset` is meant: `delta` seconds (the default) or `epoch` seconds.
    #[serde(default)]
    pub reset: ResetKind,
    /// Quotas stated in headers of the target's own names.
    #[serde(default)]
    pub quotas: Vec<QuotaHeaders>,
    /// Usage stated in one header as used and limit (`api-usage=18/5000`).
    #[serde(default)]
    pub usage: Vec<UsageHeader>,
    /// Answers other than 429 that mean "rate limited".
    #[serde(default)]
    pub limited: Vec<LimitedAnswer>,
}

/// One quota in headers of the target's own names; each name is optional, and a quota is
/// stated only with a limit and a window (a header's or a fixed one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaHeaders {
    /// The header holding the requests allowed per window.
    pub limit: Option<String>,
    /// The header holding the window's length, in `window_unit`.
    pub window: Option<String>,
    /// The unit of `window`: `s` (default) or `ms`.
    #[serde(default)]
    pub window_unit: Unit,
    /// A fixed window in seconds, for a target whose window is documented, not sent.
    pub window_seconds: Option<u64>,
    /// The header holding the requests left in the window.
    pub remaining: Option<String>,
    /// The header holding when the window resets, in `reset_unit`.
    pub reset: Option<String>,
    /// What `reset` holds: a delta in `s` (default) or `ms`, or an instant, `epoch` or
    /// `epoch_ms`.
    #[serde(default)]
    pub reset_unit: ResetUnit,
}

/// A length's unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    /// Seconds.
    #[default]
    #[serde(rename = "s")]
    Seconds,
    /// Milliseconds.
    #[serde(rename = "ms")]
    Milliseconds,
}

/// What a reset header holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResetUnit {
    /// Seconds from now.
    #[default]
    #[serde(rename = "s")]
    Seconds,
    /// Milliseconds from now.
    #[serde(rename = "ms")]
    Milliseconds,
    /// The UTC epoch second of the reset.
    #[serde(rename = "epoch")]
    Epoch,
    /// The UTC epoch millisecond of the reset.
    #[serde(rename = "epoch_ms")]
    EpochMilliseconds,
}

/// A header stating usage as `used` and `limit` by a pattern, over a fixed window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageHeader {
    /// The header's name.
    pub header: String,
    /// The text around the numbers: `{used}` and `{limit}` mark them, in either order
    /// (`api-usage={used}/{limit}`); the header may hold other comma-separated parts.
    pub pattern: String,
    /// The window the limit applies to, in seconds.
    pub window_seconds: u64,
}

/// An answer that means "rate limited" though its status is not 429.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitedAnswer {
    /// Its HTTP status (400 to 599).
    pub status: u16,
    /// Text its body holds; absent: every answer of that status.
    pub body_contains: Option<String>,
}

impl RateSignals {
    /// Parses a connection's `rate_signals` (absent: none beyond the standard headers).
    /// The error names the field and what is wrong.
    pub fn parse(value: Option<&serde_json::Value>) -> Result<RateSignals, Invalid> {
        Self::parse_or_why(value).map_err(Invalid::at("rate_signals"))
    }

    fn parse_or_why(value: Option<&serde_json::Value>) -> Result<RateSignals, String> {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(RateSignals::default());
        };
        let signals: RateSignals = serde_json::from_value(value.clone())
            .map_err(|e| format!("rate_signals: {e} (fields: reset, quotas, usage, limited)"))?;
        signals.check()?;
        Ok(signals)
    }

    fn check(&self) -> Result<(), String> {
        let name = |field: &str, n: &str| {
            HeaderName::try_from(n)
                .map(|_| ())
                .map_err(|_| format!("rate_signals: {field} {n:?} is not an HTTP header name"))
        };
        for (i, q) in self.quotas.iter().enumerate() {
            for (field, n) in [
                ("limit", &q.limit),
                ("window", &q.window),
                ("remaining", &q.remaining),
                ("reset", &q.reset),
            ] {
                if let Some(n) = n {
                    name(&format!("quotas[{i}].{field}"), n)?;
                }
            }
            if q.window.is_some() && q.window_seconds.is_some() {
                return Err(format!(
                    "rate_signals: quotas[{i}] names a window header and window_seconds: one"
                ));
            }
            if let Some(w) = q.window_seconds
                && !(1..=MAX_WINDOW.as_secs()).contains(&w)
            {
                return Err(format!(
                    "rate_signals: quotas[{i}].window_seconds {w} is outside 1..={}",
                    MAX_WINDOW.as_secs()
                ));
            }
            if q.limit.is_none() && q.remaining.is_none() && q.reset.is_none() {
                return Err(format!(
                    "rate_signals: quotas[{i}] names no limit, remaining or reset header"
                ));
            }
        }
        for (i, u) in self.usage.iter().enumerate() {
            name(&format!("usage[{i}].header"), &u.header)?;
            if pattern_parts(&u.pattern).is_none() {
                return Err(format!(
                    "rate_signals: usage[{i}].pattern must hold {{used}} and {{limit}} once \
                     each, with text between them (api-usage={{used}}/{{limit}})"
                ));
            }
            if !(1..=MAX_WINDOW.as_secs()).contains(&u.window_seconds) {
                return Err(format!(
                    "rate_signals: usage[{i}].window_seconds {} is outside 1..={}",
                    u.window_seconds,
                    MAX_WINDOW.as_secs()
                ));
            }
        }
        for (i, l) in self.limited.iter().enumerate() {
            if !(400..=599).contains(&l.status) || l.status == 429 {
                return Err(format!(
                    "rate_signals: limited[{i}].status {} is not a 4xx or 5xx other than 429 \
                     (a 429 always means rate limited)",
                    l.status
                ));
            }
            if l.body_contains.as_deref().is_some_and(str::is_empty) {
                return Err(format!(
                    "rate_signals: limited[{i}].body_contains is empty (leave it out for \
                     every answer of the status)"
                ));
            }
        }
        Ok(())
    }

    /// Whether a response keeps header `name` (lowercase) for the pacer: one of these
    /// signals' headers.
    pub fn names(&self, name: &str) -> bool {
        let is = |n: &Option<String>| n.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(name));
        self.quotas
            .iter()
            .any(|q| is(&q.limit) || is(&q.window) || is(&q.remaining) || is(&q.reset))
            || self
                .usage
                .iter()
                .any(|u| u.header.eq_ignore_ascii_case(name))
    }

    /// Whether an answer of `status` with `body` means "rate limited"; then the signal, as
    /// the operator reads it (`403 REQUEST_LIMIT_EXCEEDED`).
    pub fn limited(&self, status: u16, body: &str) -> Option<String> {
        self.limited.iter().find_map(|l| match &l.body_contains {
            Some(text) if status == l.status && body.contains(text.as_str()) => {
                Some(format!("{status} {text}"))
            }
            None if status == l.status => Some(status.to_string()),
            _ => None,
        })
    }

    /// The headers whose delta reset may give a refused call's wait, in seconds.
    pub fn reset_seconds_headers(&self) -> impl Iterator<Item = &str> {
        self.quotas
            .iter()
            .filter(|q| q.reset_unit == ResetUnit::Seconds)
            .filter_map(|q| q.reset.as_deref())
    }

    /// What a response's `headers` state: the standard forms ([`super::headers::read`],
    /// `X-RateLimit-Reset` meant as [`RateSignals::reset`] says), then, field by field,
    /// these signals' own headers.
    pub fn read(&self, headers: &HeaderMap, now: DateTime<Utc>) -> Statement {
        super::headers::read(headers, self.reset, now).or(self.statement(headers, now))
    }

    /// What these signals' headers state: their quotas, the fewest requests left among
    /// them, the longest reset of an exhausted one (else the first stated). `now` is the
    /// instant an epoch reset is measured from.
    pub fn statement(&self, headers: &HeaderMap, now: DateTime<Utc>) -> Statement {
        let mut quotas = Vec::new();
        let mut left: Vec<(u32, Option<Duration>)> = Vec::new();
        let mut resets = Vec::new();
        for q in &self.quotas {
            let window = match (&q.window, q.window_seconds) {
                (Some(h), _) => number(headers, h).map(|n| match q.window_unit {
                    Unit::Seconds => Duration::from_secs(n),
                    // A quota is counted in whole seconds.
                    Unit::Milliseconds => Duration::from_secs(n / 1000),
                }),
                (None, Some(s)) => Some(Duration::from_secs(s)),
                (None, None) => None,
            }
            .filter(|w| !w.is_zero() && *w <= MAX_WINDOW);
            let limit = q.limit.as_deref().and_then(|h| count(headers, h));
            if let (Some(limit), Some(window)) = (limit, window) {
                quotas.push(Quota { limit, window });
            }
            let reset = q
                .reset
                .as_deref()
                .and_then(|h| reset(headers, h, q.reset_unit, now));
            resets.extend(reset);
            if let Some(r) = q.remaining.as_deref().and_then(|h| count(headers, h)) {
                left.push((r, reset));
            }
        }
        for u in &self.usage {
            let Some((used, limit)) = usage(headers, u) else {
                continue;
            };
            quotas.push(Quota {
                limit,
                window: Duration::from_secs(u.window_seconds),
            });
            left.push((limit.saturating_sub(used), None));
        }
        let fewest = left
            .iter()
            .copied()
            .min_by(|(r1, t1), (r2, t2)| r1.cmp(r2).then(t2.cmp(t1)));
        Statement {
            quota: quotas
                .iter()
                .copied()
                .min_by(|a, b| a.per_minute().total_cmp(&b.per_minute())),
            quotas,
            remaining: fewest.map(|(r, _)| r),
            reset: fewest.and_then(|(_, t)| t).or(resets.first().copied()),
        }
    }
}

/// The header's first value as a non-negative integer.
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    let raw = headers.get(name)?.to_str().ok()?;
    let s = raw.split([',', ';']).next()?.trim();
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// A count that fits a `u32`.
fn count(headers: &HeaderMap, name: &str) -> Option<u32> {
    number(headers, name)?.try_into().ok()
}

/// A reset as a wait from `now`, within [`super::headers::MAX_RESET`] (an instant past reads
/// as zero).
fn reset(headers: &HeaderMap, name: &str, unit: ResetUnit, now: DateTime<Utc>) -> Option<Duration> {
    let n = number(headers, name)?;
    let now_ms = u64::try_from(now.timestamp_millis()).ok()?;
    let wait = match unit {
        ResetUnit::Seconds => Duration::from_secs(n),
        ResetUnit::Milliseconds => Duration::from_millis(n),
        ResetUnit::Epoch => Duration::from_millis(n.checked_mul(1000)?.saturating_sub(now_ms)),
        ResetUnit::EpochMilliseconds => Duration::from_millis(n.saturating_sub(now_ms)),
    };
    (wait <= super::headers::MAX_RESET).then_some(wait)
}

/// The text before, between and after `{used}` and `{limit}`, and whether used comes first.
fn pattern_parts(pattern: &str) -> Option<(&str, &str, &str, bool)> {
    let (u, l) = (pattern.find("{used}")?, pattern.find("{limit}")?);
    if pattern.matches("{used}").count() != 1 || pattern.matches("{limit}").count() != 1 {
        return None;
    }
    let (first, second, used_first) = match u < l {
        true => (("{used}", u), ("{limit}", l), true),
        false => (("{limit}", l), ("{used}", u), false),
    };
    let between = &pattern[first.1 + first.0.len()..second.1];
    if between.is_empty() {
        return None;
    }
    Some((
        &pattern[..first.1],
        between,
        &pattern[second.1 + second.0.len()..],
        used_first,
    ))
}

/// `(used, limit)` from a usage header, the first comma-separated part that fits.
fn usage(headers: &HeaderMap, u: &UsageHeader) -> Option<(u32, u32)> {
    let (before, between, after, used_first) = pattern_parts(&u.pattern)?;
    let raw = headers.get(u.header.as_str())?.to_str().ok()?;
    raw.split(',').find_map(|part| {
        let rest = part.trim().strip_prefix(before)?;
        let rest = rest.strip_suffix(after).unwrap_or(rest);
        let (a, b) = rest.split_once(between)?;
        let parse = |s: &str| -> Option<u32> {
            let s = s.trim();
            (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let (a, b) = (parse(a)?, parse(b)?);
        Some(if used_first { (a, b) } else { (b, a) })
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_example_is_signals_courier_takes() {
        let examples = crate::doc_examples::of(include_str!("signals.rs"));
        assert_eq!(examples.len(), 1);
        super::RateSignals::parse(Some(&examples[0])).unwrap();
    }

    use serde_json::json;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::try_from(*k).unwrap(),
                    reqwest::header::HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn mistakes_are_refused_naming_the_field() {
        for (value, says) in [
            (json!({"quota": []}), "unknown field `quota`"),
            (json!({"quotas": [{"limit": "X Bad"}]}), "quotas[0].limit"),
            (json!({"quotas": [{}]}), "names no limit"),
            (
                json!({"quotas": [{"limit": "L", "window": "W", "window_seconds": 60}]}),
                "one",
            ),
            (
                json!({"usage": [{"header": "U", "pattern": "{used}{limit}", "window_seconds": 1}]}),
                "usage[0].pattern",
            ),
            (
                json!({"usage": [{"header": "U", "pattern": "{used}/{limit}", "window_seconds": 0}]}),
                "usage[0].window_seconds",
            ),
            (json!({"limited": [{"status": 429}]}), "limited[0].status"),
            (json!({"limited": [{"status": 200}]}), "limited[0].status"),
            (
                json!({"limited": [{"status": 403, "body_contains": ""}]}),
                "body_contains is empty",
            ),
            (json!({"reset": "weekly"}), "unknown variant `weekly`"),
        ] {
            let e = RateSignals::parse(Some(&value)).unwrap_err();
            assert!(e.reason.contains(says), "{value}: {e}");
            assert_eq!(e.field, "rate_signals");
        }
        assert_eq!(RateSignals::parse(None).unwrap(), RateSignals::default());
    }

    #[test]
    fn quotas_usage_and_resets_are_read_by_the_names_given() {
        let signals = RateSignals::parse(Some(&json!({
            "quotas": [
                {"limit": "X-Max", "window": "X-Interval-Ms", "window_unit": "ms",
                 "remaining": "X-Left", "reset": "X-Reset-Ms", "reset_unit": "ms"},
                {"limit": "X-Daily", "window_seconds": 86400, "remaining": "X-Daily-Left"}
            ],
            "usage": [{"header": "X-Usage", "pattern": "calls={used}/{limit}",
                       "window_seconds": 3600}]
        })))
        .unwrap();
        let now = Utc::now();
        let s = signals.statement(
            &headers(&[
                ("x-max", "100"),
                ("x-interval-ms", "10000"),
                ("x-left", "0"),
                ("x-reset-ms", "2500"),
                ("x-daily", "250000"),
                ("x-daily-left", "9"),
                ("x-usage", "other=1/2, calls=40/50"),
            ]),
            now,
        );
        assert_eq!(
            s.quotas,
            [
                Quota {
                    limit: 100,
                    window: Duration::from_secs(10)
                },
                Quota {
                    limit: 250_000,
                    window: Duration::from_secs(86_400)
                },
                Quota {
                    limit: 50,
                    window: Duration::from_secs(3600)
                },
            ]
        );
        assert_eq!(s.remaining, Some(0));
        assert_eq!(s.reset, Some(Duration::from_millis(2500)));
        assert!(signals.names("x-daily-left") && signals.names("x-usage"));
        assert!(!signals.names("x-other"));
        // Garbage is ignored field by field.
        let s = signals.statement(
            &headers(&[
                ("x-max", "-1"),
                ("x-interval-ms", "1e9"),
                ("x-usage", "calls=a/b"),
            ]),
            now,
        );
        assert!(s.is_empty(), "{s:?}");
    }

    #[test]
    fn an_epoch_reset_is_a_wait_from_now_and_a_past_one_none() {
        let signals = RateSignals::parse(Some(&json!({
            "quotas": [{"remaining": "R", "reset": "E", "reset_unit": "epoch"}]
        })))
        .unwrap();
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let s = signals.statement(&headers(&[("r", "0"), ("e", "1000030")]), now);
        assert_eq!(s.reset, Some(Duration::from_secs(30)));
        let s = signals.statement(&headers(&[("r", "0"), ("e", "999000")]), now);
        assert_eq!(s.reset, Some(Duration::ZERO));
    }

    #[test]
    fn a_limited_answer_is_known_by_its_status_and_marker() {
        let signals = RateSignals::parse(Some(&json!({
            "limited": [{"status": 403, "body_contains": "REQUEST_LIMIT_EXCEEDED"},
                        {"status": 503}]
        })))
        .unwrap();
        assert_eq!(
            signals.limited(403, r#"[{"errorCode":"REQUEST_LIMIT_EXCEEDED"}]"#),
            Some("403 REQUEST_LIMIT_EXCEEDED".into())
        );
        assert_eq!(signals.limited(403, "forbidden"), None);
        assert_eq!(signals.limited(503, ""), Some("503".into()));
        assert_eq!(
            RateSignals::default().limited(403, "REQUEST_LIMIT_EXCEEDED"),
            None
        );
    }
}
