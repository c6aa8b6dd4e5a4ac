//! Hands out request slots per budget, before the target has to say 429.
//!
//! A budget (a connection, a rule with a budget key of its own, or every connection
//! naming the same key) keeps its shared state in its `budgets` row as a
//! [`BudgetState`]: the pace, what each long window has spent, what 429s taught. A worker
//! process leases a small slice of slots at once (a quarter second's worth) in one short
//! transaction: it locks the row, lets [`BudgetState::lease`] book the slots, and writes
//! the state back. Slots are spaced at the effective rate across all processes; losing a
//! process loses at most the slice it held.
//!
//! Within a process, rules waiting on one budget are served by start-time fair queueing:
//! each request of a rule is stamped `max(now_virtual, last_of_rule) + 1/weight`, and the
//! lowest stamp gets the next slot, so rules with a backlog share the budget by weight.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::oneshot;

pub use super::tuning::{HEADROOM, SLICE, SPENT_WAIT};
use super::{
    blocks::Blocks,
    budget::{BudgetState, SliceRequest, interval},
    controller::PARAMS,
    limits::Limit,
};
use crate::clock::{Clock, PRECISE_WITHIN};

/// The least time between two calls of one process on a budget, as a share of the slot
/// interval: half the [`HEADROOM`], so a call's trip to the target may vary by the other
/// half without the pair arriving closer together than the rate allows.
pub const MIN_GAP_SHARE: f64 = 1.0 - HEADROOM / 2.0;

/// The round trips a process keeps per budget: a trip slower than nine in ten of them
/// holds the next call back by how much slower than the middle one it was (see
/// [`Pacer::returned`]), so a path whose every trip varies widely is not slowed on most
/// calls.
pub const RECENT_TRIPS: usize = 32;

fn std_interval(rate: f64) -> Duration {
    interval(rate).to_std().unwrap_or_default()
}

/// The time between two slots of a budget paced at `rpm` requests per minute.
pub fn interval_for(rpm: f64) -> Duration {
    std_interval(rpm / 60.0)
}

/// The time between two slots of a budget declaring `rpm` requests per minute.
pub fn emission_interval(rpm: u32) -> Duration {
    interval_for(f64::from(rpm))
}

/// What a waiting request gets: its slot, or the time a spent window frees.
/// A request slot: when the call may go out, and the pace (requests per second) the slot
/// was booked at, which a 429 on the call reports as the pace refused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slot {
    /// When the call may go out.
    pub at: DateTime<Utc>,
    /// The pace of the lease that booked it.
    pub paced: f64,
    /// The end of the budget's latest block as the lease knew it: a block set since (a 429
    /// refused a pace the slot may carry) makes the slot stale.
    pub block: Option<DateTime<Utc>>,
}

/// What a waiting request gets: a slot, or when a spent long window frees.
type Granted = Result<Slot, DateTime<Utc>>;

/// Per-rule fair queue of waiting requests.
#[derive(Default)]
struct FairQueue {
    /// Virtual time: the stamp of the request served last.
    now_virtual: f64,
    /// The stamp of each rule's latest request.
    last: HashMap<i64, f64>,
    /// Waiting requests by (stamp, arrival order).
    waiting: BTreeMap<(u64, u64), oneshot::Sender<Granted>>,
    /// Arrival counter, to keep equal stamps in arrival order.
    seq: u64,
}

impl FairQueue {
    fn push(&mut self, rule: i64, weight: u32, tx: oneshot::Sender<Granted>) {
        let start = self
            .last
            .get(&rule)
            .copied()
            .unwrap_or(0.0)
            .max(self.now_virtual);
        let stamp = start + 1.0 / f64::from(weight.max(1));
        self.last.insert(rule, stamp);
        self.seq += 1;
        // Stamps are non-negative, so their bit patterns order like the numbers.
        self.waiting.insert((stamp.to_bits(), self.seq), tx);
    }

