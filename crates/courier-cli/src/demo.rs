//! `courier demo`: the end-to-end showcase. On a fresh `courier_demo` database (on the
//! server `DATABASE_URL` points at, or on a private throwaway cluster when nothing answers
//! there and PostgreSQL's server binaries are installed) it starts an in-process User.com
//! target with one workspace limited to 10 requests/s, applies the User.com preset
//! (`presets/usercom.json`: a connection and three of its rules, as customers, consents and
//! price changes), enqueues a burst larger than a
//! minute's budget, runs a worker in-process with live progress, and ends with a summary:
//! every record delivered, none failed, the 429s met and the blocks they set, the rate
//! achieved against the declared one, the records each rule's calls carried. The consents
//! arrive as a bulk import once their customers are in the workspace, and go as mass
//! updates of up to [`CONSENTS_PER_CALL`] custom ids (the preset's rule groups them by
//! attribute and value).
//!
//! Like all tooling, the demo touches courier's tables only through the engine's public
//! functions, each in the module that owns the table (`apply`, `enqueue`, `ledger`,
//! `runs`, `ratelimit::blocks`), and through the SQL users are documented to use
//! (`docs/enqueue-and-ledger.md`); dropping its own database is PostgreSQL's business.

use std::{
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use courier_target::{Target, TargetConfig, WorkspaceConfig};
use sqlx::{Connection, postgres::PgConnectOptions};

use crate::{
    cluster::{Cluster, server_binaries},
    progress::Progress,
};

use courier::{
    apply,
    config::{Settings, redact_url},
    db,
    enqueue::{self, NewDelivery},
    ledger::{self, DeliveryStatus},
    ratelimit::blocks,
    runs,
    worker::{self, Engine},
};

/// The database the demo (re)creates on the configured server.
pub const DEMO_DATABASE: &str = "courier_demo";
/// Records enqueued by default: 50 s of the workspace's budget at 10/s, done in about a
/// minute with the second act's slowdown.
pub const DEFAULT_RECORDS: usize = 500;
/// The demo workspace's limit (requests per second), User.com's default.
pub const DEFAULT_RATE: u32 = 10;
/// The environment variable the demo connection reads its API key from. The demo sets it
/// for itself (to a random token) unless it is already set.
pub const KEY_VAR: &str = "COURIER_DEMO_USERCOM_KEY";
/// The most consent changes one mass update of the demo carries.
pub const CONSENTS_PER_CALL: i32 = 100;
/// The demo workspace's name.
pub const WORKSPACE: &str = "demo";
/// The one command that installs PostgreSQL, printed when there is none.
pub const INSTALL_HINT: &str = "apt-get install -y postgresql";
/// How long the demo waits for PostgreSQL to answer before looking for server binaries.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of `courier demo`.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Deliveries to enqueue, spread over the three rules.
    pub records: usize,
    /// The target workspace's limit in requests per second (the connection declares the
    /// same rate per minute).
    pub rate: u32,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            records: DEFAULT_RECORDS,
            rate: DEFAULT_RATE,
        }
    }
}

/// The demo's rules: name, the User.com preset's rule it is, records per call.
const RULES: [(&str, &str, i32); 3] = [
    ("customers", "usercom-users", 1),
    ("consents", "usercom-attributes", CONSENTS_PER_CALL),
    ("price_changes", "usercom-product-events", 1),
];

