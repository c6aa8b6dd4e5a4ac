//! The scenarios: each sets up a target, a connection and rules on a fresh database,
//! enqueues a burst, runs workers until it is drained, and reports its figures.

use std::{
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::Context;
use apalis::prelude::{
    BackendExt, BoxDynError, TaskBuilder, WorkerBuilder, WorkerBuilderExt, WorkerContext,
};
use apalis_postgres::{Config, PostgresStorage};
use courier_target::{RetryAfterMode, Target, TargetConfig, Window, WorkspaceConfig};
use serde_json::json;
use sqlx::PgPool;

use super::{
    BenchConfig, Child, Report, STATEMENTS_PER_SAMPLE, Workers,
    chaos::{self, ChaosOptions},
    fixtures::{KEY_VAR, TOKEN, connection, customers_on_workspace, new_connection, rule, users},
    fresh_database, machine, transactions, watch,
};
use courier::{
    catalog::{self, NewRule},
    dispatcher::Dispatcher,
    enqueue::{self, NewDelivery},
    ledger::{self, DeliveryStatus},
    maintenance::retention,
    queue::{self, Tick},
    ratelimit::blocks,
    runs,
};
/// The longest a scenario may take to drain before it counts as failed.
const DRAIN_LIMIT: Duration = Duration::from_secs(1800);

/// A benchmark scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Two rules on one connection declaring 6,000/min; target allows 100/s, sliding.
    Pacing,
    /// `pacing` with several worker processes on one budget (three unless told).
    MultiWorker,
    /// No limit, no latency: deliveries per second and transactions per record, against
    /// apalis-postgres draining no-op jobs.
    Throughput,
    /// Target answering in 50–250 ms: rate kept and enqueue-to-delivered times.
    Latency,
    /// Connection declares 600/min, target allows 5/s and answers 429.
    Storm,
    /// A blocked connection with a backlog: database load and CPU of an idle worker.
    IdleThrottled,
    /// 1,000 connections, 5 rules each, 200,000 deliveries.
    Scale,
    /// Limiter kind × declared ÷ real × processes: how the pace meets real limiters.
    Limits,
    /// Real worker processes on a private PostgreSQL cluster: kill -9, database restart
    /// and outage, poison rows.
    Chaos,
    /// Twenty worker processes started one after another, each with a backlog already in
    /// the database: time from the process's start to the target's first call.
    ColdStart,
    /// Deliveries flowing steadily for a while with a short retention: table sizes level.
    Soak,
    /// Many records per call: a User.com mass update, a batch sink split around invalid
    /// records, and throughput against one record per call.
    Bulk,
    /// An initial sync of a million customers through Klaviyo's profile bulk import jobs,
    /// at Klaviyo's published limits.
    InitialSync,
    /// A thousand people erased at once from three targets and from courier.
    Erasure,
}

impl Scenario {
    /// Every scenario, in BENCHMARKS.md's order.
    pub const ALL: [Scenario; 14] = [
        Scenario::Pacing,
        Scenario::Throughput,
        Scenario::Latency,
        Scenario::MultiWorker,
        Scenario::Storm,
        Scenario::IdleThrottled,
        Scenario::Scale,
        Scenario::Limits,
        Scenario::Chaos,
        Scenario::ColdStart,
        Scenario::Soak,
        Scenario::Bulk,
        Scenario::InitialSync,
        Scenario::Erasure,
    ];

    /// Its name on the command line and in result files.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Pacing => "pacing",
            Scenario::MultiWorker => "multi-worker",
            Scenario::Throughput => "throughput",
            Scenario::Latency => "latency",
            Scenario::Storm => "storm",
            Scenario::IdleThrottled => "idle-throttled",
            Scenario::Scale => "scale",
            Scenario::Limits => "limits",
            Scenario::Chaos => "chaos",
            Scenario::ColdStart => "cold-start",
            Scenario::Soak => "soak",
            Scenario::Bulk => "bulk",
            Scenario::InitialSync => "initial-sync",
            Scenario::Erasure => "erasure",
        }
    }

    /// Records enqueued unless told otherwise.
    pub fn default_records(self) -> usize {
        match self {
            Scenario::Pacing | Scenario::MultiWorker => 3_000,
            Scenario::Throughput => 50_000,
            Scenario::Latency => 2_000,
            Scenario::Storm => 300,
            Scenario::IdleThrottled => 10_000,
            Scenario::Scale => 200_000,
            Scenario::Limits => super::limits::DEFAULT_RECORDS,
            Scenario::Chaos => 600,
            Scenario::ColdStart => 300,
            Scenario::Soak => 24_000,
            Scenario::Bulk => super::bulk::DEFAULT_RECORDS,
            Scenario::InitialSync => super::sync::DEFAULT_RECORDS,
            Scenario::Erasure => super::erasure::DEFAULT_RECORDS,
        }
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Scenario::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Scenario::ALL.iter().map(|x| x.name()).collect();
                format!("unknown scenario {s:?}; one of {}", names.join(", "))
            })
    }
}

