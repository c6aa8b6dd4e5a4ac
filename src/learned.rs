//! What a budget learns about the target's real limit (pure functions; the pacer stores
//! the results in the `budgets` row and PostgreSQL's `courier_learned_rpm` and
//! `courier_effective_rpm` compute the same formulas for leases and `budget_rates`).
//!
//! - **Effective rate** = the least of the declared rate, the learned rate (after its
//!   probes back up) and the rate the target's headers advertise.
//! - **A 429** says the pace `p` was above the real limit. What the target accepted since
//!   the previous 429's block ended (or the busy stretch started), across processes, per
//!   second of that stretch (at least one second), tells by how much:
//!   - accepted well below the pace ([`MEASURED`]) over a short stretch
//!     ([`MEASURE_WITHIN`]): a window or bucket let its budget through and refused the
//!     rest; what it let through per second is the limit, taken as the learned rate in one
//!     step (a rate declared 10× too high is corrected by one 429). Within [`QUIET`] of
//!     another 429 the stretch may have met another client's burst: the cut is at most a
//!     half;
//!   - accepted about at the pace, soon after another 429's block, but what the target
//!     let through *between the two refusals* (that block included, [`between_rpm`])
//!     under 60% of the pace ([`BETWEEN_CUT_BELOW`]): a bucket with a burst refilled
//!     during the block and let the excess through until it was empty (over block and
//!     stretch, it let through exactly its rate), or a window lost the block's time (it
//!     let through less than its rate). The rate between refusals is taken, with a fast
//!     probe back towards the pace: a bucket's 429 then lets the same through between
//!     refusals again, which settles the rate without a probe ([`Lesson::Bucket`]); a
//!     window's lets through less, well below the pace refused, which lay some 40% past
//!     its limit ([`WINDOW_PAST`]): the limit is taken from it. A late call's 429 soon after
//!     another looks the same, and the probe gives its pace back within seconds. Taken
//!     once: not after a probe's 429 nor in a streak, where a window's lost block time
//!     would halve the pace again and again; nor after a halving, where a limiter with no
//!     burst let through only the climb back;
//!   - accepted about at the pace after a measured cut, but 60–95% of the rate sent let
//!     through between the two refusals ([`BUCKET_BELOW`]): the measure counted a bucket's
//!     burst, which then hid the excess until it was empty; over the block and
//!     the stretch the bucket let through its refill rate, which is taken and settled
//!     ([`Lesson::Bucket`]; a bucket of 10 at 10/s declared 5× too high is found by its
//!     second 429, some 6 s in);
//!   - accepted about at the pace: the limit lies just below it; a sporadic 429 costs 1%
//!     ([`MAX_CUT`]); one met while the learned rate probes up fast 12% ([`PROBE_CUT`]:
//!     the limit refuses a slice or two after it is crossed), slowly 3%; one within
//!     [`QUIET`] of another 3%, the next in a row 6%, then 9%... ([`recent_cut`]);
//!   - too few accepted to measure ([`MIN_SAMPLE`]): a limiter with no burst refused the
//!     second call. Alone that may be a late call ([`LONE_CUT`], 1%); within [`QUIET`] of
//!     another 429 the pace is halved ([`NO_BURST_CUT`]), and cut to 35% if the halved
//!     pace is refused at once again ([`HALVED_AGAIN_CUT`]); after half a second at the
//!     cut pace ([`FAST_HOLD`]) it **probes back up fast** ([`FAST_PROBE_PER_SECOND`])
//!     towards the pace that was refused (the *ceiling*), so the limit is found between the
//!     two by the next 429.
//!
//!   One 429 per [`ONE_CUT_PER`] counts: calls in flight meeting the same exhausted window
//!   do not cut again.
//! - **After a quiet period** ([`QUIET`]) without a 429 the learned rate probes upward
//!   slowly ([`PROBE_PER_SECOND`]), until it reaches the declared rate and is forgotten:
//!   a limit that rose again is found again, never above the declared rate.

use chrono::{DateTime, Utc};

use crate::{pacer::HEADROOM, rate_headers::Statement};

