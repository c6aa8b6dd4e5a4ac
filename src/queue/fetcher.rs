//! What wakes this process's chain-queue fetcher, and what it did: one per process, shared
//! by the queue [listener](super::listener), the safety-net poll and every (re)start of the
//! apalis worker ([`ChainBackend`](super::ChainBackend)).
//!
//! apalis fetches whenever its worker task is woken and nothing is in flight; a wake that
//! arrives while a fetch is in flight is spent on that fetch, whose snapshot may predate the
//! job announced. Here every reason to fetch **rings** a counter, and a fetch **answers**
//! the rings it saw when it started: while a ring is unanswered and no fetch is in flight,
//! the backend fetches again. So a job announced at any moment, or committed before the
//! listener (re)subscribed, is fetched by a fetch that started after it was visible.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use apalis::prelude::{PollSnapshot, PollStrategy};
use futures::task::AtomicWaker;
use tokio::sync::{Semaphore, watch};

/// The first pause before a restarted queue worker registers again.
pub const RESTART_PAUSE_MIN: Duration = Duration::from_millis(250);
/// The longest pause before a restarted queue worker registers again: a failure that keeps
/// coming back restarts it at most this often, never in a hot loop.
pub const RESTART_PAUSE_MAX: Duration = Duration::from_secs(5);
/// A queue worker that ran this long before failing starts over from the shortest pause.
pub const RESTART_STREAK_RESET: Duration = Duration::from_secs(60);

/// The chain-queue fetcher's shared state in this process.
pub struct Fetcher {
    /// Reasons to fetch so far: announcements of jobs, poll ticks, (re)subscriptions.
    rung: AtomicU64,
    /// The highest `rung` seen at the start of a fetch that completed.
    answered: AtomicU64,
    /// Whether a fetch is in flight (a wake now would be spent on it).
    in_flight: AtomicBool,
    /// The apalis worker task to wake when rung.
    waker: AtomicWaker,
    /// Subscriptions of the queue listener so far (1 once it first listens).
    subscriptions: watch::Sender<u64>,
    /// Fetches completed so far.
    fetches: watch::Sender<u64>,
    /// Restarts of the apalis worker so far.
    restarts: AtomicU64,
    /// Consecutive restarts and when the worker last registered, for the restart pause.
    streak: Mutex<(u32, Option<Instant>)>,
    /// When the next job scheduled for later falls due, as the last empty fetch saw it
    /// (taken by the backend, which sets its timer).
    due: Mutex<Option<tokio::time::Instant>>,
    /// Tests only: each subscription of the listener takes a permit first, so a test can
    /// hold the listener back and force the orderings that are races in production.
    gate: Option<Arc<Semaphore>>,
}

impl Fetcher {
    /// A fetcher for a worker process.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::with_gate(None))
    }

    /// A fetcher whose listener subscribes only with a permit from `gate`, one permit per
    /// subscription (tests).
    pub fn gated(gate: Arc<Semaphore>) -> Arc<Self> {
        Arc::new(Self::with_gate(Some(gate)))
    }

    fn with_gate(gate: Option<Arc<Semaphore>>) -> Self {
        Self {
            rung: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            in_flight: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            subscriptions: watch::Sender::new(0),
            fetches: watch::Sender::new(0),
            restarts: AtomicU64::new(0),
            streak: Mutex::new((0, None)),
            due: Mutex::new(None),
            gate,
        }
    }

    /// There may be a job to fetch: wakes the fetcher.
    pub fn ring(&self) {
        self.rung.fetch_add(1, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Like [`ring`](Self::ring) from inside the fetcher's own poll, which fetches next
    /// anyway: no wake.
    pub(super) fn ring_quietly(&self) {
        self.rung.fetch_add(1, Ordering::SeqCst);
    }

    /// The task to wake when rung.
    pub(super) fn register(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }

    /// Whether a ring is unanswered while no fetch is in flight: the fetcher must fetch.
    pub(super) fn owes_fetch(&self) -> bool {
        !self.in_flight.load(Ordering::SeqCst)
            && self.rung.load(Ordering::SeqCst) > self.answered.load(Ordering::SeqCst)
    }

    /// Whether a fetch is in flight.
    pub(super) fn fetching(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A fetch starts: it answers every ring so far once it completes.
    pub(super) fn fetch_started(&self) -> Fetch<'_> {
        self.in_flight.store(true, Ordering::SeqCst);
        Fetch {
            fetcher: self,
            rung: self.rung.load(Ordering::SeqCst),
        }
    }

    /// The next job scheduled for later falls due in `wait`.
    pub(super) fn due_in(&self, wait: Duration) {
        *self.due.lock().expect("fetcher lock") = Some(tokio::time::Instant::now() + wait);
    }

    /// When the next job scheduled for later falls due, if a fetch saw one since last asked.
    pub(super) fn take_due(&self) -> Option<tokio::time::Instant> {
        self.due.lock().expect("fetcher lock").take()
    }

    /// The listener listens (again): rings, since jobs may have been announced unheard.
    pub(super) fn subscribed(&self) {
        self.ring();
        self.subscriptions.send_modify(|n| *n += 1);
    }

    /// Waits for a permit to subscribe (tests hold the listener back this way).
    pub(super) async fn may_subscribe(&self) {
        if let Some(gate) = &self.gate
            && let Ok(permit) = gate.acquire().await
        {
            permit.forget();
        }
    }

    /// The apalis worker failed and is being restarted.
    pub(crate) fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::SeqCst);
    }

    /// How long a restarted worker waits before it registers again: doubling from
    /// [`RESTART_PAUSE_MIN`] to [`RESTART_PAUSE_MAX`] while restarts follow each other,
    /// back to the minimum after a worker ran for [`RESTART_STREAK_RESET`].
    pub(super) fn restart_pause(&self) -> Duration {
        let mut streak = self.streak.lock().expect("fetcher lock");
        let (count, registered) = &mut *streak;
        if registered.is_some_and(|t| t.elapsed() >= RESTART_STREAK_RESET) {
            *count = 0;
        }
        *count = count.saturating_add(1);
        let pause = RESTART_PAUSE_MIN.saturating_mul(1 << (*count - 1).min(16));
        pause.min(RESTART_PAUSE_MAX)
    }

    /// The worker registered (started or restarted).
    pub(super) fn registered(&self) {
        self.streak.lock().expect("fetcher lock").1 = Some(Instant::now());
    }

    /// Subscriptions of the queue listener so far.
    pub fn subscriptions(&self) -> watch::Receiver<u64> {
        self.subscriptions.subscribe()
    }

    /// Fetches completed so far.
    pub fn fetches(&self) -> watch::Receiver<u64> {
        self.fetches.subscribe()
    }

    /// Rings so far (announcements heard, poll ticks, subscriptions).
    pub fn rings(&self) -> u64 {
        self.rung.load(Ordering::SeqCst)
    }

    /// Restarts of the apalis worker so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Waits until the queue listener has subscribed at least once.
    pub async fn listening(&self) {
        let mut subscriptions = self.subscriptions();
        let _ = subscriptions.wait_for(|n| *n > 0).await;
    }
}