    fn pop(&mut self) -> Option<oneshot::Sender<Granted>> {
        let ((stamp, _), tx) = self.waiting.pop_first()?;
        self.now_virtual = f64::from_bits(stamp);
        Some(tx)
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Tells every waiting request that a spent window frees at `until`.
    fn fail_all(&mut self, until: DateTime<Utc>) {
        for (_, tx) in std::mem::take(&mut self.waiting) {
            let _ = tx.send(Err(until));
        }
    }

    /// Forgets requests whose caller stopped waiting (a 429 or a stop ended its batch): no
    /// slot is leased for them, so the shared budget is not booked for calls never made.
    fn forget_gone(&mut self) {
        self.waiting.retain(|_, tx| !tx.is_closed());
    }
}

/// One budget's in-process state: its declaration, and what this process keeps of it
/// between leases under one lock ([`Budget::local`]), never held across an `.await`.
struct Budget {
    /// The budget key (`connection:<id>`, a rule's or a shared key).
    key: String,
    /// The limits declared for it, shortest window first.
    limits: Vec<Limit>,
    /// Percent of its long windows kept for other clients.
    reserve: u8,
    /// The rest, under one lock.
    local: Mutex<Local>,
}

impl Budget {
    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().expect("budget mutex")
    }
}

/// What a process keeps of a budget between leases.
struct Local {
    /// Leased slots not yet handed out.
    slots: VecDeque<Slot>,
    /// Leased slots dropped unused (nobody took them in their time), to be given back to
    /// the long windows at the next lease: a call never made spends nothing of a quota.
    unused: Vec<DateTime<Utc>>,
    /// Requests waiting for a slot, in fair turn.
    queue: FairQueue,
    /// Whether a lease is under way.
    leasing: bool,
    /// Slots handed out by this process: one per writer call.
    granted: u64,
    /// How far ahead of now a lease starts, and how long before its last slot the next
    /// one is asked for (microseconds): twice the last lease's round trip (at most a
    /// slice), so the slots are still fresh when they arrive, however fast the rate.
    lookahead_us: i64,
    /// The pace (requests per second) of this process's latest lease (before any: the
    /// declared pace).
    rate: f64,
    /// The limits the target's headers stated, not yet reported.
    advertised: Option<Vec<Limit>>,
    /// No slot before this time: the target said its budget is spent until then.
    hold: Option<DateTime<Utc>>,
    /// The shared budget's next free slot as of this process's last lease: how far other
    /// processes (or a spent long window) have booked it.
    booked_until: Option<DateTime<Utc>>,
    /// No lease before this time: the last slot leased is not near yet (or a spent long
    /// window frees then).
    next_lease: Option<DateTime<Utc>>,
    /// This process's latest call on the budget (see [`Pacer::depart`]).
    trip: Trip,
}

impl Local {
    fn new(declared: &[Limit]) -> Self {
        Self {
            slots: VecDeque::new(),
            unused: Vec::new(),
            queue: FairQueue::default(),
            leasing: false,
            granted: 0,
            lookahead_us: 0,
            rate: declared.first().map_or(f64::MAX, Limit::per_second),
            advertised: None,
            hold: None,
            booked_until: None,
            next_lease: None,
            trip: Trip::default(),
        }
    }

    /// The pace the latest lease booked its slots at.
    fn rate(&self) -> f64 {
        self.rate
    }
}

/// A process's latest call on a budget and how quickly calls come back.
#[derive(Default)]
struct Trip {
    /// When the latest call was let go.
    let_go: Option<DateTime<Utc>>,
    /// How late it left ([`Pacer::left`]), or how much slower than usual its round trip
    /// was once it answered ([`Pacer::returned`]): the more, at most an interval.
    late: Duration,
    /// The latest [`RECENT_TRIPS`] round trips.
    recent: VecDeque<Duration>,
}