/// A sporadic 429 (none within [`QUIET`] before it) at about the pace cuts it to this share.
pub const MAX_CUT: f64 = 0.99;
/// A 429 at about the pace within [`QUIET`] of another cuts it to this share.
pub const RECENT_CUT: f64 = 0.97;
/// A 429 met while the learned rate probes up fast cuts the pace to this share: back below
/// the limit it just crossed, with room for the probe's overshoot. The refusal comes a
/// slice or two after the crossing (about 0.45 s at 10/s, 8–9% past the limit at
/// [`FAST_PROBE_PER_SECOND`]; BENCHMARKS.md, `limits`); a cut of 8% would leave the pace
/// 0.4% below the limit, where one late call meets the next 429. One that ends the slow
/// probe cuts [`RECENT_CUT`]'s 3%.
pub const PROBE_CUT: f64 = 0.88;
/// A fast probe's 429 from a window comes this far past the window's limit: a window
/// refuses once one of them fills, a second or so after the climb (20% a second) crossed
/// it (1.29–1.43× a 5/s window, with one process and three; BENCHMARKS.md, `limits`).
/// Taken near the top: a rate found a few percent high costs another 429 and its block, one
/// found a few percent low costs those few percent until the slow probe.
pub const WINDOW_PAST: f64 = 1.4;
/// An accepted rate below this share of the rate sent says what the limit is...
pub const MEASURED: f64 = 0.9;
/// ...when measured over a stretch this short (seconds): a window or bucket refusing a
/// burst. Over a longer one the pace changed (a probe, a drop) and the average says less.
pub const MEASURE_WITHIN: f64 = 3.0;
/// Calls accepted before a 429 for their rate to say what the target allows.
pub const MIN_SAMPLE: i64 = 5;
/// A 429 after too few accepted calls to measure (a limiter with no burst) cuts the pace
/// to this share within [`QUIET`] of another 429 (the deepest cut of all but the next)...
pub const NO_BURST_CUT: f64 = 0.5;
/// ...and to this share when the pace that cut left was refused at once again, before its
/// probe began: the limit lies below half the pace first refused. Each such cut costs a
/// block (a second, sending nothing) and a 429, the probe from a pace cut too deep only
/// seconds at a lower pace: a rate declared 10× too high lands below the limit after three
/// cuts, not four (five 429s in all, 1.6% of a 300-record drain, not six), one declared
/// 5× too high after two, at 87% of the limit (not three, at 62%).
pub const HALVED_AGAIN_CUT: f64 = 0.35;
/// ...and to this share otherwise: one call arriving late and the next on time make a lone
/// 429 of a limiter without burst, at any pace.
pub const LONE_CUT: f64 = MAX_CUT;
/// Seconds after the 429's block ends before the fast probe towards the ceiling starts:
/// the pace the 429 left is tried first (a limiter with no burst refuses the second call
/// after the block if it is still too fast).
pub const FAST_HOLD: f64 = 0.5;
/// The fast probe's growth per second (multiplicative), up to the ceiling: from a halved
/// pace 62% of the limit (a rate declared 10× too high, halved four times) to the limit in
/// 2.4 s. A slice of slots (a quarter second's worth) is leased at one rate: the rate a
/// 429 cuts is that of the refused call's slice.
pub const FAST_PROBE_PER_SECOND: f64 = 0.2;
/// A 429 at about the pace soon after another, when the target let through, between the
/// two refusals (the block included), less than this share of the rate sent: a bucket that
/// refilled during the block and let the excess through until it was empty again within
/// half a block's time ([`between_rpm`]; a bucket of a second's refill, paced at twice its
/// rate, lets through about half the pace), or a window that lost the block's time. The
/// rate between refusals is taken, and a fast probe climbs back towards the pace refused:
/// a window's limit is found above it by the probe's 429, a bucket's is confirmed by a
/// rate between refusals the same again ([`SAME_BETWEEN`]). A late call's 429 (a limiter
/// with no burst refuses one at any pace) soon after another looks the same; later after
/// it, it is cut as one at the pace ([`recent_cut`]).
pub const BETWEEN_CUT_BELOW: f64 = 0.6;
/// After a measured cut, a 429 at about the pace when the target let through, between the
/// two refusals (the block included), less than this share of the rate sent: the measure
/// counted a bucket's burst (a bucket of a second's refill reads 11–12/s for its 10/s
/// while the burst lasts), which then hid the excess until it was empty; over block and stretch it let
/// through its refill rate (92% of the rate sent at 11/s, 85% at 12/s), which is taken. A
/// window's late call 1.5–19 s after its measured cut looks the same; the slow probe gives
/// its pace back. Below [`BETWEEN_CUT_BELOW`] (a stretch shorter than one and a half
/// blocks) a window's lost block time may be most of it: the rate between refusals is
/// taken with a fast probe instead.
pub const BUCKET_BELOW: f64 = 0.95;
/// Two rates between refusals this close (a share of the first) are a bucket's refill,
/// which repeats to within a percent or so. A window's differ by more: the block costs it
/// a varying part of a window each time.
pub const SAME_BETWEEN: f64 = 0.05;
/// The learned rate never goes below this share of the declared rate: a target that
/// answers nothing but 429 (a spent daily quota) is left to its blocks.
pub const MIN_SHARE: f64 = 0.05;
/// Seconds without a 429 before the learned rate probes upward slowly.
pub const QUIET: f64 = 60.0;
/// The slow probe's growth per second (multiplicative).
pub const PROBE_PER_SECOND: f64 = 0.01;
/// The largest exponent a probe grows by (e^40 is past any declared rate; the cap keeps
/// PostgreSQL's `exp` from overflowing on a budget quiet for days).
pub const MAX_GROWTH: f64 = 40.0;
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