pub(super) async fn run(scenario: Scenario, config: &BenchConfig) -> anyhow::Result<Report> {
    if std::env::var(KEY_VAR).is_err() {
        // SAFETY: set once, before any worker (thread or child) reads the environment.
        unsafe { std::env::set_var(KEY_VAR, TOKEN) };
    }
    let records = config.records.unwrap_or(scenario.default_records());
    if scenario == Scenario::Chaos {
        // Its own private cluster, not the server DATABASE_URL names: it restarts it.
        let knobs = &config.chaos;
        let mut options = ChaosOptions::bench(super::courier_exe()?);
        options.records = records;
        options.workers = config.workers.unwrap_or(2).max(1);
        options.kills = knobs.kills.unwrap_or(10);
        options.outage = match knobs.outage {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => Some(Duration::from_secs(30)),
        };
        options.poison_apalis = !knobs.skip_apalis_poison;
        if let Some(seed) = knobs.seed {
            options.seed = seed;
        }
        if let Some(phases) = &knobs.phases {
            for p in phases {
                anyhow::ensure!(
                    [
                        "kill", "rolling", "restart", "outage", "poison", "apalis", "skew"
                    ]
                    .contains(&p.as_str()),
                    "unknown chaos phase {p:?}; phases are kill, rolling, restart, outage, \
                     poison, apalis, skew"
                );
            }
            let on = |p: &str| phases.iter().any(|x| x == p);
            if !on("kill") {
                options.kills = 0;
            }
            if !on("rolling") {
                options.rolling = 0;
            }
            options.restart = on("restart");
            if !on("outage") {
                options.outage = None;
            }
            options.poison = on("poison");
            options.poison_apalis &= on("apalis");
            if !on("skew") {
                options.skews.clear();
            }
        }
        return chaos::bench(options).await;
    }
    let (pool, url) = fresh_database(config).await?;
    let mut report = Report::new(scenario.name(), machine(&pool).await);
    report.figure("records", records as u64);
    match scenario {
        Scenario::Pacing => paced(&mut report, config, &pool, &url, records, 1).await?,
        Scenario::MultiWorker => {
            let processes = config.workers.unwrap_or(3).max(1);
            paced(&mut report, config, &pool, &url, records, processes).await?
        }
        Scenario::Throughput => throughput(&mut report, config, &pool, records).await?,
        Scenario::Latency => latency(&mut report, config, &pool, records).await?,
        Scenario::Storm => storm(&mut report, config, &pool, records).await?,
        Scenario::IdleThrottled => idle(&mut report, config, &pool, &url, records).await?,
        Scenario::Scale => scale(&mut report, config, &pool, &url, records).await?,
        Scenario::ColdStart => cold_start(&mut report, config, &pool, &url, records).await?,
        Scenario::Soak => soak(&mut report, config, &pool, records).await?,
        Scenario::Limits => super::limits::run(&mut report, config, records).await?,
        Scenario::Bulk => super::bulk::run(&mut report, config, records).await?,
        Scenario::InitialSync => {
            super::sync::run(&mut report, config, &pool, &url, records).await?
        }
        Scenario::Erasure => super::erasure::run(&mut report, config, &pool, &url, records).await?,
        Scenario::Chaos => unreachable!("chaos returned above"),
    }
    pool.close().await;
    Ok(report)
}

async fn usercom_target(rate: u32, window: Window) -> anyhow::Result<Target> {
    Ok(Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("bench", TOKEN)],
        rate,
        period: Duration::from_secs(1),
        window,
        retry_after: RetryAfterMode::Seconds,
        ..TargetConfig::default()
    })
    .await?)
}

