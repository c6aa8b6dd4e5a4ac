//! The rescuer: liveness by process, not by the staleness window. Each pass
//!
//! 1. puts back in the queue every chain job held by a process whose heartbeat has lapsed
//!    (`worker_dead_after`), with its id unchanged, and frees the rule leases such
//!    processes held: the same run resumes in a live process with the same job;
//! 2. gives a new job to every running run whose heartbeat has lapsed while its current
//!    job ended without moving it on (failed during a database outage, killed, lost), or
//!    was fetched by a live process over [`NEVER_STARTED_WINDOWS`] windows ago and never
//!    started: the run's `job_id` names the new job, so the old one can never move the
//!    run again. It locks the rules before the runs, as a chain job's lease statements do.
//!
//! A process is dead when its beat has lapsed for `worker_dead_after`, or sooner, two beats
//! after the session it named for itself (its queue listener's) has gone: a kill -9 closes
//! the socket and the server drops the session at once (`courier_worker_alive`).
//!
//! How far a pass may judge others depends on this process's own view ([`Judgement`]):
//! right after an outage every process looks dead until it beats again, so a process that
//! has been cut off from the database judges nobody until it has reached it for a whole
//! window again. A process that has reached the database ever since it started, for two
//! beats, may already take for dead those whose session is gone (the killed ones): every
//! live process it can see has beaten within that time, so a gone session with a beat
//! older than two beats is evidence of its own; a lapsed beat alone waits for the window.
//! So a fleet whose every process is younger than the window (a rolling restart, a crash
//! loop) still resumes a killed holder's work within seconds.

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::{
    chain::lease,
    engine::Engine,
    queue::{self, CHAIN_JOB_MAX_ATTEMPTS, CHAIN_QUEUE, ChainJob},
    runs,
};

/// A job fetched by a live process and still not started after this many
/// `worker_dead_after` windows was dropped (a queue worker's restart that could not put it
/// back); its run gets a new job.
const NEVER_STARTED_WINDOWS: i32 = 4;

/// What a pass may take for dead, given what this process knows about its own view of
/// the database (see [`Rescuer::judgement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// A process whose beat has lapsed for the window, or whose named session is gone
    /// and whose beat is two beats old; and runs whose job ended without moving them on.
    Full,
    /// Only a process whose named session is gone and whose beat is two beats old (the
    /// evidence a young process can trust); no run is given a new job.
    SessionGone,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rescued {
    /// Jobs of dead processes put back in the queue (apalis ids).
    pub requeued: Vec<String>,
    /// Runs given a new job.
    pub resumed: Vec<i64>,
}