/// What a budget row holds about its learned rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Learned {
    /// The rate set by the last 429 (`None`: nothing learned).
    pub rpm: Option<f64>,
    /// When it took hold: the end of the block the 429 set (the probes count from then).
    pub at: Option<DateTime<Utc>>,
    /// The rate the fast probe climbs towards (the pace a limiter with no burst refused).
    pub ceiling: Option<f64>,
}

fn secs(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

impl Learned {
    /// The learned rate at `at`, after its fast probe towards the ceiling and its slow one
    /// past the quiet period; `None` once it is back at (or above) the declared rate:
    /// nothing learned any more.
    pub fn now(&self, declared: u32, at: DateTime<Utc>) -> Option<f64> {
        let (learned, learned_at) = (self.rpm?, self.at?);
        let s = secs(learned_at, at);
        let growth = |rate: f64, after: f64| (rate * (s - after).max(0.0)).min(MAX_GROWTH).exp();
        let fast = match self.ceiling {
            Some(c) if c > learned => c.min(learned * growth(FAST_PROBE_PER_SECOND, FAST_HOLD)),
            _ => learned,
        };
        let v = fast * growth(PROBE_PER_SECOND, QUIET);
        (v < f64::from(declared)).then_some(v)
    }

    /// How the learned rate is climbing at `at`: in its fast probe (past its hold, not yet
    /// at its ceiling: a 429 there says the probe crossed the limit; one at the ceiling
    /// is one at the pace), its slow one (past the quiet period), or not.
    pub fn probing(&self, at: DateTime<Utc>) -> Probe {
        let (Some(learned), Some(learned_at)) = (self.rpm, self.at) else {
            return Probe::No;
        };
        let s = secs(learned_at, at);
        let climbing = |c: f64| {
            c > learned
                * (FAST_PROBE_PER_SECOND * (s - FAST_HOLD))
                    .min(MAX_GROWTH)
                    .exp()
        };
        if self.ceiling.is_some_and(climbing) && s > FAST_HOLD && s < QUIET {
            Probe::Fast
        } else if s > QUIET {
            Probe::Slow
        } else {
            Probe::No
        }
    }
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
    Some(accepted.max(0) as f64 * 60.0 / secs(since?, at).max(MIN_STRETCH))
}

/// Whether a learned rate is probing upward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It holds.
    No,
    /// By [`FAST_PROBE_PER_SECOND`], towards its ceiling.
    Fast,
    /// By [`PROBE_PER_SECOND`], after the quiet period.
    Slow,
}

/// What a 429 knows when it comes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evidence {
    /// The rate the target accepted over the stretch before it ([`accepted_rpm`]).
    pub accepted_rpm: Option<f64>,
    /// Calls accepted in that stretch.
    pub accepted: i64,
    /// The stretch's length in seconds.
    pub stretch: f64,
    /// Whether an earlier 429 came within [`QUIET`] seconds.
    pub recent_429: bool,
    /// The cuts at about the pace in a row before this 429 ([`Cut::streak`]).
    pub streak: u32,
    /// Whether the pace was climbing in a probe ([`Learned::probing`]).
    pub probing: Probe,
    /// The rate the target let through since the previous 429, its block included
    /// ([`between_rpm`]); `None` without one within [`QUIET`].
    pub between_rpm: Option<f64>,
    /// How the learned rate was set last, and the rate it set (before its probes).
    pub previous: Option<(Lesson, f64)>,
}

/// Requests per minute the target let through between two 429s: `accepted` calls over the
/// previous 429's block (`block` seconds) and the stretch since (`stretch` seconds). A
/// bucket refills during the block and lets that much through after it: over both, its
/// rate exactly. Any limiter lets through at most about its rate over the two.
pub fn between_rpm(accepted: i64, block: f64, stretch: f64) -> Option<f64> {
    let secs = block.max(0.0) + stretch.max(0.0);
    (secs > 0.0).then(|| accepted.max(0) as f64 * 60.0 / secs.max(MIN_STRETCH))
}