/// A fetch in flight; dropped unanswered if it fails or is cancelled.
pub(super) struct Fetch<'a> {
    fetcher: &'a Fetcher,
    /// `rung` when the fetch started: the rings it answers.
    rung: u64,
}

impl Fetch<'_> {
    /// The fetch completed: every ring before it started is answered.
    pub(super) fn answered(self) {
        self.fetcher.answered.fetch_max(self.rung, Ordering::SeqCst);
        self.fetcher.fetches.send_modify(|n| *n += 1);
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        self.fetcher.in_flight.store(false, Ordering::SeqCst);
    }
}

/// Wakes the queue's fetcher every `period`, so jobs scheduled for later (a chain waiting
/// out a block) are fetched when due: PostgreSQL's notify trigger only announces jobs due
/// at insert time. apalis-core 1.0's own `IntervalStrategy` fires once and then never
/// re-arms its timer (it returns `Ready` with a fresh, never-polled delay), so scheduled
/// jobs waited for the 30 s worker heartbeat; this one re-arms every time. The chain
/// worker's [`ChainBackend`](super::ChainBackend) polls it directly; it is also a poll strategy for plain
/// apalis workers (the benchmarks' no-op drain).
pub struct Tick(tokio::time::Interval);

impl Tick {
    /// A tick every `period`, the first at once; missed ticks are not made up in a burst.
    pub fn every(period: Duration) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self(interval)
    }

    /// Whether a tick is due; the waker is registered for the next one either way.
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> bool {
        let mut fired = false;
        // Drain ready ticks until the timer is pending again, which registers the waker.
        while self.0.poll_tick(cx).is_ready() {
            fired = true;
        }
        fired
    }
}

impl PollStrategy for Tick {
    fn poll_drive(&mut self, cx: &mut Context<'_>, _: &PollSnapshot) -> Poll<Option<()>> {
        if self.poll_fired(cx) {
            Poll::Ready(Some(()))
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_during_a_fetch_is_owed_after_it() {
        let f = Fetcher::new();
        assert!(!f.owes_fetch());
        f.ring();
        assert!(f.owes_fetch());
        let fetch = f.fetch_started();
        assert!(!f.owes_fetch(), "in flight");
        f.ring();
        fetch.answered();
        assert!(
            f.owes_fetch(),
            "the ring during the fetch is not answered by it"
        );
        f.fetch_started().answered();
        assert!(!f.owes_fetch());
    }

    #[test]
    fn a_failed_fetch_answers_nothing() {
        let f = Fetcher::new();
        f.ring();
        drop(f.fetch_started());
        assert!(f.owes_fetch());
    }

    #[test]
    fn restart_pauses_double_up_to_the_cap() {
        let f = Fetcher::new();
        let pauses: Vec<_> = (0..7).map(|_| f.restart_pause()).collect();
        assert_eq!(pauses[0], RESTART_PAUSE_MIN);
        assert_eq!(pauses[1], RESTART_PAUSE_MIN * 2);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*pauses.last().unwrap(), RESTART_PAUSE_MAX);
    }
}
