//! The call stage: for each delivery to send, a request slot from the pacer (in fair turn
//! with other rules), then one writer call, timed. Calls run up to the connection's max in
//! flight; none starts once the batch is told to stop (a 429, an opened circuit) or the
//! process is stopping, and those deliveries come back as not attempted.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{claim::Claimed, context::JobContext};
use crate::{
    engine::Engine,
    writer::{Outgoing, Receipt, WriteError, Writer},
};

/// The answer to one call; `None` when the call was not made.
pub type Answer = Option<(Result<Receipt, WriteError>, Duration)>;

/// Tells calls not yet started to stay unsent, and those waiting for a slot to give up.
#[derive(Debug, Default)]
pub struct Stop(CancellationToken);

impl Stop {
    /// No further call starts.
    pub fn stop(&self) {
        self.0.cancel();
    }

    /// Whether calls were told to stop.
    pub fn stopped(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// Calls the writer for each delivery `source` yields (its index in the job's claimed
/// deliveries, and the delivery), yielding each index with its answer in completion order.
/// The source may be fed while calls go on (the next batch, claimed during this one's
/// tail); the stream ends when the source does and every call has answered.
pub fn calls<'a>(
    engine: &'a Engine,
    ctx: &'a JobContext,
    writer: &'a dyn Writer,
    source: impl Stream<Item = (usize, Arc<Claimed>)> + 'a,
    stop: &'a Stop,
) -> impl Stream<Item = (usize, Answer)> + 'a {
    let rpm = writer.requests_per_minute();
    let weight = ctx.weight.max(1) as u32;
    let halted = move || stop.stopped() || engine.shutdown.is_cancelled();
    source
        .map(move |(i, d)| async move {
            if halted() {
                return (i, None);
            }
            // One request of the budget per call, in fair turn with other rules.
            let key = &ctx.connection.budget_key;
            let slot = async {
                let asked = Instant::now();
                loop {
                    let at = engine.pacer.acquire(key, rpm, ctx.rule_id, weight).await?;
                    engine.clock.sleep_until_precise(at).await;
                    // The target said its budget is spent until later than this slot
                    // (remaining 0): a new slot, from then on.
                    if engine.pacer.held_until(key).is_none_or(|h| h <= at) {
                        let go = engine.pacer.spaced(key);
                        engine.clock.sleep_until_precise(go).await;
                        engine.metrics.pacer_waited(key, asked.elapsed());
                        return Ok::<_, crate::pacer::PacerError>(go);
                    }
                }
            };
            // A stop does not wait for slots: the delivery stays pending, untouched.
            let go = tokio::select! {
                waited = slot => match waited {
                    Ok(go) => go,
                    Err(e) => {
                        tracing::error!(error = %e, "no request slot; delivery left pending");
                        return (i, None);
                    }
                },
                _ = engine.shutdown.cancelled() => return (i, None),
                _ = stop.0.cancelled() => return (i, None),
            };
            // A 429 or a stop may have come in while this call waited for its slot.
            if halted() {
                return (i, None);
            }
            let started = Instant::now();
            let result = writer
                .write(Outgoing {
                    delivery_id: d.id,
                    record_key: &d.record_key,
                    path: &ctx.path,
                    payload: &d.payload,
                })
                .await;
            // From the time the call was due: a thread that woke late delays it too.
            let trip = (engine.clock.now() - go).to_std().unwrap_or_default();
            engine.pacer.returned(key, go, trip);
            let status = match &result {
                Ok(receipt) => receipt.http_status,
                Err(e) => e.http_status(),
            };
            engine.metrics.call(&ctx.connection.name, status);
            (i, Some((result, started.elapsed())))
        })
        .buffer_unordered(writer.max_in_flight().max(1))
}