/// Resumes work that dead processes (or failed jobs) left behind.
pub struct Rescuer<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Rescuer<'a> {
    /// A rescuer over `engine`.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// How far this process may judge others now: [`Judgement::Full`] once it has reached
    /// the database for a whole `worker_dead_after` window; [`Judgement::SessionGone`]
    /// once it has reached it for two beats and ever since it started; else not at all
    /// (it was cut off from the database lately, or it has only just started).
    pub fn judgement(&self) -> Option<Judgement> {
        let (health, settings) = (&self.engine.health, &self.engine.settings);
        if health.healthy_for(settings.worker_dead_after) {
            Some(Judgement::Full)
        } else if health.never_cut_off_for(2 * settings.heartbeat_every()) {
            Some(Judgement::SessionGone)
        } else {
            None
        }
    }

    /// One pass with the full judgement (tests call it; [`Rescuer::run`] passes the
    /// judgement this process may make at the time).
    pub async fn run_once(&self) -> Result<Rescued, sqlx::Error> {
        self.run_as(Judgement::Full).await
    }

    /// One pass that takes for dead only what `judgement` allows.
    pub async fn run_as(&self, judgement: Judgement) -> Result<Rescued, sqlx::Error> {
        let now = self.engine.clock.now();
        let window = chrono::Duration::from_std(self.engine.settings.worker_dead_after)
            .expect("a few seconds");
        let cutoff = now - window;
        // A process whose named session is gone is dead once its beat is this old.
        let grace = now
            - chrono::Duration::from_std(2 * self.engine.settings.heartbeat_every())
                .expect("a few seconds");
        let mut tx = self.engine.pool.begin().await?;
        let beat_cutoff = (judgement == Judgement::Full).then_some(cutoff);
        let requeued = requeue_dead(&mut tx, beat_cutoff, grace, now).await?;
        if judgement == Judgement::SessionGone {
            if !requeued.is_empty() {
                queue::wake_fetchers(&mut *tx).await?;
            }
            tx.commit().await?;
            for id in &requeued {
                tracing::warn!(task = %id, "job of a killed worker put back in the queue");
            }
            return Ok(Rescued {
                requeued,
                resumed: Vec::new(),
            });
        }
        let jobs = resume_stalled(&mut tx, cutoff, now, window).await?;
        if !requeued.is_empty() {
            queue::wake_fetchers(&mut *tx).await?;
        }
        tx.commit().await?;
        for id in &requeued {
            tracing::warn!(task = %id, "job of a dead worker put back in the queue");
        }
        let resumed: Vec<i64> = jobs.iter().map(|(j, _)| j.run_id).collect();
        for run in &resumed {
            tracing::warn!(
                run,
                "run resumed with a new job (its job ended without moving it on)"
            );
        }
        Ok(Rescued { requeued, resumed })
    }

    /// What a process that stops cleanly does last, once its queue worker has stopped (no
    /// job runs in it any more): puts back the chain jobs it still holds (fetched but not
    /// started, or cut off by the shutdown timeout) with their ids unchanged and frees its
    /// rule leases, then wakes every fetcher. The next process resumes those runs at once,
    /// instead of after a rescuer's window. Returns the jobs put back.
    pub async fn release_own(&self) -> Result<Vec<String>, sqlx::Error> {
        let engine = self.engine;
        let mut tx = engine.pool.begin().await?;
        lease::release_all_of(&mut *tx, &engine.worker_name).await?;
        let released = sqlx::query_scalar!(
            "UPDATE apalis.jobs SET status = 'Pending', lock_by = NULL, lock_at = NULL,
                    run_at = $3, attempts = LEAST(attempts, $4)
             WHERE job_type = $1 AND lock_by = $2 AND status IN ('Queued', 'Running')
             RETURNING id",
            CHAIN_QUEUE,
            engine.worker_name,
            engine.clock.now(),
            CHAIN_JOB_MAX_ATTEMPTS as i32 - 1
        )
        .fetch_all(&mut *tx)
        .await?;
        if !released.is_empty() {
            queue::wake_fetchers(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(released)
    }

    /// Runs passes every `heartbeat_every` until `shutdown`, each with the judgement this
    /// process may make at the time ([`Rescuer::judgement`]).
    pub async fn run(self, shutdown: CancellationToken) {
        let settings = &self.engine.settings;
        super::every(
            "rescuer",
            settings.heartbeat_every(),
            &self.engine.health,
            shutdown,
            || async {
                if let Some(judgement) = self.judgement() {
                    self.run_as(judgement).await?;
                }
                Ok(())
            },
        )
        .await;
    }
}

/// Puts jobs held by dead processes back in the queue (same id, no attempt counted) and
/// frees the leases those processes held; returns the jobs' ids. Without a `cutoff`, a
/// lapsed beat alone is no proof of death: only a gone session is.
async fn requeue_dead(
    tx: &mut sqlx::PgConnection,
    cutoff: Option<DateTime<Utc>>,
    grace: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    lease::release_of_dead(&mut *tx, cutoff, grace).await?;
    sqlx::query_scalar!(
        "UPDATE apalis.jobs j SET status = 'Pending', lock_by = NULL, lock_at = NULL,
                run_at = $4, attempts = LEAST(attempts, $5)
         WHERE j.job_type = $1 AND j.status IN ('Queued', 'Running')
           AND NOT EXISTS (SELECT 1 FROM workers w
                           WHERE w.name = j.lock_by
                             AND courier_worker_alive(w, COALESCE($2::timestamptz, '-infinity'), $3))
         RETURNING j.id",
        CHAIN_QUEUE,
        cutoff,
        grace,
        now,
        CHAIN_JOB_MAX_ATTEMPTS as i32 - 1
    )
    .fetch_all(&mut *tx)
    .await
}

/// Gives a new chain job to every run whose job ended without moving it on, or was
/// fetched long ago by a process that never started it (inside `tx`); returns the jobs
/// pushed.
async fn resume_stalled(
    tx: &mut sqlx::PgConnection,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    window: chrono::Duration,
) -> Result<Vec<(ChainJob, String)>, sqlx::Error> {
    let stalled = runs::stalled(&mut *tx, cutoff, now - window * NEVER_STARTED_WINDOWS).await?;
    if stalled.is_empty() {
        return Ok(Vec::new());
    }
    let rules: Vec<i64> = stalled.iter().map(|r| r.rule_id).collect();
    lease::lock(&mut *tx, &rules).await?;
    let jobs = runs::move_on(&mut *tx, &stalled, now, cutoff).await?;
    let moved_rules: Vec<i64> = jobs.iter().map(|(j, _)| j.rule_id).collect();
    lease::release_rules(&mut *tx, &moved_rules).await?;
    queue::push(&mut *tx, &jobs).await?;
    Ok(jobs)
}