/// Runs the demo; returns an error when any delivery did not arrive.
pub async fn run(mut settings: Settings, opts: DemoOptions) -> anyhow::Result<()> {
    anyhow::ensure!(opts.records >= 3, "--records must be at least 3");
    anyhow::ensure!(opts.rate >= 1, "--rate must be at least 1");
    let (server_url, _cluster) = find_server(&settings.database_url).await?;
    settings.database_url = fresh_database(&server_url).await?;
    let pool = db::connect_with(&settings.database_url, &settings.pool()).await?;
    db::migrate(&pool).await?;
    let target = start_target(opts.rate).await?;
    catalog_for(&pool, &target, opts.rate).await?;

    let counts = split(opts.records);
    let [customers, consents, prices] = records(counts);
    let started = Instant::now();
    enqueue::enqueue_many(&pool, "customers", customers).await?;
    enqueue::enqueue_many(&pool, "price_changes", prices).await?;
    println!(
        "enqueued {} deliveries: {} customers (usercom-users), {} price changes \
         (usercom-product-events); {} consents (usercom-attributes) follow as a bulk import \
         once the customers are in; declared rate {}/min",
        counts[0] + counts[2],
        counts[0],
        counts[2],
        counts[1],
        opts.rate * 60
    );

    let engine = Arc::new(Engine::new(pool.clone(), settings));
    worker::cancel_on_signal(engine.shutdown.clone());
    let handle = tokio::spawn(worker::run(engine.clone()));
    let show = Show {
        pool: &pool,
        target: &target,
        engine: &engine,
        opts: &opts,
        counts,
        started,
    };
    show.until_drained(consents).await?;
    engine.shutdown.cancel();
    handle.await??;
    let all_arrived = show.summary().await?;
    pool.close().await;
    anyhow::ensure!(
        all_arrived,
        "not every record arrived exactly once, without a failed outcome or an attempt spent on a 429"
    );
    Ok(())
}

/// Drops and creates the demo's database on `server_url`'s server; returns its URL.
async fn fresh_database(server_url: &str) -> anyhow::Result<String> {
    let server = PgConnectOptions::from_str(server_url)?;
    let admin = sqlx::PgPool::connect_with(server.database("postgres"))
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    let url = crate::database_url(server_url, DEMO_DATABASE);
    println!("demo database: {DEMO_DATABASE} (fresh)");
    db::create_database(&url).await?;
    Ok(url)
}

/// The local User.com target with the demo's workspace at `rate` requests/s; its token
/// is `KEY_VAR`'s, which the demo sets for itself unless it is set.
async fn start_target(rate: u32) -> anyhow::Result<Target> {
    let token = match std::env::var(KEY_VAR) {
        Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
        _ => {
            let token = format!(
                "{:016x}{:016x}",
                rand::random::<u64>(),
                rand::random::<u64>()
            );
            // SAFETY: set before the worker (the only other reader of the environment in
            // this process) starts; nothing else reads or writes the environment meanwhile.
            unsafe { std::env::set_var(KEY_VAR, &token) };
            token
        }
    };
    let mut workspace = WorkspaceConfig::new(WORKSPACE, &token);
    workspace.custom_attributes = Some(
        ["email_consent", "sms_consent"]
            .map(String::from)
            .into_iter()
            .collect(),
    );
    let target = Target::start_with(TargetConfig {
        workspaces: vec![workspace],
        rate,
        ..TargetConfig::default()
    })
    .await?;
    println!(
        "local User.com target: workspace {WORKSPACE:?} at {} ({rate} requests/s, fixed window)",
        target.workspace_url(WORKSPACE),
    );
    Ok(target)
}