/// Hands out request slots per budget; one per worker process.
pub struct Pacer {
    /// Where budgets' shared state lives.
    pool: PgPool,
    /// Where "now" comes from.
    clock: Clock,
    /// The 429 blocks this process knows (its own, and others' by NOTIFY): no slot of a
    /// blocked budget goes out before the block ends.
    pub(super) blocks: Arc<Blocks>,
    /// Budgets this process has used, by key.
    budgets: Mutex<HashMap<String, Arc<Budget>>>,
}

/// Why no slot could be had.
#[derive(Debug, thiserror::Error)]
pub enum PacerError {
    /// Leasing from the shared budget failed.
    #[error("leasing from budget {key}: {source}")]
    Lease {
        /// The budget key.
        key: String,
        /// The database error.
        source: sqlx::Error,
    },
    /// The pacer went away while the request waited.
    #[error("pacer stopped")]
    Stopped,
    /// A declared long window is spent until then (its deliveries wait).
    #[error("a declared limit is spent until {0}")]
    Spent(DateTime<Utc>),
}

impl Pacer {
    /// A pacer over the budgets in `pool`.
    pub fn new(pool: PgPool, clock: Clock, blocks: Arc<Blocks>) -> Self {
        Self {
            pool,
            clock,
            blocks,
            budgets: Mutex::new(HashMap::new()),
        }
    }

    fn budget(&self, key: &str, limits: &[Limit], reserve: u8) -> Arc<Budget> {
        let mut budgets = self.budgets.lock().expect("pacer mutex");
        match budgets.get(key) {
            // A changed declaration takes effect with a fresh in-memory budget.
            Some(b) if b.limits == limits && b.reserve == reserve => b.clone(),
            _ => {
                let b = Arc::new(Budget {
                    key: key.to_owned(),
                    limits: limits.to_vec(),
                    reserve,
                    local: Mutex::new(Local::new(limits)),
                });
                budgets.insert(key.to_owned(), b.clone());
                b
            }
        }
    }

    fn known(&self, key: &str) -> Option<Arc<Budget>> {
        self.budgets.lock().expect("pacer mutex").get(key).cloned()
    }

    /// A call on budget `key` sent at `sent` on a slot booked at pace `paced` met a 429
    /// whose block ends at `block_end`: the target allows less than that pace. The controller learns from
    /// it in the budget's row (shared by every process, see
    /// [`controller`](super::controller)); slots this process leased are dropped, and the
    /// shared booking is cut back to the end of the block.
    pub async fn throttled(
        &self,
        key: &str,
        sent: DateTime<Utc>,
        paced: f64,
        block_end: DateTime<Utc>,
    ) -> Result<(), PacerError> {
        let Some(b) = self.known(key) else {
            return Ok(());
        };
        {
            let mut local = b.local();
            local.slots.clear();
            local.next_lease = None;
        }
        let now = self.clock.now();
        let cut = self
            .with_state(&b, |st| {
                st.refused(&PARAMS, paced, sent, now, block_end)
                    .then(|| st.learned.clone())
            })
            .await?;
        if let Some(learned) = cut {
            tracing::debug!(
                budget = key,
                paced,
                by = learned.by,
                base = learned.base,
                ceiling = learned.ceiling,
                "a 429: the budget's learned rate is lowered"
            );
        }
        Ok(())
    }

