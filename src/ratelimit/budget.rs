//! A budget's shared state (pure): where its pace stands, what each declared window has
//! spent, what it has learned. The pacer keeps it in the budget's row (`budgets.state`,
//! JSON), reads it under a row lock, and changes it only through these methods; the
//! simulator drives the same methods on a virtual clock.
//!
//! - **The pace.** Slots are spaced evenly at the effective rate: the least of the
//!   shortest declared window's rate, the learned rate and the advertised one, with
//!   [`HEADROOM`] to spare (GCRA without burst: `tat`, the next free slot). A limiter
//!   with no burst sees its rate at most.
//! - **Longer windows are counted.** Each further limit (`300/min`, `100000/day`) counts
//!   the slots it saw in [`BUCKETS`] buckets per window; a slot goes where every window
//!   has room for it, counting whole buckets (never fewer than were spent in any window).
//!   So the burst of the short window is used until a long one is spent, and then the
//!   budget waits until its oldest bucket leaves the window.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use super::tuning::{HEADROOM, SLICE};
use super::{
    controller::{Learned, Params, Sample},
    limits::{Limit, usable_quota},
    tuning::SPENT_WAIT,
};

/// Buckets a long window is counted in: a spent window waits at most a bucket (1/60 of
/// it) longer than an exact count would.
pub const BUCKETS: i64 = 60;

/// The slots of one long window, in buckets of `window / BUCKETS`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// The limit counted.
    pub limit: Limit,
    /// Slots per bucket, by bucket number (microseconds since the epoch ÷ bucket length).
    pub buckets: Vec<(i64, u32)>,
}

/// A budget's shared state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetState {
    /// The next free slot of the pace.
    pub tat: Option<DateTime<Utc>>,
    /// What each long window has spent.
    #[serde(default)]
    pub spent: Vec<Spent>,
    /// What 429s taught.
    #[serde(default)]
    pub learned: Learned,
    /// What the target let through, for the next 429 to measure.
    #[serde(flatten)]
    pub sample: Sample,
    /// The limits the target's headers stated last, and when (a statement holds until
    /// another answer states otherwise).
    pub advertised: Option<(Vec<Limit>, DateTime<Utc>)>,
    /// No slot before this: the target said its budget is spent until then.
    pub hold: Option<DateTime<Utc>>,
}

/// A slice of slots a process leased.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// The slots, in order.
    pub slots: Vec<DateTime<Utc>>,
    /// The rate they are paced at (requests per second, before headroom).
    pub rate: f64,
    /// A long window is spent: the next slot is no earlier than this (past the horizon).
    pub spent_until: Option<DateTime<Utc>>,
}

/// What a process asks of a budget when it leases a slice of slots
/// ([`BudgetState::lease`]).
#[derive(Clone, Copy, Debug)]
pub struct SliceRequest<'a> {
    /// The limits the connection declares.
    pub limits: &'a [Limit],
    /// Percent of each long window kept for others.
    pub reserve: u8,
    /// The most slots wanted.
    pub n: u32,
    /// How far from now a slot may lie before a spent long window stops the slice.
    pub horizon: chrono::Duration,
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn at_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).expect("in range")
}

/// The time between two slots at `rate` requests per second, [`HEADROOM`] wider; never
/// longer than the longest window a limit may have.
pub fn interval(rate: f64) -> chrono::Duration {
    let exact = 1.0 / (rate.max(f64::MIN_POSITIVE) * (1.0 - HEADROOM));
    let exact = exact.min(super::limits::MAX_WINDOW.as_secs_f64());
    chrono::Duration::microseconds((exact * 1e6).ceil() as i64)
}

/// Slots to lease at once at `rate` requests per second: a [`SLICE`]'s worth, at least one.
pub fn slice_len(rate: f64) -> u32 {
    ((rate.max(0.0) * SLICE.as_secs_f64()).floor() as u32).max(1)
}

impl Spent {
    fn bucket_len(&self) -> i64 {
        (self.limit.window.as_micros() as i64 / BUCKETS).max(1)
    }

    /// The counted window: [`HEADROOM`] longer than declared.
    fn window_len(&self) -> i64 {
        (self.limit.window.as_micros() as f64 * (1.0 + HEADROOM)) as i64
    }

    /// The first bucket that counts for a slot at `t`.
    fn first_counted(&self, t: i64) -> i64 {
        (t - self.window_len()).div_euclid(self.bucket_len())
    }