/// The User.com preset's connection (pointed at the demo's workspace, declaring `rate`
/// per second as requests per minute in place of the preset's limits) and its [`RULES`],
/// applied as one catalog file.
async fn catalog_for(pool: &sqlx::PgPool, target: &Target, rate: u32) -> anyhow::Result<()> {
    let preset = courier::presets::find("usercom").map_err(anyhow::Error::msg)?;
    let mut connection = preset.connection(&serde_json::json!({
        "name": "demo-usercom",
        "base_url": target.workspace_url(WORKSPACE),
        "api_key_env": KEY_VAR,
        "requests_per_minute": rate * 60,
        "max_in_flight": rate.clamp(1, 16),
        "timeout_ms": 5_000,
    }));
    connection.remove("limits");
    let rules = RULES
        .iter()
        .map(|(name, rule, per_call)| {
            let over = serde_json::json!({"name": name, "connection": "demo-usercom",
                                          "batch_size": 50, "records_per_call": per_call});
            preset.rule(Some(rule), &over).map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let file = serde_json::json!({"connections": [connection], "rules": rules});
    apply::apply_file(pool, &file.to_string(), Default::default()).await?;
    Ok(())
}

/// The demo's records, `counts` of each: customers, their consent changes (one attribute
/// each, the shape a mass update carries; each after its customer), price changes.
fn records(counts: [usize; 3]) -> [Vec<NewDelivery>; 3] {
    let customers = (0..counts[0])
        .map(|k| {
            NewDelivery::new(
                format!("customer:{k}"),
                serde_json::json!({
                    "custom_id": format!("c{k}"),
                    "email": format!("customer{k}@example.com"),
                    "first_name": "Demo",
                    "last_name": format!("Customer {k}"),
                    "email_consent": k % 2 == 0,
                    "unsubscribed": false,
                }),
            )
        })
        .collect();
    let consents = (0..counts[1])
        .map(|k| NewDelivery {
            depends_on: Some(format!("customer:{k}")),
            ..NewDelivery::new(
                format!("consent:{k}"),
                serde_json::json!({
                    "custom_id": format!("c{k}"),
                    "attributes": {"sms_consent": k % 3 == 0},
                }),
            )
        })
        .collect();
    let prices = (0..counts[2])
        .map(|k| {
            NewDelivery::new(
                format!("price:{k}"),
                serde_json::json!({
                    "product_custom_id": format!("sku-{k}"),
                    "user_custom_id": "c0",
                    "event_type": "view",
                    "data": {"price": 10.0 + (k % 90) as f64, "currency": "EUR", "stock": k % 7},
                }),
            )
        })
        .collect();
    [customers, consents, prices]
}

/// What the demo shows while and after the worker delivers.
struct Show<'a> {
    pool: &'a sqlx::PgPool,
    target: &'a Target,
    engine: &'a Engine,
    opts: &'a DemoOptions,
    /// Customers, consents and price changes.
    counts: [usize; 3],
    /// When the first records were enqueued.
    started: Instant,
}

impl Show<'_> {
    /// Live progress until nothing is pending (or the worker stops); the consents are
    /// enqueued once every customer is delivered.
    async fn until_drained(&self, consents: Vec<NewDelivery>) -> anyhow::Result<()> {
        let mut consents = Some(consents);
        let progress = Progress::new(self.opts.records as u64);
        let mut watch = Watch::default();
        let mut rival = Rival::new(self.opts.rate, self.opts.records);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut last = (Instant::now(), 0u64);
        let mut rate = 0.0;
        let mut next_line = Duration::ZERO;
        let mut delivered = 0;
        loop {
            tick.tick().await;
            let elapsed = self.started.elapsed();
            if let Some(line) = rival.step(self.target, delivered, elapsed) {
                progress.event(&line);
            }
            for line in watch.events(self.pool).await? {
                progress.event(&line);
            }
            let row = Tick::read(self.pool).await?;
            // The current rate is the target's view: calls per second over the last second.
            let now = Instant::now();
            let counters = self.target.counters();
            if now - last.0 >= Duration::from_secs(1) {
                rate = (counters.requests - last.1) as f64 / (now - last.0).as_secs_f64();
                last = (now, counters.requests);
            }
            delivered = row.delivered;
            if row.customers as usize == self.counts[0]
                && let Some(import) = consents.take()
            {
                enqueue::enqueue_many(self.pool, "consents", import).await?;
                progress.event(&format!(
                    "a bulk consent import arrives: {} consent changes, sent as mass updates \
                     of up to {CONSENTS_PER_CALL} custom ids per call",
                    self.counts[1]
                ));
                continue;
            }
            let done =
                (row.pending == 0 && consents.is_none()) || self.engine.shutdown.is_cancelled();
            // Piped output gets a plain line a second (and the last one).
            if progress.is_live() || elapsed >= next_line || done {
                next_line = elapsed + Duration::from_secs(1);
                let message = format!(
                    "pending {}  failed {}  runs waiting {} throttled {}  429s met {}  calls {rate:.1}/s",
                    row.pending, row.failed, row.waiting, row.throttled, counters.throttled
                );
                progress.update(row.delivered as u64, &message, || {
                    format!(
                        "[{:5.1}s] delivered {:>6}  {message}",
                        elapsed.as_secs_f64(),
                        row.delivered
                    )
                });
            }
            if done {
                progress.finish();
                return Ok(());
            }
        }
    }

    /// Prints the summary; returns whether every record arrived exactly once, with no
    /// failed outcome and no attempt spent on a 429.
    async fn summary(&self) -> anyhow::Result<bool> {
        let elapsed = self.started.elapsed().as_secs_f64();
        let summary = Summary::read(self.pool).await?;
        let counters = self.target.counters();
        let ws = counters
            .workspaces
            .get(WORKSPACE)
            .cloned()
            .unwrap_or_default();
        let arrived = arrived(&ws);
        let per_call = self.records_per_call().await?;
        let rate = self.opts.rate;
        let last_block = summary
            .blocked_until
            .map(|t| format!(" (last block until {})", t.format("%H:%M:%S%.3f")))
            .unwrap_or_default();
        println!("\nsummary");
        println!(
            "  delivered            {} of {} ({} customers, {} consents, {} price changes arrived)",
            summary.delivered, self.opts.records, arrived[0], arrived[1], arrived[2]
        );
        println!(
            "  failed outcomes      {} (ledger rows with 429: {}; a 429 is not an outcome)",
            summary.failed, summary.ledger_429s
        );
        println!(
            "  duplicates           {} (accepted writes beyond the first per record key)",
            ws.duplicates
        );
        println!(
            "  attempts on 429s     {} (attempts counted beyond the calls with an outcome)",
            summary.attempts_on_429s
        );
        println!(
            "  429s met             {} of {} requests; connection blocks: {} row(s){last_block}, throttled runs: {}",
            ws.throttled, ws.requests, summary.blocks, summary.throttled_runs
        );
        println!(
            "  rate                 {:.1} deliveries/s achieved vs {rate} declared ({}/min); \
             the target saw at most {} requests in any second, {} in any minute",
            summary.delivered as f64 / elapsed,
            rate * 60,
            ws.peak_per_second,
            ws.peak_per_minute
        );
        println!("  records per call     {per_call}");
        println!("  most calls at once   {}", counters.max_in_flight);
        println!("  elapsed              {elapsed:.1}s");
        Ok(summary.delivered as usize == self.opts.records
            && summary.failed == 0
            && arrived == self.counts
            && ws.duplicates == 0
            && summary.attempts_on_429s == 0)
    }

    /// Each rule's records per call, from the worker's own metrics exposition.
    async fn records_per_call(&self) -> anyhow::Result<String> {
        let now = chrono::Utc::now();
        let exposition =
            courier::metrics::scrape::render(&self.engine.metrics, self.pool, now).await?;
        Ok(RULES
            .map(|(rule, _, _)| {
                let (records, calls) = records_per_call(&exposition, rule);
                format!(
                    "{rule} {:.1} ({records:.0} in {calls:.0} calls)",
                    records / calls.max(1.0)
                )
            })
            .join(", "))
    }
}

