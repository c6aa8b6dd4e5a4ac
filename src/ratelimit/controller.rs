//! The learned rate: what 429s teach a budget about the target's real limit, as one small
//! controller (pure; the pacer keeps its state in the budget's row).
//!
//! The rule (rates in requests per second; `p` is the pace a refused call was booked at):
//!
//! 1. A 429 cuts the pace to `p × decrease`, or to the rate the target let through since
//!    the last cut if that is lower (counted over at least a second); with fewer than
//!    `min_sample` calls let through the pace was far above the limit and is cut to
//!    `p × deep_decrease`. A pace that held `s` seconds longer than `hold` was barely too
//!    high: the cut shrinks to `(1 − decrease) × hold / s` of it. One cut per block: a call
//!    that left before the last block ended met the same refusal and does not cut again.
//! 2. The refused pace becomes the **ceiling**; but a call refused within a second of the
//!    last cut, after the rate let through cut deeper, found a window's quota: the ceiling
//!    is that rate ÷ `decrease`. From the cut, the pace climbs back towards halfway
//!    between a plain cut and the ceiling (`ceiling × (1 + decrease) / 2`), closing the gap
//!    with time constant `approach`: the limit lies between the two.
//! 3. A 429 that ends at least `hold` seconds without one remembers the pace that held
//!    (**held**). If a cut within `hold` seconds of that left the ceiling below a plain
//!    cut of held (the limit dropped, as when another client shares the account), the pace
//!    climbs towards held instead, from `approach` seconds after it.
//! 4. After the last block's length ÷ [`HEADROOM`] without a 429 (the **quiet**) the
//!    ceiling itself grows by `probe` per second: a limit that rose is found again, and a
//!    refused probe costs at most the share of the time the headroom gives up too. A ceiling no call was refused at (a window's quota, estimated in
//!    its first second) grows at once, unless the pace climbs back to held: a burst let
//!    through at once says little of the rate that follows. Back at the declared rate,
//!    nothing is learned.
//!
//! As a state machine: **declared** (nothing learned) → a 429 **cuts** ([`Learned::refused`])
//! → **climb** (rule 2) or **held pace** (rule 3) → **probe** (rule 4) → back at the
//! declared rate, **declared**; a 429 in any state cuts again. [`Learned::phase`] says which
//! state a budget is in at a moment, and [`Phase::rate`] is the pace there.
//!
//! The effective rate is the least of the declared pace, this learned rate and what the
//! target's headers advertise. [`Learned::by`] labels what the last 429 did, for
//! diagnostics only: nothing reads it back.
//!
//! The rule's input is the [`Sample`]: the calls the target let through since the last cut
//! (or since the budget got busy), kept in the budget's row beside what was learned.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::tuning::HEADROOM;

/// The controller's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// A 429 cuts the pace to this share of the pace refused (at most), after a pace that
    /// held `hold` seconds or less.
    pub decrease: f64,
    /// A 429 with fewer than `min_sample` calls let through before it cuts to this share.
    pub deep_decrease: f64,
    /// Calls let through since the last cut for their rate to say where the limit lies.
    pub min_sample: u64,
    /// Seconds: the time constant of the climb back towards the ceiling.
    pub approach: f64,
    /// The ceiling's growth per second after the quiet (multiplicative).
    pub probe: f64,
    /// Seconds: a pace unrefused this long is held (and cut less, the longer it held); a
    /// cut this soon after a held pace climbs back to it.
    pub hold: f64,
    /// The learned pace never falls below this share of the declared pace: a target that
    /// answers 429 to everything for a while leaves no pace it would take minutes to
    /// climb back from.
    pub floor: f64,
}

/// The parameters courier runs with (fitted in the simulator, `src/ratelimit/sim.rs`).
pub const PARAMS: Params = Params {
    decrease: 0.92,
    deep_decrease: 0.4,
    min_sample: 5,
    approach: 3.0,
    probe: 0.02,
    hold: 15.0,
    floor: 0.05,
};

// Not tunables: bounds that keep the state finite.

/// The largest exponent the probe grows by (past any real rate; keeps `exp` finite on a
/// budget quiet for days).
const MAX_GROWTH: f64 = 40.0;
/// How long before the newest slot a sample keeps each slot's time: longer than a call's
/// answer takes to come back, as a slot booked after a refused call's must not count.
const RECENT: chrono::Duration = chrono::Duration::seconds(2);
/// The most slot times a sample keeps (a budget's row stays small however fast the pace).
pub const RECENT_MOST: usize = 1000;

