//! What a budget learns about the target's real limit (pure functions; the pacer stores
//! the results in the `budgets` row and PostgreSQL's `courier_learned_rpm` and
//! `courier_effective_rpm` compute the same formulas for leases and `budget_rates`).
//!
//! - **Effective rate** = the least of the declared rate, the learned rate (after its
//!   probe back up) and the rate the target's headers advertise.
//! - **A 429** sets the learned rate from what the target accepted: the calls answered
//!   other than 429 since the previous 429's block ended (or the busy stretch started),
//!   across processes, per second of that stretch (at least one second). That estimate is kept
//!   within [`MIN_CUT`] and [`MAX_CUT`] of the rate paced at when the 429 came, so a
//!   sporadic 429 (the estimate is the rate itself) costs 1% and a declared rate far above
//!   the real one is corrected in one step when the estimate is good, in a few 30% steps
//!   otherwise. One 429 per [`ONE_CUT_PER`] counts: calls in flight meeting the same
//!   exhausted window do not cut again.
//! - **After a quiet period** ([`QUIET`]) without a 429 the learned rate probes upward by
//!   [`PROBE_PER_SECOND`], until it reaches the declared rate and is forgotten.

use chrono::{DateTime, Utc};

use crate::{pacer::HEADROOM, rate_headers::Statement};

/// A 429 never cuts the learned rate below this share of the rate paced at...
pub const MIN_CUT: f64 = 0.7;
/// ...and always cuts it at least to this share (a 429 says the pace was too fast).
pub const MAX_CUT: f64 = 0.99;
/// Calls accepted before a 429 for their rate to say what the target allows.
pub const MIN_SAMPLE: i64 = 3;
/// A lone 429 after too few accepted calls to measure (jitter against a limiter without
/// burst) cuts the pace to this share.
pub const LONE_CUT: f64 = 0.97;
/// The learned rate never goes below this share of the declared rate: a target that
/// answers nothing but 429 (a spent daily quota) is left to its blocks.
pub const MIN_SHARE: f64 = 0.05;
/// Seconds without a 429 before the learned rate probes upward.
pub const QUIET: f64 = 30.0;
/// The upward probe's growth per second after the quiet period (multiplicative).
pub const PROBE_PER_SECOND: f64 = 0.01;
/// The shortest stretch an accepted-rate estimate divides by, in seconds: a target
/// counting on one-second windows lets a burst through faster than its rate.
pub const MIN_STRETCH: f64 = 1.0;
/// A 429 within this long of the previous one does not cut again.
pub const ONE_CUT_PER: chrono::Duration = chrono::Duration::seconds(1);
/// A statement from the target's headers holds this long unless restated.
pub const ADVERTISED_FOR: chrono::Duration = chrono::Duration::minutes(10);

/// A spent budget (remaining 0) whose reset comes within this long is sat out by the
/// pacer within the batch; a longer one stops the batch, which waits in the queue.
pub const HOLD_IN_BATCH: std::time::Duration = std::time::Duration::from_secs(1);

/// When a response says the budget is spent (remaining 0 with a reset): the reset.
pub fn spent_until(statement: &Statement, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    match (statement.remaining, statement.reset) {
        (Some(0), Some(reset)) if !reset.is_zero() => {
            Some(at + chrono::Duration::from_std(reset).ok()?)
        }
        _ => None,
    }
}

/// The learned rate at `at` after its probe upward, or `None` once it is back at (or
/// above) the declared rate: nothing learned any more.
pub fn learned_now(
    learned: Option<f64>,
    learned_at: Option<DateTime<Utc>>,
    declared: u32,
    at: DateTime<Utc>,
) -> Option<f64> {
    let (learned, learned_at) = (learned?, learned_at?);
    let quiet_for = (at - learned_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
    let v = learned * (PROBE_PER_SECOND * (quiet_for - QUIET).max(0.0)).exp();
    (v < f64::from(declared)).then_some(v)
}

/// The advertised rate, while its statement holds.
pub fn advertised_now(
    advertised: Option<f64>,
    advertised_at: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
) -> Option<f64> {
    advertised.filter(|_| advertised_at.is_some_and(|t| t > at - ADVERTISED_FOR))
}

/// The rate to pace at: the least of the three, at least 1 request per minute.
pub fn effective(declared: u32, learned: Option<f64>, advertised: Option<f64>) -> f64 {
    let mut rpm = f64::from(declared);
    for v in [learned, advertised].into_iter().flatten() {
        rpm = rpm.min(v);
    }
    rpm.max(1.0)
}

/// The requests per minute the target accepted: `accepted` calls since `since` (the end
/// of the previous 429's block, or the start of the busy stretch), over at least
/// [`MIN_STRETCH`]; `None` without a stretch to measure.
pub fn accepted_rpm(accepted: i64, since: Option<DateTime<Utc>>, at: DateTime<Utc>) -> Option<f64> {
    let secs = (at - since?).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
    Some(accepted.max(0) as f64 * 60.0 / secs.max(MIN_STRETCH))
}

/// What a 429 knows when it comes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evidence {
    /// The rate the target accepted over the stretch before it ([`accepted_rpm`]).
    pub accepted_rpm: Option<f64>,
    /// Calls accepted in that stretch.
    pub accepted: i64,
    /// Whether an earlier 429 came within [`QUIET`] seconds.
    pub recent_429: bool,
}

