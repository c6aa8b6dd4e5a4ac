//! The eraser: passes in every worker process (run by the poller's loop, woken by
//! `courier_erasures` and when a part falls due) that carry erasures out. Each pass hashes
//! the identities of erasures just asked ([`store::hash_open`]), marks their deliveries and
//! suppresses the pending ones ([`store::sweep`]), tells each connection's target whose
//! turn has come, and closes (purges) the erasures every target has answered
//! ([`store::close`]). A connection's part is leased to one process; it waits while
//! something may still carry the person there ([`store::in_flight`]) or the connection's
//! circuit is open, then its erase is a paced call like any other ([`paced::call`]: a slot
//! of the connection's budget, or of the erase endpoint's own limits, its 429 blocking the
//! budget and spending no attempt, the breaker told). No transaction is open while the
//! target is called. Nothing here logs a person's identities.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::store::{self, Due, Step};
use crate::{
    breaker, catalog,
    engine::Engine,
    model::Connection,
    paced::{self, Heard},
    ratelimit::{blocks, limits::Limit},
    writer::{
        WriteError, Writer, Written,
        contract::no_jobs,
        erase::{EraseShape, Said},
        secrets::cut,
    },
};

/// The channel an erasure is announced on (`courier_erase`).
pub const WAKE_CHANNEL: &str = "courier_erasures";
/// Connections' parts one pass leases at most.
const PER_PASS: i64 = 100;
/// Erasures one pass closes at most.
const CLOSE_PER_PASS: i64 = 100;
/// How long a lease lasts: longer than a lookup and an erase take.
const LEASE: chrono::Duration = chrono::Duration::minutes(2);
/// How soon a part waiting for something in flight looks again.
const WAIT: chrono::Duration = chrono::Duration::seconds(5);
/// Attempts an erase may spend on failures worth retrying (5xx, timeouts) before it is
/// reported failed; a 429 spends none.
pub const MAX_ATTEMPTS: i32 = 10;

/// The eraser of one process.
pub struct Eraser {
    engine: Arc<Engine>,
    /// Whether this process has said it cannot carry erasures out (no key), once.
    said_keyless: std::sync::atomic::AtomicBool,
}

impl Eraser {
    /// An eraser over `engine`.
    pub fn new(engine: &Arc<Engine>) -> Self {
        Self {
            engine: engine.clone(),
            said_keyless: Default::default(),
        }
    }

