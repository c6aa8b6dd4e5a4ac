//! One paced call: every request courier makes to a target (a delivery call, each step of
//! a job's submit, a poll, a page of a job's errors) goes through [`call`]: a request slot
//! of the budget it names, in fair turn with other rules, once the pacer lets it go; the
//! request; its answer sealed before anything keeps it; the answer heard by the pacer; and
//! the pacer's verdict with it, counted in the metrics. What a verdict leaves to be written
//! (a 429's block, a budget the target says is spent, what the breaker hears, the calls
//! made) is gathered in a [`Heard`] and written by [`Heard::write`], one way for every
//! caller. No other module tells the pacer a request left, returned or was answered.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tokio_util::sync::CancellationToken;

use crate::{
    breaker,
    engine::Engine,
    ratelimit::{
        answer::{Answer, Answered, Verdict},
        blocks,
        limits::Limit,
        pacer::PacerError,
    },
    writer::{WriteError, Writer, Written},
};

/// The budget a call spends from, and its turn against other rules.
#[derive(Clone, Copy, Debug)]
pub struct Budget<'a> {
    /// The budget's key.
    pub key: &'a str,
    /// Its limits.
    pub limits: &'a [Limit],
    /// The share of it left for others (percent).
    pub reserve: u8,
    /// The rule calling.
    pub rule_id: i64,
    /// The rule's weight against other rules.
    pub weight: u32,
}

/// A call not sent.
#[derive(Debug)]
pub enum NotSent {
    /// Told to stop (a stop, a shutdown) before it left.
    Stopped,
    /// The pacer gave no slot.
    NoSlot(PacerError),
}

/// A call made.
#[derive(Debug)]
pub struct Called {
    /// The target's answer, sealed.
    pub result: Result<Written, WriteError>,
    /// When the call left (the engine's clock).
    pub sent: DateTime<Utc>,
    /// The pace its slot was booked at (requests per second).
    pub paced: f64,
    /// What the pacer made of the answer.
    pub verdict: Verdict,
}

/// Makes one call on `budget`: waits for a slot (giving up when `stop` or the engine's
/// shutdown fires first; never, without `stop`: a step of a submit already under way),
/// sends `send`'s request, seals its answer, has the pacer hear it and counts a block in
/// the metrics.
pub async fn call<Fut>(
    engine: &Engine,
    budget: Budget<'_>,
    writer: &dyn Writer,
    stop: Option<&CancellationToken>,
    send: impl FnOnce() -> Fut,
) -> Result<Called, NotSent>
where
    Fut: Future<Output = Result<Written, WriteError>>,
{
    let (go, paced) = match stop {
        None => slot(engine, budget).await.map_err(NotSent::NoSlot)?,
        Some(stop) => {
            let halted = || stop.is_cancelled() || engine.shutdown.is_cancelled();
            if halted() {
                return Err(NotSent::Stopped);
            }
            let granted = tokio::select! {
                waited = slot(engine, budget) => waited.map_err(NotSent::NoSlot)?,
                _ = engine.shutdown.cancelled() => return Err(NotSent::Stopped),
                _ = stop.cancelled() => return Err(NotSent::Stopped),
            };
            // A 429 or a stop may have come in while this call waited for its slot.
            if halted() {
                return Err(NotSent::Stopped);
            }
            granted
        }
    };
    let sent = engine.clock.now();
    engine.pacer.left(budget.key, go, sent);
    let answer = send().await;
    // From the time the call was due: a thread that woke late delays it too.
    let trip = (engine.clock.now() - go).to_std().unwrap_or_default();
    engine.pacer.returned(budget.key, go, trip);
    // What the target said is sealed here, once, before anything keeps or shows it.
    let result = writer.secrets().seal(answer);
    let heard = Answer {
        answered: answered(&result),
        headers: rate_headers(&result),
        signals: writer.rate_signals(),
        sent,
        paced,
    };
    let verdict = engine
        .pacer
        .hear(budget.key, heard, engine.clock.now())
        .await;
    if matches!(verdict, Verdict::Block { .. }) {
        engine.metrics.rate_limited(budget.key);
    }
    Ok(Called {
        result,
        sent,
        paced,
        verdict,
    })
}

/// The graver of two verdicts of one submit's calls: a block over a spent budget over
/// going on; of two, the later.
pub fn graver(a: Verdict, b: Verdict) -> Verdict {
    fn rank(v: &Verdict) -> (u8, Option<DateTime<Utc>>) {
        match v {
            Verdict::GoOn => (0, None),
            Verdict::Spent { until, .. } => (1, Some(*until)),
            Verdict::Block { until, .. } => (2, Some(*until)),
        }
    }
    if rank(&b) > rank(&a) { b } else { a }
}

