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

use crate::clock::Clock;

/// Slots leased per statement: about a quarter second's worth, at least 1, at most this.
pub const MAX_SLICE: u32 = 50;

/// After a 429 a process paces the budget at this share of its previous speed...
pub const SLOWDOWN: f64 = 0.5;
/// ...never slower than this share of the declared rate...
pub const MIN_SPEED: f64 = 0.05;
/// ...and grows back by this share per call the target answered without a 429.
pub const RECOVERY_PER_CALL: f64 = 0.002;

/// A slot may still be spent this late (or a tenth of an interval, if longer).
pub const MIN_STALE_TOLERANCE: Duration = Duration::from_millis(1);
/// The furthest ahead of now a lease may start.
pub const MAX_LOOKAHEAD: Duration = Duration::from_millis(200);

/// Share of the declared rate left unused, so that arrival jitter (timers, scheduling, the
/// network) never pushes a target that counts on a sliding window over its limit: slots
/// are spaced 2% wider than the declared rate needs, which tolerates a ~20 ms jitter at
/// 10 requests/s while using 98% of the budget.
pub const HEADROOM: f64 = 0.02;

/// The time between two requests of a budget declaring `requests_per_minute`.
pub fn emission_interval(requests_per_minute: u32) -> Duration {
    let exact = 60.0 / (f64::from(requests_per_minute.max(1)) * (1.0 - HEADROOM));
    // Whole microseconds: what PostgreSQL's interval and timestamp types hold.
    Duration::from_micros((exact * 1e6).ceil() as u64)
}

/// Slots to lease at once for a budget: a quarter second's worth, within 1..=MAX_SLICE.
pub fn slice_len(requests_per_minute: u32) -> u32 {
    (requests_per_minute / 240).clamp(1, MAX_SLICE)
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
}

/// One budget's in-process state.
struct Budget {
    /// The budget key (`connection:<id>` or a shared key).
    key: String,
    /// Time between two slots.
    interval: Duration,
    /// Slots leased per statement.
    slice: u32,
    /// Leased slots not yet handed out, waiting requests, and whether a lease is under way.
    state: Mutex<BudgetState>,
    /// Slots handed out by this process: one per writer call.
    granted: AtomicU64,
    /// How far ahead of now a lease starts (microseconds): twice the last lease's round
    /// trip, so the slots are still fresh when they arrive, however fast the rate.
    lookahead_us: AtomicU64,
    /// Share of the declared rate this process paces at (as f64 bits): halved by a 429,
    /// grown back by [`RECOVERY_PER_CALL`] per answered call, never above 1.
    speed: AtomicU64,
    /// The shared budget's next free slot as of this process's last lease: how far other
    /// processes have booked it.
    booked_until: Mutex<Option<DateTime<Utc>>>,
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
                    slice: slice_len(requests_per_minute),
                    state: Mutex::new(BudgetState::default()),
                    granted: AtomicU64::new(0),
                    lookahead_us: AtomicU64::new(0),
                    speed: AtomicU64::new(1.0f64.to_bits()),
                    booked_until: Mutex::new(None),
                });
                budgets.insert(key.to_owned(), b.clone());
                b
            }
        }
    }

    /// A call on budget `key` met a 429: the target allows less than declared, so this
    /// process slows down (multiplicative decrease) instead of meeting 429 after 429.
    pub fn throttled(&self, key: &str) {
        if let Some(b) = self.budgets.lock().expect("pacer mutex").get(key) {
            let speed = (f64::from_bits(b.speed.load(Ordering::Relaxed)) * SLOWDOWN).max(MIN_SPEED);
            b.speed.store(speed.to_bits(), Ordering::Relaxed);
            // Slots leased at the old pace fall inside the block the 429 set anyway.
            b.state.lock().expect("budget mutex").slots.clear();
            tracing::debug!(budget = key, speed, "slowing down after a 429");
        }
    }

    /// `calls` calls on budget `key` were answered without a 429 (additive increase).
    pub fn answered(&self, key: &str, calls: u32) {
        if let Some(b) = self.budgets.lock().expect("pacer mutex").get(key) {
            let speed = f64::from_bits(b.speed.load(Ordering::Relaxed));
            if speed < 1.0 {
                let speed = (speed + RECOVERY_PER_CALL * f64::from(calls)).min(1.0);
                b.speed.store(speed.to_bits(), Ordering::Relaxed);
            }
        }
    }

    /// The share of the declared rate this process paces budget `key` at.
    pub fn speed(&self, key: &str) -> f64 {
        self.budgets
            .lock()
            .expect("pacer mutex")
            .get(key)
            .map_or(1.0, |b| f64::from_bits(b.speed.load(Ordering::Relaxed)))
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
        let now = self.clock.now();
        // A slot nobody took in time is dropped rather than spent late, right before the
        // next one: two requests that close together could exceed a sliding window.
        let tolerance = (budget.interval / 10).max(MIN_STALE_TOLERANCE);
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

    async fn refill(self: Arc<Self>, budget: Arc<Budget>) {
        loop {
            let result = self.lease_slice(&budget).await;
            let mut st = budget.state.lock().expect("budget mutex");
            match result {
                Ok(slots) => st.slots.extend(slots),
                Err(e) => {
                    tracing::error!(error = %e, "pacer could not lease; waiting requests fail");
                    st.queue = FairQueue::default();
                    st.leasing = false;
                    return;
                }
            }
            self.serve(&budget, &mut st);
            if st.queue.is_empty() {
                st.leasing = false;
                return;
            }
        }
    }

    async fn lease_slice(&self, budget: &Budget) -> Result<Vec<DateTime<Utc>>, PacerError> {
        let asked = std::time::Instant::now();
        let lookahead = budget.lookahead_us.load(Ordering::Relaxed) as i64;
        let now = self.clock.now() + chrono::Duration::microseconds(lookahead);
        let speed = f64::from_bits(budget.speed.load(Ordering::Relaxed));
        let spaced =
            Duration::from_micros((budget.interval.as_micros() as f64 / speed).ceil() as u64);
        let interval = chrono::Duration::from_std(spaced).expect("fits");
        let len = interval * budget.slice as i32;
        let start = sqlx::query_scalar!(
            r#"INSERT INTO budgets AS b (budget_key, tat, updated_at) VALUES ($1, $2::timestamptz + $3::interval, $2)
               ON CONFLICT (budget_key) DO UPDATE
                 SET tat = GREATEST(b.tat, EXCLUDED.updated_at) + $3::interval, updated_at = EXCLUDED.updated_at
               RETURNING tat - $3::interval AS "start!""#,
            budget.key,
            now,
            sqlx::postgres::types::PgInterval::try_from(len).expect("interval fits"),
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|source| PacerError::Lease {
            key: budget.key.clone(),
            source,
        })?;
        *budget.booked_until.lock().expect("budget mutex") = Some(start + len);
        let round_trip = asked.elapsed().min(MAX_LOOKAHEAD / 2);
        budget
            .lookahead_us
            .store(2 * round_trip.as_micros() as u64, Ordering::Relaxed);
        Ok((0..budget.slice as i32)
            .map(|i| start + interval * i)
            .collect())
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
        let slice = slice_len(rpm);
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
        assert_eq!(slice_len(600), 2);
        assert_eq!(slice_len(6_000), 25);
        assert_eq!(slice_len(60), 1);
        assert_eq!(slice_len(1_000_000), MAX_SLICE);
    }
}
