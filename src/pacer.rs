//! Pacing against a declared rate, before the target has to say 429.
//!
//! Each budget (a connection, or every connection naming the same budget key) spends at
//! most its declared requests per minute. The budget's state lives in PostgreSQL (table
//! `budgets`) as a GCRA "theoretical arrival time": the earliest moment the next request
//! may go out. A worker process leases a small slice of request slots at once by moving
//! that time forward (one statement per slice), and hands the slots out in memory. Slots
//! are spaced one emission interval apart across all processes, so no 60 s window and no
//! 1 s window sees more than the declared rate; losing a process loses at most the slice
//! it held.
//!
//! Within a process, rules waiting on one budget are served by start-time fair queueing:
//! each request of a rule is stamped `max(now_virtual, last_of_rule) + 1/weight`, and the
//! lowest stamp gets the next slot, so rules with a backlog share the budget by weight.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::{clock::Clock, learned};

/// Slots leased per statement: about a quarter second's worth, at least 1, at most this.
pub const MAX_SLICE: u32 = 50;

/// A budget whose slots all lay this far in the past was idle: the count of accepted
/// calls a 429 estimates the real rate from starts afresh.
pub const IDLE_AFTER: Duration = Duration::from_secs(5);

/// A slot may still be spent this late (or the interval's [`HEADROOM`], if longer: a call
/// that late is still no closer to the next slot than the declared rate allows, which a
/// limiter with no burst checks).
pub const MIN_STALE_TOLERANCE: Duration = Duration::from_millis(1);
/// How far ahead of now a budget's first lease starts, before a round trip was timed.
pub const FIRST_LOOKAHEAD: Duration = Duration::from_millis(20);
/// The furthest ahead of now a lease may start.
pub const MAX_LOOKAHEAD: Duration = Duration::from_millis(200);

/// Share of the declared rate left unused, so that arrival jitter (timers, scheduling, the
/// network) never pushes a target that counts on a sliding window over its limit: slots
/// are spaced 2% wider than the declared rate needs, which tolerates a ~20 ms jitter at
/// 10 requests/s while using 98% of the budget.
pub const HEADROOM: f64 = 0.02;

/// The least time between two calls of one process on a budget, as a share of the slot
/// interval: half the [`HEADROOM`], so a call's trip to the target may vary by the other
/// half without the pair arriving closer together than the rate allows.
pub const MIN_GAP_SHARE: f64 = 1.0 - HEADROOM / 2.0;

/// The most a call's answer coming back late holds the process's next call back, as a share
/// of the slot interval (see [`Pacer::returned`]).
pub const MAX_LATE_SHARE: f64 = 0.05;

/// A process's first slice on a budget, or its first after [`IDLE_AFTER`] without a call,
/// books its slots this share wider: its first calls go out on cold connections and code
/// paths and may reach the target a few milliseconds late (the 2% [`HEADROOM`] is 2 ms at
/// 10/s), and the next slot, another process's or its own, would then follow too closely
/// for a limiter with no burst, which then refuses the second call of a drain
/// (BENCHMARKS.md, `limits`). It costs a quarter second at 5% less once per start.
pub const COLD_SPREAD: f64 = MAX_LATE_SHARE;

/// How far the quickest round trip a budget remembers drifts towards a slower one, per
/// call: 1/this of the difference (a network that became slower is learned in a few
/// hundred calls).
const QUICKEST_DRIFT: u32 = 256;

/// The time between two requests of a budget declaring `requests_per_minute`.
pub fn emission_interval(requests_per_minute: u32) -> Duration {
    interval_for(f64::from(requests_per_minute))
}

/// The time between two requests of a budget paced at `rpm` requests per minute (the
/// effective rate, see [`learned`](crate::learned)), [`HEADROOM`] wider; PostgreSQL's
/// `courier_slot_interval` is the same formula.
pub fn interval_for(rpm: f64) -> Duration {
    let exact = 60.0 / (rpm.max(1.0) * (1.0 - HEADROOM));
    // Whole microseconds: what PostgreSQL's interval and timestamp types hold.
    Duration::from_micros((exact * 1e6).ceil() as u64)
}

/// The slot interval of a process's cold slice ([`COLD_SPREAD`] wider than
/// [`interval_for`]), in whole microseconds.
pub fn cold_interval_for(rpm: f64) -> Duration {
    let warm = interval_for(rpm).as_micros() as f64;
    Duration::from_micros((warm * (1.0 + COLD_SPREAD)).round() as u64)
}

