//! The shared context of a worker process: the pool, settings, clock, HTTP client, pacer,
//! the in-memory copy of rate-limit blocks, the metrics, the process's unique name and its
//! stop signal.
//! Every other part borrows it; it depends on none of them but the pieces it holds.

use std::{collections::HashMap, sync::Arc};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    config::Settings,
    health::{Health, is_outage},
    invalid::Invalid,
    metrics::Metrics,
    model::{Connection, Rule},
    profile::{self, RuleProfile},
    ratelimit::{blocks::Blocks, pacer::Pacer},
    writer::{self, Writer, WriterConfigError},
};

/// What is made from a stored row (a connection's writer, a rule's profile), kept by the
/// row's id with what it was made from (as JSON): made again once that changes.
struct Kept<V>(std::sync::Mutex<HashMap<i64, (String, V)>>);

impl<V: Clone> Kept<V> {
    /// The value kept for `id` if it was made from `print`, else `make`'s (kept in its
    /// place when made).
    fn get_or_make<E>(
        &self,
        id: i64,
        print: String,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, v)) = kept.get(&id)
            && *seen == print
        {
            return Ok(v.clone());
        }
        let v = make()?;
        kept.insert(id, (print, v.clone()));
        Ok(v)
    }
}

impl<V> Default for Kept<V> {
    fn default() -> Self {
        Self(Default::default())
    }
}

/// What every part of a worker process shares.
pub struct Engine {
    /// The database holding courier's tables and the queue.
    pub pool: PgPool,
    /// Validated settings.
    pub settings: Settings,
    /// Where "now" comes from (manual in tests).
    pub clock: Clock,
    /// One HTTP client (and connection pool) for every writer.
    pub http: reqwest::Client,
    /// Unique per process: owner of rule leases, creator of runs, apalis worker name.
    pub worker_name: String,
    /// Cancelled when the process is asked to stop.
    pub shutdown: CancellationToken,
    /// Request slots per budget, fair between rules, shared with other processes.
    pub pacer: Arc<Pacer>,
    /// Rate-limit blocks per budget key, kept in memory (refreshed by NOTIFY).
    pub blocks: Arc<Blocks>,
    /// Whether the database answers, as this process saw it last.
    pub health: Health,
    /// This process's Prometheus counters (served by the binary at `/metrics`).
    pub metrics: Arc<Metrics>,
    /// Each connection's writer, built once and kept while the connection is unchanged
    /// (by its id: a changed connection's writer, its OAuth token with it, is replaced).
    writers: Kept<Arc<dyn Writer>>,
    /// Each rule's profile, parsed once and kept while what it is parsed from (the rule's
    /// profile columns and its connection's writer) is unchanged.
    profiles: Kept<Result<Arc<RuleProfile>, Invalid>>,
    /// Where this process serves its metrics and dashboard, once the binary has bound the
    /// address (set before the first beat, which records it in the `workers` row so that
    /// `courier status` lists it).
    pub http_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

impl Engine {
    /// Runs `statement` until it succeeds or fails for a reason other than an outage:
    /// while the database cannot be reached, it tries again (backing off to 2 s) for up to
    /// `chain_stale_after`, logging the outage once. A job that keeps its place through a
    /// database restart resumes within a second or two of the database answering.
    pub async fn retry_outage<T, F, Fut>(&self, mut statement: F) -> Result<T, sqlx::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let give_up = tokio::time::Instant::now() + self.settings.chain_stale_after;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            match statement().await {
                Ok(v) => {
                    self.health.ok();
                    return Ok(v);
                }
                Err(e) if is_outage(&e) && tokio::time::Instant::now() < give_up => {
                    self.health.failed(&e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `conn`'s writer: the one built for it while it is unchanged, else a new one (which
    /// replaces the old, and its OAuth token with it).
    pub fn writer(&self, conn: &Connection) -> Result<Arc<dyn Writer>, WriterConfigError> {
        let print = serde_json::to_string(conn).unwrap_or_default();
        self.writers
            .get_or_make(conn.id, print, || writer::build(conn, &self.http))
    }

    /// Rule `rule`'s profile on `connection`: the one parsed while neither changed what it
    /// is parsed from, else parsed anew (replacing the old).
    pub fn profile(
        &self,
        rule: &Rule,
        connection: &Connection,
    ) -> Result<Arc<RuleProfile>, Invalid> {
        let stored = profile::Stored::of(rule, connection);
        // Parsing cannot fail here: a profile that cannot be used is kept with its reason.
        let Ok(parsed) = self
            .profiles
            .get_or_make(rule.id, stored.fingerprint(), || {
                Ok::<_, std::convert::Infallible>(RuleProfile::parse(stored).map(Arc::new))
            });
        parsed
    }

    /// An engine on `pool` with the system clock and a fresh unique worker name.
    pub fn new(pool: PgPool, settings: Settings) -> Self {
        Self::with_clock(pool, settings, Clock::system())
    }

    /// An engine whose notion of "now" comes from `clock` (tests pass a manual one).
    pub fn with_clock(pool: PgPool, settings: Settings, clock: Clock) -> Self {
        let blocks = Arc::new(Blocks::default());
        Self {
            pacer: Arc::new(Pacer::new(pool.clone(), clock.clone(), blocks.clone())),
            blocks,
            health: Health::new(clock.clone()),
            metrics: Arc::new(Metrics::new()),
            http_addr: std::sync::OnceLock::new(),
            writers: Default::default(),
            profiles: Default::default(),
            pool,
            settings,
            clock,
            // No redirect is followed: credentials go only to the origins the operator
            // configured, and a 3xx is an answer of its own (never `delivered`).
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .pool_max_idle_per_host(256)
                .build()
                .expect("reqwest client builds"),
            worker_name: unique_worker_name(),
            shutdown: CancellationToken::new(),
        }
    }
}

/// `courier-<host>-<pid>-<random>`: a restarted process never reuses a dead one's name
/// (apalis would otherwise keep the dead one's jobs "running" forever).
pub fn unique_worker_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!(
        "courier-{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}
