//! The pruner: forgets per-budget call counts (table `budget_calls`) older than
//! [`KEEP_CALLS`] (they only serve "calls in the last minute" in `courier status`), and
//! the heartbeats of processes dead for as long.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::Engine;

/// How long call counts, and the rows of dead processes, are kept.
pub const KEEP_CALLS: Duration = Duration::from_secs(3600);
/// How often the pruner runs.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Deletes old call counts and the rows of long-dead processes.
pub struct Pruner<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Pruner<'a> {
    /// A pruner over `engine`.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// One pass; returns how many rows it deleted.
    pub async fn run_once(&self) -> Result<u64, sqlx::Error> {
        let before =
            self.engine.clock.now() - chrono::Duration::from_std(KEEP_CALLS).expect("fits");
        let calls = crate::ratelimit::report::prune_calls(&self.engine.pool, before).await?;
        let workers = crate::workers::forget_dead(&self.engine.pool, before).await?;
        Ok(calls + workers)
    }

    /// Runs passes every [`PRUNE_EVERY`] until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        super::every("pruner", PRUNE_EVERY, &self.engine.health, shutdown, || {
            self.run_once()
        })
        .await;
    }
}