/// How a 429 set the learned rate (stored with it in the budget row as text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lesson {
    /// A lone 429 after too few accepted calls: [`LONE_CUT`].
    Lone,
    /// Again after too few: [`NO_BURST_CUT`] ([`HALVED_AGAIN_CUT`] after another such
    /// cut), with a fast probe.
    Halved,
    /// What a window or bucket let through over a short stretch.
    Measured,
    /// The rate between two refusals, with a fast probe ([`BETWEEN_CUT_BELOW`]).
    Between,
    /// A bucket's refill: the rate between refusals after a measured cut ([`BUCKET_BELOW`]),
    /// or the same rate between refusals again after the fast probe ([`SAME_BETWEEN`]).
    Bucket,
    /// A 429 met by the fast probe: [`PROBE_CUT`].
    Probe,
    /// A 429 met by the slow probe: [`RECENT_CUT`].
    SlowProbe,
    /// Again at about the pace: [`recent_cut`].
    Streak,
    /// A sporadic 429 at about the pace: [`MAX_CUT`].
    Sporadic,
}

impl Lesson {
    /// Every lesson (the names the migration's CHECK allows).
    pub const ALL: [Lesson; 9] = [
        Lesson::Lone,
        Lesson::Halved,
        Lesson::Measured,
        Lesson::Between,
        Lesson::Bucket,
        Lesson::Probe,
        Lesson::SlowProbe,
        Lesson::Streak,
        Lesson::Sporadic,
    ];

    /// The name stored in `budgets.learned_by`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lesson::Lone => "lone",
            Lesson::Halved => "halved",
            Lesson::Measured => "measured",
            Lesson::Between => "between",
            Lesson::Bucket => "bucket",
            Lesson::Probe => "probe",
            Lesson::SlowProbe => "slow_probe",
            Lesson::Streak => "streak",
            Lesson::Sporadic => "sporadic",
        }
    }

    /// The lesson a stored name stands for (`None` for an unknown one).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == name)
    }
}

/// The cut of the `streak`-th 429 in a row at about the pace, each within [`QUIET`] of the
/// one before: [`RECENT_CUT`]'s 3%, twice that, three times..., at most a half. A
/// limit just below the pace is met again at once (a fixed window refuses the call after
/// its quota in every window), and the accepted rate cannot show by how much: a
/// window entered after a block lets its whole quota through.
pub fn recent_cut(streak: u32) -> f64 {
    (1.0 - (1.0 - RECENT_CUT) * f64::from(streak.max(1))).max(NO_BURST_CUT)
}

/// What a 429 teaches a budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cut {
    /// The learned rate.
    pub rpm: f64,
    /// The rate a fast probe climbs towards, if any.
    pub ceiling: Option<f64>,
    /// The cuts at about the pace in a row, each within [`QUIET`] of the one before, this
    /// one included ([`recent_cut`]); 0 after any other cut.
    pub streak: u32,
    /// How it was set.
    pub by: Lesson,
}

/// What a 429 met while pacing at `paced` requests per minute teaches (see the module's
/// description). Never below [`MIN_SHARE`] of `declared`.
pub fn after_429(paced: f64, evidence: Evidence, declared: u32) -> Cut {
    let sent = paced * (1.0 - HEADROOM);
    let mut streak = 0;
    let between = evidence.between_rpm.filter(|_| evidence.recent_429);
    // The target let through well below the rate sent over the stretch.
    let well_below = evidence.accepted_rpm.is_some_and(|a| a < sent * MEASURED);
    let (learned, ceiling, by) = match evidence.accepted_rpm {
        _ if evidence.accepted < MIN_SAMPLE && !evidence.recent_429 => {
            (paced * LONE_CUT, None, Lesson::Lone)
        }
        _ if evidence.accepted < MIN_SAMPLE => {
            let again = evidence.probing == Probe::No
                && evidence.previous.is_some_and(|(l, _)| l == Lesson::Halved);
            let cut = if again {
                HALVED_AGAIN_CUT
            } else {
                NO_BURST_CUT
            };
            (paced * cut, Some(paced * RECENT_CUT), Lesson::Halved)
        }
        Some(rate)
            if well_below
                && evidence.stretch <= MEASURE_WITHIN
                && evidence.probing == Probe::No =>
        {
            // Soon after another 429, a deep cut is in doubt (the stretch may have met
            // another client's burst): at most halved.
            let floor = if evidence.recent_429 {
                paced * NO_BURST_CUT
            } else {
                0.0
            };
            (rate.min(paced).max(floor), None, Lesson::Measured)
        }
        _ => {
            let (rpm, ceiling, by, run) = about_the_pace(evidence, paced, between, well_below);
            streak = run;
            (rpm, ceiling, by)
        }
    };
    let floor = (f64::from(declared) * MIN_SHARE).max(1.0);
    Cut {
        rpm: learned.max(floor),
        ceiling: ceiling.filter(|&c| c > learned.max(floor)),
        streak,
        by,
    }
}