    /// Slots counted for a slot at `t`, and the earliest time one more would fit.
    fn room(&self, t: i64, quota: u32) -> Result<(), i64> {
        let first = self.first_counted(t);
        let mut used = 0u64;
        let mut free_at = None;
        // Buckets are kept in order; walk from the newest, the oldest frees first.
        for &(b, n) in self.buckets.iter().rev() {
            if b < first {
                break;
            }
            used += u64::from(n);
            if used >= u64::from(quota) && free_at.is_none() {
                // Once this bucket leaves the window, the slots after it fit.
                free_at = Some((b + 1) * self.bucket_len() + self.window_len());
            }
        }
        match free_at {
            Some(at) => Err(at.max(t + 1)),
            None => Ok(()),
        }
    }

    fn count(&mut self, t: i64) {
        let b = t.div_euclid(self.bucket_len());
        // In order (a 429 may move the pace back before buckets already counted).
        match self.buckets.binary_search_by_key(&b, |&(b, _)| b) {
            Ok(i) => self.buckets[i].1 += 1,
            Err(i) => self.buckets.insert(i, (b, 1)),
        }
    }

    /// A slot counted at `t` that was never used: counted no more.
    fn uncount(&mut self, t: i64) {
        let b = t.div_euclid(self.bucket_len());
        if let Ok(i) = self.buckets.binary_search_by_key(&b, |&(b, _)| b) {
            self.buckets[i].1 -= 1;
            if self.buckets[i].1 == 0 {
                self.buckets.remove(i);
            }
        }
    }

    fn forget_before(&mut self, t: i64) {
        let first = self.first_counted(t);
        self.buckets.retain(|&(b, _)| b >= first);
    }

    /// Slots counted in the window ending at `now`, and when the oldest of them leaves it.
    pub fn used(&self, now: DateTime<Utc>) -> (u32, Option<DateTime<Utc>>) {
        let first = self.first_counted(micros(now));
        let live = self.buckets.iter().filter(|&&(b, _)| b >= first);
        let used = live.clone().map(|&(_, n)| n).sum();
        let oldest = live.map(|&(b, _)| b).min();
        (
            used,
            oldest.map(|b| at_micros((b + 1) * self.bucket_len() + self.window_len())),
        )
    }
}

impl BudgetState {
    /// The state kept in a budget's row (`budgets.state`); none, or one courier cannot read
    /// (written by another version), is a fresh state.
    pub fn from_row(state: Option<serde_json::Value>) -> Self {
        state
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default()
    }

    /// The limits in force: those `declared`, and those the target's headers stated last;
    /// of two on one window, the lesser quota. Shortest window first.
    pub fn limits(&self, declared: &[Limit]) -> Vec<Limit> {
        let mut limits = declared.to_vec();
        for a in self.advertised() {
            match limits.iter_mut().find(|l| l.window == a.window) {
                Some(l) => l.quota = l.quota.min(a.quota),
                None => limits.push(*a),
            }
        }
        limits.sort_by_key(|l| l.window);
        limits
    }

    /// The limits the target's headers stated last.
    pub fn advertised(&self) -> &[Limit] {
        self.advertised.as_ref().map_or(&[], |(limits, _)| limits)
    }

    /// The pace (requests per second) at `now`: the rate of the shortest window in force
    /// ([`BudgetState::limits`]) or the learned rate, as [`Learned::pace`] decides.
    pub fn rate(&self, declared: &[Limit], params: &Params, now: DateTime<Utc>) -> f64 {
        let limits = self.limits(declared);
        let pace = limits.first().map_or(f64::MAX, Limit::per_second);
        self.learned.pace(params, pace, now)
    }

    /// Leases up to `ask.n` slots from `now` on, honouring every limit in force (shortest
    /// window first) with `ask.reserve` percent of the long windows kept for others. Stops
    /// early at a slot further than `ask.horizon` from now (a spent long window): the slots
    /// leased up to it, possibly none.
    pub fn lease(&mut self, params: &Params, now: DateTime<Utc>, ask: &SliceRequest) -> Slice {
        self.sync_windows(&self.limits(ask.limits));
        self.hold = self.hold.filter(|&h| h > now);
        let idle = chrono::Duration::from_std(SPENT_WAIT).expect("fits");
        let was_idle = self.tat.is_none_or(|t| t < now - idle);
        self.sample.follow(&self.learned, was_idle, now);
        let rate = self.rate(ask.limits, params, now);
        let step = interval(rate);
        let mut t = micros(
            self.tat
                .unwrap_or(now)
                .max(now)
                .max(self.hold.unwrap_or(now)),
        );
        let quotas: Vec<u32> = self
            .spent
            .iter()
            .map(|s| usable_quota(&s.limit, ask.reserve))
            .collect();
        let mut slots = Vec::new();
        let mut spent_until = None;
        let horizon = micros(now + ask.horizon);
        while slots.len() < ask.n.min(slice_len(rate)) as usize {
            let paced = t;
            t = self.room_from(t, &quotas);
            // A window spent beyond the horizon stops the slice (the pace alone never does:
            // a slot booked far ahead by other processes is still this process's turn).
            if t > paced && t > horizon {
                spent_until = Some(at_micros(t));
                break;
            }
            self.book(t);
            slots.push(at_micros(t));
            t += step.num_microseconds().expect("fits");
            self.tat = Some(at_micros(t));
        }
        for s in &mut self.spent {
            s.forget_before(micros(now));
        }
        Slice {
            slots,
            rate,
            spent_until,
        }
    }

