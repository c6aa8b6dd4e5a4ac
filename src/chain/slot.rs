//! A request slot of a rule's budget, the one way a call of the chain (a record's call, a
//! job's submit step, a poll) waits for its turn: in fair turn with other rules, once its
//! time has come and the pacer lets it go.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::context::JobContext;
use crate::{engine::Engine, ratelimit::pacer::PacerError};

/// A request slot of the call's budget, in fair turn with other rules, once its time has
/// come and the pacer lets the call go: when it goes, and the pace the slot was booked at.
pub async fn slot(engine: &Engine, ctx: &JobContext) -> Result<(DateTime<Utc>, f64), PacerError> {
    let key = &ctx.connection.budget_key;
    let (reserve, weight) = (ctx.connection.reserve(), ctx.weight.max(1) as u32);
    let asked = Instant::now();
    loop {
        let slot = engine
            .pacer
            .acquire(key, &ctx.limits, reserve, ctx.rule_id, weight)
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
