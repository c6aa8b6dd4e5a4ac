//! The poller: a loop in every worker process that polls the target's asynchronous jobs
//! ([`crate::jobs`]) when each falls due, and settles a job's records when it reports; the
//! same loop (and its one LISTEN connection) runs the eraser's passes
//! ([`crate::erasure::eraser`]). A
//! poll and each page of errors is a call like any other ([`paced::call`]): a slot from
//! the rule's budget (or the job's own poll budget), in fair turn with the other rules, its answer heard by the pacer and
//! its verdict written as a delivery call's is (a 429 or a spent budget blocks it, the
//! breaker hears it); while the connection's circuit is open, no job is polled. A job is
//! polled from what its own row and its rule say, never from the run that submitted it:
//! the poller reads nothing of the chain. The wait between polls doubles from the rule's first poll up to its
//! most (a job taking an hour is not polled every second). No transaction is open while the
//! target is called: a job is leased to one process (another takes it over when the lease
//! lapses, or sooner when the rescuer's rule finds that process dead), and its records' outcomes are committed in one transaction with its end.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::{
    breaker, catalog,
    engine::Engine,
    erasure::eraser::Eraser,
    invalid::Invalid,
    jobs::{self, Due, Ended},
    ledger::{self, Entry, Outcome},
    model::Connection,
    paced::{self, Heard},
    profile::RuleProfile,
    ratelimit::{
        blocks,
        limits::{self, Limit},
    },
    retry::{Retry, RetryPolicy},
    runs,
    writer::{
        Receipt, WriteError, Writer, Written, contract,
        job::{ErrorsFile, JobShape, JobState, RecordError, Records},
    },
};

/// The channel a submitted job is announced on (trigger `target_jobs_notify`).
pub const WAKE_CHANNEL: &str = "courier_jobs";
/// Jobs one pass leases at most.
const PER_PASS: i64 = 20;
/// How long a lease on a job lasts: longer than a poll and its errors take.
const LEASE: chrono::Duration = chrono::Duration::minutes(2);
/// The longest sleep between passes when nothing is due (a missed notification costs
/// at most this).
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// The poller of one process.
pub struct Poller {
    engine: Arc<Engine>,
}

/// What a poll found out.
enum Found {
    /// Still running, or the target could not be heard: poll again after `every_ms`.
    Again { said: String, every_ms: i32 },
    /// The job ended: settle its records.
    Ended {
        ended: Ended,
        said: String,
        errors: Vec<RecordError>,
        /// Why the records no error names are `unconfirmed` rather than delivered.
        unconfirmed: Option<String>,
        error: Option<String>,
    },
}

/// What a complete job's errors say.
#[derive(Default)]
struct Read {
    errors: Vec<RecordError>,
    unconfirmed: Option<String>,
}

impl Poller {
    /// A poller over `engine`.
    pub fn new(engine: &Arc<Engine>) -> Self {
        Self {
            engine: engine.clone(),
        }
    }

    /// Polls every job due now, one after the other; returns how many were polled.
    pub async fn run_once(&self) -> Result<usize, sqlx::Error> {
        let e = &self.engine;
        let now = e.clock.now();
        let dead_after = chrono::Duration::from_std(e.settings.worker_dead_after)
            .unwrap_or(chrono::Duration::MAX);
        let leased = (now, now + LEASE);
        let due = jobs::lease_due(&e.pool, &e.worker_name, leased, dead_after, PER_PASS).await?;
        let n = due.len();
        for job in due {
            self.poll(job).await?;
        }
        Ok(n)
    }