    /// The earliest time from `t` (microseconds) at which every long window has room, each
    /// holding its quota in `quotas`.
    fn room_from(&self, mut t: i64, quotas: &[u32]) -> i64 {
        loop {
            let wait = self
                .spent
                .iter()
                .zip(quotas)
                .filter_map(|(s, &q)| s.room(t, q).err())
                .max();
            match wait {
                Some(later) => t = later,
                None => return t,
            }
        }
    }

    /// Books a slot at `t` (microseconds): counted in every long window and in the sample.
    fn book(&mut self, t: i64) {
        for s in &mut self.spent {
            s.count(t);
        }
        self.sample.book(at_micros(t));
    }

    /// Slots booked at `slots` that went unused (no call took them in their time): each
    /// long window counts them no more, so a quota is spent only by calls made.
    pub fn unbook(&mut self, slots: &[DateTime<Utc>]) {
        for &at in slots {
            for s in &mut self.spent {
                s.uncount(micros(at));
            }
        }
    }

    /// Keeps one count per long limit (every declared limit but the shortest), dropping
    /// counts of limits no longer declared.
    fn sync_windows(&mut self, limits: &[Limit]) {
        let long = limits.get(1..).unwrap_or_default();
        self.spent.retain(|s| long.contains(&s.limit));
        for l in long {
            if !self.spent.iter().any(|s| s.limit == *l) {
                self.spent.push(Spent {
                    limit: *l,
                    buckets: Vec::new(),
                });
            }
        }
        self.spent.sort_by_key(|s| s.limit.window);
    }

    /// A call sent at `sent`, paced at `paced`, met a 429 at `now` whose block ends at
    /// `block_end`. The controller learns from the sample ([`Sample::measure`]); a cut
    /// starts a new sample and drops the booking past the block. Returns whether it cut.
    pub fn refused(
        &mut self,
        params: &Params,
        paced: f64,
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
        block_end: DateTime<Utc>,
    ) -> bool {
        let through = self.sample.measure(sent);
        let cut = self
            .learned
            .refused(params, paced, through, sent, now, block_end);
        if cut {
            self.sample.restart(self.learned.since);
            self.tat = self.tat.map(|t| t.min(block_end));
        }
        cut
    }

    /// The target's headers stated `limits` at `now`.
    pub fn advertise(&mut self, limits: Vec<Limit>, now: DateTime<Utc>) {
        self.advertised = Some((limits, now));
    }

