//! The process heartbeat (table `workers`, owned here): every worker process writes its
//! beat a few times per `worker_dead_after` window. The [rescuer](super::rescuer) takes a
//! process whose beat has lapsed for dead. The row also says where the process serves its
//! metrics and dashboard (`http_addr`), for `courier status`. A process that stops cleanly
//! (or fails once it has beaten) removes its row.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;

/// One live worker process.
#[derive(Debug, Serialize)]
pub struct WorkerLine {
    /// Its unique name (`courier-<host>-<pid>-<random>`).
    pub name: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last beat.
    pub heartbeat_at: DateTime<Utc>,
    /// Where it serves `/metrics` and the dashboard (`None`: nowhere).
    pub http_addr: Option<String>,
    /// How far its host's wall clock is ahead of the database's, in milliseconds
    /// (negative: behind), at its last beat. It keeps time by the database's clock.
    pub clock_offset_ms: Option<f64>,
}

/// The live workers, oldest first: alive by `window` (`COURIER_WORKER_DEAD_AFTER_SECONDS`),
/// or, their session gone, by two beats of it, as the rescuer judges them.
pub async fn live(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
    window: chrono::Duration,
) -> Result<Vec<WorkerLine>, sqlx::Error> {
    let grace = window * 2 / 5;
    sqlx::query_as!(
        WorkerLine,
        r#"SELECT w.name, w.started_at, w.heartbeat_at, w.http_addr, w.clock_offset_ms FROM workers w
           WHERE courier_worker_alive(w, $1, $2) ORDER BY w.started_at, w.name"#,
        now - window,
        now - grace
    )
    .fetch_all(db)
    .await
}

/// Beats for this process.
pub struct Heartbeat<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Heartbeat<'a> {
    /// A heartbeat for `engine`'s process.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// One beat: the database's clock measured, then the beat written by it.
    pub async fn run_once(&self) -> Result<(), sqlx::Error> {
        let beat = self.beat().await;
        match &beat {
            Ok(_) => self.engine.health.ok(),
            Err(e) if crate::health::is_outage(e) => self.engine.health.failed(e),
            Err(_) => {}
        }
        beat
    }

    async fn beat(&self) -> Result<(), sqlx::Error> {
        let offset = self.engine.clock.sync(&self.engine.pool).await?;
        let offset_ms = offset.map(|o| o.wall.as_seconds_f64() * 1000.0);
        sqlx::query!(
            "INSERT INTO workers (name, started_at, heartbeat_at, http_addr, clock_offset_ms)
             VALUES ($1, $2, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE
                 SET heartbeat_at = EXCLUDED.heartbeat_at, clock_offset_ms = EXCLUDED.clock_offset_ms",
            self.engine.worker_name,
            self.engine.clock.now(),
            self.engine.http_addr.get().map(|a| a.to_string()),
            offset_ms
        )
        .execute(&self.engine.pool)
        .await?;
        Ok(())
    }

    /// Removes the rows of processes whose last beat is older than `before` (the pruner's
    /// pass: by then the rescuer has long taken their work over). Returns how many.
    pub async fn forget_dead(
        pool: &sqlx::PgPool,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query!("DELETE FROM workers WHERE heartbeat_at < $1", before)
            .execute(pool)
            .await?;
        Ok(gone.rows_affected())
    }

    /// Notes the database role of process `worker`'s sessions (its queue listener's, as
    /// `application_name` names it), by which the rescuer finds whether a session of it is
    /// still connected.
    pub async fn note_session_role(pool: &sqlx::PgPool, worker: &str) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE workers SET session_role = current_user WHERE name = $1",
            worker
        )
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Beats every `heartbeat_every` until `shutdown`, then removes this process's row.
    pub async fn run(self, shutdown: CancellationToken) {
        let period = self.engine.settings.heartbeat_every();
        super::every("heartbeat", period, &self.engine.health, shutdown, || {
            self.run_once()
        })
        .await;
        let gone = sqlx::query!(
            "DELETE FROM workers WHERE name = $1",
            self.engine.worker_name
        )
        .execute(&self.engine.pool)
        .await;
        if let Err(e) = gone {
            tracing::warn!(error = %e, "could not remove this worker's heartbeat");
        }
    }
}
