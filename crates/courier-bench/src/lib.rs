//! `courier-bench <scenario>`: measured runs of the whole system, against a fresh database
//! on the PostgreSQL server `DATABASE_URL` names and the local [`courier_target`], with
//! `courier worker` processes where a scenario needs them ([`courier_exe`]). Each run
//! prints a table, writes `bench-results/<scenario>.json` and draws
//! `bench-results/<scenario>.svg`: calls per second over time against the declared rate,
//! with 429s and blocks marked. `BENCHMARKS.md` explains every figure.
//!
//! The bench touches courier's tables only through the engine's public functions, each
//! in the module that owns the table (`catalog`, `chain::lease`, `runs`, `ledger`,
//! `workers`, `jobs`, `status`, `maintenance::retention`, `ratelimit::blocks`,
//! `ratelimit::pacer`, `queue::table`), and
//! through the SQL users are documented to use (`docs/enqueue-and-ledger.md`: bulk
//! enqueue by `INSERT INTO deliveries ... SELECT`, reading deliveries and the ledger as
//! shown there); PostgreSQL's own catalog and statistics (`server_version`,
//! `pg_stat_database`, `pg_database_size`, `ANALYZE`) are not courier's tables, and the
//! chaos suite's poison rows and unreadable queue row are fault injection, written behind
//! the owners on purpose in functions that say so (as its post-mortem dump of a failed
//! run reads the raw rows).

mod bulk;
pub mod chaos;
pub mod erasure;
mod fixtures;
pub mod limits;
mod plot;
mod scenarios;
mod sync;

use std::{
    path::PathBuf,
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use serde::Serialize;
use sqlx::{PgPool, postgres::PgConnectOptions};

use courier_target::Target;

use courier::{
    config::Settings,
    db,
    ledger::{self, DeliveryStatus},
    ratelimit::{blocks, pacer},
    runs, status,
};

pub use scenarios::Scenario;

/// How a benchmark run is set up.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The server's URL (any database on it): the bench creates its own database there.
    pub server_url: String,
    /// The database the run (re)creates.
    pub database: String,
    /// Records to enqueue; `None` takes the scenario's default.
    pub records: Option<usize>,
    /// Worker processes for `multi-worker` (`None` takes three) and `chaos` (two).
    pub workers: Option<usize>,
    /// Where the JSON and SVG go; `None` writes nothing.
    pub out_dir: Option<PathBuf>,
    /// Worker settings (concurrency, polls) for in-process and child workers.
    pub settings: Settings,
    /// What `chaos` does (the other scenarios ignore it).
    pub chaos: ChaosKnobs,
    /// Which cells `limits` runs (the other scenarios ignore it).
    pub limits: LimitsKnobs,
}

/// The cells of `courier-bench limits` to run.
#[derive(Clone, Debug, Default)]
pub struct LimitsKnobs {
    /// Limiter kinds (`None`: all).
    pub limiters: Option<Vec<courier_target::Window>>,
    /// Ratios by their file label, `x1` … `x10`, `drop` (`None`: all).
    pub ratios: Option<Vec<String>>,
    /// Rules on the connection, the records spread over them (`None`: one). With several,
    /// every process calls at once.
    pub rules: Option<usize>,
}

/// The knobs of `courier-bench chaos` beyond records and workers.
#[derive(Clone, Debug, Default)]
pub struct ChaosKnobs {
    /// SIGKILLs during the kill phase (`None`: ten).
    pub kills: Option<usize>,
    /// The outage's length (`None`: 30 s; zero skips the outage).
    pub outage: Option<Duration>,
    /// Leave the apalis job whose id is not a ULID out of the poison rows.
    pub skip_apalis_poison: bool,
    /// Seed of the victim choice (`None`: random, printed in the report).
    pub seed: Option<u64>,
    /// The phases to run, of `kill`, `rolling`, `restart`, `outage`, `poison`, `apalis`, `skew`
    /// (`None`: all).
    pub phases: Option<Vec<String>>,
}

/// A fault marked on the plot: a line at `t`, a shaded span to `until`.
#[derive(Clone, Debug, Serialize)]
pub struct Mark {
    /// Seconds since the burst was enqueued.
    pub t: f64,
    /// The end of the span, if the fault lasted.
    pub until: Option<f64>,
    /// What happened.
    pub label: String,
}

