//! The table `workers`, owned here: a row per live worker process, beaten a few times per
//! `worker_dead_after` window by its [heartbeat](crate::maintenance::heartbeat). The
//! [rescuer](crate::maintenance::rescuer) takes a process whose beat has lapsed for dead.
//! The row also says where the process serves its metrics and dashboard (`http_addr`), for
//! `courier status`. A process that stops cleanly (or fails once it has beaten) removes its
//! row.

use chrono::{DateTime, Utc};
use serde::Serialize;

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

/// Writes process `name`'s beat at `now` (its row, made on the first beat), with where it
/// serves HTTP and how far its wall clock is off the database's.
pub async fn beat(
    db: impl sqlx::PgExecutor<'_>,
    name: &str,
    now: DateTime<Utc>,
    http_addr: Option<String>,
    clock_offset_ms: Option<f64>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO workers (name, started_at, heartbeat_at, http_addr, clock_offset_ms)
         VALUES ($1, $2, $2, $3, $4)
         ON CONFLICT (name) DO UPDATE
             SET heartbeat_at = EXCLUDED.heartbeat_at, clock_offset_ms = EXCLUDED.clock_offset_ms",
        name,
        now,
        http_addr,
        clock_offset_ms
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Removes process `name`'s row (it stops).
pub async fn remove(db: impl sqlx::PgExecutor<'_>, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query!("DELETE FROM workers WHERE name = $1", name)
        .execute(db)
        .await?;
    Ok(())
}

/// Removes the rows of processes whose last beat is older than `before` (the pruner's
/// pass: by then the rescuer has long taken their work over). Returns how many.
pub async fn forget_dead(
    db: impl sqlx::PgExecutor<'_>,
    before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let gone = sqlx::query!("DELETE FROM workers WHERE heartbeat_at < $1", before)
        .execute(db)
        .await?;
    Ok(gone.rows_affected())
}

/// Notes the database role of process `worker`'s sessions (its queue listener's, as
/// `application_name` names it), by which the rescuer finds whether a session of it is
/// still connected.
pub async fn note_session_role(
    db: impl sqlx::PgExecutor<'_>,
    worker: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE workers SET session_role = current_user WHERE name = $1",
        worker
    )
    .execute(db)
    .await?;
    Ok(())
}