/// What a budget has learned; the default is nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// When the last cut took hold (the end of its block); `None`: nothing learned.
    pub since: Option<DateTime<Utc>>,
    /// The pace right after the cut (requests per second).
    pub base: f64,
    /// Where the limit lies at most: the pace the last 429 refused, or below it the quota
    /// a window let through in its first second.
    pub ceiling: f64,
    /// The pace the last 429 refused.
    #[serde(default)]
    pub refused: f64,
    /// The pace that held for `hold` seconds before a 429, and when it was remembered.
    pub held: Option<(f64, DateTime<Utc>)>,
    /// When the last 429 that cut came.
    pub last_429: Option<DateTime<Utc>>,
    /// What the last cut did, for diagnostics only (`cut`, `measured`, `deep`).
    pub by: String,
}

fn secs(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

impl Learned {
    /// The pace in force at `now` (requests per second): `declared` (the shortest window
    /// in force), or the learned pace below it, never under `floor` of `declared`.
    pub fn pace(&self, p: &Params, declared: f64, now: DateTime<Utc>) -> f64 {
        let floor = declared * p.floor;
        match self.rate(p, declared, now) {
            Some(l) => declared.min(l.max(floor)),
            None => declared,
        }
    }

    /// The learned pace at `now` (requests per second), or `None` when nothing is learned
    /// or it has climbed back to `declared`.
    pub fn rate(&self, p: &Params, declared: f64, now: DateTime<Utc>) -> Option<f64> {
        let rate = self.phase(p, now)?.rate(p);
        (rate < declared).then_some(rate)
    }

    /// The controller's state at `now`: `None` before any cut; else where the climb from
    /// the last cut stands (rules 2–4 of the module's rule).
    pub fn phase(&self, p: &Params, now: DateTime<Utc>) -> Option<Phase> {
        let since = self.since?;
        let s = secs(since, now).max(0.0);
        // Rule 3: a lasting pace the last cut came soon after, leaving the ceiling below a
        // plain cut of it.
        let held = self
            .held
            .filter(|&(h, at)| secs(at, since) < p.hold && self.ceiling < p.decrease * h);
        let (toward, target, from, climbing) = match held {
            Some((h, _)) if s > p.approach => {
                (Toward::Held, h, self.ceiling.min(h), s - p.approach)
            }
            _ => (
                Toward::Halfway,
                self.ceiling * (1.0 + p.decrease) / 2.0,
                self.base,
                s,
            ),
        };
        // Rule 4: the cut's block (its 429 came when it began) sets how long the quiet
        // lasts. A ceiling estimated from a window's quota (no call was refused at it) and
        // not climbing back to a held pace probes at once.
        let block = self.last_429.map_or(0.0, |at| secs(at, since));
        let estimated = held.is_none() && self.ceiling < self.refused;
        let quiet = if estimated { 0.0 } else { block / HEADROOM };
        Some(Phase {
            toward,
            from,
            target,
            climbing,
            probing: (s - quiet).max(0.0),
        })
    }

    /// A call booked at pace `paced` (requests per second) and sent at `sent` met a 429 at
    /// `now`, after the target let `accepted` calls through over the `stretch` seconds
    /// before it since the last cut (or since the budget got busy); its block ends at
    /// `block_end`. Returns whether it cut.
    pub fn refused(
        &mut self,
        p: &Params,
        paced: f64,
        (accepted, stretch): (u64, f64),
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
        block_end: DateTime<Utc>,
    ) -> bool {
        if self.since.is_some_and(|s| sent < s) {
            return false; // sent before the last block ended: the same refusal
        }
        if self.last_429.is_none_or(|t| secs(t, now) >= p.hold) && stretch >= p.hold {
            self.held = Some((paced, now));
        }
        // The share of `paced` to cut to, and the ceiling the refusal shows.
        let (share, ceiling, by) = if accepted < p.min_sample {
            (p.deep_decrease, paced, "deep")
        } else {
            let measured = accepted as f64 / stretch.max(1.0) / paced;
            if measured < p.decrease {
                // Refused within a second: a window let its quota through.
                let ceiling = if stretch < 1.0 {
                    paced * measured / p.decrease
                } else {
                    paced
                };
                (measured, ceiling, "measured")
            } else {
                // A pace that held longer than `hold` was barely too high: cut less.
                let held_for = stretch.max(p.hold);
                (1.0 - (1.0 - p.decrease) * p.hold / held_for, paced, "cut")
            }
        };
        self.base = paced * share;
        self.ceiling = ceiling;
        self.refused = paced;
        self.since = Some(block_end.max(now));
        self.last_429 = Some(now);
        self.by = by.to_owned();
        true
    }
}

/// What the pace climbs towards after a cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toward {
    /// Halfway between a plain cut and the ceiling: the limit lies between the two (rule 2).
    Halfway,
    /// The lasting pace, from `approach` seconds after a cut that came soon after it and
    /// left the ceiling below a plain cut of it (rule 3).
    Held,
}