/// Slots to lease at once for a budget paced at `rpm` requests per minute: a quarter
/// second's worth, within 1..=MAX_SLICE. PostgreSQL's `courier_slice_len` is the same
/// formula; the lease statement computes it from the rate it books at and returns it.
pub fn slice_len(rpm: f64) -> u32 {
    ((rpm.max(0.0) / 240.0).floor() as u32).clamp(1, MAX_SLICE)
}

/// GCRA with no burst tolerance: leases `n` slots after `tat` (or now, if later); returns
/// the first slot and the new arrival time. Slot `i` is `start + i · interval`.
pub fn lease(
    tat: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    n: u32,
    interval: Duration,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = tat.map_or(now, |t| t.max(now));
    let len = chrono::Duration::from_std(interval * n).expect("slice fits");
    (start, start + len)
}

/// What a 429 taught budget `key`, paced at `paced`, at `debug`: the block the 429 set is
/// the line at `info`; the rate learned shows in status, the metrics and the dashboard.
fn trace_cut(key: &str, paced: f64, evidence: &learned::Evidence, cut: &learned::Cut) {
    tracing::debug!(
        budget = key,
        paced,
        accepted = ?evidence.accepted_rpm,
        calls = evidence.accepted,
        stretch = evidence.stretch,
        between = ?evidence.between_rpm,
        recent = evidence.recent_429,
        by = cut.by.as_str(),
        streak = cut.streak,
        probing = ?evidence.probing,
        learned = cut.rpm,
        ceiling = ?cut.ceiling,
        "a 429: the budget's learned rate is lowered"
    );
}

/// A budget's row as a 429 reads it.
struct BudgetRow {
    declared_rpm: Option<i32>,
    learned_rpm: Option<f64>,
    learned_at: Option<DateTime<Utc>>,
    ceiling_rpm: Option<f64>,
    advertised_rpm: Option<f64>,
    advertised_at: Option<DateTime<Utc>>,
    last_429_at: Option<DateTime<Utc>>,
    streak_429: i32,
    accepted: i64,
    accepted_since: Option<DateTime<Utc>>,
    learned_by: Option<String>,
}

impl BudgetRow {
    /// What it has learned.
    fn learned(&self) -> learned::Learned {
        learned::Learned {
            rpm: self.learned_rpm,
            at: self.learned_at,
            ceiling: self.ceiling_rpm,
        }
    }

    /// Its effective rate at `now` (see [`learned::effective`]).
    fn effective(&self, declared: u32, now: DateTime<Utc>) -> f64 {
        learned::effective(
            declared,
            self.learned().now(declared, now),
            learned::advertised_now(self.advertised_rpm, self.advertised_at, now),
        )
    }

    /// What a 429 met `now` tells, with `pending` calls this process saw accepted and has
    /// not reported yet.
    fn evidence(&self, pending: i64, now: DateTime<Utc>) -> learned::Evidence {
        let quiet = chrono::Duration::milliseconds((learned::QUIET * 1e3) as i64);
        let accepted = self.accepted + pending;
        let stretch = self
            .accepted_since
            .map_or(0.0, |since| (now - since).as_seconds_f64().max(0.0));
        // The previous 429's block: from it to the end it set (`learned_at`).
        let previous_block = self
            .last_429_at
            .zip(self.learned_at)
            .map(|(last, end)| (end - last).as_seconds_f64());
        learned::Evidence {
            accepted_rpm: learned::accepted_rpm(accepted, self.accepted_since, now),
            accepted,
            stretch,
            recent_429: self.last_429_at.is_some_and(|t| t > now - quiet),
            streak: self.streak_429.max(0) as u32,
            probing: self.learned().probing(now),
            between_rpm: previous_block
                .filter(|_| self.accepted_since.is_some())
                .and_then(|block| learned::between_rpm(accepted, block, stretch)),
            previous: self
                .learned_by
                .as_deref()
                .and_then(learned::Lesson::parse)
                .zip(self.learned_rpm),
        }
    }
}

/// Per-rule fair queue of waiting requests.
#[derive(Default)]
struct FairQueue {
    /// Virtual time: the stamp of the request served last.
    now_virtual: f64,
    /// The stamp of each rule's latest request.
    last: HashMap<i64, f64>,
    /// Waiting requests by (stamp, arrival order).
    waiting: BTreeMap<(u64, u64), oneshot::Sender<DateTime<Utc>>>,
    /// Arrival counter, to keep equal stamps in arrival order.
    seq: u64,
}

