//! The call stage: for each call to make (one delivery, or several of a bulk rule), a
//! request slot from the pacer (in fair turn with other rules), then one writer call,
//! timed. Calls run up to the connection's max in flight; none starts once the batch is
//! told to stop (a 429, an opened circuit) or the process is stopping, and those
//! deliveries come back as not attempted.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{claim::Claimed, context::ChainContext};
use crate::{
    engine::Engine,
    enqueue::Op,
    paced::{self, NotSent},
    profile::RuleProfile,
    ratelimit::{answer::Verdict, pacer::PacerError},
    writer::{Outgoing, WriteError, Writer, Written, answer::Refusal},
};

/// One call's answer, or a call not made.
#[derive(Debug)]
pub struct Answered {
    /// The deliveries (indexes into the job's claimed deliveries) whose outcome this
    /// answer decides: those the call carried, or none for a call refused as a whole and
    /// split (its halves were sent again and answer for them).
    pub indices: Vec<usize>,
    /// The call, `None` when it was not made.
    pub answer: Option<Made>,
}

/// A call made.
#[derive(Debug)]
pub struct Made {
    /// The target's answer.
    pub result: Result<Written, WriteError>,
    /// When the call left (the engine's clock).
    pub sent: DateTime<Utc>,
    /// How long the call took.
    pub elapsed: Duration,
    /// The pace its slot was booked at (requests per second).
    pub paced: f64,
    /// What the pacer made of its answer (of a submit in steps, the gravest).
    pub verdict: Verdict,
    /// The requests it took: one, or each of a job's submit in steps.
    pub requests: u32,
}

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

/// A call to make: the deliveries it carries (their indexes in the job's claimed
/// deliveries, and the deliveries).
pub type Group = Vec<(usize, Arc<Claimed>)>;

/// Makes the calls `source` yields, yielding each call's answer as it completes (the calls
/// of up to the writer's max in flight groups run at once). A call of several
/// records refused as a whole for its content ([`WriteError::Permanent`], but for a
/// refusal of the request itself: see [`refuses_content`]), or answered by a 207 that
/// accounts for none of them, is split in halves, each sent
/// again as a paced call of its own, down to single records. The source may be fed while
/// calls go on (the next batch, claimed during this one's tail); the stream ends when the
/// source does and every call has answered.
pub fn calls<'a>(
    engine: &'a Engine,
    ctx: &'a ChainContext,
    profile: &'a RuleProfile,
    writer: &'a dyn Writer,
    source: impl Stream<Item = Group> + 'a,
    stop: &'a Stop,
) -> impl Stream<Item = Answered> + 'a {
    source
        .map(move |group| Box::pin(call_group(engine, ctx, profile, writer, group, stop)))
        .flatten_unordered(writer.max_in_flight().max(1))
}

/// The calls of one group, each answer yielded as it comes: the group, then the halves of
/// any call refused as a whole (after a 429, the rest are not made).
fn call_group<'a>(
    engine: &'a Engine,
    ctx: &'a ChainContext,
    profile: &'a RuleProfile,
    writer: &'a dyn Writer,
    group: Group,
    stop: &'a Stop,
) -> impl Stream<Item = Answered> + 'a {
    futures::stream::unfold(
        (vec![group], false),
        move |(mut todo, limited)| async move {
            let group = todo.pop()?;
            let indices = group.iter().map(|(i, _)| *i).collect::<Vec<_>>();
            let answer = match limited {
                true => None,
                false => call_once(engine, ctx, profile, writer, &group, stop).await,
            };
            if let Some(Made { result, .. }) = &answer
                && group.len() > 1
                && decides_none(result, &profile.refusals)
            {
                let (first, second) = group.split_at(group.len() / 2);
                // Popped from the end: the first half goes first.
                todo.push(second.to_vec());
                todo.push(first.to_vec());
                engine.metrics.split(&ctx.rule_name);
                // The refused call itself decides no record: its halves do.
                let answered = Answered {
                    indices: Vec::new(),
                    answer,
                };
                return Some((answered, (todo, limited)));
            }
            let limited = limited
                || matches!(
                    &answer,
                    Some(Made {
                        result: Err(WriteError::RateLimited { .. }),
                        ..
                    })
                );
            Some((Answered { indices, answer }, (todo, limited)))
        },
    )
}