    /// Runs passes until `shutdown`, of the jobs and of the eraser's (`eraser`, which
    /// shares this loop's one LISTEN connection): when a job is submitted or an erasure
    /// asked (NOTIFY) and when the next job or erasure falls due. Fails only when it cannot
    /// start (its LISTEN connection).
    pub async fn run(self, eraser: Eraser, shutdown: CancellationToken) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.engine.pool).await?;
        listener
            .listen_all([WAKE_CHANNEL, crate::erasure::eraser::WAKE_CHANNEL])
            .await?;
        loop {
            let health = &self.engine.health;
            if let Err(e) = self.run_once().await {
                crate::maintenance::failed(health, "job poll", &e);
            }
            let erasing = match eraser.run_once().await {
                Ok(more) => more,
                Err(e) => {
                    crate::maintenance::failed(health, "erasure pass", &e);
                    false
                }
            };
            let next = jobs::next_due(&self.engine.pool).await.unwrap_or_else(|e| {
                crate::maintenance::failed(health, "job poller's next-due", &e);
                None
            });
            let next = match (next, eraser.next_due().await) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let next = if erasing {
                Some(self.engine.clock.now())
            } else {
                next
            };
            let sleep = next.map_or(MAX_SLEEP, |at| {
                (at - self.engine.clock.now())
                    .to_std()
                    .unwrap_or_default()
                    .min(MAX_SLEEP)
            });
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                n = listener.recv() => {
                    if n.is_err() {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    while listener.next_buffered().is_some() {}
                }
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Polls one leased job and records what it found.
    async fn poll(&self, job: Due) -> Result<(), sqlx::Error> {
        let e = &self.engine;
        let now = e.clock.now();
        let Some(ctx) = JobRule::load(e, &job, now).await? else {
            // The rule is gone: its jobs and records go with it.
            let found = ended(Ended::Overdue, "its rule is gone", None);
            return self.settle(&job, None, None, found).await;
        };
        let (profile, shape) = match &ctx.profile {
            Ok(p) => match &p.job {
                Some(shape) => (p, shape),
                None => {
                    let found = ended(Ended::Overdue, "its rule no longer names a job", None);
                    return self.settle(&job, Some(&ctx), None, found).await;
                }
            },
            Err(err) => {
                let found = Found::Again {
                    said: format!("the rule is unusable: {err}"),
                    every_ms: next_every(&job, shape_max(None)),
                };
                return self.settle(&job, Some(&ctx), None, found).await;
            }
        };
        let found = match e.writer(&ctx.connection) {
            // An open circuit: the target is down; the job waits as the runs do.
            Ok(_) if !ctx.circuit_admits => Found::Again {
                said: "the connection's circuit is open: not polled".into(),
                every_ms: next_every(&job, shape_max(Some(shape))),
            },
            Ok(w) => self.ask(&ctx, w.as_ref(), shape, &job).await?,
            Err(err) => Found::Again {
                said: err.to_string(),
                every_ms: next_every(&job, shape_max(Some(shape))),
            },
        };
        // Still running (or unheard) past its bound: overdue. A job that reports late is
        // still settled by the poll that hears it.
        let bound = chrono::Duration::seconds(i64::from(shape.overdue_after_seconds));
        let found = match found {
            Found::Again { said, .. } if e.clock.now() - job.submitted_at > bound => {
                let why = format!(
                    "not finished {} s after its submit (the target said {said}): its records \
                     stay accepted{}",
                    shape.overdue_after_seconds,
                    if shape.resend_overdue {
                        ", and are sent again"
                    } else {
                        ""
                    }
                );
                ended(Ended::Overdue, &said, Some(why))
            }
            found => found,
        };
        self.settle(&job, Some(&ctx), Some(profile), found).await
    }

    /// Polls the job at the target and, once it is complete, reads its errors.
    async fn ask(
        &self,
        ctx: &JobRule,
        writer: &dyn Writer,
        shape: &JobShape,
        job: &Due,
    ) -> Result<Found, sqlx::Error> {
        // What the target says is stored and shown: sealed first, as a call's answer is.
        let seal = |text: &str| writer.secrets().redact(text);
        let again = |said: String| Found::Again {
            said: seal(&said),
            every_ms: next_every(job, shape_max(Some(shape))),
        };
        let polled = match self
            .read(ctx, writer, &shape.poll_path(&job.target_id))
            .await?
        {
            Ok(receipt) => receipt,
            Err(said) => return Ok(again(said)),
        };
        let state = shape.state(polled.body.json());
        match state {
            JobState::Running(said) => Ok(again(said)),
            JobState::Failed(said) => {
                let said = seal(&said);
                let why = format!("the target's job {} ended {said}", seal(&job.target_id));
                Ok(ended(Ended::Failed, &said, Some(why)))
            }
            JobState::Complete => Ok(match self.errors(ctx, writer, shape, job, &polled).await? {
                Ok(read) => Found::Ended {
                    ended: Ended::Complete,
                    said: "complete".into(),
                    errors: read.errors,
                    unconfirmed: read.unconfirmed,
                    error: None,
                },
                Err(said) => again(format!("complete; {said}")),
            }),
        }
    }

    /// A complete job's errors, every page of them (at the target's path, or in the file
    /// the poll's answer names), each message sealed; `Err` with why they cannot be read
    /// now (the job is polled again). The listing is bounded by what it can hold: an empty
    /// page, or a next page already read, ends it; one listing more errors than the job
    /// has records (a page of one error a record makes `records + 1` pages at most) is
    /// not trusted: the job ends, the records no error read names `unconfirmed`, with the
    /// reason, and is never listed again.
    async fn errors(
        &self,
        ctx: &JobRule,
        writer: &dyn Writer,
        shape: &JobShape,
        job: &Due,
        polled: &Receipt,
    ) -> Result<Result<Read, String>, sqlx::Error> {
        let seal = |text: &str| writer.secrets().redact(text);
        let records = self.records(job, shape).await?;
        let mut read = Read::default();
        let (mut unmatched, mut stray) = (0, 0);
        let mut file = match shape.errors.as_ref().map(|e| e.file(polled.body.json())) {
            Some(ErrorsFile::At(url)) => Some(url),
            Some(ErrorsFile::Refused(why)) => return Ok(Err(seal(&why))),
            Some(ErrorsFile::Unnamed(why)) => {
                read.unconfirmed = Some(seal(&why));
                return Ok(Ok(read));
            }
            Some(ErrorsFile::None) | None => None,
        };
        let mut next = shape.errors_path(&job.target_id);
        let mut seen: std::collections::HashSet<String> = next.iter().cloned().collect();
        let mut listed = 0;
        loop {
            let page = match (file.take(), next.take()) {
                (Some(url), _) => match writer.jobs() {
                    Some(jobs) => jobs.fetch(&url).await,
                    None => Err(contract::no_jobs()),
                }
                .map_err(|e| seal(&format!("its errors file: {e}"))),
                (None, Some(path)) => self.read(ctx, writer, &path).await?,
                (None, None) => break,
            };
            let page = match page {
                Ok(receipt) => receipt,
                Err(said) => return Ok(Err(format!("errors: {said}"))),
            };
            let body = match shape.errors_answer(&page.body) {
                Ok(body) => body,
                Err(why) => return Ok(Err(seal(&why.0))),
            };
            let found = match shape.errors_page(&body, &records) {
                Ok(found) => found,
                Err(why) => return Ok(Err(seal(&why.0))),
            };
            let items = found.errors.len() + found.unmatched + found.stray;
            listed += items;
            unmatched += found.unmatched;
            stray += found.stray;
            read.errors.extend(found.errors.into_iter().map(|mut e| {
                e.message = crate::writer::secrets::cut(seal(&e.message));
                e
            }));
            if listed > records.count {
                read.unconfirmed = Some(format!(
                    "the job's errors listed {listed} errors for its {} records, more than \
                     it can hold: the listing is not read further",
                    records.count
                ));
                return Ok(Ok(read));
            }
            // An empty page, or a link to a page already read, ends the listing.
            next = found
                .next
                .map(|said| shape.next_page(&job.target_id, said))
                .filter(|link| items > 0 && seen.insert(link.clone()));
        }
        Ok(Ok(unplaced(job, &records, read, unmatched, stray)))
    }

    /// The job's records as its errors name them: by position, or by a key of each.
    async fn records(&self, job: &Due, shape: &JobShape) -> Result<Records, sqlx::Error> {
        Ok(match shape.key_pointer() {
            Some(pointer) => {
                let keys =
                    jobs::payload_keys(&self.engine.pool, &job.delivery_ids, pointer).await?;
                Records::keyed(keys.into_iter().map(|k| k.map(|k| shape.key(k))).collect())
            }
            None => Records::counted(job.delivery_ids.len()),
        })
    }

    /// One paced GET ([`paced::call`]) on the rule's budget, or the job's own poll budget:
    /// its verdict written as every call's is (a 429's block or a spent budget for every
    /// process, the breaker told, the call counted). `Err` with what the target said when
    /// it did not answer with a 2xx.
    async fn read(
        &self,
        ctx: &JobRule,
        writer: &dyn Writer,
        path: &str,
    ) -> Result<Result<Receipt, String>, sqlx::Error> {
        let e = &self.engine;
        let Some(jobs) = writer.jobs() else {
            return Ok(Err(contract::no_jobs().to_string()));
        };
        let send = || async {
            let answer = jobs.ask(reqwest::Method::GET, path, None, None).await;
            answer.map(|receipt| Written::all(receipt, 0))
        };
        let called = match paced::call(e, ctx.budget(), writer, Some(&e.shutdown), send).await {
            Ok(called) => called,
            Err(err) => return Ok(Err(format!("no request slot: {err:?}"))),
        };
        let mut heard = Heard::default();
        heard.heard(&called.verdict, paced::reachable(&called.result));
        if let Err(err) = &called.result {
            heard.last_error = Some(err.to_string());
        }
        let at = e.clock.now();
        let cause = blocks::Cause {
            budget_key: &ctx.budget_key,
            connection_id: ctx.connection.id,
            rule_id: Some(ctx.rule_id),
            run_id: Some(ctx.run_id),
        };
        let mut tx = e.pool.begin().await?;
        let blocked = heard.write(&mut tx, e, &cause, at).await?;
        tx.commit().await?;
        if let Some(until) = blocked {
            e.blocks.written(cause.budget_key, until);
        }
        Ok(match called.result {
            Ok(written) => Ok(written.receipt),
            Err(WriteError::RateLimited { .. }) => Err("rate limited (429)".into()),
            Err(err) => Err(err.to_string()),
        })
    }

    /// Records what a poll found: the next poll, or the job's end with its records'
    /// outcomes, in one transaction (nothing when another process took the job over).
    async fn settle(
        &self,
        job: &Due,
        ctx: Option<&JobRule>,
        profile: Option<&RuleProfile>,
        found: Found,
    ) -> Result<(), sqlx::Error> {
        let e = &self.engine;
        let now = e.clock.now();
        let (ended, said, errors, unconfirmed, error) = match found {
            Found::Again { said, every_ms } => {
                return jobs::polled(&e.pool, job.id, &e.worker_name, &said, every_ms, now).await;
            }
            Found::Ended {
                ended,
                said,
                errors,
                unconfirmed,
                error,
            } => (ended, said, errors, unconfirmed, error),
        };
        let mut tx = e.pool.begin().await?;
        if !jobs::end(
            &mut tx,
            job.id,
            &e.worker_name,
            ended,
            &said,
            error.as_deref(),
            now,
        )
        .await?
        {
            return Ok(()); // another process holds it now
        }
        let resend = profile
            .and_then(|p| p.job.as_ref())
            .is_some_and(|s| s.resend_overdue);
        let accepted = ledger::accepted(&mut tx, &job.delivery_ids).await?;
        let entries = match (ended, ctx) {
            (Ended::Complete, _) => outcomes(job, &accepted, &errors, unconfirmed, now),
            (Ended::Failed, Some(ctx)) => failed(ctx, &accepted, error.as_deref(), now),
            (Ended::Overdue, Some(ctx)) if resend => failed(ctx, &accepted, error.as_deref(), now),
            _ => Vec::new(),
        };
        if let Some(ctx) = ctx {
            ledger::record_job(
                &mut tx,
                job.run_id,
                job.rule_id,
                ctx.connection.id,
                job.id,
                &entries,
                now,
            )
            .await?;
            // What the job reported counts in the run that handed it the records (its
            // `accepted` already counts them as handed over).
            let mut reported = runs::Counters::default();
            for entry in &entries {
                e.metrics
                    .outcomes(&ctx.rule_name, entry.outcome.as_str(), 1);
                if entry.outcome != Outcome::Unconfirmed {
                    reported.count(entry.outcome);
                }
            }
            runs::add_reported(&mut *tx, job.run_id, &reported).await?;
        }
        tx.commit().await?;
        tracing::info!(job = job.id, target_id = %job.target_id, ended = ?ended, records = entries.len(), "a target's job ended");
        Ok(())
    }
}

/// A complete job's errors read whole, with those it could not place: errors that may name
/// a record without saying which (`unmatched`) reject the records they may name; errors
/// naming keys no record has (`stray`) leave the rest unconfirmed.
fn unplaced(job: &Due, records: &Records, mut read: Read, unmatched: usize, stray: usize) -> Read {
    if unmatched > 0 {
        tracing::warn!(
            job = job.id,
            unmatched,
            "errors of a job name no record of it"
        );
        read.errors.extend(unnamed(records, unmatched));
    }
    if stray > 0 {
        tracing::warn!(
            job = job.id,
            stray,
            "errors of a job name keys no record has"
        );
        read.unconfirmed = Some(format!(
            "the job reported {stray} error(s) naming a record by a key none of its \
             records has: which records failed is unknown"
        ));
    }
    read
}

/// The records a complete job's `unmatched` errors may name, as the errors name records by
/// key: those without a key of their own, whose fate the target told but courier cannot
/// read. Rejected, never read as delivered.
fn unnamed(records: &Records, unmatched: usize) -> impl Iterator<Item = RecordError> + '_ {
    records.unkeyed.iter().map(move |&index| RecordError {
        index,
        message: format!(
            "the job reported {unmatched} error(s) naming a record by a key this record does \
             not have alone (absent, or shared with another record of the job): its fate is \
             unknown"
        ),
    })
}