/// The records of each kind that arrived in the workspace: customers, consents (single
/// or mass updates), price changes.
fn arrived(ws: &courier_target::WorkspaceCounters) -> [usize; 3] {
    let kinds: [&[&str]; 3] = [
        &["user:"],
        &["user_attributes:", "mass_update:"],
        &["product_event:"],
    ];
    kinds.map(|p| {
        ws.accepted
            .keys()
            .filter(|k| p.iter().any(|p| k.starts_with(p)))
            .count()
    })
}

/// Runs in `status`, of `by_status` ([`runs::count_by_status`]).
fn runs_in(by_status: &[(String, i64)], status: &str) -> i64 {
    (by_status.iter().filter(|(s, _)| s == status))
        .map(|(_, n)| n)
        .sum()
}

/// One look at the demo's database while it runs.
struct Tick {
    pending: i64,
    delivered: i64,
    /// Customers delivered (rule `customers`).
    customers: i64,
    failed: i64,
    waiting: i64,
    throttled: i64,
}

impl Tick {
    async fn read(pool: &sqlx::PgPool) -> Result<Self, sqlx::Error> {
        let counts = ledger::status_counts(pool).await?;
        let runs = runs::count_by_status(pool).await?;
        Ok(Tick {
            pending: counts.total(&[DeliveryStatus::Pending]),
            delivered: counts.total(&[DeliveryStatus::Delivered]),
            customers: counts.of_rule("customers", &[DeliveryStatus::Delivered]),
            failed: counts.total(&[DeliveryStatus::Rejected, DeliveryStatus::Exhausted]),
            waiting: runs_in(&runs, "waiting"),
            throttled: runs_in(&runs, "throttled"),
        })
    }
}