/// A request slot of `budget`, in fair turn with other rules, once its time has come and
/// the pacer lets the call go: when it goes, and the pace the slot was booked at.
async fn slot(engine: &Engine, budget: Budget<'_>) -> Result<(DateTime<Utc>, f64), PacerError> {
    let key = budget.key;
    let asked = std::time::Instant::now();
    loop {
        let slot = engine
            .pacer
            .acquire(
                key,
                budget.limits,
                budget.reserve,
                budget.rule_id,
                budget.weight,
            )
            .await?;
        engine.clock.sleep_until_precise(slot.at).await;
        // A block, or the target's statement that its budget is spent (remaining 0),
        // until later than this slot, or a block set since it was booked: a new slot.
        if engine.pacer.may_use(key, &slot) {
            let mut go = engine.clock.now();
            while let Err(later) = engine.pacer.depart(key, go) {
                engine.clock.sleep_until_precise(later).await;
                go = later.max(engine.clock.now());
            }
            engine.metrics.pacer_waited(key, asked.elapsed());
            return Ok((go, slot.paced));
        }
    }
}

/// Whether a call's answer shows the target answering: any answer does, even a 4xx; a
/// 5xx, a timeout or a refused connection does not; a call the writer refused before
/// sending says nothing.
pub fn reachable(result: &Result<Written, WriteError>) -> Option<bool> {
    match result {
        Ok(_) => Some(true),
        Err(WriteError::Permanent { status: None, .. }) => None,
        Err(e) => Some(e.proves_reachable()),
    }
}

/// How the target answered, as the budget hears it.
pub fn answered(result: &Result<Written, WriteError>) -> Answered {
    match result {
        Err(WriteError::RateLimited { wait, raw, .. }) => Answered::Refused {
            wait: *wait,
            raw: raw.clone(),
        },
        _ => Answered::NotRefused,
    }
}

/// The rate-limit headers of an answer (none for an error without them).
fn rate_headers(result: &Result<Written, WriteError>) -> &reqwest::header::HeaderMap {
    static NONE: std::sync::LazyLock<reqwest::header::HeaderMap> =
        std::sync::LazyLock::new(reqwest::header::HeaderMap::new);
    match result {
        Ok(written) => &written.receipt.rate_headers,
        Err(WriteError::RateLimited { rate_headers, .. }) => rate_headers,
        Err(_) => &NONE,
    }
}

/// What calls' verdicts leave to write for their budget: the calls made, what the breaker
/// heard, a 429's block, a budget the target said is spent.
#[derive(Debug, Default)]
pub struct Heard {
    /// What the breaker hears, in answer order.
    pub reachability: Vec<bool>,
    /// The last error a call met, for the circuit's record.
    pub last_error: Option<String>,
    /// Calls made (429s included), for the budget's count.
    pub calls: i32,
    /// A 429 met: when the block it sets ends, and the raw header.
    pub rate_limited: Option<(DateTime<Utc>, Option<String>)>,
    /// The target's headers said its budget is spent (remaining 0): until when, and what
    /// they said.
    pub spent: Option<(DateTime<Utc>, String)>,
}

impl Heard {
    /// Takes in one call's verdict; the call counts, and the breaker hears `reachable`
    /// (a 429 says the target is up).
    pub fn heard(&mut self, verdict: &Verdict, reachable: Option<bool>) {
        self.calls += 1;
        match verdict {
            Verdict::GoOn => {}
            Verdict::Spent { until, said, .. } => {
                if self.spent.as_ref().is_none_or(|(u, _)| u < until) {
                    self.spent = Some((*until, said.clone()));
                }
            }
            Verdict::Block { until, raw } => {
                self.rate_limited = Some((*until, raw.clone()));
            }
        }
        let reachable = match verdict {
            Verdict::Block { .. } => Some(true),
            _ => reachable,
        };
        self.reachability.extend(reachable);
    }

    /// Adds calls made that no verdict of their own stands for (a job's submit steps).
    pub fn more_calls(&mut self, n: u32) {
        self.calls += i32::try_from(n).unwrap_or(i32::MAX);
    }

    /// Whether something must be written now: a block (other processes hold back from
    /// then on).
    pub fn blocks(&self) -> bool {
        self.rate_limited.is_some()
    }

    /// Writes the circuit's record, the budget's call count and the blocks inside `tx`;
    /// returns when the latest block ends, if one was set.
    pub async fn write(
        &self,
        tx: &mut PgConnection,
        engine: &Engine,
        cause: &blocks::Cause<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        breaker::record(
            tx,
            cause.connection_id,
            &self.reachability,
            self.last_error.as_deref(),
            &engine.settings.breaker,
            now,
        )
        .await?;
        crate::ratelimit::report::record_calls(&mut *tx, cause.budget_key, self.calls, now).await?;
        let mut blocked = None;
        if let Some((until, raw)) = &self.rate_limited {
            blocked = Some(blocks::block(&mut *tx, cause, *until, raw.as_deref(), now).await?);
        }
        if let Some((until, raw)) = &self.spent {
            let length = blocks::block_length(Some((*until - now).to_std().unwrap_or_default()));
            let until = now + chrono::Duration::from_std(length).expect("capped at a day");
            let until = blocks::block(&mut *tx, cause, until, Some(raw), now).await?;
            blocked = Some(blocked.map_or(until, |b: DateTime<Utc>| b.max(until)));
        }
        Ok(blocked)
    }
}