/// `n` small records keyed `<prefix>:<i>`.
fn numbered(prefix: &str, n: usize) -> Vec<NewDelivery> {
    (0..n)
        .map(|k| NewDelivery::new(format!("{prefix}:{k}"), json!({"n": k})))
        .collect()
}

/// Outcome counts, drain time and attempts not explained by ledger rows (i.e. spent on
/// 429s, which must be none).
async fn outcomes(report: &mut Report, pool: &PgPool) -> anyhow::Result<f64> {
    let totals = ledger::totals(pool).await?;
    let drain = totals.enqueued_to_finished_secs;
    report.figure("delivered", totals.delivered);
    report.figure("failed outcomes", totals.failures);
    report.figure("attempts spent on 429s", totals.attempts_without_outcome);
    report.figure("drain time (s)", drain);
    Ok(drain)
}

/// Calls per second while the backlog was being sent: from the first outcome to the last
/// (so a worker's start-up is not counted against the pacer).
async fn sending_rate(pool: &PgPool, calls: u64) -> anyhow::Result<f64> {
    let span = ledger::totals(pool).await?.first_to_last_outcome_secs;
    Ok(if span > 0.0 {
        (calls.saturating_sub(1)) as f64 / span
    } else {
        0.0
    })
}

async fn rate_figures(
    report: &mut Report,
    pool: &PgPool,
    target: &Target,
    declared_per_second: f64,
) -> anyhow::Result<()> {
    let c = target.counters();
    let calls = c.requests as f64;
    let rate = sending_rate(pool, c.requests).await?;
    report.declared_per_second = Some(declared_per_second);
    report.figure("calls", c.requests);
    report.figure("achieved calls/s (first to last call)", rate);
    report.figure("achieved ÷ declared", rate / declared_per_second);
    report.figure("429s", c.throttled);
    report.figure(
        "429 share",
        if calls > 0.0 {
            c.throttled as f64 / calls
        } else {
            0.0
        },
    );
    report.figure("most calls in a sliding second", c.peak_per_second);
    report.figure("most calls in a sliding minute", c.peak_per_minute);
    Ok(())
}

async fn paced(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    records: usize,
    processes: usize,
) -> anyhow::Result<()> {
    let target = usercom_target(100, Window::Sliding).await?;
    connection(
        pool,
        "workspace",
        "usercom",
        target.workspace_url("bench"),
        6_000,
        16,
    )
    .await?;
    rule(pool, "customers", "workspace", "usercom-users", 100).await?;
    rule(pool, "accounts", "workspace", "usercom-users", 100).await?;
    enqueue::enqueue_many(pool, "customers", users("customer", records / 2)).await?;
    enqueue::enqueue_many(pool, "accounts", users("account", records - records / 2)).await?;
    let started = Instant::now();
    let workers = if processes == 1 {
        Workers::in_process(pool, &config.settings)
    } else {
        Workers::children(processes, url, &config.settings)?
    };
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    workers.stop().await?;
    report.figure("worker processes", processes as u64);
    outcomes(report, pool).await?;
    rate_figures(report, pool, &target, 100.0).await?;
    // Each rule's share of the first half of the calls (while both had a backlog).
    let (first, total): (i64, i64) = sqlx::query_as(
        "WITH firsts AS (SELECT l.rule_id FROM ledger l ORDER BY l.id LIMIT (SELECT count(*) / 2 FROM ledger))
         SELECT count(*) FILTER (WHERE rule_id = (SELECT id FROM rules WHERE name = 'customers')),
                count(*) FROM firsts",
    )
    .fetch_one(pool)
    .await?;
    let share = first as f64 / total.max(1) as f64;
    report.figure("customers' share while both had a backlog", share);
    report.figure("accounts' share while both had a backlog", 1.0 - share);
    Ok(())
}