    /// The target said its budget is spent until `until`: no slot before then.
    pub fn hold_until(&mut self, until: DateTime<Utc>) {
        self.hold = Some(self.hold.map_or(until, |h| h.max(until)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::{
        controller::{PARAMS, RECENT_MOST},
        tuning::SPENT_WAIT,
    };

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    /// Up to 50 slots at the pace.
    fn ask(limits: &[Limit], reserve: u8, horizon: chrono::Duration) -> SliceRequest<'_> {
        SliceRequest {
            limits,
            reserve,
            n: 50,
            horizon,
        }
    }

    fn lease_all(limits: &[Limit], secs: i64, processes: usize) -> Vec<DateTime<Utc>> {
        let mut st = BudgetState::default();
        let mut slots = Vec::new();
        let mut now = t0();
        let end = t0() + chrono::Duration::seconds(secs);
        let horizon = chrono::Duration::seconds(1);
        while now < end {
            for _ in 0..processes {
                let s = st.lease(&PARAMS, now, &ask(limits, 0, horizon));
                slots.extend(s.slots);
            }
            now = slots.last().copied().unwrap_or(now).max(now) + chrono::Duration::milliseconds(7);
        }
        slots.retain(|&s| s < end);
        slots.sort();
        slots
    }

    fn most_in(slots: &[DateTime<Utc>], len: chrono::Duration) -> usize {
        let (mut end, mut most) = (0, 0);
        for start in 0..slots.len() {
            while end < slots.len() && slots[end] < slots[start] + len {
                end += 1;
            }
            most = most.max(end - start);
        }
        most
    }

    #[test]
    fn every_window_holds_and_the_burst_is_used() {
        let limits = [Limit::new(10, 1), Limit::new(300, 60)];
        let slots = lease_all(&limits, 185, 3);
        assert!(most_in(&slots, chrono::Duration::seconds(1)) <= 10);
        assert!(most_in(&slots, chrono::Duration::seconds(60)) <= 300);
        // The first 300 go at the short window's pace, in about 30 s, not 60.
        let first_300 = slots[299] - slots[0];
        assert!(first_300 < chrono::Duration::seconds(31), "{first_300}");
        // Over three minutes, about 3 × 300 (less a bucket per window).
        assert!(slots.len() >= 850, "{}", slots.len());
    }

    #[test]
    fn slots_given_back_unused_leave_their_windows_room_for_others() {
        let limits = [Limit::new(400, 1), Limit::new(100, 60)];
        let horizon = chrono::Duration::seconds(1);
        let later = t0() + chrono::Duration::seconds(2);
        let lease_more = |st: &mut BudgetState| {
            let mut n = 0;
            while n < 200 {
                let s = st.lease(&PARAMS, later, &ask(&limits, 0, horizon));
                if s.slots.is_empty() {
                    break;
                }
                n += s.slots.len();
            }
            n
        };
        let mut st = BudgetState::default();
        let first = st.lease(&PARAMS, t0(), &ask(&limits, 0, horizon)).slots;
        assert_eq!(first.len(), 50);
        // Forty of the fifty never carried a call: the minute window counts the ten used.
        st.unbook(&first[10..]);
        assert_eq!(
            lease_more(&mut st),
            90,
            "the minute's 100, less the 10 used"
        );
        // Without the give-back, the window holds only the 50 left.
        let mut kept = BudgetState::default();
        kept.lease(&PARAMS, t0(), &ask(&limits, 0, horizon));
        assert_eq!(lease_more(&mut kept), 50);
    }

    #[test]
    fn a_limit_slower_than_one_call_a_minute_is_kept() {
        for (limit, window) in [(1000, 86_400), (30, 3_600)] {
            let limits = [Limit::new(limit, window)];
            let slots = lease_all(&limits, 2 * window as i64, 1);
            let most = most_in(&slots, chrono::Duration::seconds(window as i64));
            assert!(
                most <= limit as usize,
                "{most} calls in a window of {limit}/{window}s"
            );
        }
    }

    #[test]
    fn a_spent_window_stops_a_lease_at_the_horizon_and_says_when() {
        let limits = [Limit::new(10, 1), Limit::new(20, 3600)];
        let mut st = BudgetState::default();
        let h = chrono::Duration::seconds(1);
        let mut got = 0;
        let mut now = t0();
        for _ in 0..20 {
            got += st.lease(&PARAMS, now, &ask(&limits, 0, h)).slots.len();
            now += chrono::Duration::milliseconds(300);
        }
        assert_eq!(got, 20);
        let (used, frees) = st.spent[0].used(now);
        assert_eq!(used, 20);
        assert!(frees.unwrap() > t0() + chrono::Duration::seconds(3600));
        // With a 10% reserve, 18 of 20.
        let mut st = BudgetState::default();
        let got: usize = (0..20)
            .map(|i| {
                let now = t0() + chrono::Duration::milliseconds(300 * i);
                st.lease(&PARAMS, now, &ask(&limits, 10, h)).slots.len()
            })
            .sum();
        assert_eq!(got, 18);
    }

    #[test]
    fn limits_the_target_states_are_kept_beside_the_declared_ones_until_restated() {
        let mut st = BudgetState::default();
        let declared = [Limit::new(10, 1)];
        st.advertise(vec![Limit::new(5, 1), Limit::new(20, 3600)], t0());
        assert_eq!(
            st.limits(&declared),
            [Limit::new(5, 1), Limit::new(20, 3600)]
        );
        let h = chrono::Duration::seconds(1);
        let mut got = 0;
        for i in 0..40 {
            let now = t0() + chrono::Duration::milliseconds(300 * i);
            got += st.lease(&PARAMS, now, &ask(&declared, 0, h)).slots.len();
        }
        assert_eq!(got, 20, "the stated hourly quota holds");
        // Until another answer states otherwise.
        let later = t0() + chrono::Duration::hours(2);
        st.advertise(vec![Limit::new(8, 1)], later);
        assert_eq!(st.limits(&declared), [Limit::new(8, 1)]);
    }

    #[test]
    fn a_refused_call_counts_every_process_calls_before_it() {
        let limits = [Limit::new(50, 1)];
        let mut st = BudgetState::default();
        let h = chrono::Duration::seconds(1);
        // Three processes lease in turn at 50/s, none has heard an answer yet.
        let slots: Vec<_> = (0..3)
            .flat_map(|_| st.lease(&PARAMS, t0(), &ask(&limits, 0, h)).slots)
            .collect();
        assert_eq!(slots.len(), 36);
        // The target lets 10 a second through: the eleventh call is refused.
        let sent = slots[10];
        let now = sent + chrono::Duration::milliseconds(2);
        assert!(st.refused(&PARAMS, 50.0, sent, now, t0() + h));
        assert_eq!(st.learned.by, "measured");
        assert!((st.learned.base - 10.0).abs() < 1e-9, "{}", st.learned.base);
        assert!((st.learned.ceiling - 10.0 / PARAMS.decrease).abs() < 1e-9);
        // Later than the first second, the same: the slots booked before the refused
        // call's, not those booked after it, over the time up to it.
        let mut st = BudgetState::default();
        let first = st.lease(&PARAMS, t0(), &ask(&limits, 0, h)).slots.len();
        let later = t0() + chrono::Duration::milliseconds(1100);
        let next = st.lease(&PARAMS, later, &ask(&limits, 0, h)).slots;
        st.refused(&PARAMS, 50.0, next[0], next[0], next[0] + h);
        let through = first as f64 / 1.1;
        assert!(
            (st.learned.base - through).abs() < 1e-6,
            "{}",
            st.learned.base
        );
        assert!((st.learned.ceiling - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_budget_idle_for_a_while_starts_a_new_sample() {
        let limits = [Limit::new(10, 1)];
        let h = chrono::Duration::seconds(1);
        let far = t0() + chrono::Duration::hours(1);
        let mut st = BudgetState::default();
        let mut booked = st.lease(&PARAMS, t0(), &ask(&limits, 0, h)).slots.len();
        let busy = t0() + chrono::Duration::milliseconds(200);
        booked += st.lease(&PARAMS, busy, &ask(&limits, 0, h)).slots.len();
        assert_eq!(st.sample.stretch_from, Some(t0()));
        assert_eq!(st.sample.measure(far).0, booked as u64);
        // Its next free slot went unused for longer than a pause within a run of calls:
        // what was let through before says nothing of the rate a 429 now would meet.
        let later = busy + chrono::Duration::from_std(SPENT_WAIT).unwrap() + h;
        let now_booked = st.lease(&PARAMS, later, &ask(&limits, 0, h)).slots.len();
        assert_eq!(st.sample.stretch_from, Some(later));
        assert_eq!(st.sample.measure(far).0, now_booked as u64);
    }

    #[test]
    fn a_busy_budget_keeps_few_slot_times() {
        // No limit declared: slices of 50 as fast as they are asked for.
        let mut st = BudgetState::default();
        let h = chrono::Duration::seconds(1);
        for _ in 0..40 {
            st.lease(&PARAMS, t0(), &ask(&[], 0, h));
        }
        assert_eq!(st.sample.recent_us.len(), RECENT_MOST);
        let far = t0() + chrono::Duration::hours(1);
        assert_eq!(st.sample.measure(far).0, 40 * 50, "every slot counted");
        // Busy on at 10/s: only the slots of the last two seconds keep their times.
        let limits = [Limit::new(10, 1)];
        for tenth in 1..=100 {
            let now = t0() + chrono::Duration::milliseconds(100 * tenth);
            st.lease(&PARAMS, now, &ask(&limits, 0, h));
        }
        assert!(
            st.sample.recent_us.len() <= 21,
            "{}",
            st.sample.recent_us.len()
        );
    }

    #[test]
    fn a_single_limit_paces_evenly() {
        let slots = lease_all(&[Limit::new(600, 60)], 30, 2);
        assert!(most_in(&slots, chrono::Duration::seconds(1)) <= 10);
        let gaps = slots.windows(2).map(|w| w[1] - w[0]).min().unwrap();
        assert!(gaps >= chrono::Duration::milliseconds(100), "{gaps}");
    }
}
