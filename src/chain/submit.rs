//! A job's submit in several calls (Salesforce Bulk API 2.0): the job's `open` call, whose
//! answer names the job; the records' call, to the rule's path with the job's `{id}`; its
//! `close` call, after which the target runs the job. Each call takes a slot of the rule's
//! budget and is heard by the pacer ([`paced::call`]); the submit's verdict is the gravest
//! of its calls'. A call that fails ends the submit with its answer: the records' outcome is that answer's (a job never closed is never run, so records sent
//! again are not held twice). The submit's answer is the records' call's, with the open
//! call's body, which names the job. A submit that fails after its open aborts the job
//! where the rule says how (`abort`); one whose every record is refused before sending
//! opens none.

use tokio_util::sync::CancellationToken;

use super::context::ChainContext;
use crate::{
    engine::Engine,
    paced::{self, Called, NotSent},
    profile::RuleProfile,
    ratelimit::answer::Verdict,
    writer::{
        Outgoing, WriteError, Writer, Written,
        job::{JobShape, Step},
    },
};

/// The submit's answer (the gravest verdict of its calls with it), and how many requests
/// it took.
pub(super) struct Stepped {
    pub called: Called,
    pub requests: u32,
}

/// Opens a job, sends `records` into it and closes it, each a paced call; `NotSent` when
/// the first did not go (`stop`, a shutdown, no slot).
pub(super) async fn in_steps(
    engine: &Engine,
    ctx: &ChainContext,
    profile: &RuleProfile,
    (shape, open): (&JobShape, &Step),
    writer: &dyn Writer,
    records: &[Outgoing<'_>],
    stop: &CancellationToken,
) -> Result<Stepped, NotSent> {
    // Nothing to send (every record refused as the rule shapes it): no job is opened, and
    // each record is refused alone, as the records' call refuses it without a request.
    if !records.iter().any(|r| profile.sendable(r)) {
        let result = writer.write_many(profile.call(records)).await;
        let called = Called {
            result,
            sent: engine.clock.now(),
            paced: 0.0,
            verdict: Verdict::GoOn,
        };
        return Ok(Stepped {
            called,
            requests: 0,
        });
    }
    let send = || ask(writer, open, &open.path);
    let opened = paced::call(engine, ctx.budget(), writer, Some(stop), send).await?;
    let mut steps = Steps {
        requests: 1,
        verdict: Verdict::GoOn,
        first: (opened.sent, opened.paced),
    };
    let opened = match steps.take(opened) {
        Ok(w) => w.receipt,
        Err(e) => return Ok(steps.end(Err(e))),
    };
    let id = match shape.target_id(&opened) {
        Ok(id) => id,
        Err(why) => {
            let message = format!("the job's open call: {why}; no record was sent");
            let e = WriteError::Transient {
                status: opened.http_status,
                message,
            };
            return Ok(steps.end(Err(e)));
        }
    };
    let call = Opened {
        engine,
        ctx,
        profile,
        writer,
        id: &id,
    };
    let filled = call.fill_and_close(shape, records, &mut steps).await;
    let mut written = match filled {
        Ok(written) => written,
        Err(e) => {
            call.abort(shape, &mut steps).await;
            return Ok(steps.end(Err(e)));
        }
    };
    written.receipt.body = opened.body;
    Ok(steps.end(Ok(written)))
}

/// A submit's calls so far: how many, their gravest verdict, when the first left and at
/// what pace.
struct Steps {
    requests: u32,
    verdict: Verdict,
    first: (chrono::DateTime<chrono::Utc>, f64),
}

impl Steps {
    /// A step's answer, its verdict kept.
    fn take(&mut self, called: Called) -> Result<Written, WriteError> {
        self.verdict = paced::graver(
            std::mem::replace(&mut self.verdict, Verdict::GoOn),
            called.verdict,
        );
        called.result
    }

    /// One more paced step (not stopped by the batch's stop: the job is open), its answer.
    async fn step<Fut>(
        &mut self,
        o: &Opened<'_>,
        send: impl FnOnce() -> Fut,
    ) -> Result<Written, WriteError>
    where
        Fut: Future<Output = Result<Written, WriteError>>,
    {
        match paced::call(o.engine, o.ctx.budget(), o.writer, None, send).await {
            Ok(called) => {
                self.requests += 1;
                self.take(called)
            }
            Err(e) => Err(no_slot(&e)),
        }
    }

    /// The submit's answer.
    fn end(self, result: Result<Written, WriteError>) -> Stepped {
        Stepped {
            called: Called {
                result,
                sent: self.first.0,
                paced: self.first.1,
                verdict: self.verdict,
            },
            requests: self.requests,
        }
    }
}

/// A job opened at the target, the rest of its submit to make.
struct Opened<'a> {
    engine: &'a Engine,
    ctx: &'a ChainContext,
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
        steps: &mut Steps,
    ) -> Result<Written, WriteError> {
        let path = shape.id_path(&self.ctx.path, self.id);
        let records: Vec<Outgoing<'_>> = records
            .iter()
            .map(|r| Outgoing { path: &path, ..*r })
            .collect();
        let send = || self.writer.write_many(self.profile.call(&records));
        let written = steps.step(self, send).await?;
        if let Some(close) = &shape.close {
            let path = close.path(self.id);
            steps.step(self, || ask(self.writer, close, &path)).await?;
        }
        Ok(written)
    }

    /// Aborts the job after its submit failed, if the rule says how: one paced call, its
    /// answer heard; a failure is logged, and the submit's own answer stands.
    async fn abort(&self, shape: &JobShape, steps: &mut Steps) {
        let Some(abort) = &shape.abort else { return };
        let path = abort.path(self.id);
        let aborted = steps.step(self, || ask(self.writer, abort, &path)).await;
        if let Err(e) = aborted {
            tracing::warn!(job = self.id, error = %e, "a job whose submit failed could not be aborted");
        }
    }
}

/// A call of `step` to `path`, its answer as a written call of no record.
async fn ask(writer: &dyn Writer, step: &Step, path: &str) -> Result<Written, WriteError> {
    let jobs = writer.jobs().ok_or_else(crate::writer::contract::no_jobs)?;
    let answer = jobs
        .ask(step.method(), path, step.body.as_ref(), None)
        .await;
    answer.map(|r| Written::all(r, 0))
}

/// A slot not granted mid-submit: the records go again later.
fn no_slot(e: &NotSent) -> WriteError {
    WriteError::Transient {
        status: None,
        message: format!("no request slot for the job's next call ({e:?}); sent again"),
    }
}
