//! A job's submit in several calls (Salesforce Bulk API 2.0): the job's `open` call, whose
//! answer names the job; the records' call, to the rule's path with the job's `{id}`; its
//! `close` call, after which the target runs the job. Each call takes a slot of the rule's
//! budget and is heard by the pacer. A call that fails ends the submit with its answer: the
//! records' outcome is that answer's (a job never closed is never run, so records sent
//! again are not held twice). The submit's answer is the records' call's, with the open
//! call's body, which names the job. A submit that fails after its open aborts the job
//! where the rule says how (`abort`); one whose every record is refused before sending
//! opens none.

use chrono::{DateTime, Utc};

use super::{classify, context::JobContext, slot};
use crate::{
    engine::Engine,
    profile::RuleProfile,
    writer::{
        Outgoing, WriteError, Writer, Written,
        job::{JobShape, Step},
    },
};

/// The submit's answer, and how many requests it took.
pub(super) struct Stepped {
    pub result: Result<Written, WriteError>,
    pub requests: u32,
}

/// Opens a job, sends `records` into it and closes it; the first call goes at `go` (a slot
/// already granted at pace `paced`).
pub(super) async fn in_steps(
    engine: &Engine,
    ctx: &JobContext,
    profile: &RuleProfile,
    (shape, open): (&JobShape, &Step),
    writer: &dyn Writer,
    records: &[Outgoing<'_>],
    (go, paced): (DateTime<Utc>, f64),
) -> Stepped {
    // Nothing to send (every record refused as the rule shapes it): no job is opened, and
    // each record is refused alone, as the records' call refuses it without a request.
    if !records.iter().any(|r| profile.sendable(r)) {
        let result = writer.write_many(profile.call(records)).await;
        return Stepped {
            result,
            requests: 0,
        };
    }
    let mut requests = 1;
    let fail = |e, requests| Stepped {
        result: Err(e),
        requests,
    };
    let opened = request(engine, ctx, writer, go, ask(writer, open, &open.path)).await;
    hear_ok(engine, ctx, writer, &opened, go, paced).await;
    let opened = match opened {
        Ok(w) => w.receipt,
        Err(e) => return fail(e, requests),
    };
    let id = match shape.target_id(&opened) {
        Ok(id) => id,
        Err(why) => {
            let message = format!("the job's open call: {why}; no record was sent");
            let e = WriteError::Transient {
                status: opened.http_status,
                message,
            };
            return fail(e, requests);
        }
    };
    let call = Opened {
        engine,
        ctx,
        profile,
        writer,
        id: &id,
    };
    let filled = call.fill_and_close(shape, records, &mut requests).await;
    let mut written = match filled {
        Ok(written) => written,
        Err(e) => {
            call.abort(shape, &mut requests).await;
            return fail(e, requests);
        }
    };
    written.receipt.body = opened.body;
    Stepped {
        result: Ok(written),
        requests,
    }
}

/// A job opened at the target, the rest of its submit to make.
struct Opened<'a> {
    engine: &'a Engine,
    ctx: &'a JobContext,
    profile: &'a RuleProfile,
    writer: &'a dyn Writer,
    id: &'a str,
}

impl Opened<'_> {
    /// The records' call into the job, then its close; each takes a slot of its own.
    async fn fill_and_close(
        &self,
        shape: &JobShape,
        records: &[Outgoing<'_>],
        requests: &mut u32,
    ) -> Result<Written, WriteError> {
        let (engine, ctx, writer) = (self.engine, self.ctx, self.writer);
        let path = shape.id_path(&ctx.path, self.id);
        let records: Vec<Outgoing<'_>> = records
            .iter()
            .map(|r| Outgoing { path: &path, ..*r })
            .collect();
        let (go, paced) = slot::slot(engine, ctx).await.map_err(|e| no_slot(&e))?;
        *requests += 1;
        let send = writer.write_many(self.profile.call(&records));
        let mut written = request(engine, ctx, writer, go, send).await?;
        if let Some(close) = &shape.close {
            hear_ok(engine, ctx, writer, &Ok(written.clone()), go, paced).await;
            let (go, _) = slot::slot(engine, ctx).await.map_err(|e| no_slot(&e))?;
            *requests += 1;
            let path = close.path(self.id);
            let closed = request(engine, ctx, writer, go, ask(writer, close, &path)).await?;
            // Its rate headers are the pacer's to hear, with the submit's answer.
            written.receipt.rate_headers = closed.receipt.rate_headers;
        }
        Ok(written)
    }

    /// Aborts the job after its submit failed, if the rule says how: one paced call, its
    /// answer heard; a failure is logged, and the submit's own answer stands.
    async fn abort(&self, shape: &JobShape, requests: &mut u32) {
        let (engine, ctx, writer) = (self.engine, self.ctx, self.writer);
        let Some(abort) = &shape.abort else { return };
        let (go, paced) = match slot::slot(engine, ctx).await {
            Ok(granted) => granted,
            Err(e) => {
                tracing::warn!(job = self.id, error = %e, "no slot to abort a job whose submit failed");
                return;
            }
        };
        *requests += 1;
        let path = abort.path(self.id);
        let aborted = request(engine, ctx, writer, go, ask(writer, abort, &path)).await;
        hear_ok(engine, ctx, writer, &aborted, go, paced).await;
        if let Err(e) = aborted {
            tracing::warn!(job = self.id, error = %e, "a job whose submit failed could not be aborted");
        }
    }
}

/// A call of `step` to `path`, its answer as a written call of no record.
async fn ask(writer: &dyn Writer, step: &Step, path: &str) -> Result<Written, WriteError> {
    let answer = writer.ask(step.method(), path, step.body.as_ref()).await;
    answer.map(|r| Written::all(r, 0))
}

/// One request of the submit, leaving at `go`: the pacer told when it left and returned,
/// its answer sealed.
async fn request(
    engine: &Engine,
    ctx: &JobContext,
    writer: &dyn Writer,
    go: DateTime<Utc>,
    send: impl Future<Output = Result<Written, WriteError>>,
) -> Result<Written, WriteError> {
    let key = &ctx.connection.budget_key;
    engine.pacer.left(key, go, engine.clock.now());
    let answer = send.await;
    let trip = (engine.clock.now() - go).to_std().unwrap_or_default();
    engine.pacer.returned(key, go, trip);
    writer.secrets().seal(answer)
}

/// A 2xx answer of a call before the submit's last, heard by the pacer as any call's (what
/// it says of the budget counts now); an error ends the submit and is heard with its answer.
async fn hear_ok(
    engine: &Engine,
    ctx: &JobContext,
    writer: &dyn Writer,
    result: &Result<Written, WriteError>,
    sent: DateTime<Utc>,
    paced: f64,
) {
    if result.is_ok() {
        let answer = classify::budget_answer(result, writer.rate_signals(), sent, paced);
        let at = engine.clock.now();
        engine
            .pacer
            .hear(&ctx.connection.budget_key, answer, at)
            .await;
    }
}

/// A slot not granted mid-submit: the records go again later.
fn no_slot(e: &crate::ratelimit::pacer::PacerError) -> WriteError {
    WriteError::Transient {
        status: None,
        message: format!("no request slot for the job's next call ({e}); sent again"),
    }
}