/// One sample of the run's progress, taken every [`SAMPLE_EVERY`].
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Sample {
    /// Seconds since the burst was enqueued.
    pub t: f64,
    /// Requests the target received so far.
    pub requests: u64,
    /// 429s it answered so far.
    pub throttled: u64,
    /// Deliveries delivered so far.
    pub delivered: i64,
    /// Whether a rate-limit block held at the sample.
    pub blocked: bool,
    /// The pace the budget sets, calls per second: its effective rate less the pacer's
    /// headroom (the least over budgets; `None` before the first lease or where the
    /// database is not read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pace: Option<f64>,
}

/// How often progress is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Where it ran: cores, memory, PostgreSQL version.
    pub machine: String,
    /// When it ran (UTC).
    pub at: String,
    /// Named figures, in display order.
    pub figures: Vec<(String, serde_json::Value)>,
    /// The declared rate in calls per second (for the plot), if any.
    pub declared_per_second: Option<f64>,
    /// Progress samples.
    pub timeline: Vec<Sample>,
    /// Faults to mark on the plot (chaos only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<Mark>,
    /// The target's real limit over time, `(from second, requests per second)` steps, for
    /// the plot (limits only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub real_limit: Vec<(f64, f64)>,
}

impl Report {
    fn new(scenario: &str, machine: String) -> Self {
        Self {
            scenario: scenario.to_owned(),
            machine,
            at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            figures: Vec::new(),
            declared_per_second: None,
            timeline: Vec::new(),
            marks: Vec::new(),
            real_limit: Vec::new(),
        }
    }

    fn figure(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.figures.push((name.to_owned(), value.into()));
    }

    /// The value of a figure, for tests and summaries.
    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.figures.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The figures as an aligned table.
    pub fn render(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .figures
            .iter()
            .map(|(n, v)| {
                let v = match v {
                    serde_json::Value::Number(n) if n.is_f64() => {
                        format!("{:.3}", n.as_f64().unwrap_or_default())
                    }
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                vec![n.clone(), v]
            })
            .collect();
        format!(
            "scenario {} on {} at {}\n{}",
            self.scenario,
            self.machine,
            self.at,
            courier_cli::tables::table(&["figure", "value"], &rows)
        )
    }
}

/// Runs one scenario and writes its results.
pub async fn run(scenario: Scenario, config: BenchConfig) -> anyhow::Result<Report> {
    let report = scenarios::run(scenario, &config).await?;
    if let Some(dir) = &config.out_dir {
        let (json, svg) = report.write(dir)?;
        println!("wrote {} and {}", json.display(), svg.display());
    }
    Ok(report)
}

impl Report {
    /// Writes `<scenario>.json` (figures and timeline) and `<scenario>.svg` (the plot) to
    /// `dir`; returns their paths.
    fn write(&self, dir: &std::path::Path) -> anyhow::Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join(format!("{}.json", self.scenario));
        std::fs::write(&json, serde_json::to_vec_pretty(self)?)?;
        let svg = dir.join(format!("{}.svg", self.scenario));
        std::fs::write(&svg, plot::svg(self))?;
        Ok((json, svg))
    }
}

/// A fresh database for a run, dropped and created again.
async fn fresh_database(config: &BenchConfig) -> anyhow::Result<(PgPool, String)> {
    let server = PgConnectOptions::from_str(&config.server_url)?;
    let admin = PgPool::connect_with(server.clone().database("postgres"))
        .await
        .context("connecting to PostgreSQL (set DATABASE_URL)")?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
        config.database
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    let url = courier_cli::database_url(&config.server_url, &config.database);
    db::create_database(&url).await?;
    let pool = db::connect(&url, 20).await?;
    db::migrate(&pool).await?;
    Ok((pool, url))
}

/// Cores, memory and the server's version, for the report.
async fn machine(pool: &PgPool) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024 / 1024);
    let pg: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await
        .unwrap_or_default();
    format!("{cores} cores, {mem_gib} GiB, PostgreSQL {pg}")
}

/// Transactions committed or rolled back in the current database so far: every statement
/// outside an explicit transaction is one, a transaction of several statements is one.
async fn transactions(pool: &PgPool) -> anyhow::Result<i64> {
    // Statistics are sent at transaction end with a short delay; ask for a fresh snapshot.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await?;
    Ok(sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?)
}

/// The statements one progress sample sends (deliveries by status, runs by status, the
/// blocks in force, the budgets' pace), which a figure counting transactions leaves out.
const STATEMENTS_PER_SAMPLE: i64 = 4;

