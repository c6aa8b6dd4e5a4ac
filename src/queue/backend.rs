//! The apalis backend of the chain worker. apalis-postgres' `PostgresStorage` drives its
//! own persistence, and in 1.0.0 that persistence ends the worker (and the `Monitor`
//! restarts it at once, in a loop) whenever a fetched row cannot be read, a statement meets
//! a database outage, or it registers again under the same name from another pooled
//! connection (`WorkerAlreadyExists`, a session advisory lock). Here apalis-core's
//! [`Persisted`] drives a persistence of courier's ([`ChainStorage`]) built on
//! apalis-postgres' own public queries, which:
//!
//! - sets aside rows apalis cannot read, once, and delivers the rest of the batch: a
//!   payload that is not JSON inside the fetch's transaction, any other unreadable row
//!   through [`set_aside_unreadable`](super::table::set_aside_unreadable) before fetching again;
//! - rides out database outages (an empty fetch, a skipped beat, acknowledgements retried)
//!   instead of ending the worker;
//! - on a restart, pauses first (doubling up to [`RESTART_PAUSE_MAX`]), puts back the jobs
//!   the failed worker held, sets aside unreadable rows, and registers without apalis'
//!   advisory lock (worker names are unique per process);
//! - reports every fetch to the [`Fetcher`], and [`ChainBackend`] fetches again whenever
//!   the fetcher was rung after the last fetch started: a wake is never lost;
//! - after an empty fetch, reads when the next job scheduled for later falls due, and
//!   fetches then: such a job is announced by no insert, and the process that scheduled it
//!   may be gone before its own timer announces it.
//!
//! [`RESTART_PAUSE_MAX`]: super::fetcher::RESTART_PAUSE_MAX