/// The controller's state at a moment after a cut. The states are named by [`Phase::name`]:
/// **climb** (from the cut pace towards halfway below the ceiling), **held pace** (climbing
/// back to the lasting pace instead) and **probe** (past the quiet, the target itself
/// grows); the **cut** is the one transition a 429 makes ([`Learned::refused`]), and back at
/// the declared pace the budget is **declared** again ([`Learned::rate`] is `None`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Phase {
    /// What the climb heads for.
    pub toward: Toward,
    /// The pace the climb starts from (requests per second).
    pub from: f64,
    /// The pace it heads for before any probing.
    pub target: f64,
    /// Seconds into the climb.
    pub climbing: f64,
    /// Seconds past the quiet (0 while quiet): the target grows by `probe` for each.
    pub probing: f64,
}

impl Phase {
    /// The state's name: `climb`, `held pace` or `probe`.
    pub fn name(&self) -> &'static str {
        match (self.probing > 0.0, self.toward) {
            (true, _) => "probe",
            (false, Toward::Held) => "held pace",
            (false, Toward::Halfway) => "climb",
        }
    }

    /// The pace in this state (requests per second): the target, grown by the probe, closed
    /// on from `from` with time constant `approach`.
    pub fn rate(&self, p: &Params) -> f64 {
        let grown = self.target * (p.probe * self.probing).min(MAX_GROWTH).exp();
        grown - (grown - self.from) * (-self.climbing / p.approach).exp()
    }
}

/// What the target let through since the last cut, or since the budget got busy: the
/// slots every process booked. Each call before a refused one was let through (a refusal
/// cuts, and the sample starts again), and the slots are counted as they are booked, so
/// no process's count lags behind another's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Where the sample began.
    pub stretch_from: Option<DateTime<Utc>>,
    /// Slots booked since `stretch_from` before those in `recent_us`.
    #[serde(default)]
    pub booked: u64,
    /// The latest slots booked, in microseconds after `stretch_from`, oldest first: those
    /// within [`RECENT`] of the newest (at most [`RECENT_MOST`]), so that a refused call
    /// counts the slots before its own, not the ones booked after it.
    #[serde(default)]
    pub recent_us: VecDeque<i64>,
}

impl Sample {
    /// At a lease at `now`: a budget that `was_idle` (or never sampled) starts afresh, from
    /// the end of the last cut's block if that is later.
    pub fn follow(&mut self, learned: &Learned, was_idle: bool, now: DateTime<Utc>) {
        if was_idle || self.stretch_from.is_none() {
            self.restart(Some(learned.since.map_or(now, |s| s.max(now))));
        }
    }

    /// Starts afresh from `from`.
    pub fn restart(&mut self, from: Option<DateTime<Utc>>) {
        self.stretch_from = from;
        self.booked = 0;
        self.recent_us.clear();
    }

    /// Books a slot at `t`.
    pub fn book(&mut self, t: DateTime<Utc>) {
        let Some(from) = self.stretch_from else {
            return;
        };
        let after = (t - from).num_microseconds().unwrap_or(i64::MAX).max(0);
        self.recent_us.push_back(after);
        let recent = RECENT.num_microseconds().expect("fits");
        while self
            .recent_us
            .front()
            .is_some_and(|&s| s < after - recent || self.recent_us.len() > RECENT_MOST)
        {
            self.recent_us.pop_front();
            self.booked += 1;
        }
    }