/// Samples progress until nothing is pending and no run is active (or `limit` passes).
async fn watch(
    pool: &PgPool,
    target: &Target,
    started: Instant,
    limit: Duration,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let counts = ledger::status_counts(pool).await?;
        let delivered = counts.total(&[DeliveryStatus::Delivered]);
        let active_runs: i64 = (runs::count_by_status(pool).await?.into_iter())
            .filter(|(status, _)| ["running", "waiting"].contains(&status.as_str()))
            .map(|(_, n)| n)
            .sum();
        let open = counts.total(&[DeliveryStatus::Pending, DeliveryStatus::Accepted]) + active_runs;
        let blocked = !blocks::current(pool, chrono::Utc::now()).await?.is_empty();
        let effective_rpm = effective_rpm(pool).await?;
        let c = target.counters();
        samples.push(Sample {
            t: started.elapsed().as_secs_f64(),
            requests: c.requests,
            throttled: c.throttled,
            delivered,
            blocked,
            pace: effective_rpm.map(|rpm| rpm / 60.0 * (1.0 - pacer::HEADROOM)),
        });
        if open == 0 {
            return Ok(samples);
        }
        anyhow::ensure!(
            started.elapsed() < limit,
            "not drained within {limit:?}: {open} pending or accepted deliveries or active runs"
        );
    }
}

/// The least effective rate (requests per minute) of the budgets, as status computes it.
async fn effective_rpm(pool: &PgPool) -> anyhow::Result<Option<f64>> {
    let budgets = courier::ratelimit::report::paced(pool).await?;
    let now = chrono::Utc::now();
    Ok(budgets
        .iter()
        .map(|b| status::budget_pace(&b.state, &b.limits, b.reserve, now).effective_rpm)
        .reduce(f64::min))
}

/// The `courier` binary worker processes run: `COURIER_BIN`, else the one cargo built beside
/// this program (or beside the directory of a test's executable).
pub fn courier_exe() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("COURIER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    let beside = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("courier"))
        .find(|bin| bin.is_file());
    beside.with_context(|| {
        format!(
            "no `courier` binary beside {}: build it (`cargo build --release`) or set COURIER_BIN",
            exe.display()
        )
    })
}

/// A worker process: a child `courier worker` on the bench database.
struct Child {
    child: std::process::Child,
}

impl Child {
    fn spawn(url: &str, settings: &Settings) -> anyhow::Result<Self> {
        let child = std::process::Command::new(courier_exe()?)
            .arg("worker")
            .env("DATABASE_URL", url)
            // The bench's own filter (`warn` unless told): a child's pacer lines show what
            // each process learned.
            .env(
                "COURIER_LOG",
                std::env::var("COURIER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            // Many workers on one host: none serves metrics (they would share a port).
            .env("COURIER_HTTP_ADDR", "")
            .env(
                "COURIER_QUEUE_POLL_MS",
                settings.queue_poll.as_millis().to_string(),
            )
            .env(
                "COURIER_DISPATCH_INTERVAL_MS",
                settings.dispatch_interval.as_millis().to_string(),
            )
            .env(
                "COURIER_WORKER_CONCURRENCY",
                settings.worker_concurrency.to_string(),
            )
            .spawn()
            .context("starting a worker process")?;
        Ok(Self { child })
    }

    /// User + system CPU seconds so far (from /proc).
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start after ") ".
        let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) / 100.0
    }

    /// Peak resident memory in MiB (VmHWM).
    fn peak_rss_mib(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .map_or(0.0, |kb| kb / 1024.0)
    }

    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) -> anyhow::Result<()> {
        std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let status = self.child.wait()?;
        anyhow::ensure!(status.success(), "worker exited with {status}");
        Ok(())
    }
}

/// Workers for a run: in this process, or child processes.
enum Workers {
    InProcess(
        Arc<courier::worker::Engine>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ),
    Children(Vec<Child>),
}

impl Workers {
    fn in_process(pool: &PgPool, settings: &Settings) -> Self {
        let engine = Arc::new(courier::worker::Engine::new(pool.clone(), settings.clone()));
        let handle = tokio::spawn(courier::worker::run(engine.clone()));
        Workers::InProcess(engine, handle)
    }

    fn children(n: usize, url: &str, settings: &Settings) -> anyhow::Result<Self> {
        Ok(Workers::Children(
            (0..n)
                .map(|_| Child::spawn(url, settings))
                .collect::<anyhow::Result<_>>()?,
        ))
    }

    async fn stop(self) -> anyhow::Result<()> {
        match self {
            Workers::InProcess(engine, handle) => {
                engine.shutdown.cancel();
                handle.await??;
            }
            Workers::Children(children) => {
                for c in children {
                    c.stop()?;
                }
            }
        }
        Ok(())
    }
}