    /// One pass: hashes and sweeps new erasures, tells the targets whose turn has come,
    /// closes the erasures every target answered. Returns whether more parts are due than
    /// one pass leases (the next pass should follow at once).
    pub async fn run_once(&self) -> Result<bool, sqlx::Error> {
        let e = &self.engine;
        let Some(key) = e.settings.erasure_key.as_ref() else {
            // Nothing can be carried out without the key: said once, when anyone is erased.
            let said = &self.said_keyless;
            if !said.load(std::sync::atomic::Ordering::Relaxed) && store::anyone(&e.pool).await? {
                said.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    "people are erased and this worker has no COURIER_ERASURE_KEY: it carries \
                     out no erasure and holds deliveries back; give every worker the key"
                );
            }
            return Ok(false);
        };
        store::hash_open(&e.pool, key).await?;
        let mut db = e.pool.acquire().await?;
        store::sweep(&mut db, None, e.clock.now()).await?;
        drop(db);
        let now = e.clock.now();
        let due = store::lease_due(&e.pool, &e.worker_name, (now, now + LEASE), PER_PASS).await?;
        let n = due.len();
        // Each connection's parts in turn, the connections side by side: one target's pace
        // does not hold back another's.
        let mut by_connection: Vec<Vec<Due>> = Vec::new();
        for part in due {
            match by_connection
                .iter_mut()
                .find(|g| g[0].connection_id == part.connection_id)
            {
                Some(group) => group.push(part),
                None => by_connection.push(vec![part]),
            }
        }
        let told = by_connection
            .into_iter()
            .map(|parts| self.tell_connection(parts));
        futures::future::try_join_all(told).await?;
        let closed = store::close(&e.pool, CLOSE_PER_PASS, e.clock.now()).await?;
        if !closed.is_empty() {
            tracing::info!(erasures = ?closed, "erasures closed: every target answered, courier's copies purged");
        }
        Ok(n as i64 >= PER_PASS)
    }

    /// When the next part falls due, if any (an error is logged as a failed pass).
    pub async fn next_due(&self) -> Option<DateTime<Utc>> {
        self.engine.settings.erasure_key.as_ref()?;
        store::next_due(&self.engine.pool)
            .await
            .unwrap_or_else(|e| {
                crate::maintenance::failed(&self.engine.health, "eraser's next-due", &e);
                None
            })
    }

    /// Records `step` of `part`, counted in the metrics when it is an end.
    async fn record(&self, part: &Due, step: &Step) -> Result<(), sqlx::Error> {
        let e = &self.engine;
        if let Step::Answered { outcome, .. } = step {
            e.metrics.erasure_answered(outcome);
        }
        store::record(&e.pool, part.id, &e.worker_name, step, e.clock.now()).await
    }

    /// Tells one connection's target about its parts, in turn, or several people to a call
    /// where its erase takes a batch; each part once nothing is in flight there for it.
    async fn tell_connection(&self, parts: Vec<Due>) -> Result<(), sqlx::Error> {
        let target = match self.target(parts[0].connection_id).await? {
            Ok(target) => target,
            Err(step) => {
                for part in &parts {
                    self.record(part, &step).await?;
                }
                return Ok(());
            }
        };
        let mut ready = Vec::new();
        for part in parts {
            match self.ready(&target, &part).await? {
                Ok(person) => ready.push((part, person)),
                Err(step) => self.record(&part, &step).await?,
            }
        }
        let call = Erase {
            engine: &self.engine,
            connection: &target.connection,
            shape: &target.shape,
            writer: target.writer.as_ref(),
        };
        if target.shape.batch_size > 1 {
            for chunk in ready.chunks(target.shape.batch_size) {
                let people: Vec<&Value> = chunk.iter().map(|(_, person)| person).collect();
                let body = target.shape.batch_body(&people);
                let result = call
                    .send(target.shape.method.clone(), &target.shape.path, Some(&body))
                    .await?;
                for (part, _) in chunk {
                    self.record(part, &self.answered(&target.shape, part, &result))
                        .await?;
                }
            }
            return Ok(());
        }
        for (part, person) in ready {
            let step = self.tell_one(&call, &part, person).await?;
            self.record(&part, &step).await?;
        }
        Ok(())
    }

    /// Connection `connection_id`'s target: the connection, its erase operation and its
    /// writer; or the step every part of it takes when there is none, or it is down.
    async fn target(
        &self,
        connection_id: Option<i64>,
    ) -> Result<Result<Target, Step>, sqlx::Error> {
        let e = &self.engine;
        let now = e.clock.now();
        let gone = || {
            Ok(Err(final_step(
                "no_operation",
                "the connection was deleted".into(),
            )))
        };
        let Some(connection_id) = connection_id else {
            return gone();
        };
        let Some(connection) = catalog::connection(&e.pool, connection_id).await? else {
            return gone();
        };
        let stated =
            sqlx::query_scalar!("SELECT erase FROM connections WHERE id = $1", connection_id)
                .fetch_one(&e.pool)
                .await?;
        let Some(stated) = stated else {
            return Ok(Err(final_step(
                "no_operation",
                "the connection states no erase operation (since removed): its target was not \
                 told"
                    .into(),
            )));
        };
        let shape = match EraseShape::parse(&stated) {
            Ok(shape) => shape,
            Err(err) => return Ok(Err(final_step("failed", err.reason))),
        };
        let (_, admits) = breaker::for_run(&e.pool, connection_id, 0, now).await?;
        if !admits {
            return Ok(Err(Step::Again {
                at: now + WAIT,
                spent: false,
                why: "waiting for the connection's circuit to close".into(),
            }));
        }
        let writer = match e.writer(&connection) {
            Ok(w) => w,
            Err(err) => {
                return Ok(Err(Step::Again {
                    at: now + WAIT,
                    spent: false,
                    why: err.to_string(),
                }));
            }
        };
        Ok(Ok(Target {
            connection,
            shape,
            writer,
        }))
    }

    /// The person as `target`'s call names them (the one identity it uses), once nothing
    /// that may still carry them there is in flight; else the step the part takes.
    async fn ready(&self, target: &Target, part: &Due) -> Result<Result<Value, Step>, sqlx::Error> {
        let Some((kind, value)) = target.shape.identity_of(&part.person) else {
            return Ok(Err(final_step(
                "no_identity",
                format!(
                    "the connection's erase names a person by {}, and the erasure gives none",
                    target.shape.identity.join(" or ")
                ),
            )));
        };
        if let Some(what) = store::in_flight(&self.engine.pool, part).await? {
            return Ok(Err(Step::Again {
                at: self.engine.clock.now() + WAIT,
                spent: false,
                why: format!("waiting for {what}"),
            }));
        }
        Ok(Ok(serde_json::json!({ kind: value })))
    }

    /// One person's erase: the lookup first where the operation has one, then its call.
    async fn tell_one(
        &self,
        call: &Erase<'_>,
        part: &Due,
        mut person: Value,
    ) -> Result<Step, sqlx::Error> {
        let shape = call.shape;
        if let Some(lookup) = &shape.lookup {
            let path = match shape.lookup_path(lookup, &person) {
                Ok(p) => p,
                Err(why) => return Ok(final_step("failed", why)),
            };
            let found = match call.send(reqwest::Method::GET, &path, None).await? {
                Ok(written) => written.receipt.body.json().and_then(|b| {
                    let v = b.pointer(&lookup.found)?;
                    v.as_str()
                        .map(str::to_owned)
                        .or_else(|| v.as_i64().map(|n| n.to_string()))
                }),
                Err(err) => return Ok(self.unanswered(part, &err)),
            };
            match found {
                Some(id) => person["found"] = id.into(),
                None => {
                    return Ok(final_step(
                        "unknown",
                        "the target's lookup found nobody".into(),
                    ));
                }
            }
        }
        let (path, body) = match (shape.path_for(&person), shape.body_for(&person)) {
            (Ok(path), Ok(body)) => (path, body),
            (Err(why), _) | (_, Err(why)) => return Ok(final_step("failed", why)),
        };
        let result = call
            .send(shape.method.clone(), &path, body.as_ref())
            .await?;
        Ok(self.answered(shape, part, &result))
    }

    /// What an erase call's answer means for `part`.
    fn answered(
        &self,
        shape: &EraseShape,
        part: &Due,
        result: &Result<Written, WriteError>,
    ) -> Step {
        let read = |status: u16, message: Option<&str>| match shape.said(status) {
            Some(said) => Step::Answered {
                outcome: said.as_str(),
                http_status: Some(status),
                error: message
                    .filter(|_| said == Said::Unknown)
                    .map(|m| cut(m.to_owned())),
            },
            None => Step::Answered {
                outcome: "failed",
                http_status: Some(status),
                error: Some(message.map_or_else(
                    || format!("the target answered {status}"),
                    |m| cut(m.to_owned()),
                )),
            },
        };
        match result {
            Ok(written) => read(written.receipt.http_status.unwrap_or(200), None),
            Err(WriteError::Permanent {
                status: Some(status),
                message,
            }) => read(*status, Some(message)),
            Err(err) => self.unanswered(part, err),
        }
    }

    /// A call the target did not answer for good: tried again (a 429 spends no attempt),
    /// or failed.
    fn unanswered(&self, part: &Due, err: &WriteError) -> Step {
        let now = self.engine.clock.now();
        match err {
            WriteError::RateLimited { wait, .. } => Step::Again {
                at: now
                    + (*wait)
                        .and_then(|w| chrono::Duration::from_std(w).ok())
                        .unwrap_or(chrono::Duration::seconds(1)),
                spent: false,
                why: "rate limited (429): the budget is blocked for the wait".into(),
            },
            WriteError::Permanent { status, message } => Step::Answered {
                outcome: "failed",
                http_status: *status,
                error: Some(cut(message.clone())),
            },
            other => {
                let status = match other {
                    WriteError::Transient { status, .. } => *status,
                    WriteError::Unaccounted { status, .. } => Some(*status),
                    _ => None,
                };
                self.failed(part, cut(other.to_string()), status)
            }
        }
    }

    /// A failure worth retrying: again after a backoff, or failed on the last attempt.
    fn failed(&self, part: &Due, why: String, status: Option<u16>) -> Step {
        if part.attempts + 1 >= MAX_ATTEMPTS {
            return Step::Answered {
                outcome: "failed",
                http_status: status,
                error: Some(format!("{why} (after {MAX_ATTEMPTS} attempts)")),
            };
        }
        let backoff = 2_i64
            .saturating_pow(part.attempts.clamp(0, 12) as u32)
            .min(3600);
        Step::Again {
            at: self.engine.clock.now() + chrono::Duration::seconds(backoff),
            spent: true,
            why,
        }
    }
}