/// What the summary reads from the database once the worker has stopped.
struct Summary {
    delivered: i64,
    /// Ledger rows of a failure.
    failed: i64,
    /// Ledger rows of a call answered 429.
    ledger_429s: i64,
    /// Attempts counted beyond the calls with an outcome.
    attempts_on_429s: i64,
    /// Blocks set (one row per budget, its latest).
    blocks: usize,
    /// The end of the latest block.
    blocked_until: Option<chrono::DateTime<chrono::Utc>>,
    throttled_runs: i64,
}

impl Summary {
    async fn read(pool: &sqlx::PgPool) -> Result<Self, sqlx::Error> {
        let totals = ledger::totals(pool).await?;
        let blocks = blocks::set_since(pool, None).await?;
        let runs = runs::count_by_status(pool).await?;
        Ok(Summary {
            delivered: totals.delivered,
            failed: totals.failures,
            ledger_429s: totals.answered_429,
            attempts_on_429s: totals.attempts_without_outcome,
            blocks: blocks.len(),
            blocked_until: blocks.iter().map(|b| b.blocked_until).max(),
            throttled_runs: runs_in(&runs, "throttled"),
        })
    }
}

/// The records and calls of `rule` in a Prometheus exposition's
/// `courier_records_per_call` histogram (its `_sum` and `_count`).
fn records_per_call(exposition: &str, rule: &str) -> (f64, f64) {
    let value = |series: &str| {
        let name = format!("courier_records_per_call_{series}{{rule=\"{rule}\"}} ");
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(&name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

/// Splits `records` over the three rules (customers get the remainder, so every consent
/// has its customer).
fn split(records: usize) -> [usize; 3] {
    let third = records / 3;
    [records - 2 * third, third, third]
}

/// Finds a PostgreSQL server: the one at `database_url`, else a private throwaway cluster
/// when the server binaries are installed. Returns the server's URL (database part kept)
/// and the cluster, which is stopped and removed when dropped.
async fn find_server(database_url: &str) -> anyhow::Result<(String, Option<Cluster>)> {
    let opts = PgConnectOptions::from_str(database_url)
        .with_context(|| format!("DATABASE_URL {} is not a URL", redact_url(database_url)))?;
    let attempt = tokio::time::timeout(
        CONNECT_TIMEOUT,
        sqlx::PgConnection::connect_with(&opts.database("postgres")),
    )
    .await;
    match attempt {
        Ok(Ok(conn)) => {
            conn.close().await.ok();
            return Ok((database_url.to_owned(), None));
        }
        Ok(Err(sqlx::Error::Io(_))) | Err(_) => {}
        Ok(Err(e)) => {
            return Err(e).with_context(|| {
                format!("connecting to PostgreSQL at {}", redact_url(database_url))
            });
        }
    }
    let Some(bin) = server_binaries() else {
        anyhow::bail!(
            "nothing answers at {} and PostgreSQL's server binaries are not installed; \
             install PostgreSQL with:\n\n    {INSTALL_HINT}\n",
            redact_url(database_url)
        );
    };
    println!(
        "nothing answers at {}; starting a private throwaway PostgreSQL cluster ({})",
        redact_url(database_url),
        bin.display()
    );
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(&bin)).await??;
    println!(
        "private cluster in {} on 127.0.0.1:{} (stopped and removed on exit)",
        cluster.dir.display(),
        cluster.port
    );
    Ok((cluster.url(), Some(cluster)))
}

/// What the demo has shown of blocks and waiting runs, to print each change once.
#[derive(Default)]
struct Watch {
    /// The newest block's `set_at` printed so far.
    block_seen: Option<chrono::DateTime<chrono::Utc>>,
    /// Runs seen waiting, by id.
    waiting: std::collections::BTreeSet<i64>,
}

impl Watch {
    /// Lines for the blocks set and the runs that started or stopped waiting since the
    /// last call.
    async fn events(&mut self, pool: &sqlx::PgPool) -> anyhow::Result<Vec<String>> {
        let mut lines = Vec::new();
        for b in blocks::set_since(pool, self.block_seen).await? {
            self.block_seen = Some(b.set_at);
            lines.push(format!(
                "429 met: connection {} blocked until {} (retry-after {:?}, met by rule {}); \
                 no attempt spent, no failure recorded",
                b.connection.as_deref().unwrap_or("?"),
                b.blocked_until.format("%H:%M:%S%.3f"),
                b.retry_after_raw.as_deref().unwrap_or(""),
                b.rule.as_deref().unwrap_or("?"),
            ));
        }
        let seen: Vec<i64> = self.waiting.iter().copied().collect();
        for r in runs::waits(pool, &seen).await? {
            let was = self.waiting.contains(&r.id);
            match (was, r.status.as_str()) {
                (false, "waiting") => {
                    self.waiting.insert(r.id);
                    lines.push(format!(
                        "run {} ({}) waiting{}",
                        r.id,
                        r.rule,
                        r.resume_at
                            .map(|t| format!(" until {}", t.format("%H:%M:%S%.3f")))
                            .unwrap_or_default()
                    ));
                }
                (true, "waiting") => {}
                (true, status) => {
                    self.waiting.remove(&r.id);
                    lines.push(match status {
                        "running" => format!("run {} ({}) resumed", r.id, r.rule),
                        _ => format!("run {} ({}) ended {status}", r.id, r.rule),
                    });
                }
                (false, _) => {}
            }
        }
        Ok(lines)
    }
}

/// The demo's second act: once half the records are delivered, another client starts
/// using the workspace, so the target lets courier have only half its rate for
/// [`Rival::LASTS`]; courier meets 429s, blocks the connection, waits, learns the lower
/// rate and finds the full one again when the other client is done.
struct Rival {
    /// The workspace's full rate and the share left while the other client runs.
    rate: u32,
    /// Delivered records at which the other client starts.
    from: i64,
    /// When it started, once it has.
    started: Option<Duration>,
    /// Whether it is done.
    done: bool,
}

impl Rival {
    /// How long the other client uses the workspace.
    const LASTS: Duration = Duration::from_secs(8);

    fn new(rate: u32, records: usize) -> Self {
        Self {
            rate,
            from: (records / 2) as i64,
            started: None,
            done: rate < 2,
        }
    }

    /// Starts or ends the other client's use; the line saying so, if it did.
    fn step(&mut self, target: &Target, delivered: i64, elapsed: Duration) -> Option<String> {
        match self.started {
            _ if self.done => None,
            None if delivered >= self.from => {
                self.started = Some(elapsed);
                let left = self.rate / 2;
                target.set_limit(Some(WORKSPACE), left);
                Some(format!(
                    "another client starts using workspace {WORKSPACE:?}: the target now lets \
                     courier have {left} requests/s of its {}; courier still declares {}/min",
                    self.rate,
                    self.rate * 60
                ))
            }
            Some(at) if elapsed >= at + Self::LASTS => {
                self.done = true;
                target.set_limit(Some(WORKSPACE), self.rate);
                Some(format!(
                    "the other client is done: the target allows {} requests/s again",
                    self.rate
                ))
            }
            _ => None,
        }
    }
}