    /// Runs `change` on budget `b`'s shared state under its row lock, and stores it.
    async fn with_state<T>(
        &self,
        b: &Budget,
        change: impl FnOnce(&mut BudgetState) -> T,
    ) -> Result<T, PacerError> {
        let lease_err = |source| PacerError::Lease {
            key: b.key.clone(),
            source,
        };
        let mut tx = self.pool.begin().await.map_err(lease_err)?;
        let row = sqlx::query_scalar!(
            "INSERT INTO budgets (budget_key, updated_at) VALUES ($1, $2)
             ON CONFLICT (budget_key) DO UPDATE SET updated_at = EXCLUDED.updated_at
             RETURNING state",
            b.key,
            self.clock.now()
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(lease_err)?;
        let mut st = BudgetState::from_row(Some(row));
        let out = change(&mut st);
        let limits: Vec<String> = b.limits.iter().map(ToString::to_string).collect();
        sqlx::query!(
            "UPDATE budgets SET state = $2, limits = $3, reserve_percent = $4
             WHERE budget_key = $1",
            b.key,
            serde_json::to_value(&st).expect("a budget's state serializes"),
            &limits,
            i16::from(b.reserve)
        )
        .execute(&mut *tx)
        .await
        .map_err(lease_err)?;
        tx.commit().await.map_err(lease_err)?;
        Ok(out)
    }

    /// The target's headers stated `limits` for budget `key` (one per policy): the budget
    /// keeps them beside the declared ones, reported with this process's next lease.
    pub fn advertised(&self, key: &str, limits: Vec<Limit>) {
        if let Some(b) = self.known(key) {
            b.local().advertised = Some(limits);
        }
    }

    /// The target said budget `key` is spent until `until` (a remaining count of 0): this
    /// process hands out no slot before then, and its next lease books the shared budget
    /// from then on.
    pub fn hold(&self, key: &str, until: DateTime<Utc>) {
        if let Some(b) = self.known(key) {
            let mut local = b.local();
            local.hold = Some(local.hold.map_or(until, |h| h.max(until)));
            local.slots.retain(|s| s.at >= until);
        }
    }

    /// Until when budget `key` is held back, if later than now: by a 429's block (whichever
    /// process met it) or by this process's hold (see [`Pacer::hold`]).
    pub fn held_until(&self, key: &str) -> Option<DateTime<Utc>> {
        let hold = self.known(key).and_then(|b| b.local().hold);
        let block = self.blocks.until(key);
        hold.max(block).filter(|&h| h > self.clock.now())
    }

    /// Whether a call on budget `key` may use `slot` now that its time has come: the
    /// budget is not held back past it ([`Pacer::held_until`]), and no block was set
    /// since it was booked (a 429 refused the pace it was booked at, however long ago it
    /// was leased ahead). A slot that may not is given up for a new one.
    pub fn may_use(&self, key: &str, slot: &Slot) -> bool {
        self.held_until(key).is_none_or(|h| h <= slot.at) && self.blocks.until(key) <= slot.block
    }

    /// The rate (requests per second) this process paces budget `key` at, as its last
    /// lease found the shared budget: the shortest declared window's, the learned and the
    /// advertised rate, the least.
    pub fn effective_rate(&self, key: &str) -> Option<f64> {
        self.known(key).map(|b| b.local().rate())
    }

    /// The earliest a new request on budget `key` could go out, as far as this process
    /// knows without asking the database: its first unserved leased slot, or else the time
    /// its last lease found the shared budget booked until (by other processes). `None`
    /// while requests of this process wait for the key (a new one joins them in fair
    /// turn) or when nothing is known. The throttle layer lets a chain job wait for a
    /// time far ahead in the queue instead of in a worker slot.
    pub fn next_free(&self, key: &str) -> Option<DateTime<Utc>> {
        let budget = self.known(key)?;
        let local = budget.local();
        if !local.queue.is_empty() || local.leasing {
            return None;
        }
        let free = match local.slots.front() {
            Some(slot) => slot.at,
            None => local.booked_until?,
        };
        Some(free).filter(|&t| t > self.clock.now())
    }

    /// Lets a call on budget `key` whose slot has come go at `at` (now, or the time it slept
    /// until), and returns `at`; or returns the time it may go, if this process's latest
    /// call on the budget went less than [`MIN_GAP_SHARE`] of the slot interval before,
    /// plus how late that call left ([`Pacer::left`]) or came back ([`Pacer::returned`]).
    /// A call late on its way and the next one on time would arrive closer together than
    /// the rate allows, which a limiter with no burst refuses. The caller sleeps until the
    /// time returned and asks again, so a lateness learned meanwhile still holds the call
    /// back. Held back this way, the calls after a late one catch up on the schedule by the
    /// rest of the headroom each.
    pub fn depart(&self, key: &str, at: DateTime<Utc>) -> Result<DateTime<Utc>, DateTime<Utc>> {
        let Some(b) = self.known(key) else {
            return Ok(at);
        };
        let mut local = b.local();
        let gap = std_interval(local.rate()).mul_f64(MIN_GAP_SHARE) + local.trip.late;
        let gap = chrono::Duration::from_std(gap).expect("fits");
        let trip = &mut local.trip;
        match trip.let_go {
            Some(l) if l + gap > at => Err(l + gap),
            _ => {
                trip.let_go = Some(at);
                trip.late = Duration::ZERO;
                Ok(at)
            }
        }
    }

    /// The call on budget `key` let go at `let_go` (as [`Pacer::depart`] returned) left
    /// only at `left`: its task woke late, or building the call took that long. If it is
    /// still the process's latest call, the next one keeps its gap from then (up to one
    /// interval later): the pair never leaves closer together than [`MIN_GAP_SHARE`] of the
    /// interval, which a limiter with no burst would refuse.
    pub fn left(&self, key: &str, let_go: DateTime<Utc>, left: DateTime<Utc>) {
        let Some(b) = self.known(key) else {
            return;
        };
        let mut local = b.local();
        let interval = std_interval(local.rate());
        let trip = &mut local.trip;
        if trip.let_go == Some(let_go) {
            let late = (left - let_go).to_std().unwrap_or_default().min(interval);
            trip.late = trip.late.max(late);
        }
    }

    /// The call on budget `key` let go at `let_go` (as [`Pacer::depart`] returned) answered
    /// after `round_trip`. If it is still the process's latest call and its trip was slower
    /// than nine in ten of the process's [`RECENT_TRIPS`] on the budget, the time it took
    /// beyond the middle one (at most an interval) holds the next call back: the call may
    /// have reached the target that late, and the next one, on time, would follow it too
    /// closely for a limiter with no burst.
    pub fn returned(&self, key: &str, let_go: DateTime<Utc>, round_trip: Duration) {
        let Some(b) = self.known(key) else {
            return;
        };
        let mut local = b.local();
        let interval = std_interval(local.rate());
        let trip = &mut local.trip;
        if trip.recent.len() == RECENT_TRIPS {
            trip.recent.pop_front();
        }
        trip.recent.push_back(round_trip);
        let mut sorted: Vec<Duration> = trip.recent.iter().copied().collect();
        sorted.sort_unstable();
        let tenths = |q: usize| sorted[(sorted.len() - 1) * q / 10];
        if trip.let_go == Some(let_go) && round_trip > tenths(9) {
            let late = round_trip.saturating_sub(tenths(5)).min(interval);
            trip.late = trip.late.max(late);
        }
    }

    /// Slots this process has handed out for budget `key` (one per writer call).
    pub fn granted(&self, key: &str) -> u64 {
        self.known(key).map_or(0, |b| b.local().granted)
    }

    /// Waits for the next request slot of budget `key` on behalf of `rule`, and returns
    /// it: the time the request may go out and the pace it was booked at. The caller
    /// sleeps until then ([`Clock::sleep_until`]); one slot is one request.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        reserve: u8,
        rule: i64,
        weight: u32,
    ) -> Result<Slot, PacerError> {
        let budget = self.budget(key, limits, reserve);
        let (tx, rx) = oneshot::channel();
        let need_lease = {
            let mut st = budget.local();
            st.queue.push(rule, weight, tx);
            self.serve(&mut st);
            let need = !st.queue.is_empty() && !st.leasing;
            if need {
                st.leasing = true;
            }
            need
        };
        if need_lease {
            // A task of its own, so a cancelled caller never strands the lease flag.
            let pacer = self.clone();
            let budget = budget.clone();
            tokio::spawn(async move { pacer.refill(budget).await });
        }
        match rx.await {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(until)) => Err(PacerError::Spent(until)),
            Err(_) => Err(PacerError::Stopped),
        }
    }

    /// Hands leased slots to waiting requests in fair order; drops slots already stale.
    fn serve(&self, st: &mut Local) {
        st.queue.forget_gone();
        let now = self.clock.now();
        // A slot nobody took in time is dropped rather than spent late, right before the
        // next one: two requests that close together could exceed the limit. Late by the
        // interval's headroom (or the timer's resolution), a call is still no closer to the
        // next slot than the declared rate allows, which a limiter with no burst checks.
        let tolerance = std_interval(st.rate())
            .mul_f64(HEADROOM)
            .max(crate::clock::RESOLUTION);
        let stale = now - chrono::Duration::from_std(tolerance).expect("fits");
        while !st.queue.is_empty() {
            let Some(slot) = st.slots.pop_front() else {
                return;
            };
            if slot.at < stale {
                // Unused in its time: spending it late would make a burst.
                st.unused.push(slot.at);
                continue;
            }
            if let Some(tx) = st.queue.pop() {
                // A dropped waiter loses its slot; it was paid for, but it is only one.
                if tx.send(Ok(slot)).is_ok() {
                    st.granted += 1;
                }
            }
        }
    }

    /// Leases slices while requests wait, each when the previous one is nearly spent: a
    /// process books at most a slice ahead, however many requests wait, so a changed rate
    /// (a 429's cut, a probe) shows in its calls within a quarter second, and processes
    /// share the budget in turn. A long window spent for more than [`SPENT_WAIT`] fails
    /// the waiting requests ([`PacerError::Spent`]): their deliveries stay pending, and the
    /// chain's next job waits for the window in the queue.
    async fn refill(self: Arc<Self>, budget: Arc<Budget>) {
        loop {
            let due = budget.local().next_lease;
            if let Some(due) = due.filter(|&d| d > self.clock.now()) {
                self.clock.sleep_until(due).await;
                // The waiters may have gone meanwhile (their batch stopped on a 429).
                let mut st = budget.local();
                st.queue.forget_gone();
                if st.queue.is_empty() {
                    st.leasing = false;
                    return;
                }
            }
            let result = self.lease_slice(&budget).await;
            let mut st = budget.local();
            match result {
                Ok((slots, spent)) => {
                    let last = slots.last().map(|s| s.at);
                    st.slots.extend(slots);
                    let spent_wait = chrono::Duration::from_std(SPENT_WAIT).expect("fits");
                    if let Some(until) = spent.filter(|&u| u > self.clock.now() + spent_wait) {
                        self.serve(&mut st);
                        st.queue.fail_all(until);
                        st.leasing = false;
                        return;
                    }
                    // The timer may wake its lateness after the deadline.
                    let ahead = st.lookahead_us + PRECISE_WITHIN.as_micros() as i64;
                    st.next_lease = last
                        .or(spent)
                        .map(|t| t - chrono::Duration::microseconds(ahead));
                }
                Err(e) => {
                    tracing::error!(error = %e, "pacer could not lease; waiting requests fail");
                    st.queue = FairQueue::default();
                    st.leasing = false;
                    return;
                }
            }
            self.serve(&mut st);
            if st.queue.is_empty() {
                st.leasing = false;
                return;
            }
        }
    }

    /// Leases the next slice of budget `budget` from its shared state; returns the slots,
    /// and when a spent long window frees if one stopped the slice.
    async fn lease_slice(
        &self,
        budget: &Budget,
    ) -> Result<(Vec<Slot>, Option<DateTime<Utc>>), PacerError> {
        // Timed on the engine's clock: a manual one stands still through the round trip, so
        // a test's leases start where it put the clock, whatever the database's speed.
        let asked = self.clock.now();
        // A blocked budget books from the block's end; a block longer than a batch sits out
        // fails the waiting requests like a spent window.
        let known_block = self.blocks.until(&budget.key);
        let blocked = known_block.filter(|&b| b > asked);
        let spent_wait = chrono::Duration::from_std(SPENT_WAIT).expect("fits");
        if let Some(until) = blocked.filter(|&b| b > asked + spent_wait) {
            return Ok((Vec::new(), Some(until)));
        }
        let (now, advertised, hold, unused) = {
            let mut local = budget.local();
            let ahead = asked + chrono::Duration::microseconds(local.lookahead_us);
            let now = blocked.map_or(ahead, |b| b.max(ahead));
            let unused = std::mem::take(&mut local.unused);
            (now, local.advertised.take(), local.hold, unused)
        };
        let (slice, tat) = self
            .with_state(budget, |st| {
                st.unbook(&unused);
                if let Some(limits) = advertised {
                    st.advertise(limits, now);
                }
                if let Some(until) = hold.filter(|&h| h > now) {
                    st.hold_until(until);
                }
                let ask = SliceRequest {
                    limits: &budget.limits,
                    reserve: budget.reserve,
                    n: u32::MAX,
                    horizon: spent_wait,
                };
                let slice = st.lease(&PARAMS, now, &ask);
                (slice, st.tat)
            })
            .await?;
        let round_trip = (self.clock.now() - asked)
            .to_std()
            .unwrap_or_default()
            .min(SLICE / 2);
        let mut local = budget.local();
        if !slice.slots.is_empty() {
            local.rate = slice.rate;
        }
        local.booked_until = slice.spent_until.or(tat);
        local.lookahead_us = 2 * round_trip.as_micros() as i64;
        let paced = slice.rate;
        let slots = slice
            .slots
            .into_iter()
            .map(|at| Slot {
                at,
                paced,
                block: known_block,
            })
            .collect();
        Ok((slots, slice.spent_until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_queue_serves_rules_by_weight() {
        let mut q = FairQueue::default();
        let mut order = Vec::new();
        let mut rxs = Vec::new();
        // Rule 1 arrives with a burst of 6 before rule 2 and 3 ask at all.
        for _ in 0..6 {
            let (tx, rx) = oneshot::channel();
            q.push(1, 1, tx);
            rxs.push((1, rx));
        }
        for _ in 0..6 {
            let (tx, rx) = oneshot::channel();
            q.push(2, 1, tx);
            rxs.push((2, rx));
        }
        for _ in 0..6 {
            let (tx, rx) = oneshot::channel();
            q.push(3, 2, tx);
            rxs.push((3, rx));
        }
        let now = Utc::now();
        for _ in 0..8 {
            q.pop()
                .unwrap()
                .send(Ok(Slot {
                    at: now,
                    paced: 1.0,
                    block: None,
                }))
                .unwrap();
        }
        for (rule, mut rx) in rxs {
            if rx.try_recv().is_ok() {
                order.push(rule);
            }
        }
        let served = |r| order.iter().filter(|&&x| x == r).count();
        assert_eq!((served(1), served(2), served(3)), (2, 2, 4), "{order:?}");
    }

    #[tokio::test]
    async fn a_slot_carries_the_pace_it_was_booked_at() {
        let pool = PgPool::connect_lazy("postgres://127.0.0.1/unused").unwrap();
        let pacer = Arc::new(Pacer::new(pool, Clock::system(), Arc::default()));
        let limits = [Limit::new(100, 1)];
        let b = pacer.budget("k", &limits, 0);
        assert_eq!(
            b.local().rate(),
            100.0,
            "before any lease: the declared pace"
        );
        // Slots of a climbing pace, leased before: each keeps the pace of its lease, so a
        // 429 on a call reports the pace that call went out at, not the latest.
        let now = Utc::now() + chrono::Duration::seconds(1);
        for (i, paced) in [9.0, 9.5, 10.0].into_iter().enumerate() {
            let at = now + chrono::Duration::milliseconds(100 * i as i64);
            b.local().slots.push_back(Slot {
                at,
                paced,
                block: None,
            });
        }
        b.local().rate = 10.5;
        for paced in [9.0, 9.5, 10.0] {
            let slot = pacer.acquire("k", &limits, 0, 1, 1).await.unwrap();
            assert_eq!(slot.paced, paced);
        }
    }
}