/// A 429 when the target let through about the pace, or while a probe climbed: what the
/// rate between refusals (`between`) and the lesson before say the limit is. Also the
/// streak of such cuts this one continues (0 when it is of another kind).
fn about_the_pace(
    evidence: Evidence,
    paced: f64,
    between: Option<f64>,
    well_below: bool,
) -> (f64, Option<f64>, Lesson, u32) {
    let sent = paced * (1.0 - HEADROOM);
    let (rpm, ceiling, by) = match (evidence.probing, between, evidence.previous) {
        // After a measured cut, the target let through 60–95% of the rate sent between
        // the two refusals: a bucket's burst hid the excess the measure left, and over
        // block and stretch it let through its refill rate. Settled without a probe.
        (Probe::No, Some(e), Some((Lesson::Measured, _)))
            if (sent * BETWEEN_CUT_BELOW..sent * BUCKET_BELOW).contains(&e) =>
        {
            (e.min(paced), None, Lesson::Bucket)
        }
        // The probe from a rate between refusals met the same rate again: a bucket.
        (Probe::Fast, Some(e), Some((Lesson::Between, from)))
            if (e - from).abs() <= from * SAME_BETWEEN =>
        {
            (e.min(paced), None, Lesson::Bucket)
        }
        // Not the same rate between refusals, and well below the pace over the probe's
        // stretch: a window, whose block cost it part of a window between refusals,
        // and which let through all the probe sent as it climbed from under its limit
        // until one window filled, [`WINDOW_PAST`] past the limit. The pace refused
        // over that overshoot, never below the rate between refusals, is taken as the
        // probe's lesson (not as measured: a window's 429 at about that pace is a
        // streak's, not a bucket's). The climb's average says only where it started.
        (Probe::Fast, Some(e), Some((Lesson::Between, _))) if well_below => {
            ((paced / WINDOW_PAST).max(e), None, Lesson::Probe)
        }
        (Probe::Fast, ..) => (paced * PROBE_CUT, None, Lesson::Probe),
        // The slow probe overshoots the limit by a quarter second's growth at most.
        (Probe::Slow, ..) => (paced * RECENT_CUT, None, Lesson::SlowProbe),
        // Once: after a rate between refusals has been taken and probed from, a window
        // whose block keeps costing it time would halve the pace at every other 429.
        (Probe::No, Some(e), previous)
            if e < sent * BETWEEN_CUT_BELOW
                && evidence.streak == 0
                && !previous.is_some_and(|(l, _)| {
                    matches!(
                        l,
                        Lesson::Between | Lesson::Probe | Lesson::Bucket | Lesson::Halved
                    )
                }) =>
        {
            (
                e.max(paced * NO_BURST_CUT),
                Some(paced * RECENT_CUT),
                Lesson::Between,
            )
        }
        (Probe::No, ..) if evidence.recent_429 => {
            let streak = evidence.streak + 1;
            return (paced * recent_cut(streak), None, Lesson::Streak, streak);
        }
        (Probe::No, ..) => (paced * MAX_CUT, None, Lesson::Sporadic),
    };
    (rpm, ceiling, by, 0)
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
            stretch: 1.0,
            recent_429,
            streak: 0,
            probing: Probe::No,
            between_rpm: None,
            previous: None,
        }
    }

    /// The learned rate and ceiling of [`after_429`].
    fn cut(paced: f64, evidence: Evidence, declared: u32) -> (f64, Option<f64>) {
        let c = after_429(paced, evidence, declared);
        (c.rpm, c.ceiling)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_sporadic_429_costs_one_percent() {
        // 294 calls accepted over 30 s at 98% of 600/min: the pace was right.
        let accepted = accepted_rpm(294, Some(t(0.0)), t(30.0));
        let (learned, _) = cut(600.0, ev(accepted, 294, false), 600);
        assert!(close(learned, 594.0), "{learned}");
        // 240 over 30 s, after a probe climbed: too long a stretch to measure the limit by.
        let long = Evidence {
            stretch: 30.0,
            ..ev(accepted_rpm(240, Some(t(0.0)), t(30.0)), 240, false)
        };
        let (learned, ceiling) = cut(600.0, long, 600);
        assert!(close(learned, 594.0), "{learned}");
        assert_eq!(ceiling, None, "no fast probe: the limit is just below");
        // Another within the quiet period: 3%.
        let (again, _) = cut(594.0, ev(accepted, 294, true), 600);
        assert!(close(again, 594.0 * RECENT_CUT), "{again}");
    }

    #[test]
    fn a_429_again_and_again_at_about_the_pace_cuts_deeper_each_time() {
        let again = |streak| {
            let evidence = Evidence {
                streak,
                ..ev(Some(590.0), 50, true)
            };
            after_429(600.0, evidence, 600)
        };
        assert!(close(again(0).rpm, 600.0 * 0.97));
        assert_eq!(again(0).streak, 1);
        assert!(close(again(1).rpm, 600.0 * 0.94));
        assert!(close(again(2).rpm, 600.0 * 0.91));
        assert!(close(again(15).rpm, 600.0 * 0.52));
        assert_eq!(again(16).rpm, 300.0, "at most halved");
        assert_eq!(again(u32::MAX - 1).rpm, 300.0);
        // Any other cut ends the streak: a sporadic one, one while probing, a measured one.
        let sporadic = Evidence {
            streak: 3,
            ..ev(Some(590.0), 50, false)
        };
        assert_eq!(after_429(600.0, sporadic, 600).streak, 0);
        let probe = Evidence {
            streak: 3,
            probing: Probe::Fast,
            ..ev(Some(590.0), 50, true)
        };
        assert_eq!(after_429(600.0, probe, 600).streak, 0);
        let measured = Evidence {
            streak: 3,
            ..ev(Some(400.0), 8, true)
        };
        assert_eq!(after_429(600.0, measured, 600).streak, 0);
        // Measured soon after another 429: taken, but at most halved, and no fast probe.
        assert_eq!(cut(600.0, ev(Some(400.0), 8, true), 600), (400.0, None));
        assert_eq!(cut(600.0, ev(Some(100.0), 8, true), 600), (300.0, None));
    }

    #[test]
    fn a_rate_declared_too_high_is_cut_to_what_was_accepted_in_one_step() {
        // Declared 100/s, the target let 10 through in its one-second window.
        let accepted = accepted_rpm(10, Some(t(0.0)), t(0.1));
        assert_eq!(accepted, Some(600.0), "at least one second is measured");
        let (learned, ceiling) = cut(6_000.0, ev(accepted, 10, false), 6_000);
        assert_eq!((learned, ceiling), (600.0, None));
        // Never above the pace itself.
        let (learned, _) = cut(500.0, ev(Some(440.0), 40, false), 600);
        assert!(close(learned, 440.0), "{learned}");
        let floor = cut(40.0, ev(Some(1.0), 3, true), 600).0;
        assert_eq!(floor, 30.0, "never below 5% of declared");
        assert_eq!(accepted_rpm(3, None, t(1.0)), None);
    }

    #[test]
    fn a_limiter_without_burst_halves_the_pace_which_probes_back_up_fast() {
        // Declared 20/s against 10/s with no burst: the second call was refused. The first
        // time it may have been a late call: 1%.
        let lone = cut(1_200.0, ev(Some(60.0), 1, false), 1_200);
        assert_eq!(lone, (1_200.0 * LONE_CUT, None));
        // Again within the quiet period: halved, and a fast probe back towards the pace.
        let (learned, ceiling) = cut(1_200.0, ev(Some(60.0), 1, true), 1_200);
        assert_eq!(learned, 600.0);
        assert_eq!(ceiling, Some(1_200.0 * RECENT_CUT));
        let l = Learned {
            rpm: Some(learned),
            at: Some(t(100.0)),
            ceiling,
        };
        let at = |s: f64| l.now(1_200, t(100.0 + s)).unwrap();
        assert_eq!(at(FAST_HOLD), 600.0, "the halved pace is tried first");
        assert_eq!(l.probing(t(100.0 + FAST_HOLD)), Probe::No);
        assert!(close(
            at(FAST_HOLD + 2.0),
            600.0 * (2.0 * FAST_PROBE_PER_SECOND).exp()
        ));
        assert_eq!(l.probing(t(100.0 + FAST_HOLD + 2.0)), Probe::Fast);
        assert_eq!(
            at(FAST_HOLD + 20.0),
            1_200.0 * RECENT_CUT,
            "up to its ceiling"
        );
        assert_eq!(
            l.probing(t(100.0 + FAST_HOLD + 20.0)),
            Probe::No,
            "a 429 at the ceiling is one at the pace"
        );
        // The halved pace refused at once again: 35% of it, with a fast probe back up
        // to the pace refused; one met while its probe climbs is the probe's.
        let again = |probing| Evidence {
            probing,
            previous: Some((Lesson::Halved, 600.0)),
            ..ev(Some(60.0), 1, true)
        };
        let third = after_429(600.0, again(Probe::No), 1_200);
        assert_eq!(
            (third.rpm, third.ceiling, third.by),
            (
                600.0 * HALVED_AGAIN_CUT,
                Some(600.0 * RECENT_CUT),
                Lesson::Halved
            )
        );
        assert_eq!(after_429(700.0, again(Probe::Fast), 1_200).rpm, 350.0);
        // After any other lesson: halved.
        let other = Evidence {
            previous: Some((Lesson::Lone, 1_188.0)),
            ..again(Probe::No)
        };
        assert_eq!(after_429(1_188.0, other, 1_200).rpm, 594.0);
        // Declared 10× too high: a lone 429, a halving and two cuts to 35% leave the
        // pace below the limit (600), where its probe starts.
        let landed = 6_000.0 * LONE_CUT * NO_BURST_CUT * HALVED_AGAIN_CUT * HALVED_AGAIN_CUT;
        assert!(
            (300.0..600.0 * (1.0 - HEADROOM)).contains(&landed),
            "{landed}"
        );
        // The probe crossed the limit: 12% below where it was refused, no more fast probe.
        let probing = Evidence {
            probing: Probe::Fast,
            ..ev(Some(600.0), 40, true)
        };
        assert_eq!(cut(700.0, probing, 1_200), (700.0 * PROBE_CUT, None));
    }

    /// Evidence of a 429 soon after another, at about the pace, with `between` let
    /// through between the two refusals and `previous` the lesson before.
    fn again(between: f64, previous: Option<(Lesson, f64)>) -> Evidence {
        Evidence {
            between_rpm: Some(between),
            previous,
            ..ev(Some(1_145.0), 21, true)
        }
    }

    #[test]
    fn a_bucket_declared_too_high_is_found_by_what_it_lets_through_between_refusals() {
        // A bucket of 10 refilling at 10/s, paced at 19/s: after each 1 s block it lets
        // 10 + 10·t through and refuses after t ≈ 1.1 s, at about the pace.
        assert_eq!(between_rpm(21, 1.0, 1.1), Some(600.0));
        let sporadic = Some((Lesson::Sporadic, 1_188.0));
        let cut = after_429(1_200.0, again(600.0, sporadic), 1_200);
        assert_eq!(
            (cut.rpm, cut.ceiling, cut.by),
            (600.0, Some(1_200.0 * RECENT_CUT), Lesson::Between),
            "the rate between refusals, and a fast probe back up"
        );
        // The probe's 429 lets the same through between refusals: a bucket, no more probe.
        let probing = Evidence {
            probing: Probe::Fast,
            ..again(630.0, Some((Lesson::Between, 600.0)))
        };
        let cut = after_429(1_000.0, probing, 1_200);
        assert_eq!(
            (cut.rpm, cut.ceiling, cut.by),
            (630.0, None, Lesson::Bucket)
        );
        // A window's limit lies above: the probe let through more than the rate it started
        // from, and its 429 is a probe's.
        let window = Evidence {
            probing: Probe::Fast,
            ..again(700.0, Some((Lesson::Between, 600.0)))
        };
        assert_eq!(after_429(1_000.0, window, 1_200).rpm, 1_000.0 * PROBE_CUT);
        // A window's or a sliding log's refusals within one window of the block: at most
        // halved, with the probe.
        assert_eq!(after_429(600.0, again(200.0, sporadic), 1_200).rpm, 300.0);
        // About the pace between refusals too: the limit lies just below the pace.
        // A late call's 429 a few seconds after the block: cut as one at the pace.
        let late = after_429(600.0, again(450.0, sporadic), 1_200);
        assert_eq!((late.by, late.rpm), (Lesson::Streak, 600.0 * RECENT_CUT));
        let near = after_429(600.0, again(580.0, sporadic), 1_200);
        assert_eq!((near.by, near.rpm), (Lesson::Streak, 600.0 * RECENT_CUT));
    }

    #[test]
    fn a_windows_limit_is_found_above_the_rate_between_refusals_by_the_probe() {
        // A window of 5/s after a drop (measured): 226 between refusals, 10% under the 250
        // the probe started from, and 295 let through over the probe's stretch, well below
        // the pace of 426 it was refused at: the limit lies ÷ 1.4 below that.
        let window = Evidence {
            probing: Probe::Fast,
            accepted_rpm: Some(295.0),
            ..again(226.0, Some((Lesson::Between, 250.0)))
        };
        let cut = after_429(426.0, window, 600);
        assert_eq!(
            (cut.rpm, cut.ceiling, cut.by),
            (426.0 / WINDOW_PAST, None, Lesson::Probe)
        );
        assert!((300.0..320.0).contains(&cut.rpm), "{}", cut.rpm);
        // About the pace over the stretch too: a probe's cut.
        let near = Evidence {
            accepted_rpm: Some(400.0),
            ..window
        };
        let cut = after_429(426.0, near, 600);
        assert_eq!((cut.rpm, cut.by), (426.0 * PROBE_CUT, Lesson::Probe));
        // Never below the rate between refusals.
        let low = Evidence {
            accepted_rpm: Some(200.0),
            ..window
        };
        assert_eq!(after_429(300.0, low, 600).rpm, 226.0);
    }

    #[test]
    fn after_a_measured_cut_a_bucket_settles_at_what_it_lets_through_between_refusals() {
        // After a measured cut (the burst of a bucket of 10 and a second's refill: 12/s),
        // the bucket let through its refill rate between the refusals, below the rate sent:
        // settled at once, no probe.
        let measured = Some((Lesson::Measured, 720.0));
        let cut = after_429(720.0, again(596.0, measured), 3_000);
        assert_eq!(
            (cut.rpm, cut.ceiling, cut.by),
            (596.0, None, Lesson::Bucket)
        );
        // Far below the pace (a window's block was most of the time between): the rate
        // between refusals with a fast probe, not settled.
        let window = after_429(720.0, again(300.0, measured), 3_000);
        assert_eq!((window.rpm, window.by), (360.0, Lesson::Between));
        assert!(window.ceiling.is_some());
        // About the pace between refusals too (a late call long after the measured cut):
        // one at the pace.
        let cut = after_429(660.0, again(595.0, measured), 6_000);
        assert_eq!(
            (cut.rpm, cut.by),
            (595.0, Lesson::Bucket),
            "92% of 646.8 sent"
        );
        let late = after_429(720.0, again(690.0, measured), 3_000);
        assert_eq!((late.by, late.rpm), (Lesson::Streak, 720.0 * RECENT_CUT));
    }

    #[test]
    fn the_rate_between_refusals_is_taken_once() {
        let sporadic = Some((Lesson::Sporadic, 1_188.0));
        // The rate between refusals is taken once: after its probe's 429, or in a streak,
        // a window's lost block time would halve the pace at every other 429.
        // Nor after a halving: a limiter with no burst (GCRA) let through only the fast
        // probe's climb back, which taken as its rate settled a 10/s GCRA at 5.7/s as a
        // "bucket".
        for previous in [
            Lesson::Between,
            Lesson::Probe,
            Lesson::Bucket,
            Lesson::Halved,
        ] {
            let after = after_429(600.0, again(200.0, Some((previous, 620.0))), 1_200);
            assert_eq!(after.by, Lesson::Streak, "{previous:?}");
        }
        let in_streak = Evidence {
            streak: 1,
            ..again(200.0, sporadic)
        };
        assert_eq!(after_429(600.0, in_streak, 1_200).by, Lesson::Streak);
        // Without a recent 429 the rate between refusals says nothing.
        let old = Evidence {
            recent_429: false,
            ..again(200.0, sporadic)
        };
        assert_eq!(after_429(600.0, old, 1_200).by, Lesson::Sporadic);
        for lesson in Lesson::ALL {
            assert_eq!(Lesson::parse(lesson.as_str()), Some(lesson));
        }
        assert_eq!(Lesson::parse("guess"), None);
        assert_eq!(between_rpm(5, 0.0, 0.0), None);
    }

    #[test]
    fn the_learned_rate_holds_then_probes_back_to_the_declared_one() {
        let l = Learned {
            rpm: Some(300.0),
            at: Some(t(100.0)),
            ceiling: None,
        };
        let learned = |secs: f64| l.now(600, t(100.0 + secs));
        assert_eq!(learned(0.0), Some(300.0));
        assert_eq!(
            learned(QUIET),
            Some(300.0),
            "holds through the quiet period"
        );
        assert_eq!(l.probing(t(100.0 + QUIET - 1.0)), Probe::No, "no ceiling");
        assert_eq!(l.probing(t(100.0 + QUIET + 1.0)), Probe::Slow);
        // The slow probe crossed the limit: 3% below.
        let slow = Evidence {
            probing: Probe::Slow,
            ..ev(Some(290.0), 300, false)
        };
        assert_eq!(cut(310.0, slow, 600), (310.0 * RECENT_CUT, None));
        let probed = learned(QUIET + 10.0).unwrap();
        assert!(probed > 300.0 && probed < 340.0, "{probed}");
        // ln 2 / 1% ≈ 69.3 s after the quiet period it is back at the declared rate.
        assert!(learned(QUIET + 69.0).is_some());
        assert_eq!(
            learned(QUIET + 70.0),
            None,
            "forgotten at the declared rate"
        );
        assert_eq!(learned(1e9), None, "no overflow after a long quiet");
        assert_eq!(Learned::default().now(600, t(0.0)), None);
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