async fn throughput(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    records: usize,
) -> anyhow::Result<()> {
    let target = Target::start(0).await?;
    connection(pool, "open", "http_json", target.url(), 60_000_000, 64).await?;
    let rules = ["a", "b", "c", "d"];
    for r in rules {
        rule(pool, r, "open", &format!("{r}/"), 500).await?;
    }
    for (i, r) in rules.iter().enumerate() {
        let n = records / rules.len() + usize::from(i < records % rules.len());
        let batch = numbered(r, n);
        enqueue::enqueue_many(pool, r, batch).await?;
    }
    let before = transactions(pool).await?;
    let started = Instant::now();
    let workers = Workers::in_process(pool, &config.settings);
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    workers.stop().await?;
    let samples = report.timeline.len() as i64 * STATEMENTS_PER_SAMPLE; // the sampler's own
    let xacts = transactions(pool).await? - before - samples;
    let drain = outcomes(report, pool).await?;
    let rate = records as f64 / drain.max(f64::EPSILON);
    report.figure("deliveries/s", rate);
    report.figure(
        "transactions per delivered record",
        xacts as f64 / records as f64,
    );

    // The bare queue: apalis-postgres draining the same number of no-op jobs.
    let baseline = apalis_noop(pool, records, &config.settings).await?;
    report.figure("apalis no-op jobs/s (batch 100)", baseline);
    report.figure("courier ÷ bare queue", rate / baseline);
    Ok(())
}

/// apalis-postgres draining `n` no-op jobs, fetched 100 at a time: jobs per second.
async fn apalis_noop(
    pool: &PgPool,
    n: usize,
    settings: &courier::config::Settings,
) -> anyhow::Result<f64> {
    const QUEUE: &str = "courier.bench-noop";
    let mut tx = pool.begin().await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let tasks = chunk
            .iter()
            .map(|i| TaskBuilder::new(serde_json::to_vec(&json!({"n": i})).expect("json")).build())
            .collect();
        apalis_postgres::queries::push_tasks(&mut *tx, QUEUE, tasks).await?;
    }
    tx.commit().await?;
    async fn noop(_: serde_json::Value) -> Result<(), BoxDynError> {
        Ok(())
    }
    let storage = PostgresStorage::<serde_json::Value>::new(pool)
        .with_config(Config::default().queue(QUEUE).batch_size(100))
        .with_pubsub()
        .poll_with_strategy(Tick::every(settings.queue_poll));
    let ctx = WorkerContext::new("bench-noop");
    let worker = WorkerBuilder::new(ctx.clone())
        .backend(storage)
        .concurrency(settings.worker_concurrency)
        .build(noop);
    let started = Instant::now();
    let handle = tokio::spawn(async move { worker.run().await });
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let done = queue::done_in(pool, QUEUE).await?;
        if done as usize >= n {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < DRAIN_LIMIT,
            "apalis baseline did not drain"
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = ctx.stop();
    handle.abort();
    Ok(n as f64 / elapsed)
}

async fn latency(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    records: usize,
) -> anyhow::Result<()> {
    let target = Target::start(0).await?;
    target.set_faults(courier_target::Faults {
        latency: Some((Duration::from_millis(50), Duration::from_millis(250))),
        ..Default::default()
    });
    connection(pool, "slow", "http_json", target.url(), 6_000, 64).await?;
    rule(pool, "customers", "slow", "customers/", 500).await?;
    let batch = numbered("c", records);
    enqueue::enqueue_many(pool, "customers", batch).await?;
    let started = Instant::now();
    let workers = Workers::in_process(pool, &config.settings);
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    workers.stop().await?;
    outcomes(report, pool).await?;
    rate_figures(report, pool, &target, 100.0).await?;
    report.figure(
        "most calls in flight",
        target.counters().max_in_flight as u64,
    );
    let (p50, p99): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))::float8,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))::float8
         FROM deliveries WHERE status = 'delivered'",
    )
    .fetch_one(pool)
    .await?;
    report.figure("enqueue→delivered p50 (s)", p50);
    report.figure("enqueue→delivered p99 (s)", p99);
    Ok(())
}

async fn storm(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    records: usize,
) -> anyhow::Result<()> {
    let target = usercom_target(5, Window::Fixed).await?;
    customers_on_workspace(pool, &target, 600, 8).await?;
    enqueue::enqueue_many(pool, "customers", users("customer", records)).await?;
    let started = Instant::now();
    let workers = Workers::in_process(pool, &config.settings);
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    workers.stop().await?;
    let drain = outcomes(report, pool).await?;
    rate_figures(report, pool, &target, 10.0).await?;
    let blocks = report
        .timeline
        .windows(2)
        .filter(|w| !w[0].blocked && w[1].blocked)
        .count();
    report.figure("blocks seen (sampled)", blocks as u64);
    let ideal = records as f64 / 5.0;
    report.figure("ideal drain at 5/s (s)", ideal);
    report.figure("drain ÷ ideal", drain / ideal);
    Ok(())
}