/// The learned rate after a 429 met while pacing at `paced` requests per minute.
///
/// With at least [`MIN_SAMPLE`] calls accepted before it, the rate the target accepted
/// decides (the pace leaves [`HEADROOM`] unused, so an accepted rate equal to the pace less
/// the headroom means the pace itself was about right), kept within [`MIN_CUT`] and
/// [`MAX_CUT`] of the pace. With fewer, the stretch says nothing: a lone 429 (none within
/// the quiet period) is taken for jitter on a limiter without burst and costs
/// [`LONE_CUT`]; one following another recent 429 cuts by [`MIN_CUT`]. Never below
/// [`MIN_SHARE`] of `declared`.
pub fn after_429(paced: f64, evidence: Evidence, declared: u32) -> f64 {
    let learned = match evidence.accepted_rpm {
        Some(rate) if evidence.accepted >= MIN_SAMPLE => {
            (rate / (1.0 - HEADROOM)).clamp(paced * MIN_CUT, paced * MAX_CUT)
        }
        _ if evidence.recent_429 => paced * MIN_CUT,
        _ => paced * LONE_CUT,
    };
    learned.max(f64::from(declared) * MIN_SHARE).max(1.0)
}

/// Requests per minute a stated quota of `limit` per `window` allows.
pub fn quota_rpm(limit: u32, window: std::time::Duration) -> Option<f64> {
    let secs = window.as_secs_f64();
    (limit > 0 && secs > 0.0).then(|| f64::from(limit) * 60.0 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: f64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::microseconds((s * 1e6) as i64)
    }

    fn ev(accepted_rpm: Option<f64>, accepted: i64, recent_429: bool) -> Evidence {
        Evidence {
            accepted_rpm,
            accepted,
            recent_429,
        }
    }

    #[test]
    fn a_sporadic_429_costs_one_percent() {
        // 300 calls accepted over 30 s at 98% of 600/min: the pace was right.
        let accepted = accepted_rpm(294, Some(t(0.0)), t(30.0));
        let learned = after_429(600.0, ev(accepted, 294, false), 600);
        assert!((learned - 594.0).abs() < 1e-9, "{learned}");
        // A 429 after a single accepted call (a late call, then one on time, against a
        // limiter without burst): 3%.
        let lone = after_429(
            600.0,
            ev(accepted_rpm(1, Some(t(0.0)), t(0.2)), 1, false),
            600,
        );
        assert!((lone - 582.0).abs() < 1e-9, "{lone}");
    }

    #[test]
    fn a_rate_declared_too_high_is_cut_to_what_was_accepted() {
        // Declared 10/s, the target let 5 through in its one-second window.
        let accepted = accepted_rpm(5, Some(t(0.0)), t(0.5));
        assert_eq!(accepted, Some(300.0), "at least one second is measured");
        let learned = after_429(600.0, ev(accepted, 5, false), 600);
        assert!(
            (learned - 420.0).abs() < 1e-9,
            "a 30% step at most: {learned}"
        );
        // The next 429, after a 1.5 s stretch with 5 accepted: 30% again at most.
        let second = ev(accepted_rpm(5, Some(t(0.5)), t(2.0)), 5, true);
        let learned = after_429(learned, second, 600);
        assert!((learned - 294.0).abs() < 1e-9, "{learned}");
        // Too little accepted to measure, after another recent 429: the deepest cut.
        assert!((after_429(100.0, ev(None, 0, true), 100) - 70.0).abs() < 1e-9);
        let floor = after_429(40.0, ev(None, 0, true), 600);
        assert_eq!(floor, 30.0, "never below 5% of declared");
        assert_eq!(
            after_429(1.0, ev(None, 0, false), 1),
            1.0,
            "never below 1/min"
        );
        assert_eq!(accepted_rpm(3, None, t(1.0)), None);
    }

    #[test]
    fn the_learned_rate_holds_then_probes_back_to_the_declared_one() {
        let at = t(100.0);
        let learned = |secs: f64| learned_now(Some(300.0), Some(at), 600, t(100.0 + secs));
        assert_eq!(learned(0.0), Some(300.0));
        assert_eq!(
            learned(QUIET),
            Some(300.0),
            "holds through the quiet period"
        );
        let probed = learned(QUIET + 10.0).unwrap();
        assert!(probed > 300.0 && probed < 340.0, "{probed}");
        // ln 2 / 1% ≈ 69.3 s after the quiet period it is back at the declared rate.
        assert!(learned(QUIET + 69.0).is_some());
        assert_eq!(
            learned(QUIET + 70.0),
            None,
            "forgotten at the declared rate"
        );
        assert_eq!(learned_now(None, Some(at), 600, at), None);
        assert_eq!(learned_now(Some(300.0), None, 600, at), None);
    }

    #[test]
    fn effective_is_the_least_and_advertising_lapses() {
        assert_eq!(effective(600, None, None), 600.0);
        assert_eq!(effective(600, Some(420.0), None), 420.0);
        assert_eq!(effective(600, Some(420.0), Some(300.0)), 300.0);
        assert_eq!(
            effective(600, None, Some(6_000.0)),
            600.0,
            "never above declared"
        );
        assert_eq!(effective(600, Some(0.01), None), 1.0);
        let at = t(1_000.0);
        assert_eq!(advertised_now(Some(300.0), Some(t(999.0)), at), Some(300.0));
        assert_eq!(
            advertised_now(Some(300.0), Some(t(1_000.0 - 601.0)), at),
            None
        );
        assert_eq!(quota_rpm(5, std::time::Duration::from_secs(1)), Some(300.0));
        assert_eq!(
            quota_rpm(100, std::time::Duration::from_secs(60)),
            Some(100.0)
        );
        assert_eq!(quota_rpm(0, std::time::Duration::from_secs(1)), None);
        assert_eq!(quota_rpm(5, std::time::Duration::ZERO), None);
    }
}
