//! The quarantine: rows of the chain queue apalis cannot read (an id that is not a ULID, a
//! payload that is not UTF-8 JSON, and the like: SQL function `courier_job_unreadable`)
//! are set aside once, status `Killed` with the reason in `last_result`, and logged once,
//! instead of failing every batch they are fetched in and the worker with it, in a loop.
//!
//! The queue worker sets such rows aside itself when a fetch meets one, and before it
//! starts or restarts ([`ChainStorage`](crate::queue::backend::ChainStorage)); this loop
//! also finds the ones no fetch has met yet (scheduled for later, or failed).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{
    engine::Engine,
    queue::{self, SetAside},
};

/// How often the whole chain queue is looked over.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Sets aside the chain queue's unreadable rows.
pub struct Quarantine<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Quarantine<'a> {
    /// A quarantine over `engine`'s queue.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// One sweep, one statement; returns the rows set aside (each logged once).
    pub async fn run_once(&self) -> Result<Vec<SetAside>, sqlx::Error> {
        queue::set_aside_unreadable(&self.engine.pool).await
    }

    /// Sweeps every [`SWEEP_EVERY`] until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        super::every(
            "quarantine",
            SWEEP_EVERY,
            &self.engine.health,
            shutdown,
            || self.run_once(),
        )
        .await;
    }
}
