//! The reaper: ends runs whose heartbeat went quiet (their process died or lost the
//! database for longer than `chain_stale_after`), freeing their rules for a new run.

use tokio_util::sync::CancellationToken;

use crate::{engine::Engine, runs};

/// Marks runs whose heartbeat is older than `chain_stale_after` as stale.
pub struct Reaper<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Reaper<'a> {
    /// A reaper over `engine`.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// One pass; returns the reaped run ids.
    pub async fn run_once(&self) -> Result<Vec<i64>, sqlx::Error> {
        let now = self.engine.clock.now();
        let cutoff =
            now - chrono::Duration::from_std(self.engine.settings.chain_stale_after).expect("fits");
        let reaped = runs::reap_stale(&self.engine.pool, cutoff, now).await?;
        for id in &reaped {
            tracing::warn!(run = id, "run reaped as stale");
        }
        if !reaped.is_empty() {
            runs::wake(&self.engine.pool).await?;
        }
        Ok(reaped)
    }

    /// Runs passes every `reaper_interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let period = self.engine.settings.reaper_interval;
        super::every("reaper", period, &self.engine.health, shutdown, || {
            self.run_once()
        })
        .await;
    }
}