fn ended(ended: Ended, said: &str, error: Option<String>) -> Found {
    Found::Ended {
        ended,
        said: said.to_owned(),
        errors: Vec::new(),
        unconfirmed: None,
        error,
    }
}

/// What a job is polled with, read from its own row's rule and that rule's connection,
/// never from the run that submitted it (which is named only in the ledger rows its
/// records' outcomes add).
struct JobRule {
    /// The rule.
    rule_id: i64,
    /// Its name (for metrics).
    rule_name: String,
    /// The run that submitted the job.
    run_id: i64,
    /// Its share of its budget against other rules.
    weight: i32,
    /// What its calls are, or why its stored profile cannot be used.
    profile: Result<Arc<RuleProfile>, Invalid>,
    /// Attempts and backoff.
    retry: RetryPolicy,
    /// The connection.
    connection: Connection,
    /// The budget polls spend from: the job's own poll budget where the rule names one,
    /// else the connection's.
    budget_key: String,
    /// That budget's limits.
    limits: Vec<Limit>,
    /// Whether the connection's circuit lets a call through now.
    circuit_admits: bool,
}

impl JobRule {
    /// Job `job`'s rule, its connection and circuit at `now`; `None` when the rule is gone.
    async fn load(
        engine: &Engine,
        job: &Due,
        now: DateTime<Utc>,
    ) -> Result<Option<Self>, sqlx::Error> {
        let pool = &engine.pool;
        let Some((rule, connection)) = catalog::rule_with_connection(pool, job.rule_id).await?
        else {
            return Ok(None);
        };
        let (_, circuit_admits) = breaker::for_run(pool, connection.id, job.run_id, now).await?;
        let profile = engine.profile(&rule, &connection);
        let own = profile
            .as_ref()
            .ok()
            .and_then(|p| p.job.as_ref()?.poll_budget.clone());
        let (budget_key, limits) = match own {
            Some(b) => (b.key, limits::check(b.limits).unwrap_or_default()),
            None => (connection.budget_key.clone(), connection.declared_limits()),
        };
        Ok(Some(JobRule {
            rule_id: rule.id,
            rule_name: rule.name,
            run_id: job.run_id,
            weight: rule.weight,
            profile,
            retry: RetryPolicy {
                max_attempts: rule.max_attempts,
                backoff_base_ms: rule.backoff_base_ms,
                backoff_max_ms: rule.backoff_max_ms,
            },
            connection,
            budget_key,
            limits,
            circuit_admits,
        }))
    }

