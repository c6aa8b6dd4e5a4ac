//! The process heartbeat: every worker process beats a few times per `worker_dead_after`
//! window into its row of [`workers`](crate::workers), the database's clock measured each
//! time; the row goes when the process stops.

use tokio_util::sync::CancellationToken;

use crate::{engine::Engine, workers};

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
        workers::beat(
            &self.engine.pool,
            &self.engine.worker_name,
            self.engine.clock.now(),
            self.engine.http_addr.get().map(|a| a.to_string()),
            offset.map(|o| o.wall.as_seconds_f64() * 1000.0),
        )
        .await
    }

    /// Beats every `heartbeat_every` until `shutdown`, then removes this process's row.
    pub async fn run(self, shutdown: CancellationToken) {
        let period = self.engine.settings.heartbeat_every();
        super::every("heartbeat", period, &self.engine.health, shutdown, || {
            self.run_once()
        })
        .await;
        let gone = workers::remove(&self.engine.pool, &self.engine.worker_name).await;
        if let Err(e) = gone {
            tracing::warn!(error = %e, "could not remove this worker's heartbeat");
        }
    }
}