use std::{
    collections::HashSet,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use apalis::prelude::{Backend, Task, WorkerContext};
use apalis_codec::json::JsonCodec;
use apalis_core::backend::{
    BackendConfig,
    finalize::Ephemeral,
    persistence::{Persisted, Persistence, TaskEvent, TaskPersistLayer},
};
use apalis_postgres::{Config, Error, queries};
use futures::FutureExt;
use serde_json::Value;

use super::fetcher::{Fetcher, Tick};
use super::table::{CHAIN_JOB_MAX_ATTEMPTS, CHAIN_QUEUE, UNREADABLE, set_aside_unreadable};
use crate::{engine::Engine, health::is_outage};

/// How often apalis' worker row is refreshed (`apalis.workers.last_seen`).
const APALIS_HEARTBEAT: Duration = Duration::from_secs(30);
/// Missed apalis heartbeats before another worker of the queue takes this one's jobs for
/// orphans (courier's own rescuer acts much sooner, on its process heartbeat).
const APALIS_MISSED_HEARTBEATS: usize = 10;
/// Added to the wait for a job scheduled for later: `get_jobs` takes only jobs whose
/// `run_at` is before its transaction began.
const DUE_MARGIN: Duration = Duration::from_millis(5);
/// How `apalis.workers.storage_name` names this backend (as apalis' own does).
const STORAGE_NAME: &str = "PgStorage";

/// The chain queue as apalis' worker consumes it: [`ChainStorage`] driven by apalis-core's
/// [`Persisted`], woken by the [`Fetcher`] and by the safety-net poll.
pub struct ChainBackend {
    /// Registration, heartbeat, fetching and acknowledgements.
    persisted: Persisted<ChainStorage>,
    /// Rings to answer; shared with the listener and the next restart.
    fetcher: Arc<Fetcher>,
    /// The safety-net poll (`COURIER_QUEUE_POLL_MS`).
    poll: Tick,
    /// When the next job scheduled for later falls due, as the last empty fetch saw it: no
    /// insert announces such a job, and the process that scheduled it (and its timer to
    /// announce it) may be gone.
    due: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The last fetch came back empty and nothing has rung since: `Persisted` would fetch
    /// again on any wake of the worker task (every answer of a job in flight wakes it), so
    /// it is not polled until a ring.
    idle: bool,
}

impl ChainBackend {
    /// A backend for one (re)start of the chain worker of `engine`'s process.
    pub fn new(engine: &Arc<Engine>, fetcher: &Arc<Fetcher>) -> Self {
        let config = Config::default()
            .queue(CHAIN_QUEUE)
            .batch_size(engine.settings.queue_batch_size)
            .heartbeat_interval(APALIS_HEARTBEAT)
            .missed_heartbeats(APALIS_MISSED_HEARTBEATS);
        Self {
            persisted: Persisted::new(ChainStorage {
                engine: engine.clone(),
                config,
                fetcher: fetcher.clone(),
            }),
            fetcher: fetcher.clone(),
            poll: Tick::every(engine.settings.queue_poll),
            due: None,
            idle: false,
        }
    }
}

impl Backend for ChainBackend {
    type Task = Task<Value>;
    type Error = Error;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Error>> {
        let heartbeat = self.persisted.config.heartbeat_interval;
        self.persisted.poll_ready(cx, worker, heartbeat)
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Option<Result<Task<Value>, Error>>> {
        self.fetcher.register(cx.waker());
        if self.poll.poll_fired(cx) {
            self.fetcher.ring_quietly();
        }
        if self
            .due
            .as_mut()
            .is_some_and(|due| due.as_mut().poll(cx).is_ready())
        {
            self.due = None;
            self.fetcher.ring_quietly();
        }
        // Any wake makes `Persisted` fetch unless a fetch is in flight or tasks are buffered:
        // once a fetch found nothing, only a ring (an announcement, the poll, a job falling
        // due) fetches again.
        if self.idle && !self.fetcher.owes_fetch() {
            return Poll::Pending;
        }
        let next = self.persisted.poll_next(cx, worker);
        self.idle = next.is_pending() && !self.fetcher.fetching();
        if let Some(at) = self.fetcher.take_due() {
            let mut due = Box::pin(tokio::time::sleep_until(at));
            if due.as_mut().poll(cx).is_ready() {
                self.fetcher.ring_quietly();
                cx.waker().wake_by_ref();
            } else {
                self.due = Some(due);
            }
        }
        if next.is_pending() && self.fetcher.owes_fetch() {
            // Rung while the last fetch was in flight: that fetch may not have seen the job.
            cx.waker().wake_by_ref();
        }
        next
    }

    fn poll_close(
        &mut self,
        cx: &mut Context<'_>,
        worker: &WorkerContext,
    ) -> Poll<Result<(), Error>> {
        self.persisted.poll_close(cx, worker)
    }
}

impl BackendConfig for ChainBackend {
    type Args = Value;
    type Id = ulid::Ulid;
    // Tasks leave `ChainStorage` decoded already (the undecodable ones set aside there).
    type Kind = Ephemeral;
    type Config = Config;
    type Layer = TaskPersistLayer<JsonCodec<Value>, Value>;

    fn config(&self) -> &Config {
        &self.persisted.config
    }

    fn middleware(&mut self, _: &mut WorkerContext) -> Self::Layer {
        let batch = self.persisted.config.batch_size;
        self.persisted
            .layer(JsonCodec::<Value>::default(), batch)
            .persist_results(true)
            .lock_tasks(true)
    }
}

/// courier's persistence of the chain queue, on apalis-postgres' public queries.
#[derive(Clone)]
pub struct ChainStorage {
    /// Pool, health, shutdown and settings of the process.
    engine: Arc<Engine>,
    /// apalis' settings of the queue.
    config: Config,
    /// Told about every fetch and restart.
    fetcher: Arc<Fetcher>,
}

impl ChainStorage {
    fn queue(&self) -> &str {
        self.config.queue.as_ref()
    }

    /// Runs `statement` until it succeeds or fails for a reason other than an outage; during
    /// an outage it tries again (backing off to 2 s, the outage logged once by the engine's
    /// health) until the process stops.
    async fn through_outages<T, F, Fut>(&self, mut statement: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut pause = Duration::from_millis(100);
        loop {
            match statement().await {
                Err(Error::Database(e))
                    if is_outage(&e) && !self.engine.shutdown.is_cancelled() =>
                {
                    self.engine.health.failed(&e);
                    tokio::select! {
                        _ = self.engine.shutdown.cancelled() => return Err(Error::Database(e)),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Ok(v) => {
                    self.engine.health.ok();
                    return Ok(v);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One fetch: apalis' own, then the payloads decoded. A payload that is not JSON is set
    /// aside inside the fetch's transaction, so it is never handed out and never fails the
    /// batch; any other row apalis cannot read fails its fetch, which rolls back.
    async fn fetch_once(&self, worker: &WorkerContext) -> Result<Vec<Task<Value>>, Error> {
        let mut tx = self.engine.pool.begin().await?;
        let fetched = AssertUnwindSafe(queries::fetch_next(&mut *tx, &self.config, worker))
            .catch_unwind()
            .await
            .map_err(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Error::Database(sqlx::Error::Decode(
                    format!("apalis could not read a fetched row: {what}").into(),
                ))
            })??;
        let mut readable = Vec::with_capacity(fetched.len());
        let (mut ids, mut reasons) = (Vec::new(), Vec::new());
        for task in fetched {
            let id = task.task_id().map(|id| id.to_string()).unwrap_or_default();
            match task.try_map_args(|bytes| serde_json::from_slice::<Value>(&bytes)) {
                Ok(task) => readable.push(task),
                Err(e) => {
                    ids.push(id);
                    reasons.push(format!("payload is not UTF-8 JSON: {e}"));
                }
            }
        }
        if readable.is_empty() {
            // By the database's clock, which decides what `get_jobs` finds due.
            let due_in = sqlx::query_scalar!(
                r#"SELECT EXTRACT(EPOCH FROM min(run_at) - now())::float8 AS "secs"
                   FROM apalis.jobs
                   WHERE job_type = $1 AND run_at >= now()
                     AND (status = 'Pending' OR (status = 'Failed' AND attempts < max_attempts))"#,
                self.queue()
            )
            .fetch_one(&mut *tx)
            .await?;
            if let Some(secs) = due_in {
                let wait = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
                self.fetcher
                    .due_in(wait.min(self.engine.settings.queue_poll) + DUE_MARGIN);
            }
        }
        if !ids.is_empty() {
            sqlx::query!(
                "UPDATE apalis.jobs j
                 SET status = 'Killed', done_at = now(),
                     last_result = jsonb_build_object('Err', $4 || u.reason)
                 FROM unnest($1::text[], $2::text[]) AS u(id, reason)
                 WHERE j.id = u.id AND j.lock_by = $3",
                &ids,
                &reasons,
                worker.name(),
                UNREADABLE
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        for (id, reason) in ids.iter().zip(&reasons) {
            tracing::error!(job = %id, %reason, "{UNREADABLE}set aside (status Killed)");
        }
        Ok(readable)
    }
}

impl Persistence for ChainStorage {
    type Compact = Value;
    type Response = Value;
    type Error = Error;

    async fn register(&mut self, worker: &WorkerContext) -> Result<(), Error> {
        let restarted = worker.restarts() > 0;
        if restarted {
            // Whatever failed the last worker may fail this one: never a hot loop.
            let pause = self.fetcher.restart_pause();
            tokio::select! {
                _ = self.engine.shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
        let dead_for = self.config.orphaned_duration().as_secs();
        let this = &*self;
        let released = this
            .through_outages(|| async move {
                // Rows apalis cannot read would fail this worker's first fetch too.
                set_aside_unreadable(&this.engine.pool).await?;
                let mut tx = this.engine.pool.begin().await?;
                // The failed worker's tasks were dropped with it: put its jobs back, same
                // ids, no attempt counted (a job resumes its run as after a crash).
                let released = if restarted {
                    sqlx::query_scalar!(
                        "UPDATE apalis.jobs
                         SET status = 'Pending', lock_by = NULL, lock_at = NULL,
                             attempts = LEAST(attempts, $3)
                         WHERE job_type = $1 AND lock_by = $2 AND status IN ('Queued', 'Running')
                         RETURNING id",
                        this.queue(),
                        worker.name(),
                        CHAIN_JOB_MAX_ATTEMPTS as i32 - 1
                    )
                    .fetch_all(&mut *tx)
                    .await?
                } else {
                    Vec::new()
                };
                queries::reenqueue_orphaned(&mut *tx, this.queue(), dead_for).await?;
                // apalis' own registration refuses a name registered before unless it runs
                // on the pooled connection that took its session advisory lock; worker names
                // are unique per process here, so a restart simply registers again.
                sqlx::query!(
                    "INSERT INTO apalis.workers (id, worker_type, storage_name, layers, last_seen)
                     VALUES ($1, $2, $3, $4, now())
                     ON CONFLICT (id) DO UPDATE
                     SET worker_type = EXCLUDED.worker_type, storage_name = EXCLUDED.storage_name,
                         layers = EXCLUDED.layers, last_seen = now()",
                    worker.name(),
                    this.queue(),
                    STORAGE_NAME,
                    worker.get_service()
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(released)
            })
            .await?;
        self.fetcher.registered();
        for id in &released {
            tracing::warn!(task = %id, "job of the failed queue worker put back in the queue");
        }
        Ok(())
    }

    async fn heartbeat(&mut self, worker: &WorkerContext) -> Result<(), Error> {
        let dead_for = self.config.orphaned_duration().as_secs();
        let beat = async {
            let mut tx = self.engine.pool.begin().await?;
            queries::keep_alive(&mut *tx, self.queue(), worker).await?;
            queries::reenqueue_orphaned(&mut *tx, self.queue(), dead_for).await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        }
        .await;
        match beat {
            // The next beat will do; the worker lives on through the outage.
            Err(Error::Database(e)) if is_outage(&e) => {
                self.engine.health.failed(&e);
                Ok(())
            }
            other => other,
        }
    }

    async fn fetch_next(&mut self, worker: &WorkerContext) -> Result<Vec<Task<Value>>, Error> {
        let fetch = self.fetcher.fetch_started();
        let mut fetched = self.fetch_once(worker).await;
        // A row apalis cannot read failed the whole batch: set such rows aside, then fetch
        // again, as long as each sweep finds some (rows inserted meanwhile may be others).
        // A failure no row was set aside for ends the worker (it restarts after a pause).
        while let Err(e) = &fetched
            && !matches!(e, Error::Database(db) if is_outage(db))
        {
            match set_aside_unreadable(&self.engine.pool).await {
                Ok(set_aside) if set_aside.is_empty() => break,
                Ok(_) => fetched = self.fetch_once(worker).await,
                Err(e) => {
                    fetched = Err(e.into());
                    break;
                }
            }
        }
        let tasks = match fetched {
            Ok(tasks) => {
                self.engine.health.ok();
                tasks
            }
            // Nothing fetched; the listener rings when it is subscribed again, and the poll
            // tries anyway. The fetch counts as answered, or it would be retried at once.
            Err(Error::Database(e)) if is_outage(&e) => {
                self.engine.health.failed(&e);
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        fetch.answered();
        Ok(tasks)
    }

    async fn handle_events(
        &mut self,
        events: Vec<TaskEvent<Value>>,
        worker: &WorkerContext,
    ) -> Result<(), Error> {
        // As apalis-postgres does: completions acknowledged, the other locks taken; here
        // retried through an outage, so no acknowledgement is lost to one.
        let acks: Vec<&queries::ResultPayload> = events
            .iter()
            .filter_map(|e| match e {
                TaskEvent::Complete(result) => Some(result),
                _ => None,
            })
            .collect();
        let acked: HashSet<String> = acks.iter().map(|r| r.task_id.to_string()).collect();
        let locks: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                TaskEvent::Lock { task_id } => Some(task_id.to_string()),
                _ => None,
            })
            .filter(|id| !acked.contains(id))
            .collect();
        if acks.is_empty() && locks.is_empty() {
            return Ok(());
        }
        let (this, acks, locks) = (&*self, &acks, &locks);
        this.through_outages(|| async move {
            let mut tx = this.engine.pool.begin().await?;
            if !acks.is_empty() {
                queries::handle_results(&mut *tx, acks, worker.name()).await?;
            }
            if !locks.is_empty() {
                queries::lock_tasks(&mut *tx, locks, worker.name()).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn reenqueue_abandoned(
        &mut self,
        tasks: Vec<Task<Value>>,
        worker: &WorkerContext,
    ) -> Result<u64, Error> {
        let ids: Vec<String> = tasks
            .iter()
            .filter_map(|t| t.task_id().map(|id| id.to_string()))
            .collect();
        let mut tx = self.engine.pool.begin().await?;
        let n = queries::reenqueue_abandoned(&mut *tx, self.queue(), worker.name(), &ids).await?;
        if n as usize != tasks.len() {
            return Err(Error::ReenqueueMismatch {
                queued: tasks.len(),
                abandoned: n as usize,
            });
        }
        tx.commit().await?;
        Ok(n)
    }

    async fn push_tasks(&mut self, tasks: Vec<Task<Value>>) -> Result<(), Error> {
        let tasks = tasks
            .into_iter()
            .map(|t| t.map_args(|v| serde_json::to_vec(&v).expect("a JSON value serialises")))
            .collect();
        let mut tx = self.engine.pool.begin().await?;
        queries::push_tasks(&mut *tx, self.queue(), tasks).await?;
        tx.commit().await?;
        Ok(())
    }
}