async fn idle(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    records: usize,
) -> anyhow::Result<()> {
    const WINDOW: Duration = Duration::from_secs(60);
    let target = Target::start(0).await?;
    let id = connection(pool, "blocked", "http_json", target.url(), 600, 8).await?;
    rule(pool, "customers", "blocked", "customers/", 100).await?;
    let batch = numbered("c", records);
    enqueue::enqueue_many(pool, "customers", batch).await?;
    let key = catalog::budget_key_of(pool, "blocked")
        .await?
        .context("the connection just saved")?;
    let now = chrono::Utc::now();
    let until = now + chrono::Duration::minutes(10);
    blocks::block_by_hand(pool, &key, id, until, Some("600"), now).await?;
    let child = Child::spawn(url, &config.settings)?;
    // Let it start (migrations, registration) before measuring.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu0, x0) = (child.cpu_seconds(), transactions(pool).await?);
    tokio::time::sleep(WINDOW).await;
    let (cpu1, x1) = (child.cpu_seconds(), transactions(pool).await?);
    child.stop()?;
    let own = 2; // the two statistics reads
    report.figure("measured for (s)", WINDOW.as_secs());
    report.figure(
        "transactions/s",
        (x1 - x0 - own) as f64 / WINDOW.as_secs_f64(),
    );
    report.figure("worker CPU seconds", cpu1 - cpu0);
    report.figure("calls made", target.counters().requests);
    Ok(())
}

async fn scale(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    records: usize,
) -> anyhow::Result<()> {
    const CONNECTIONS: usize = 1_000;
    const RULES_PER_CONNECTION: usize = 5;
    let target = Target::start(0).await?;
    let connections: Vec<_> = (1..=CONNECTIONS)
        .map(|g| new_connection(&format!("c{g}"), "http_json", target.url(), 60_000_000, 8))
        .collect();
    let rules: Vec<NewRule> = (connections.iter())
        .flat_map(|c| {
            (1..=RULES_PER_CONNECTION).map(|g| NewRule {
                name: format!("{}-r{g}", c.name),
                connection: c.name.clone(),
                path: format!("r{g}/"),
                ..Default::default()
            })
        })
        .collect();
    let mut tx = pool.begin().await?;
    catalog::save_many(&mut tx, &connections, &rules).await?;
    tx.commit().await?;
    let per_rule = (records / (CONNECTIONS * RULES_PER_CONNECTION)).max(1);
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'k:' || r.id || ':' || g, jsonb_build_object('n', g)
         FROM rules r, generate_series(1, $1) g",
    )
    .bind(per_rule as i32)
    .execute(pool)
    .await?;
    let total = (per_rule * CONNECTIONS * RULES_PER_CONNECTION) as u64;
    report.figure("connections", CONNECTIONS as u64);
    report.figure("rules", (CONNECTIONS * RULES_PER_CONNECTION) as u64);
    report.figure("records enqueued (whole per rule)", total);
    sqlx::query("ANALYZE").execute(pool).await?;

    // The dispatcher's pass, timed in this process: first with every rule due (it starts
    // 5,000 runs), then a pass with nothing to start.
    let engine = courier::worker::Engine::new(pool.clone(), config.settings.clone());
    let t = Instant::now();
    let started_runs = Dispatcher::new(&engine).run_once().await?;
    report.figure(
        "dispatcher pass starting every run (ms)",
        t.elapsed().as_secs_f64() * 1e3,
    );
    report.figure("runs started by it", started_runs as u64);
    let t = Instant::now();
    Dispatcher::new(&engine).run_once().await?;
    report.figure(
        "dispatcher pass with nothing to start (ms)",
        t.elapsed().as_secs_f64() * 1e3,
    );

    let started = Instant::now();
    let child = Child::spawn(url, &config.settings)?;
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    let rss = child.peak_rss_mib();
    child.stop()?;
    let drain = started.elapsed().as_secs_f64();
    report.figure("drain time (s)", drain);
    report.figure("deliveries/s", total as f64 / drain);
    report.figure("worker peak RSS (MiB)", rss);
    let t = Instant::now();
    Dispatcher::new(&engine).run_once().await?;
    report.figure(
        "dispatcher pass after the drain (ms)",
        t.elapsed().as_secs_f64() * 1e3,
    );
    initial_sync(report, config).await
}