/// A step that ends a part: `outcome`, and why.
fn final_step(outcome: &'static str, why: String) -> Step {
    Step::Answered {
        outcome,
        http_status: None,
        error: Some(why),
    }
}

/// A connection's target, as its erase calls need it.
struct Target {
    connection: Connection,
    shape: EraseShape,
    writer: Arc<dyn Writer>,
}

/// One connection's erase calls.
struct Erase<'a> {
    engine: &'a Engine,
    connection: &'a Connection,
    shape: &'a EraseShape,
    writer: &'a dyn Writer,
}

impl Erase<'_> {
    /// The budget an erase spends from: the endpoint's own where it states limits, else
    /// the connection's.
    fn budget(&self) -> (String, Vec<Limit>) {
        match &self.shape.limits {
            Some(limits) => (
                format!("{}:erase", self.connection.budget_key),
                limits.clone(),
            ),
            None => (
                self.connection.budget_key.clone(),
                self.connection.declared_limits(),
            ),
        }
    }

    /// One paced call ([`paced::call`]) with the connection's credentials, its verdict
    /// written as every call's is; the answer sealed.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Result<Written, WriteError>, sqlx::Error> {
        let e = self.engine;
        let Some(jobs) = self.writer.jobs() else {
            return Ok(Err(no_jobs()));
        };
        let (key, limits) = self.budget();
        let budget = paced::Budget {
            key: &key,
            limits: &limits,
            reserve: self.connection.reserve(),
            rule_id: 0,
            weight: 1,
        };
        let send = || async {
            let answer = jobs
                .ask(
                    method.clone(),
                    path,
                    body,
                    self.shape.content_type.as_deref(),
                )
                .await;
            answer.map(|receipt| Written::all(receipt, 0))
        };
        let called = match paced::call(e, budget, self.writer, Some(&e.shutdown), send).await {
            Ok(called) => called,
            Err(err) => {
                return Ok(Err(WriteError::Transient {
                    status: None,
                    message: format!("no request slot: {err:?}"),
                }));
            }
        };
        let mut heard = Heard::default();
        heard.heard(&called.verdict, paced::reachable(&called.result));
        if let Err(err) = &called.result {
            heard.last_error = Some(err.to_string());
        }
        let cause = blocks::Cause {
            budget_key: &key,
            connection_id: self.connection.id,
            rule_id: None,
            run_id: None,
        };
        let at = e.clock.now();
        let mut tx = e.pool.begin().await?;
        let blocked = heard.write(&mut tx, e, &cause, at).await?;
        tx.commit().await?;
        if let Some(until) = blocked {
            e.blocks.written(cause.budget_key, until);
        }
        Ok(called.result)
    }
}