    /// For a call sent at `sent`: the calls let through before it (the slots booked before
    /// its own) and over how many seconds.
    pub fn measure(&self, sent: DateTime<Utc>) -> (u64, f64) {
        let from = self.stretch_from.unwrap_or(sent);
        let sent_after = (sent - from).num_microseconds().unwrap_or(i64::MAX);
        let recent = self.recent_us.iter().filter(|&&s| s < sent_after).count() as u64;
        (self.booked + recent, secs(from, sent).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks without a 429 before a refused ceiling grows.
    const QUIET: f64 = 1.0 / HEADROOM;

    fn t(s: f64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
            + chrono::Duration::microseconds((s * 1e6) as i64)
    }

    #[test]
    fn a_429_cuts_then_the_pace_climbs_back_to_halfway_below_the_ceiling() {
        let p = PARAMS;
        let mut l = Learned::default();
        assert_eq!(l.rate(&p, 10.0, t(0.0)), None, "nothing learned");
        assert!(l.refused(&p, 10.0, (50, 5.0), t(5.0), t(5.0), t(6.0)));
        assert_eq!(l.by, "cut");
        let at = |s| l.rate(&p, 20.0, t(s)).unwrap();
        let (cut, half) = (10.0 * p.decrease, 10.0 * (1.0 + p.decrease) / 2.0);
        assert!((at(6.0) - cut).abs() < 1e-9, "{}", at(6.0));
        assert!(at(7.0) > cut && at(7.0) < half);
        // Halfway between the plain cut and the ceiling, and no further while quiet.
        assert!(at(20.0) > half - 0.05 && at(20.0) < half, "{}", at(20.0));
        assert!(at(6.0 + QUIET) < half);
        // After the quiet period the ceiling grows; past the declared rate all is forgotten.
        assert!(at(6.0 + QUIET + 15.0) > 10.5);
        assert_eq!(l.rate(&p, 20.0, t(200.0)), None);
    }

    #[test]
    fn the_probe_waits_in_proportion_to_the_block_it_risks() {
        let p = PARAMS;
        let half = 10.0 * (1.0 + p.decrease) / 2.0;
        // A target that names no wait blocks for a minute: probing after the quiet of a 1 s block
        // would spend more time blocked than it could win.
        let mut l = Learned::default();
        l.refused(&p, 10.0, (50, 5.0), t(0.0), t(0.0), t(60.0));
        let at = |s| l.rate(&p, 20.0, t(s)).unwrap();
        assert!(at(60.0 + 2.0 * QUIET) <= half);
        assert!(at(60.0 + 60.0 * QUIET - 1.0) <= half);
        assert!(at(60.0 + 60.0 * QUIET + 10.0) > half * 1.1);
    }

    #[test]
    fn a_pace_far_too_high_is_cut_to_what_was_accepted_or_deeply() {
        let p = PARAMS;
        let mut l = Learned::default();
        // A window let 10 through in a tenth of a second at 100/s: measured 10/s.
        l.refused(&p, 100.0, (10, 0.1), t(0.0), t(0.0), t(1.0));
        assert_eq!(l.by, "measured");
        assert!((l.rate(&p, 100.0, t(1.0)).unwrap() - 10.0).abs() < 1e-9);
        // A limiter with no burst refused the second call: too few to measure.
        let mut l = Learned::default();
        l.refused(&p, 100.0, (1, 0.01), t(0.0), t(0.0), t(1.0));
        assert_eq!(l.by, "deep");
        assert!((l.rate(&p, 100.0, t(1.0)).unwrap() - 40.0).abs() < 1e-9);
    }

    #[test]
    fn a_ceiling_estimated_from_a_first_second_probes_at_once() {
        let p = PARAMS;
        // A burst of 6 let through at 100/s, then a 429: the ceiling is an estimate
        // (6 / 0.92), not a refused pace, and grows without waiting for the quiet.
        let mut l = Learned::default();
        l.refused(&p, 100.0, (6, 0.06), t(0.0), t(0.0), t(1.0));
        let half = l.ceiling * (1.0 + p.decrease) / 2.0;
        assert!(l.rate(&p, 100.0, t(11.0)).unwrap() > half * 1.15);
        // A ceiling a call was refused at waits the quiet before it grows.
        let mut l = Learned::default();
        l.refused(&p, 10.0, (50, 5.0), t(5.0), t(5.0), t(6.0));
        let half = 10.0 * (1.0 + p.decrease) / 2.0;
        assert!(l.rate(&p, 100.0, t(16.0)).unwrap() < half);
    }

    #[test]
    fn a_pace_that_held_long_is_cut_less() {
        let p = PARAMS;
        let mut l = Learned::default();
        // Four times `hold` at the pace before the 429: a quarter of the usual cut.
        let s = 4.0 * p.hold;
        l.refused(&p, 10.0, ((10.0 * s) as u64, s), t(s), t(s), t(s + 1.0));
        let cut = 10.0 * (1.0 - (1.0 - p.decrease) / 4.0);
        assert!((l.base - cut).abs() < 1e-9, "{}", l.base);
        // Held for `hold` or less: the usual cut.
        let mut l = Learned::default();
        l.refused(
            &p,
            10.0,
            ((10.0 * p.hold) as u64, p.hold),
            t(p.hold),
            t(p.hold),
            t(p.hold + 1.0),
        );
        assert!((l.base - 10.0 * p.decrease).abs() < 1e-9, "{}", l.base);
    }

    #[test]
    fn one_cut_per_block() {
        let p = PARAMS;
        let mut l = Learned::default();
        assert!(l.refused(&p, 10.0, (50, 5.0), t(0.0), t(0.0), t(1.0)));
        // Sent before the block ended, however late the answer: the same refusal.
        assert!(!l.refused(&p, 8.5, (50, 5.0), t(0.5), t(0.5), t(1.5)));
        assert!(!l.refused(&p, 8.5, (50, 5.0), t(0.99), t(1.2), t(2.2)));
        assert!((l.ceiling - 10.0).abs() < 1e-9);
        // Sent once it ended: a new refusal, heard however soon.
        assert!(l.refused(&p, 9.2, (1, 0.0), t(1.0), t(1.0), t(2.0)));
        assert!((l.ceiling - 9.2).abs() < 1e-9);
    }

    #[test]
    fn the_states_follow_one_another_as_the_rule_says() {
        let p = PARAMS;
        let mut l = Learned::default();
        assert_eq!(l.phase(&p, t(0.0)), None, "declared: nothing learned");
        // A cut ending a 1 s block: climb, then probe once the quiet is over.
        l.refused(&p, 10.0, (50, 5.0), t(5.0), t(5.0), t(6.0));
        let name = |l: &Learned, s| l.phase(&p, t(s)).unwrap().name();
        assert_eq!(name(&l, 6.5), "climb");
        assert_eq!(name(&l, 6.0 + QUIET + 1.0), "probe");
        // A drop soon after a lasting pace: the climb heads back to it.
        let mut l = Learned::default();
        l.refused(&p, 10.0, (300, 60.0), t(60.0), t(60.0), t(61.0));
        l.refused(&p, 6.0, (10, 2.0), t(63.0), t(63.0), t(64.0));
        assert_eq!(name(&l, 64.0 + p.approach / 2.0), "climb");
        let phase = l.phase(&p, t(64.0 + p.approach + 0.1)).unwrap();
        assert_eq!((phase.name(), phase.toward), ("held pace", Toward::Held));
        assert!((phase.target - 10.0).abs() < 1e-9);
    }

    #[test]
    fn after_a_drop_the_pace_that_held_is_tried_again() {
        let p = PARAMS;
        let mut l = Learned::default();
        // 10/s held for a minute, then the limit halved: measured 5/s.
        l.refused(&p, 10.0, (300, 60.0), t(60.0), t(60.0), t(61.0));
        assert!(l.held.is_some());
        l.refused(&p, 6.0, (10, 2.0), t(63.0), t(63.0), t(64.0));
        // Within `approach` of the cut, the pace stays near the low ceiling...
        assert!(l.rate(&p, 20.0, t(65.0)).unwrap() < 6.0);
        // ...then climbs towards the pace that held.
        assert!(l.rate(&p, 20.0, t(64.0 + 3.0 * p.approach)).unwrap() > 9.0);
        // With no cut since, it stays there however long ago held was remembered.
        assert!(l.rate(&p, 20.0, t(64.0 + 2.0 * p.hold)).unwrap() > 9.9);
    }
}