/// The initial sync's sizes: records loaded by one `INSERT ... SELECT`.
const SYNC_SIZES: [usize; 3] = [20_000, 100_000, 1_000_000];

/// A new user's first job, at each of [`SYNC_SIZES`]: a fresh database, one rule into a
/// batch sink without limit (100 records per call, batches of 1,000, 16 calls in flight),
/// the records loaded by one plain-SQL insert, then one `courier worker`; once with no
/// statistics (as before autovacuum's first analyze), once after `ANALYZE`. The claim's
/// cost must not hang on what the planner believes: fresh ÷ analyzed near 1.
async fn initial_sync(report: &mut Report, config: &BenchConfig) -> anyhow::Result<()> {
    let cell = BenchConfig {
        database: format!("{}_sync", config.database),
        ..config.clone()
    };
    for n in SYNC_SIZES {
        let fresh = sync_cell(&cell, n, false).await?;
        let analyzed = sync_cell(&cell, n, true).await?;
        let label = format!("initial sync {n}");
        report.figure(&format!("{label}: fresh records/s"), fresh.per_second);
        report.figure(&format!("{label}: analyzed records/s"), analyzed.per_second);
        report.figure(
            &format!("{label}: fresh ÷ analyzed"),
            fresh.per_second / analyzed.per_second,
        );
        report.figure(&format!("{label}: worker peak RSS (MiB)"), fresh.rss_mib);
        report.figure(
            &format!("{label}: database bytes per record"),
            fresh.bytes_per_record,
        );
        println!(
            "initial sync {n}: fresh {:.0}/s, analyzed {:.0}/s, worker {:.0} MiB, {:.0} B/record",
            fresh.per_second, analyzed.per_second, fresh.rss_mib, fresh.bytes_per_record
        );
    }
    Ok(())
}

/// What one initial sync measured.
struct SyncCell {
    per_second: f64,
    rss_mib: f64,
    bytes_per_record: f64,
}

async fn sync_cell(config: &BenchConfig, n: usize, analyze: bool) -> anyhow::Result<SyncCell> {
    let (pool, url) = fresh_database(config).await?;
    let target = Target::start_with(TargetConfig {
        rate: 1_000_000,
        ..TargetConfig::default()
    })
    .await?;
    connection(&pool, "sink", "http_json", target.url(), 60_000_000, 16).await?;
    catalog::upsert_rule(
        &pool,
        &NewRule {
            name: "sync".into(),
            connection: "sink".into(),
            path: "batch/per-item/".into(),
            batch_size: Some(1_000),
            records_per_call: Some(100),
            ..Default::default()
        },
    )
    .await?;
    // About 80 bytes of payload, as a shop's customer summary.
    sqlx::query(
        "INSERT INTO deliveries (rule_id, record_key, payload)
         SELECT r.id, 'customer:' || g,
                jsonb_build_object('n', g, 'email', 'c' || g || '@example.com', 'name', 'customer ' || g)
         FROM rules r, generate_series(1, $1) g",
    )
    .bind(n as i32)
    .execute(&pool)
    .await?;
    if analyze {
        sqlx::query("ANALYZE deliveries").execute(&pool).await?;
    }
    let started = Instant::now();
    let child = Child::spawn(&url, &config.settings)?;
    watch(&pool, &target, started, DRAIN_LIMIT).await?;
    let drain = started.elapsed().as_secs_f64();
    let rss_mib = child.peak_rss_mib();
    child.stop()?;
    let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(SyncCell {
        per_second: n as f64 / drain,
        rss_mib,
        bytes_per_record: bytes as f64 / n as f64,
    })
}

/// Worker starts measured by `cold-start`.
const COLD_STARTS: usize = 20;

