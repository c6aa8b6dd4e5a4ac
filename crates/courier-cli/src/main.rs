//! The `courier` command line: parses arguments, starts telemetry, loads and validates the
//! settings, and hands over to the engine library (`courier`), the local target
//! (`courier_target`) or this crate's demo and benchmarks.

use std::{io::Read, path::PathBuf, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use courier::{
    catalog::{self, CatalogFile, NewConnection, NewRule},
    config::{self, Settings},
    db, enqueue, status,
    worker::{self, Engine},
};
use courier_cli::{bench, demo};
use courier_target::{self as target, WorkspaceConfig};

/// Delivers shop records into marketing and CRM targets through a PostgreSQL job queue.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply courier's and apalis' migrations (the worker does this at start too).
    Migrate,
    /// Manage the database itself.
    #[command(subcommand)]
    Db(DbCmd),
    /// Run the worker: dispatcher, reaper and chain jobs, until SIGTERM or Ctrl-C.
    Worker,
    /// Enqueue deliveries for a rule from NDJSON (stdin or a file), all or nothing.
    Enqueue {
        /// The rule's name.
        #[arg(long)]
        rule: String,
        /// NDJSON file; stdin when absent.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Create or update connections and rules from a JSON file, all or nothing.
    Apply {
        /// `{"connections": [...], "rules": [...]}`
        file: PathBuf,
    },
    /// Manage target connections.
    #[command(subcommand)]
    Connection(ConnectionCmd),
    /// Manage rules.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// Show connections, rules and recent runs.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Run the end-to-end demo on a fresh `courier_demo` database with a local User.com target.
    Demo {
        /// Deliveries to enqueue (customers, consents and price changes).
        #[arg(long, default_value_t = demo::DEFAULT_RECORDS)]
        records: usize,
        /// The target workspace's limit in requests per second (declared as 60x per minute).
        #[arg(long, default_value_t = demo::DEFAULT_RATE)]
        rate: u32,
    },
    /// Run the local User.com-like HTTP target until Ctrl-C.
    Target(TargetArgs),
    /// Run a benchmark scenario on a fresh database (`courier_bench`, on the server
    /// `DATABASE_URL` names) with a local target; prints a table and writes
    /// `<out>/<scenario>.json` and `<out>/<scenario>.svg`. Build with --release.
    Bench {
        /// pacing, throughput, latency, multi-worker, storm, idle-throttled, scale or chaos.
        scenario: bench::Scenario,
        /// Records to enqueue (each scenario has its own default).
        #[arg(long)]
        records: Option<usize>,
        /// Worker processes for multi-worker (default 3) and chaos (default 2).
        #[arg(long)]
        workers: Option<usize>,
        /// chaos: SIGKILLs of a busy worker during the first burst (default 10).
        #[arg(long)]
        kills: Option<usize>,
        /// chaos: seconds the database stays down in the outage phase (default 30; 0
        /// skips it).
        #[arg(long)]
        outage_seconds: Option<u64>,
        /// chaos: leave out the apalis job whose id is not a ULID.
        #[arg(long)]
        skip_apalis_poison: bool,
        /// chaos: seed of the victim choice (random unless given).
        #[arg(long)]
        seed: Option<u64>,
        /// chaos: the phases to run, of kill, restart, outage, poison, apalis (default: all).
        #[arg(long, value_delimiter = ',')]
        phases: Option<Vec<String>>,
        /// Where results go.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
}

/// Options of `courier target`.
#[derive(clap::Args)]
struct TargetArgs {
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: std::net::IpAddr,
    /// A workspace, `NAME:TOKEN` or `NAME:TOKEN:attr,attr` to declare its custom
    /// attributes (repeatable). Reach it at /ws/NAME/api/public/ or with Host NAME.<anything>.
    #[arg(long = "workspace", value_parser = WorkspaceConfig::parse)]
    workspaces: Vec<WorkspaceConfig>,
    /// Requests per second each workspace allows.
    #[arg(long, default_value_t = target::DEFAULT_RATE)]
    rate: u32,
    /// Limiter window: fixed (1 s) or sliding (log).
    #[arg(long, default_value = "fixed")]
    window: target::Window,
    /// What a 429 carries: seconds, http-date or none.
    #[arg(long, default_value = "seconds")]
    retry_after: target::RetryAfterMode,
    /// Share (0..1) of requests answered 500, 502 or 504.
    #[arg(long, default_value_t = 0.0)]
    fault_5xx: f64,
    /// Extra latency per request, uniform in MIN..MAX milliseconds.
    #[arg(long, value_parser = target::parse_latency_ms)]
    latency_ms: Option<(std::time::Duration, std::time::Duration)>,
    /// Share (0..1) of requests that hang past any client timeout.
    #[arg(long, default_value_t = 0.0)]
    hang: f64,
    /// Share (0..1) of requests whose connection is closed without an answer.
    #[arg(long, default_value_t = 0.0)]
    reset: f64,
}

#[derive(Subcommand)]
enum DbCmd {
    /// Create the database DATABASE_URL names, unless it exists (connects to the server's
    /// `postgres` database for that; the role needs CREATEDB). No other command creates
    /// it or connects anywhere but DATABASE_URL.
    Create,
}

#[derive(Subcommand)]
enum ConnectionCmd {
    /// Create a connection, or update the one with that name.
    Add {
        #[arg(long)]
        name: String,
        /// Writer kind.
        #[arg(long, default_value = "http_json")]
        writer: String,
        #[arg(long)]
        base_url: String,
        /// Environment variable holding the API key.
        #[arg(long)]
        api_key_env: Option<String>,
        /// Extra header, `Name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        #[arg(long)]
        requests_per_minute: Option<i32>,
        #[arg(long)]
        max_in_flight: Option<i32>,
        #[arg(long)]
        timeout_ms: Option<i32>,
        /// Share one budget and one rate-limit block with connections naming the same key
        /// (e.g. the workspace).
        #[arg(long)]
        budget_key: Option<String>,
    },
    /// List connections.
    List,
}

#[derive(Subcommand)]
enum RuleCmd {
    /// Create a rule, or update the one with that name.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long)]
        connection: String,
        /// Path under the connection's base URL.
        #[arg(long, default_value = "")]
        path: String,
        #[arg(long)]
        batch_size: Option<i32>,
        #[arg(long)]
        max_attempts: Option<i32>,
        #[arg(long)]
        backoff_base_ms: Option<i32>,
        #[arg(long)]
        backoff_max_ms: Option<i32>,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
        /// Its share of the connection's budget against other busy rules (default 1).
        #[arg(long)]
        weight: Option<i32>,
    },
    /// List rules.
    List,
    /// Let the dispatcher start runs for a rule.
    Enable { name: String },
    /// Stop starting runs for a rule.
    Disable { name: String },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("courier: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COURIER_LOG")
                .unwrap_or_else(|_| "info,sqlx=warn,apalis=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse(), settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("courier: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, settings: Settings) -> anyhow::Result<()> {
    let pool = || db::connect(&settings.database_url, settings.db_max_connections);
    match cli.command {
        Command::Db(DbCmd::Create) => {
            let url = config::redact_url(&settings.database_url);
            if db::create_database(&settings.database_url).await? {
                println!("database created: {url}");
            } else {
                println!("database exists already: {url}");
            }
        }
        Command::Migrate => {
            db::migrate(&pool().await?).await?;
            println!("migrations applied");
        }
        Command::Worker => {
            let pool = pool().await?;
            db::migrate(&pool).await?;
            let engine = Arc::new(Engine::new(pool, settings));
            worker::cancel_on_signal(engine.shutdown.clone());
            worker::run(engine).await?;
        }
        Command::Enqueue { rule, file } => {
            let mut input = String::new();
            match file {
                Some(path) => {
                    input = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?
                }
                None => {
                    std::io::stdin().read_to_string(&mut input)?;
                }
            }
            let deliveries = enqueue::parse_ndjson(&input)?;
            let n = deliveries.len();
            enqueue::enqueue_many(&pool().await?, &rule, deliveries).await?;
            println!("enqueued {n} deliveries for rule {rule}");
        }
        Command::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let catalog: CatalogFile = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a valid catalog file", file.display()))?;
            catalog::apply(&pool().await?, &catalog).await?;
            println!(
                "applied {} connection(s) and {} rule(s)",
                catalog.connections.len(),
                catalog.rules.len()
            );
        }
        Command::Connection(ConnectionCmd::Add {
            name,
            writer,
            base_url,
            api_key_env,
            headers,
            requests_per_minute,
            max_in_flight,
            timeout_ms,
            budget_key,
        }) => {
            let mut map = serde_json::Map::new();
            for h in headers {
                let (k, v) = h
                    .split_once(':')
                    .with_context(|| format!("header {h:?} is not `Name: value`"))?;
                map.insert(k.trim().to_owned(), v.trim().into());
            }
            let id = catalog::upsert_connection(
                &pool().await?,
                &NewConnection {
                    name,
                    writer,
                    base_url,
                    api_key_env,
                    headers: map,
                    requests_per_minute,
                    max_in_flight,
                    timeout_ms,
                    budget_key,
                },
            )
            .await?;
            println!("connection {id} saved");
        }
        Command::Connection(ConnectionCmd::List) => {
            let rows = catalog::list_connections(&pool().await?).await?;
            print!(
                "{}",
                status::table(
                    &[
                        "id",
                        "name",
                        "writer",
                        "base url",
                        "key env",
                        "rate/min",
                        "in flight"
                    ],
                    &rows
                        .iter()
                        .map(|c| vec![
                            c.id.to_string(),
                            c.name.clone(),
                            c.writer.clone(),
                            c.base_url.clone(),
                            c.api_key_env.clone().unwrap_or_else(|| "-".into()),
                            c.requests_per_minute
                                .map_or("default".into(), |r| r.to_string()),
                            c.max_in_flight.to_string(),
                        ])
                        .collect::<Vec<_>>()
                )
            );
        }
        Command::Rule(RuleCmd::Add {
            name,
            connection,
            path,
            batch_size,
            max_attempts,
            backoff_base_ms,
            backoff_max_ms,
            disabled,
            weight,
        }) => {
            let id = catalog::upsert_rule(
                &pool().await?,
                &NewRule {
                    name,
                    connection,
                    path,
                    batch_size,
                    max_attempts,
                    backoff_base_ms,
                    backoff_max_ms,
                    enabled: Some(!disabled),
                    weight,
                },
            )
            .await?;
            println!("rule {id} saved");
        }
        Command::Rule(RuleCmd::List) => {
            let rows = catalog::list_rules(&pool().await?).await?;
            print!(
                "{}",
                status::table(
                    &[
                        "id",
                        "name",
                        "connection",
                        "path",
                        "enabled",
                        "batch",
                        "attempts"
                    ],
                    &rows
                        .iter()
                        .map(|r| vec![
                            r.id.to_string(),
                            r.name.clone(),
                            r.connection_id.to_string(),
                            r.path.clone(),
                            r.enabled.to_string(),
                            r.batch_size.to_string(),
                            r.max_attempts.to_string(),
                        ])
                        .collect::<Vec<_>>()
                )
            );
        }
        Command::Rule(RuleCmd::Enable { name }) => {
            catalog::set_rule_enabled(&pool().await?, &name, true).await?;
            println!("rule {name} enabled");
        }
        Command::Rule(RuleCmd::Disable { name }) => {
            catalog::set_rule_enabled(&pool().await?, &name, false).await?;
            println!("rule {name} disabled");
        }
        Command::Status { json } => {
            let report = status::report(&pool().await?, chrono::Utc::now()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
        }
        Command::Bench {
            scenario,
            records,
            workers,
            kills,
            outage_seconds,
            skip_apalis_poison,
            seed,
            phases,
            out,
        } => {
            let report = bench::run(
                scenario,
                bench::BenchConfig {
                    server_url: settings.database_url.clone(),
                    database: "courier_bench".into(),
                    records,
                    workers,
                    out_dir: Some(out),
                    settings,
                    chaos: bench::ChaosKnobs {
                        kills,
                        outage: outage_seconds.map(std::time::Duration::from_secs),
                        skip_apalis_poison,
                        seed,
                        phases,
                    },
                },
            )
            .await?;
            print!("{}", report.render());
        }
        Command::Demo { records, rate } => {
            demo::run(settings, demo::DemoOptions { records, rate }).await?;
        }
        Command::Target(args) => {
            for (name, share) in [
                ("--fault-5xx", args.fault_5xx),
                ("--hang", args.hang),
                ("--reset", args.reset),
            ] {
                anyhow::ensure!(
                    (0.0..=1.0).contains(&share),
                    "{name} must be between 0 and 1"
                );
            }
            let names: Vec<String> = args.workspaces.iter().map(|w| w.name.clone()).collect();
            let config = target::TargetConfig {
                bind: args.bind,
                port: args.port,
                workspaces: args.workspaces,
                rate: args.rate.max(1),
                window: args.window,
                retry_after: args.retry_after,
                faults: target::Faults {
                    share_5xx: args.fault_5xx,
                    latency: args.latency_ms,
                    hang_share: args.hang,
                    reset_share: args.reset,
                    ..target::Faults::default()
                },
                ..target::TargetConfig::default()
            };
            let target = target::Target::start_with(config).await?;
            println!("courier target listening on {}", target.url());
            for name in names {
                println!("  workspace {name}: {}", target.workspace_url(&name));
            }
            println!("  counters: {}_counters", target.url());
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
