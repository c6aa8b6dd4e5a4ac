//! The dispatcher: a loop in every worker process, woken by NOTIFY (deliveries inserted, a
//! run finished) and by a timer set for the next moment something falls due. Each pass starts a run, with its first chain job in
//! the same transaction, for every enabled rule that has due deliveries and no active run,
//! unless its connection's circuit is open. An open circuit whose cooldown has passed gets
//! one probing run (half-open). A paused rule, or a rule on a paused connection, gets no
//! run (resuming one sends the same NOTIFY). Rules of a connection blocked by a 429 are skipped until the
//! block lapses. It reads each table through its owner (`breaker`, `catalog`, `ledger`,
//! `blocks`) and starts runs through `runs`.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::{
    breaker, catalog,
    engine::Engine,
    ledger,
    ratelimit::blocks,
    runs::{self, WAKE_CHANNEL},
};

/// Starts runs for due rules.
pub struct Dispatcher<'a> {
    /// Shared process state.
    engine: &'a Engine,
}

impl<'a> Dispatcher<'a> {
    /// A dispatcher over `engine`.
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    /// One pass: the erasure gate's look at the deliveries enqueued since its last (those
    /// naming an erased person suppressed and emptied at once, whichever door they came
    /// through), then the runs; returns how many runs it started.
    pub async fn run_once(&self) -> Result<usize, sqlx::Error> {
        let now = self.engine.clock.now();
        crate::erasure::gate::sweep_new(self.engine, now).await?;
        Ok(self.start_closed(now).await? + self.start_probes(now).await?)
    }

    /// Rules on connections whose circuit is closed: all due ones in one transaction.
    async fn start_closed(&self, now: DateTime<Utc>) -> Result<usize, sqlx::Error> {
        let mut tx = self.engine.pool.begin().await?;
        let connections = breaker::closed(&mut *tx, now).await?;
        let rule_ids = catalog::startable_rules(&mut *tx, &connections, now).await?;
        if rule_ids.is_empty() {
            return Ok(0);
        }
        let started = runs::start(&mut tx, &rule_ids, &self.engine.worker_name, now).await?;
        tx.commit().await?;
        // One line per pass, at debug: a pass that starts thousands of runs would otherwise
        // spend more on its log than on its statements, and "run finished" is a run's one
        // line at info.
        tracing::debug!(runs = started.len(), "runs started");
        Ok(started.len())
    }

    /// Connections whose open circuit has cooled down (or whose probe ended without an
    /// answer): one run of one startable rule probes each (a rule whose own budget is
    /// blocked is not startable, whatever its connection's budget says).
    async fn start_probes(&self, now: DateTime<Utc>) -> Result<usize, sqlx::Error> {
        let pool = &self.engine.pool;
        let connections = breaker::wanting_probe(pool, now).await?;
        if connections.is_empty() {
            return Ok(0);
        }
        let candidates = catalog::first_startable_rules(pool, &connections, now).await?;
        let mut started = 0;
        for (connection_id, rule_id) in candidates {
            let mut tx = pool.begin().await?;
            let run = runs::start(&mut tx, &[rule_id], &self.engine.worker_name, now).await?;
            let Some(run_id) = run.first().map(|s| s.run_id) else {
                continue;
            };
            if !breaker::start_probe(&mut *tx, connection_id, run_id, now).await? {
                // Another process started the probe first.
                tx.rollback().await?;
                continue;
            }
            tx.commit().await?;
            tracing::info!(
                run = run_id,
                rule = rule_id,
                connection = connection_id,
                "probe run started (half-open)"
            );
            started += 1;
        }
        Ok(started)
    }

    /// The earliest moment after now at which something may become startable by time
    /// alone: a pending delivery falling due, a rate-limit block lapsing, an open circuit
    /// cooling down, a connection or rule no longer left alone. Everything else (new
    /// deliveries, finished runs) arrives by NOTIFY.
    pub async fn next_due(&self) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let now = self.engine.clock.now();
        let pool = &self.engine.pool;
        let times = [
            ledger::next_due(pool, now).await?,
            blocks::next_lapse(pool, now).await?,
            breaker::next_change(pool, now).await?,
            catalog::next_usable(pool, now).await?,
        ];
        Ok(times.into_iter().flatten().min())
    }

    /// Runs passes until `shutdown`: on every notification, and otherwise when the next
    /// thing falls due (at the latest every `dispatch_interval`). An idle or blocked
    /// system costs no polling.
    /// Fails only when it cannot start (its LISTEN connection).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.engine.pool).await?;
        listener.listen(WAKE_CHANNEL).await?;
        let max_sleep = self.engine.settings.dispatch_interval;
        loop {
            let sleep = match self.pass().await {
                Some(at) => (at - self.engine.clock.now())
                    .to_std()
                    .unwrap_or_default()
                    .min(max_sleep),
                None => max_sleep,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                n = listener.recv() => {
                    if let Err(e) = n {
                        // recv reconnects on its next call; while the database is away,
                        // try once a second rather than in a hot loop.
                        crate::maintenance::failed(&self.engine.health, "dispatcher LISTEN", &e);
                        tokio::select! {
                            _ = shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        }
                    }
                    // A burst of notifications (thousands of runs finishing) is one pass.
                    while listener.next_buffered().is_some() {}
                }
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// One pass and the time of the next one due; errors are logged, not fatal.
    async fn pass(&self) -> Option<DateTime<Utc>> {
        let health = &self.engine.health;
        if let Err(e) = self.run_once().await {
            crate::maintenance::failed(health, "dispatch", &e);
            return None;
        }
        match self.next_due().await {
            Ok(at) => at,
            Err(e) => {
                crate::maintenance::failed(health, "dispatcher's next-due", &e);
                None
            }
        }
    }
}