/// `COLD_STARTS` times: enqueue a backlog of `records` while no worker runs, start a worker
/// process, wait for the target's first call, stop the worker (SIGTERM). The backlog left
/// behind stays for the next start, as after a deploy; the figures are the time from
/// spawning the process to the first call.
async fn cold_start(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    url: &str,
    records: usize,
) -> anyhow::Result<()> {
    let target = usercom_target(10, Window::Sliding).await?;
    customers_on_workspace(pool, &target, 600, 8).await?;
    let mut firsts = Vec::with_capacity(COLD_STARTS);
    for i in 0..COLD_STARTS {
        enqueue::enqueue_many(pool, "customers", users(&format!("start{i}"), records)).await?;
        let before = target.counters().requests;
        let spawned = Instant::now();
        let child = Child::spawn(url, &config.settings)?;
        while target.counters().requests == before {
            anyhow::ensure!(
                spawned.elapsed() < Duration::from_secs(60),
                "start {i}: no call within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let first = spawned.elapsed().as_secs_f64();
        child.stop()?;
        println!("start {:>2}: first call after {first:.3} s", i + 1);
        firsts.push(first);
    }
    firsts.sort_by(f64::total_cmp);
    report.figure("worker starts", COLD_STARTS as u64);
    report.figure("start → first call, best (s)", firsts[0]);
    report.figure("start → first call, median (s)", firsts[COLD_STARTS / 2]);
    report.figure("start → first call, worst (s)", firsts[COLD_STARTS - 1]);
    report.figure(
        "queue poll interval (s)",
        config.settings.queue_poll.as_secs_f64(),
    );
    Ok(())
}

/// Records per wave of the soak, and the pause between waves.
const SOAK_WAVE: usize = 50;
const SOAK_EVERY: Duration = Duration::from_millis(250);

/// Rows of the tables retention keeps short: finished deliveries, pending ones, ledger,
/// runs, queue jobs, and finished deliveries that retention should have removed already
/// (ended longer ago than `overdue`).
async fn table_rows(pool: &PgPool, overdue: Duration) -> anyhow::Result<[i64; 6]> {
    let deliveries = ledger::status_counts(pool).await?;
    let pending = deliveries.total(&[DeliveryStatus::Pending]);
    let runs: i64 = (runs::count_by_status(pool).await?.iter())
        .map(|(_, n)| n)
        .sum();
    Ok([
        deliveries.0.iter().map(|c| c.deliveries).sum::<i64>() - pending,
        pending,
        ledger::rows(pool).await?,
        runs,
        queue::rows(pool).await?,
        retention::overdue(pool, overdue).await?,
    ])
}

/// Waves of [`SOAK_WAVE`] records every [`SOAK_EVERY`] until `records` are enqueued, with
/// a retention of a sixth of that time (1–10 s; `COURIER_RETENTION_SECONDS` below a day
/// wins). The rows of finished deliveries, ledger, runs and queue jobs, sampled every
/// second, level off at about one retention period's worth while deliveries keep flowing
/// (the pending backlog is reported apart: it measures the worker, not retention); none
/// outlives the retention period by more than a pass and a margin; and one retention
/// period after the drain nothing finished is left.
async fn soak(
    report: &mut Report,
    config: &BenchConfig,
    pool: &PgPool,
    records: usize,
) -> anyhow::Result<()> {
    let target = Target::start(0).await?;
    connection(pool, "open", "http_json", target.url(), 60_000_000, 16).await?;
    rule(pool, "soak", "open", "soak/", 100).await?;
    let waves = records.div_ceil(SOAK_WAVE).max(1);
    let clock = SoakClock::new(config, waves);
    report.figure("retention (s)", clock.retention.as_secs_f64());
    report.figure("feeding for (s)", clock.feed.as_secs_f64());
    let settings = courier::config::Settings {
        retention: Some(clock.retention),
        ..config.settings.clone()
    };
    let started = Instant::now();
    let workers = Workers::in_process(pool, &settings);
    let mut sizes = feed_soak(pool, records, started, clock.overdue).await?;
    report.timeline = watch(pool, &target, started, DRAIN_LIMIT).await?;
    sizes.push((
        started.elapsed().as_secs_f64(),
        table_rows(pool, clock.overdue).await?,
    ));
    // One retention period (and two passes) after the last delivery: nothing finished left.
    tokio::time::sleep(clock.retention + clock.pass * 2 + Duration::from_secs(1)).await;
    let after = table_rows(pool, clock.overdue).await?;
    workers.stop().await?;
    let delivered = ledger::totals(pool).await?.records_delivered;
    report.figure("records delivered (delivered_records)", delivered);
    report.figure("target requests", target.counters().requests);
    soak_figures(report, &clock, &sizes, &after);
    Ok(())
}

/// The soak's times: how long it feeds, the retention it runs with, how often retention
/// passes, and the age past which a finished row is overdue (retention, a pass, 3 s).
struct SoakClock {
    feed: Duration,
    retention: Duration,
    pass: Duration,
    overdue: Duration,
}

impl SoakClock {
    /// The times for `waves` waves: a retention of a sixth of the feeding (1–10 s) unless
    /// the settings name one below a day; passes every tenth of it, at least every second.
    fn new(config: &BenchConfig, waves: usize) -> Self {
        let feed = SOAK_EVERY * waves as u32;
        let retention = match config.settings.retention {
            Some(r) if r < Duration::from_secs(86_400) => r,
            _ => (feed / 6).clamp(Duration::from_secs(1), Duration::from_secs(10)),
        };
        // Retention passes come every tenth of the period, at least every second.
        let pass = (retention / 10).max(Duration::from_secs(1));
        let overdue = retention + pass + Duration::from_secs(3);
        Self {
            feed,
            retention,
            pass,
            overdue,
        }
    }
}

/// Enqueues the soak's `records` in waves of [`SOAK_WAVE`] every [`SOAK_EVERY`]; returns
/// the table sizes sampled about every second meanwhile (seconds since `started`).
async fn feed_soak(
    pool: &PgPool,
    records: usize,
    started: Instant,
    overdue: Duration,
) -> anyhow::Result<Vec<(f64, [i64; 6])>> {
    let waves = records.div_ceil(SOAK_WAVE).max(1);
    let mut sizes: Vec<(f64, [i64; 6])> = Vec::new();
    let mut tick = tokio::time::interval(SOAK_EVERY);
    let mut sampled = Instant::now();
    for wave in 0..waves {
        tick.tick().await;
        let n = SOAK_WAVE.min(records - wave * SOAK_WAVE);
        let prefix = format!("w{wave}");
        enqueue::enqueue_many(pool, "soak", numbered(&prefix, n)).await?;
        if sampled.elapsed() >= Duration::from_secs(1) {
            sampled = Instant::now();
            sizes.push((
                started.elapsed().as_secs_f64(),
                table_rows(pool, overdue).await?,
            ));
        }
    }
    Ok(sizes)
}

/// The soak's verdict figures: peak rows per table in the first and second half of the
/// feeding (level when the second is no higher), the most overdue rows in a sample, the
/// rows left one retention period after the drain, and every size sample.
fn soak_figures(
    report: &mut Report,
    clock: &SoakClock,
    sizes: &[(f64, [i64; 6])],
    after: &[i64; 6],
) {
    let half = clock.feed.as_secs_f64() / 2.0;
    let peak = |from: f64, to: f64, i: usize| {
        sizes
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, s)| s[i])
            .max()
            .unwrap_or(0)
    };
    for (i, table) in [
        (0, "finished deliveries"),
        (2, "ledger"),
        (3, "runs"),
        (4, "apalis.jobs"),
        (1, "pending deliveries (backlog)"),
    ] {
        report.figure(&format!("{table} rows, peak 1st half"), peak(0.0, half, i));
        report.figure(
            &format!("{table} rows, peak 2nd half"),
            peak(half, f64::MAX, i),
        );
    }
    report.figure(
        &format!(
            "finished rows older than retention + {} s, most in a sample",
            (clock.overdue - clock.retention).as_secs()
        ),
        peak(0.0, f64::MAX, 5),
    );
    report.figure(
        "rows one retention period after the drain (deliveries/ledger/runs/jobs)",
        format!(
            "{}/{}/{}/{}",
            after[0] + after[1],
            after[2],
            after[3],
            after[4]
        ),
    );
    report.figure(
        "deliveries rows one retention period after the drain",
        after[0] + after[1],
    );
    report.figure(
        "size samples (t s: finished/pending/ledger/runs/jobs)",
        sizes
            .iter()
            .map(|(t, s)| format!("{t:.0}: {}/{}/{}/{}/{}", s[0], s[1], s[2], s[3], s[4]))
            .collect::<Vec<_>>()
            .join(", "),
    );
}