/// Whether a call of several records is to be split because its answer decides none of
/// them for a reason that may be some records' doing, so splitting finds the good ones: a
/// refusal of the call for its content, or a multi-status answer (207) that accounts for
/// none of the records it carried.
fn decides_none(result: &Result<Written, WriteError>, refusals: &[Refusal]) -> bool {
    match result {
        Err(e) => refuses_content(e, refusals),
        Ok(w) => {
            w.receipt.http_status == Some(207)
                && w.items
                    .iter()
                    .any(|i| matches!(i, Some(WriteError::Unaccounted { .. })))
                && w.items.iter().all(|i| {
                    matches!(
                        i,
                        Some(
                            WriteError::Unaccounted { .. }
                                | WriteError::Permanent { status: None, .. }
                        )
                    )
                })
        }
    }
}

/// Whether a call's refusal may be one of its records' doing: a permanent refusal, but for
/// those about the request itself rather than its body (credentials 401, 403, 407;
/// address 404; method 405), which every record of the call gets as it is, unless the
/// rule names the answer a refusal of records (`refusals`).
fn refuses_content(e: &WriteError, refusals: &[Refusal]) -> bool {
    match e {
        WriteError::Permanent { status, .. } => {
            !matches!(status, Some(401 | 403 | 404 | 405 | 407))
                || refusals.iter().any(|r| r.matches(e))
        }
        _ => false,
    }
}

/// One call ([`paced::call`]: a request slot in fair turn with other rules, the writer, the
/// answer sealed and heard); `None` when the call was not made (a stop, a shutdown, no
/// slot).
async fn call_once(
    engine: &Engine,
    ctx: &ChainContext,
    profile: &RuleProfile,
    writer: &dyn Writer,
    group: &[(usize, Arc<Claimed>)],
    stop: &Stop,
) -> Option<Made> {
    let records: Vec<Outgoing<'_>> = group
        .iter()
        .map(|(_, d)| Outgoing {
            delivery_id: d.id,
            record_key: &d.record_key,
            path: &ctx.path,
            payload: &d.payload,
        })
        .collect();
    let started = Instant::now();
    // A delete is one record's call of its own shape, never a job's submit.
    let delete = group.first().is_some_and(|(_, d)| d.op == Op::Delete);
    if !delete
        && let Some(job) = &profile.job
        && let Some(open) = &job.open
    {
        let stepped =
            super::submit::in_steps(engine, ctx, profile, (job, open), writer, &records, &stop.0);
        let stepped = not_sent(stop, stepped.await)?;
        counted(engine, ctx, &stepped.called.result, records.len());
        return Some(Made {
            result: stepped.called.result,
            sent: stepped.called.sent,
            elapsed: started.elapsed(),
            paced: stepped.called.paced,
            verdict: stepped.called.verdict,
            requests: stepped.requests,
        });
    }
    let send = || match delete {
        true => writer.write_many(profile.delete_call(&records)),
        false => writer.write_many(profile.call(&records)),
    };
    let called = paced::call(engine, ctx.budget(), writer, Some(&stop.0), send).await;
    let called = not_sent(stop, called)?;
    counted(engine, ctx, &called.result, records.len());
    Some(Made {
        result: called.result,
        sent: called.sent,
        elapsed: started.elapsed(),
        paced: called.paced,
        verdict: called.verdict,
        requests: 1,
    })
}

/// A call made, or `None` for one not sent: a budget spent (the target said so) stops the
/// batch, its deliveries left pending.
fn not_sent<T>(stop: &Stop, called: Result<T, NotSent>) -> Option<T> {
    match called {
        Ok(c) => Some(c),
        Err(NotSent::Stopped) => None,
        Err(NotSent::NoSlot(e @ PacerError::Spent(_))) => {
            tracing::debug!(reason = %e, "no request slot; deliveries left pending");
            stop.stop();
            None
        }
        Err(NotSent::NoSlot(e)) => {
            tracing::error!(error = %e, "no request slot; deliveries left pending");
            None
        }
    }
}

/// A call of `n` records answered `result`, in the process's metrics.
fn counted(engine: &Engine, ctx: &ChainContext, result: &Result<Written, WriteError>, n: usize) {
    let status = match result {
        Ok(written) => written.receipt.http_status,
        Err(e) => e.http_status(),
    };
    engine.metrics.call(&ctx.connection.name, status);
    engine.metrics.records_per_call(&ctx.rule_name, n);
}