    /// The budget its polls spend from.
    fn budget(&self) -> paced::Budget<'_> {
        paced::Budget {
            key: &self.budget_key,
            limits: &self.limits,
            reserve: self.connection.reserve(),
            rule_id: self.rule_id,
            weight: self.weight.max(1) as u32,
        }
    }
}

/// The longest wait between polls, in milliseconds.
fn shape_max(shape: Option<&JobShape>) -> i64 {
    i64::from(shape.map_or(60, |s| s.max_poll_seconds)) * 1000
}

/// The wait before the next poll: twice the last, up to `max_ms`.
fn next_every(job: &Due, max_ms: i64) -> i32 {
    (i64::from(job.poll_every_ms) * 2).min(max_ms).max(1) as i32
}

/// A complete job's outcomes: each record an error names `rejected` with its message
/// (the first, when several name it), every other `delivered`, or `unconfirmed` (with why)
/// when the job's errors do not tell.
fn outcomes(
    job: &Due,
    accepted: &[(i64, i32)],
    errors: &[RecordError],
    unconfirmed: Option<String>,
    now: DateTime<Utc>,
) -> Vec<Entry> {
    let mut refused: std::collections::HashMap<i64, &str> = std::collections::HashMap::new();
    for err in errors {
        if let Some(&id) = job.delivery_ids.get(err.index) {
            refused.entry(id).or_insert(&err.message);
        }
    }
    accepted
        .iter()
        .map(|&(id, attempt)| {
            let (outcome, error) = match (refused.get(&id), &unconfirmed) {
                (Some(m), _) => (Outcome::Rejected, Some((*m).to_owned())),
                (None, Some(why)) => (Outcome::Unconfirmed, Some(why.clone())),
                (None, None) => (Outcome::Delivered, None),
            };
            Entry {
                delivery_id: id,
                outcome,
                attempt,
                http_status: None,
                error,
                duration_ms: None,
                next_attempt_at: None,
                at: now,
            }
        })
        .collect()
}

/// The outcomes of a job that failed (or was cancelled, or is overdue and its rule resends):
/// each record `failed`, due again after its backoff, or `exhausted` on its last attempt.
fn failed(
    ctx: &JobRule,
    accepted: &[(i64, i32)],
    error: Option<&str>,
    now: DateTime<Utc>,
) -> Vec<Entry> {
    accepted
        .iter()
        .map(|&(id, attempt)| {
            let (outcome, next) = match ctx.retry.after_failure(attempt, rand::random()) {
                Retry::After(wait) => (Outcome::Failed, Some(now + wait)),
                Retry::Exhausted => (Outcome::Exhausted, None),
            };
            Entry {
                delivery_id: id,
                outcome,
                attempt,
                http_status: None,
                error: error.map(str::to_owned),
                duration_ms: None,
                next_attempt_at: next,
                at: now,
            }
        })
        .collect()
}