impl FairQueue {
    fn push(&mut self, rule: i64, weight: u32, tx: oneshot::Sender<DateTime<Utc>>) {
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

    fn pop(&mut self) -> Option<oneshot::Sender<DateTime<Utc>>> {
        let ((stamp, _), tx) = self.waiting.pop_first()?;
        self.now_virtual = f64::from_bits(stamp);
        Some(tx)
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Forgets requests whose caller stopped waiting (a 429 or a stop ended its batch): no
    /// slot is leased for them, so the shared budget is not booked for calls never made.
    fn forget_gone(&mut self) {
        self.waiting.retain(|_, tx| !tx.is_closed());
    }
}

/// One budget's in-process state.
struct Budget {
    /// The budget key (`connection:<id>` or a shared key).
    key: String,
    /// Time between two slots.
    interval: Duration,
    /// Leased slots not yet handed out, waiting requests, and whether a lease is under way.
    state: Mutex<BudgetState>,
    /// Slots handed out by this process: one per writer call.
    granted: AtomicU64,
    /// How far ahead of now a lease starts (microseconds): twice the last lease's round
    /// trip, so the slots are still fresh when they arrive, however fast the rate.
    lookahead_us: AtomicU64,
    /// The declared rate (requests per minute).
    declared: u32,
    /// The effective rate the last lease paced at (as f64 bits): the least of declared,
    /// learned and advertised, as the shared budget row stood.
    effective: AtomicU64,
    /// Calls the target accepted (answered other than 429) not yet reported to the budget
    /// row; the next lease adds them.
    accepted: AtomicU64,
    /// The rate the target's headers advertised, not yet reported to the budget row.
    advertised: Mutex<Option<f64>>,
    /// No slot before this time: the target said its budget is spent until then.
    hold: Mutex<Option<DateTime<Utc>>>,
    /// The shared budget's next free slot as of this process's last lease: how far other
    /// processes have booked it.
    booked_until: Mutex<Option<DateTime<Utc>>>,
    /// This process's latest call on the budget (see [`Pacer::spaced`]).
    trip: Mutex<Trip>,
}

/// A process's latest call on a budget and how quickly calls come back.
#[derive(Default)]
struct Trip {
    /// When the latest call was let go.
    let_go: Option<DateTime<Utc>>,
    /// How much slower than the quickest its round trip was, once it answered (at most
    /// [`MAX_LATE_SHARE`] of the interval).
    late: Duration,
    /// The quickest round trip lately: the least seen, drifting towards slower ones.
    quickest: Option<Duration>,
}

#[derive(Default)]
struct BudgetState {
    slots: VecDeque<DateTime<Utc>>,
    queue: FairQueue,
    leasing: bool,
}

/// Hands out request slots per budget; one per worker process.
pub struct Pacer {
    /// Where budgets' shared state lives.
    pool: PgPool,
    /// Where "now" comes from.
    clock: Clock,
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
}

impl Pacer {
    /// A pacer over the budgets in `pool`.
    pub fn new(pool: PgPool, clock: Clock) -> Self {
        Self {
            pool,
            clock,
            budgets: Mutex::new(HashMap::new()),
        }
    }

    fn budget(&self, key: &str, requests_per_minute: u32) -> Arc<Budget> {
        let interval = emission_interval(requests_per_minute);
        let mut budgets = self.budgets.lock().expect("pacer mutex");
        match budgets.get(key) {
            // A changed declaration takes effect with a fresh in-memory budget.
            Some(b) if b.interval == interval => b.clone(),
            _ => {
                let b = Arc::new(Budget {
                    key: key.to_owned(),
                    interval,
                    state: Mutex::new(BudgetState::default()),
                    granted: AtomicU64::new(0),
                    lookahead_us: AtomicU64::new(FIRST_LOOKAHEAD.as_micros() as u64),
                    declared: requests_per_minute.max(1),
                    effective: AtomicU64::new(f64::from(requests_per_minute.max(1)).to_bits()),
                    accepted: AtomicU64::new(0),
                    advertised: Mutex::new(None),
                    hold: Mutex::new(None),
                    booked_until: Mutex::new(None),
                    trip: Mutex::default(),
                });
                budgets.insert(key.to_owned(), b.clone());
                b
            }
        }
    }

    fn known(&self, key: &str) -> Option<Arc<Budget>> {
        self.budgets.lock().expect("pacer mutex").get(key).cloned()
    }

    /// A call on budget `key` met a 429: the target allows less than the pace. The
    /// budget's learned rate (shared by every process, in its row) is set from what the
    /// target accepted since the previous 429 (see [`learned::after_429`]); slots this
    /// process leased at the old pace are dropped, and the shared budget's booking is cut
    /// back to the end of the block this one sets (`block`). The stretch the next 429
    /// measures starts with the first lease after it, or at the block's end if that is
    /// later: time spent blocked, or waiting to be fetched again, is counted apart, as the
    /// previous block ([`learned::between_rpm`]).
    pub async fn throttled(&self, key: &str, block: Duration) -> Result<(), PacerError> {
        let Some(b) = self.known(key) else {
            return Ok(());
        };
        b.state.lock().expect("budget mutex").slots.clear();
        let pending = b.accepted.swap(0, Ordering::Relaxed) as i64;
        let now = self.clock.now();
        let lease_err = |source| PacerError::Lease {
            key: key.to_owned(),
            source,
        };
        let mut tx = self.pool.begin().await.map_err(lease_err)?;
        let row = sqlx::query_as!(
            BudgetRow,
            r#"SELECT declared_rpm, learned_rpm, learned_at, ceiling_rpm, advertised_rpm,
                      advertised_at, last_429_at, streak_429, accepted, accepted_since,
                      learned_by
               FROM budgets WHERE budget_key = $1 FOR UPDATE"#,
            key
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(lease_err)?;
        let Some(row) = row else {
            return Ok(());
        };
        if row
            .last_429_at
            .is_some_and(|t| t > now - learned::ONE_CUT_PER)
        {
            // The same exhausted window, met by another call in flight: one cut is enough.
            sqlx::query!(
                "UPDATE budgets SET accepted = accepted + $2 WHERE budget_key = $1",
                key,
                pending
            )
            .execute(&mut *tx)
            .await
            .map_err(lease_err)?;
            tx.commit().await.map_err(lease_err)?;
            return Ok(());
        }
        let declared = row.declared_rpm.map_or(b.declared, |d| d.max(1) as u32);
        // The pace the refused call was spaced at: the rate of this process's last lease.
        // A probe has climbed since (by up to a slice's growth), or another process's 429
        // has cut the rate meanwhile: the lesser of the two.
        let paced = row
            .effective(declared, now)
            .min(f64::from_bits(b.effective.load(Ordering::Relaxed)));
        let evidence = row.evidence(pending, now);
        let cut = learned::after_429(paced, evidence, declared);
        let learned::Cut {
            rpm,
            ceiling,
            streak,
            by,
        } = cut;
        let block_ends = now + chrono::Duration::from_std(block).unwrap_or_default();
        sqlx::query!(
            "UPDATE budgets SET learned_rpm = $2, learned_at = $4, last_429_at = $3,
                                ceiling_rpm = $5, streak_429 = $6, accepted = 0,
                                accepted_since = NULL, tat = LEAST(tat, $4), learned_by = $7
             WHERE budget_key = $1",
            key,
            rpm,
            now,
            block_ends,
            ceiling,
            streak as i32,
            by.as_str()
        )
        .execute(&mut *tx)
        .await
        .map_err(lease_err)?;
        tx.commit().await.map_err(lease_err)?;
        b.effective.store(rpm.to_bits(), Ordering::Relaxed);
        trace_cut(key, paced, &evidence, &cut);
        Ok(())
    }

    /// `calls` calls on budget `key` were answered other than 429: the target accepted
    /// them. Counted for the budget with this process's next lease.
    pub fn answered(&self, key: &str, calls: u32) {
        if let Some(b) = self.known(key) {
            b.accepted.fetch_add(u64::from(calls), Ordering::Relaxed);
        }
    }

    /// The target's headers stated a quota of `rpm` requests per minute for budget `key`:
    /// reported to the budget row with this process's next lease.
    pub fn advertised(&self, key: &str, rpm: f64) {
        if let Some(b) = self.known(key) {
            *b.advertised.lock().expect("budget mutex") = Some(rpm);
        }
    }

    /// The target said budget `key` is spent until `until` (a remaining count of 0): this
    /// process hands out no slot before then, and its next lease books the shared budget
    /// from then on.
    pub fn hold(&self, key: &str, until: DateTime<Utc>) {
        if let Some(b) = self.known(key) {
            let mut hold = b.hold.lock().expect("budget mutex");
            *hold = Some(hold.map_or(until, |h| h.max(until)));
            b.state
                .lock()
                .expect("budget mutex")
                .slots
                .retain(|&s| s >= until);
        }
    }

    /// Until when this process holds budget `key` back (see [`Pacer::hold`]), if later
    /// than now: a slot granted before then is given up for a new one.
    pub fn held_until(&self, key: &str) -> Option<DateTime<Utc>> {
        let b = self.known(key)?;
        let hold = *b.hold.lock().expect("budget mutex");
        hold.filter(|&h| h > self.clock.now())
    }

    /// The rate (requests per minute) this process paces budget `key` at, as its last
    /// lease (or 429) found the shared budget: declared, learned and advertised, the least.
    pub fn effective_rpm(&self, key: &str) -> Option<f64> {
        self.known(key)
            .map(|b| f64::from_bits(b.effective.load(Ordering::Relaxed)))
    }

    /// The earliest a new request on budget `key` could go out, as far as this process
    /// knows without asking the database: its first unserved leased slot, or else the time
    /// its last lease found the shared budget booked until (by other processes). `None`
    /// while requests of this process wait for the key (a new one joins them in fair
    /// turn) or when nothing is known. The throttle layer lets a chain job wait for a
    /// time far ahead in the queue instead of in a worker slot.
    pub fn next_free(&self, key: &str) -> Option<DateTime<Utc>> {
        let budget = self.budgets.lock().expect("pacer mutex").get(key)?.clone();
        let st = budget.state.lock().expect("budget mutex");
        if !st.queue.is_empty() || st.leasing {
            return None;
        }
        let free = match st.slots.front() {
            Some(&slot) => slot,
            None => (*budget.booked_until.lock().expect("budget mutex"))?,
        };
        Some(free).filter(|&t| t > self.clock.now())
    }

    /// When a call on budget `key` whose slot has come may go: now, unless this process's
    /// previous call on the budget went less than [`MIN_GAP_SHARE`] of the slot interval
    /// ago, plus the time its answer came back late ([`Pacer::returned`]). A call let go
    /// late (a timer or a thread woke late), or slow on its way, and the next one on time
    /// would arrive closer together than the rate allows, which a limiter with no burst
    /// refuses; held back this way, the calls after a late one catch up on the schedule by
    /// the rest of the headroom each.
    pub fn spaced(&self, key: &str) -> DateTime<Utc> {
        let now = self.clock.now();
        let Some(b) = self.known(key) else {
            return now;
        };
        let rpm = f64::from_bits(b.effective.load(Ordering::Relaxed));
        let mut trip = b.trip.lock().expect("budget mutex");
        let gap = chrono::Duration::from_std(interval_for(rpm).mul_f64(MIN_GAP_SHARE) + trip.late)
            .expect("fits");
        let at = trip.let_go.map_or(now, |l| now.max(l + gap));
        trip.let_go = Some(at);
        trip.late = Duration::ZERO;
        at
    }

    /// The call on budget `key` let go at `let_go` (as [`Pacer::spaced`] returned) answered
    /// after `round_trip`. If it is still the process's latest call, the time its trip took
    /// beyond the quickest lately (at most [`MAX_LATE_SHARE`] of the interval) holds the
    /// next call back: the call may have reached the target that late, and the next one,
    /// on time, would follow it too closely.
    pub fn returned(&self, key: &str, let_go: DateTime<Utc>, round_trip: Duration) {
        let Some(b) = self.known(key) else {
            return;
        };
        let rpm = f64::from_bits(b.effective.load(Ordering::Relaxed));
        let mut trip = b.trip.lock().expect("budget mutex");
        let quickest = match trip.quickest {
            Some(q) if q < round_trip => q + (round_trip - q) / QUICKEST_DRIFT,
            _ => round_trip,
        };
        trip.quickest = Some(quickest);
        if trip.let_go == Some(let_go) {
            trip.late = round_trip
                .saturating_sub(quickest)
                .min(interval_for(rpm).mul_f64(MAX_LATE_SHARE));
        }
    }

    /// Slots this process has handed out for budget `key` (one per writer call).
    pub fn granted(&self, key: &str) -> u64 {
        let budgets = self.budgets.lock().expect("pacer mutex");
        budgets
            .get(key)
            .map_or(0, |b| b.granted.load(Ordering::Relaxed))
    }

    /// Waits for the next request slot of budget `key` on behalf of `rule`, and returns
    /// the time the request may go out. The caller sleeps until then
    /// ([`Clock::sleep_until`]); one slot is one request.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &str,
        requests_per_minute: u32,
        rule: i64,
        weight: u32,
    ) -> Result<DateTime<Utc>, PacerError> {
        let budget = self.budget(key, requests_per_minute);
        let (tx, rx) = oneshot::channel();
        let need_lease = {
            let mut st = budget.state.lock().expect("budget mutex");
            st.queue.push(rule, weight, tx);
            self.serve(&budget, &mut st);
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
        rx.await.map_err(|_| PacerError::Stopped)
    }

    /// Hands leased slots to waiting requests in fair order; drops slots already stale.
    fn serve(&self, budget: &Budget, st: &mut BudgetState) {
        st.queue.forget_gone();
        let now = self.clock.now();
        // A slot nobody took in time is dropped rather than spent late, right before the
        // next one: two requests that close together could exceed the limit.
        let tolerance = budget.interval.mul_f64(HEADROOM).max(MIN_STALE_TOLERANCE);
        let stale = now - chrono::Duration::from_std(tolerance).expect("fits");
        while !st.queue.is_empty() {
            let Some(slot) = st.slots.pop_front() else {
                return;
            };
            if slot < stale {
                continue; // unused in its time: spending it late would make a burst
            }
            if let Some(tx) = st.queue.pop() {
                // A dropped waiter loses its slot; it was paid for, but it is only one.
                if tx.send(slot).is_ok() {
                    budget.granted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Leases slices while requests wait, each when the previous one is nearly spent: a
    /// process books at most a slice ahead, so a changed rate (a 429's cut, a probe) shows
    /// in its calls within a quarter second, and processes share the budget in turn.
    async fn refill(self: Arc<Self>, budget: Arc<Budget>) {
        loop {
            let result = self.lease_slice(&budget).await;
            let last = {
                let mut st = budget.state.lock().expect("budget mutex");
                let last = match result {
                    Ok(slots) => {
                        let last = slots.last().copied();
                        st.slots.extend(slots);
                        last
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "pacer could not lease; waiting requests fail");
                        st.queue = FairQueue::default();
                        st.leasing = false;
                        return;
                    }
                };
                self.serve(&budget, &mut st);
                if st.queue.is_empty() {
                    st.leasing = false;
                    return;
                }
                last
            };
            if let Some(last) = last {
                let ahead = chrono::Duration::from_std(MAX_LOOKAHEAD / 2).expect("fits");
                self.clock.sleep_until(last - ahead).await;
                // The waiters may have gone meanwhile (their batch stopped on a 429).
                let mut st = budget.state.lock().expect("budget mutex");
                st.queue.forget_gone();
                if st.queue.is_empty() {
                    st.leasing = false;
                    return;
                }
            }
        }
    }

    async fn lease_slice(&self, budget: &Budget) -> Result<Vec<DateTime<Utc>>, PacerError> {
        // Timed on the engine's clock: a manual one stands still through the round trip, so
        // a test's leases start where it put the clock, whatever the database's speed.
        let asked = self.clock.now();
        let lookahead = budget.lookahead_us.load(Ordering::Relaxed) as i64;
        let now = self.clock.now() + chrono::Duration::microseconds(lookahead);
        let accepted = budget.accepted.swap(0, Ordering::Relaxed);
        let advertised = budget.advertised.lock().expect("budget mutex").take();
        let hold = {
            let mut hold = budget.hold.lock().expect("budget mutex");
            hold.take_if(|h| *h <= now);
            *hold
        };
        let idle = chrono::Duration::from_std(IDLE_AFTER).expect("fits");
        let cold = budget
            .trip
            .lock()
            .expect("budget mutex")
            .let_go
            .is_none_or(|l| l < now - idle);
        let spread = if cold { 1.0 + COLD_SPREAD } else { 1.0 };
        // One statement: books a slice, a quarter second's worth at the budget's effective
        // rate (declared, learned, advertised: the least; a cold slice [`COLD_SPREAD`]
        // wider), and reports what this process saw since its last lease. The slice's
        // length comes from the rate booked at, not from this process's last lease: after
        // a cut, no process books seconds of slots at the new pace.
        let leased = sqlx::query_file!(
            "queries/lease_slice.sql",
            budget.key,
            now,
            budget.declared as i32,
            accepted as i64,
            advertised,
            hold,
            sqlx::postgres::types::PgInterval::try_from(idle).expect("interval fits"),
            spread,
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|source| {
            // Not counted yet: the next lease reports them.
            budget.accepted.fetch_add(accepted, Ordering::Relaxed);
            PacerError::Lease {
                key: budget.key.clone(),
                source,
            }
        })?;
        budget
            .effective
            .store(leased.effective.to_bits(), Ordering::Relaxed);
        let interval = if cold {
            cold_interval_for(leased.effective)
        } else {
            interval_for(leased.effective)
        };
        let interval = chrono::Duration::from_std(interval).expect("fits");
        let slice = leased.slice;
        let len = interval * slice;
        let start = leased.tat - len;
        *budget.booked_until.lock().expect("budget mutex") = Some(leased.tat);
        let round_trip = (self.clock.now() - asked)
            .to_std()
            .unwrap_or_default()
            .min(MAX_LOOKAHEAD / 2);
        budget
            .lookahead_us
            .store(2 * round_trip.as_micros() as u64, Ordering::Relaxed);
        Ok((0..slice).map(|i| start + interval * i).collect())
    }
}

/// Counts the calls one job made against a budget (429s included), for "used in the last
/// minute" in `courier status`.
pub async fn record_calls(
    db: impl sqlx::PgExecutor<'_>,
    key: &str,
    calls: i32,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if calls > 0 {
        sqlx::query!(
            "INSERT INTO budget_calls (budget_key, at, calls) VALUES ($1, $2, $3)",
            key,
            now,
            calls
        )
        .execute(db)
        .await?;
    }
    Ok(())
}

/// Forgets call counts older than `before` (the reaper calls this).
pub async fn prune_calls(
    db: impl sqlx::PgExecutor<'_>,
    before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query!("DELETE FROM budget_calls WHERE at < $1", before)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays leases the way several processes would and checks the windows.
    #[test]
    fn leased_slots_never_exceed_the_rate_in_any_window() {
        let rpm = 6_000;
        let interval = emission_interval(rpm);
        let slice = slice_len(f64::from(rpm));
        let t0 = Utc::now();
        let mut tat = None;
        let mut slots = Vec::new();
        // Three processes asking in turn, with idle gaps, for two simulated minutes.
        let mut now = t0;
        while now < t0 + chrono::Duration::seconds(120) {
            for _process in 0..3 {
                let (start, next) = lease(tat, now, slice, interval);
                tat = Some(next);
                slots.extend(
                    (0..slice as i32)
                        .map(|i| start + chrono::Duration::from_std(interval).unwrap() * i),
                );
            }
            now += chrono::Duration::milliseconds(if slots.len() % 7 == 0 { 900 } else { 100 });
        }
        slots.sort();
        // The most slots in any window of `len` starting at a slot (two pointers).
        let most_in = |len: chrono::Duration| {
            let (mut end, mut most) = (0, 0);
            for start in 0..slots.len() {
                while end < slots.len() && slots[end] < slots[start] + len {
                    end += 1;
                }
                most = most.max(end - start);
            }
            most
        };
        assert!(most_in(chrono::Duration::seconds(1)) <= (rpm / 60) as usize);
        assert!(most_in(chrono::Duration::seconds(60)) <= rpm as usize);
        assert!(
            slots.len() > 10_000,
            "the replay leased enough to mean something"
        );
    }

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
            q.pop().unwrap().send(now).unwrap();
        }
        for (rule, mut rx) in rxs {
            if rx.try_recv().is_ok() {
                order.push(rule);
            }
        }
        let served = |r| order.iter().filter(|&&x| x == r).count();
        assert_eq!((served(1), served(2), served(3)), (2, 2, 4), "{order:?}");
    }

    #[test]
    fn slices_and_intervals() {
        let i = emission_interval(600);
        assert!(
            i > Duration::from_millis(102) && i < Duration::from_millis(103),
            "{i:?}"
        );
        assert_eq!(slice_len(600.0), 2);
        assert_eq!(slice_len(479.9), 1);
        assert_eq!(slice_len(6_000.0), 25);
        assert_eq!(slice_len(60.0), 1);
        assert_eq!(slice_len(0.0), 1);
        assert_eq!(slice_len(1_000_000.0), MAX_SLICE);
    }
}
